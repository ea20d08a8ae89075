package controlplane

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/lanesdev/lanes/internal/app/admin"
	"github.com/lanesdev/lanes/internal/app/xds"
)

// XDSConfig configures the xDS server, which serves routes to gRPC's
// proxyless clients (docs/xds.md).
type XDSConfig struct {
	// Addr is where it listens; XDSOff (the default) runs none.
	Addr string `yaml:"addr"`
	// Auth says who may open a stream: xds.AuthLoopback (the default:
	// clients on loopback addresses, no token; Addr must be a loopback
	// address) or xds.AuthToken (a token of the token store in the
	// stream's metadata).
	Auth string `yaml:"auth"`
}

// XDSOff is the value of XDSConfig.Addr that runs no xDS server.
const XDSOff = "off"

// XDSInfo is what the xDS component provides: its address ("" when off).
type XDSInfo struct {
	Addr string
	// Callers counts the server's clients by the service they call; nil
	// when the server is off.
	Callers admin.XDSCallers
}

// XDSKey is the xDS server's address.
var XDSKey = Key[XDSInfo]{"xds"}

type xdsComponent struct {
	rt   *Runtime
	srv  *xds.Server
	ln   net.Listener
	done chan struct{}
}

func (*xdsComponent) Name() string    { return "xds" }
func (*xdsComponent) Needs() []Dep    { return []Dep{DataDirKey, StoreKey, RegistryKey, EngineKey} }
func (*xdsComponent) Provides() []Dep { return []Dep{XDSKey} }

func (*xdsComponent) Validate(c *Config) error {
	x := c.XDS
	if x.Addr == XDSOff {
		return nil
	}
	if err := checkListen(x.Addr); err != nil {
		return c.fail("xds.addr", x.Addr, "%v (or off)", err)
	}
	switch x.Auth {
	case xds.AuthLoopback:
		host, _, _ := net.SplitHostPort(x.Addr)
		if a, err := netip.ParseAddr(host); (err != nil || !a.IsLoopback()) && host != "localhost" {
			return c.fail("xds.addr", x.Addr, "with xds.auth %s the xDS server listens on a loopback address only (127.0.0.1, ::1); use xds.auth %s to serve others", xds.AuthLoopback, xds.AuthToken)
		}
	case xds.AuthToken:
	default:
		return c.fail("xds.auth", x.Auth, "want %s or %s", xds.AuthLoopback, xds.AuthToken)
	}
	return nil
}

func (c *xdsComponent) Provision(ctx context.Context, rt *Runtime) error {
	c.rt = rt
	x := rt.Config.XDS
	if x.Addr == XDSOff {
		Provide(rt, XDSKey, XDSInfo{})
		return nil
	}
	tc, err := rt.Config.ServerTLS(tlsXDS)
	if err != nil {
		return err
	}
	st := Need(rt, StoreKey)
	cfg := xds.Config{TLS: tc, Registry: Need(rt, RegistryKey), Engine: Need(rt, EngineKey), Auth: x.Auth, Logger: rt.Log, Metrics: rt.Metrics}
	if x.Auth == xds.AuthToken {
		// The admin API's tokens: the admin token, and the registration
		// tokens of any scope.
		token, _, err := adminToken(rt.Config, Need(rt, DataDirKey))
		if err != nil {
			return err
		}
		cfg.Tokens, cfg.IsUnauthorized = admin.NewTokens(st, token, rt.Log), admin.IsUnauthorized
	}
	srv, err := xds.New(cfg)
	if err != nil {
		return err
	}
	c.srv = srv
	if c.ln, err = rt.Listen("xds", x.Addr); err != nil {
		return err
	}
	addr := c.ln.Addr().String()
	Provide(rt, XDSKey, XDSInfo{Addr: addr, Callers: srv})
	note := "gRPC clients dial xds:///<service>; from loopback only, no token"
	if x.Auth == xds.AuthToken {
		note = "gRPC clients dial xds:///<service> with a token"
	}
	if tc != nil {
		note += "; TLS"
	} else if x.Auth == xds.AuthToken {
		note += "; plain gRPC: the tokens cross in clear (set tls.cert)"
	}
	rt.Announce(Address{Name: "xds", URL: "grpc://" + addr, Note: note})
	return nil
}

func (c *xdsComponent) Start(context.Context) error {
	if c.srv == nil {
		return nil
	}
	c.done = make(chan struct{})
	ln := c.ln
	c.ln = nil // the server owns it now
	go func() {
		defer close(c.done)
		if err := c.srv.Serve(ln); err != nil && !errors.Is(err, net.ErrClosed) {
			c.rt.Fail(fmt.Errorf("xDS server: %w", err))
		}
	}()
	return nil
}

func (c *xdsComponent) Stop(context.Context) error {
	if c.srv == nil {
		return nil
	}
	c.srv.Close()
	if c.done != nil {
		<-c.done
	}
	return nil
}

func (c *xdsComponent) Cleanup() error {
	if c.ln != nil {
		c.ln.Close()
	}
	if c.srv != nil {
		c.srv.Close()
	}
	return nil
}
