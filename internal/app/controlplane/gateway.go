package controlplane

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"

	"github.com/lanesdev/lanes/adminapi"
	"github.com/lanesdev/lanes/internal/app/gateway"
	"github.com/lanesdev/lanes/internal/lib/addrpolicy"
	"github.com/lanesdev/lanes/lanestrace"
)

// GatewayConfig returns the configuration of the gateway that the settings
// describe (without the engine, the claims, the logger and the metrics,
// which the gateway component adds), checked by gateway.Config.Validate.
// Errors name the setting as the user gave it: the flag, the variable, or
// the file, line and field, with the value.
func (c *Config) GatewayConfig() (gateway.Config, error) {
	gc := gateway.Config{
		Domain:              c.Domain,
		Zone:                c.Zone,
		Aliases:             c.Gateway.Aliases,
		LaneCookie:          c.Gateway.LaneCookie,
		KeyHeader:           c.Gateway.KeyHeader,
		KeyCookie:           c.Gateway.KeyCookie,
		PreserveHost:        c.Gateway.PreserveHost,
		MaxIdleConnsPerHost: c.Gateway.MaxIdleConnsPerHost,
		ReadyTimeout:        c.Gateway.ReadyTimeout,

		ResponseHeaderTimeout: c.Gateway.ResponseHeaderTimeout,
		UpstreamWriteTimeout:  c.Gateway.UpstreamWriteTimeout,
		UpstreamReadTimeout:   c.Gateway.UpstreamReadTimeout,
		ClientWriteTimeout:    c.Gateway.ClientWriteTimeout,
		UpstreamIdleTimeout:   c.Gateway.UpstreamIdleTimeout,
		ClientIdleTimeout:     c.Gateway.ClientIdleTimeout,
		ClientHeaderTimeout:   c.Gateway.ClientHeaderTimeout,
		ClientReadTimeout:     c.Gateway.ClientReadTimeout,
		Retries:               c.Gateway.Retries,
		MaxConns:              c.Gateway.MaxConns,
		HTTP1:                 c.Gateway.HTTP1,
	}
	for i, r := range c.Routes {
		rt, err := ParseRoute(r)
		if err != nil {
			return gateway.Config{}, &SettingError{Source: c.routeSource(i), Value: r, Msg: err.Error()}
		}
		gc.Routes = append(gc.Routes, rt)
	}
	for _, p := range c.Gateway.StripPrefixes {
		found := false
		for i := range gc.Routes {
			if r := &gc.Routes[i]; r.Prefix != "" && strings.TrimSuffix(r.Prefix, "/") == strings.TrimSuffix(p, "/") {
				r.StripPrefix, found = true, true
			}
		}
		if !found {
			return gateway.Config{}, c.fail("gateway.strip_prefixes", p, "no route has this path prefix")
		}
	}
	trusted, err := c.ParsedTrustedProxies()
	if err != nil {
		return gateway.Config{}, err
	}
	gc.TrustedProxies = trusted
	for _, s := range c.Gateway.Disable {
		gc.Disable = append(gc.Disable, gateway.Source(s))
	}
	if err := gc.Validate(); err != nil {
		return gateway.Config{}, c.gatewayError(err)
	}
	return gc, nil
}

// gatewayError turns an error of gateway.Config.Validate into a
// SettingError that names the setting as the user gave it.
func (c *Config) gatewayError(err error) error {
	var ce *gateway.ConfigError
	if !errors.As(err, &ce) {
		return err
	}
	entry := func(key string, list []string) error {
		if ce.Index < 0 || ce.Index >= len(list) {
			return c.fail(key, strings.Join(list, ","), "%s", ce.Msg)
		}
		return c.fail(key, list[ce.Index], "%s", ce.Msg)
	}
	switch ce.Field {
	case "routes":
		if ce.Index < 0 || ce.Index >= len(c.Routes) {
			break
		}
		msg := ce.Msg
		if ce.Shadowed >= 0 && ce.Shadowed < len(c.Routes) {
			msg = fmt.Sprintf("route %q before it (%s) has the same host and path prefix, so this one can never match", c.Routes[ce.Shadowed], c.routeSource(ce.Shadowed))
		}
		return &SettingError{Source: c.routeSource(ce.Index), Value: c.Routes[ce.Index], Msg: msg}
	case "domain":
		return c.fail("domain", c.Domain, "%s", ce.Msg)
	case "aliases":
		return entry("gateway.aliases", c.Gateway.Aliases)
	case "disable":
		return entry("gateway.disable", c.Gateway.Disable)
	case "lane_cookie":
		return c.fail("gateway.lane_cookie", c.Gateway.LaneCookie, "%s", ce.Msg)
	case "key_header":
		return c.fail("gateway.key_header", c.Gateway.KeyHeader, "%s", ce.Msg)
	case "key_cookie":
		return c.fail("gateway.key_cookie", c.Gateway.KeyCookie, "%s", ce.Msg)
	case "http1":
		return c.fail("gateway.http1", c.Gateway.HTTP1, "%s", ce.Msg)
	}
	return c.fail("gateway."+ce.Field, "", "%s", ce.Msg)
}

