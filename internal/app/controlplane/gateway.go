package controlplane

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lanesdev/lanes/adminapi"
	"github.com/lanesdev/lanes/routing"
)

// Edge is the gateway as the control plane runs it.
type Edge interface {
	// Serve serves on ln (HTTP/1.1 and h2c) until Shutdown or Close.
	Serve(ln net.Listener) error
	// Shutdown stops gracefully within ctx.
	Shutdown(ctx context.Context) error
	// Close stops at once.
	Close() error
}

// EdgeConfig is what the control plane gives its gateway.
type EdgeConfig struct {
	Engine         *routing.Engine
	Routes         []adminapi.Route
	Domain         string
	TrustedProxies []netip.Prefix
	// Claims returns the lane a client address is claimed for by a dev
	// session.
	Claims     func(netip.Addr) (string, bool)
	Zone       string
	Logger     *slog.Logger
	Registerer prometheus.Registerer
}

// EdgeFactory builds the gateway.
type EdgeFactory func(EdgeConfig) (Edge, error)

// gatewayComponent serves the gateway.
type gatewayComponent struct {
	factory EdgeFactory
	rt      *Runtime
	edge    Edge
	ln      net.Listener
	done    chan struct{}
}

func (*gatewayComponent) Name() string { return "gateway" }

func (c *gatewayComponent) Provision(ctx context.Context, rt *Runtime) error {
	c.rt = rt
	routes, err := rt.Config.ParsedRoutes()
	if err != nil {
		return err
	}
	trusted, err := rt.Config.ParsedTrustedProxies()
	if err != nil {
		return err
	}
	ln, err := listen("gateway", rt.Config.GatewayAddr)
	if err != nil {
		return err
	}
	cfg := EdgeConfig{
		Engine: rt.Engine, Routes: routes, Domain: rt.Config.Domain, TrustedProxies: trusted,
		Claims: rt.Claims.Lookup, Zone: rt.Config.Zone, Logger: rt.Log.With("component", "gateway"), Registerer: rt.Metrics,
	}
	if len(routes) == 0 {
		c.edge = noRoutes()
	} else if c.edge, err = c.factory(cfg); err != nil {
		ln.Close()
		return err
	}
	c.ln = ln
	rt.GatewayURL = httpURL(ln.Addr())
	rt.Addresses = append(rt.Addresses, Address{Name: "gateway", URL: rt.GatewayURL, Note: describeRoutes(routes, rt.Config.Domain)})
	return nil
}

func describeRoutes(routes []adminapi.Route, domain string) string {
	if len(routes) == 0 {
		return "no routes: every request gets 404 (add --route /=SERVICE)"
	}
	var parts []string
	for _, r := range routes {
		parts = append(parts, r.String())
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
		if err := c.edge.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			c.rt.Fail(fmt.Errorf("gateway: %w", err))
		}
	}()
	return nil
}

func (c *gatewayComponent) Stop(ctx context.Context) error {
	err := c.edge.Shutdown(ctx)
	<-c.done
	return err
}

func (c *gatewayComponent) Cleanup() error {
	if c.ln != nil {
		c.ln.Close()
	}
	if c.edge != nil {
		return c.edge.Close()
	}
	return nil
}

// httpEdge serves a handler as an Edge.
type httpEdge struct {
	srv *http.Server
}

func newHTTPEdge(h http.Handler) *httpEdge {
	var p http.Protocols
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	return &httpEdge{srv: &http.Server{Handler: h, Protocols: &p, ReadHeaderTimeout: 10 * time.Second}}
}

func (e *httpEdge) Serve(ln net.Listener) error        { return e.srv.Serve(ln) }
func (e *httpEdge) Shutdown(ctx context.Context) error { return e.srv.Shutdown(ctx) }
func (e *httpEdge) Close() error                       { return e.srv.Close() }

// noRoutes is the gateway of a control plane started without routes.
func noRoutes() Edge {
	return newHTTPEdge(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprintln(w, `{"error":{"code":"no_route","message":"the gateway has no routes: start lanes up with --route /=SERVICE (or routes in the config file)"}}`)
	}))
}