// gatewayComponent serves the gateway.
type gatewayComponent struct {
	rt   *Runtime
	gw   *gateway.Gateway
	tls  *tls.Config // nil: plain HTTP
	ln   net.Listener
	done chan struct{}
}

func (*gatewayComponent) Name() string    { return "gateway" }
func (*gatewayComponent) Needs() []Dep    { return []Dep{EngineKey, ClaimsKey, TracesKey} }
func (*gatewayComponent) Provides() []Dep { return []Dep{GatewayKey} }

func (*gatewayComponent) Validate(cfg *Config) error {
	if err := checkListen(cfg.GatewayAddr); err != nil {
		return cfg.fail("gateway_addr", cfg.GatewayAddr, "%v", err)
	}
	_, err := cfg.GatewayConfig()
	return err
}

func (c *gatewayComponent) Provision(ctx context.Context, rt *Runtime) error {
	c.rt = rt
	gc, err := rt.Config.GatewayConfig()
	if err != nil {
		return err
	}
	gc.Engine = Need(rt, EngineKey)
	if t := Need(rt, TracesKey); t.GRPCAddr != "" {
		gc.Tracer = lanestrace.Tracer(t.Provider)
	}
	gc.Claims = Need(rt, ClaimsKey).Lookup
	gc.Logger = rt.Log.With("component", "gateway")
	gc.Registerer = rt.Metrics
	gc.Dial = &addrpolicy.Rules{Reserved: rt.Reserved(), LinkLocal: rt.Config.AllowLinkLocal}
	gw, err := gateway.New(gc)
	if err != nil {
		return err
	}
	c.gw = gw
	if c.tls, err = rt.Config.ServerTLS(tlsGateway); err != nil {
		return err
	}
	if c.ln, err = rt.Listen("gateway", rt.Config.GatewayAddr); err != nil {
		return err
	}
	url := listenerURL(c.ln.Addr(), c.tls)
	Provide(rt, GatewayKey, GatewayInfo{URL: url})
	rt.Announce(Address{Name: "gateway", URL: url, Note: describeRoutes(gc.Routes, rt.Config.Domain)})
	return nil
}

func describeRoutes(routes []adminapi.Route, domain string) string {
	if len(routes) == 0 {
		return "no routes: every request gets 404 (add --route /=SERVICE)"
	}
	var parts []string
	for _, r := range routes {
		s := r.String()
		if r.StripPrefix {
			s += " (prefix stripped)"
		}
		parts = append(parts, s)
	}
	s := "routes " + strings.Join(parts, " ")
	if domain != "" {
		s += "; lane hosts <lane>." + domain
	}
	return s
}

func (c *gatewayComponent) Start(context.Context) error {
	c.done = make(chan struct{})
	ln := c.ln
	c.ln = nil // Serve owns it now
	go func() {
		defer close(c.done)
		serve := c.gw.Serve
		if c.tls != nil {
			serve = func(ln net.Listener) error { return c.gw.ServeTLS(ln, c.tls) }
		}
		if err := serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			c.rt.Fail(fmt.Errorf("gateway: %w", err))
		}
	}()
	return nil
}

func (c *gatewayComponent) Stop(ctx context.Context) error {
	err := c.gw.Shutdown(ctx)
	<-c.done
	return err
}

func (c *gatewayComponent) Cleanup() error {
	if c.ln != nil {
		c.ln.Close()
	}
	if c.gw != nil {
		return c.gw.Close()
	}
	return nil
}
