// Package sidecar is `lanes sidecar`: one process beside a service written in
// any language, which joins the service to lanes without the SDK.
//
//   - It registers the app's instance in its lane once the app answers (a
//     TCP connection, or a 2xx/3xx from --ready-path), keeps the lease,
//     deregisters it when the app stops answering (and again registers it
//     once it answers), and on exit deregisters it at once, then drains:
//     the lifecycle of the transports' Serve helpers (internal/lib/serving).
//   - Inbound, on the advertised port, it serves the app's traffic through
//     laneshttp's server middleware (the guard with its exempt paths, the
//     server span) and an httputil.ReverseProxy to the app, which receives
//     the request's lane headers and the traceparent of the sidecar's
//     server span, to forward.
//   - Outbound, on a loopback proxy, it routes the app's HTTP calls
//     (absolute-form, as HTTP_PROXY sends them, or with the service as the
//     Host) through laneshttp.Transport behind an httputil.ReverseProxy: the
//     routed-call step of internal/lib/routedcall, its client span and
//     metrics, by the lane the request carries.
//
// With Direct, it registers the app's own address and takes no traffic.
package sidecar

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/lanesdev/lanes/internal/app/gateway"
	"github.com/lanesdev/lanes/internal/lib/accept"
	"github.com/lanesdev/lanes/internal/lib/backoff"
	"github.com/lanesdev/lanes/internal/lib/guard"
	"github.com/lanesdev/lanes/internal/lib/serving"
	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

// Sidecar is a sidecar whose listeners are open (Listen); Run runs it.
type Sidecar struct {
	cfg    Config
	log    *slog.Logger
	out    io.Writer
	reg    registry.Registry
	engine *routing.Engine

	inLn, proxyLn net.Listener // inLn nil with Direct
	inSrv         *http.Server
	proxySrv      *http.Server
	guard         *guard.Guard
	ready         readiness

	mu   sync.Mutex
	addr string // the address registered, once it is
}

// Listen validates cfg and opens the sidecar's listeners (the inbound one,
// unless cfg.Direct, and the outbound proxy). The instance registers in
// reg and the outbound calls route on engine; both must follow the same
// registry (lanesenv.Open makes them so). Nothing is served until Run.
func Listen(cfg Config, reg registry.Registry, engine *routing.Engine) (*Sidecar, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if reg == nil || engine == nil {
		return nil, errors.New("sidecar: a registry and an engine are required")
	}
	s := &Sidecar{cfg: cfg, log: cfg.Logger, out: cfg.Out, reg: reg, engine: engine}
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.out == nil {
		s.out = io.Discard
	}
	if s.cfg.Getenv == nil {
		s.cfg.Getenv = os.Getenv
	}
	if s.cfg.Proxy == "" {
		s.cfg.Proxy = DefaultProxy
	}
	if s.cfg.MaxConns == 0 {
		s.cfg.MaxConns = gateway.DefaultMaxConns()
	}
	switch {
	case s.cfg.Drain == 0:
		s.cfg.Drain = DefaultDrain
	case s.cfg.Drain < 0:
		s.cfg.Drain = 0
	}
	if s.cfg.ReadyInterval == 0 {
		s.cfg.ReadyInterval = DefaultReadyInterval
	}
	s.ready = newReadiness(s.cfg.App, s.cfg.ReadyPath)
	s.guard = guard.New(engine)

	var err error
	if !cfg.Direct {
		if s.inLn, err = net.Listen("tcp", cfg.Listen); err != nil {
			return nil, fmt.Errorf("--listen %q: %w", cfg.Listen, err)
		}
	}
	if s.proxyLn, err = net.Listen("tcp", s.cfg.Proxy); err != nil {
		if s.inLn != nil {
			s.inLn.Close()
		}
		return nil, fmt.Errorf("--proxy %q: %w", cfg.Proxy, err)
	}
	if !cfg.Direct {
		s.inSrv = s.server(s.inbound())
	}
	s.proxySrv = s.server(s.outbound())
	return s, nil
}

// InboundAddr is the inbound listener's address; nil with Direct.
func (s *Sidecar) InboundAddr() net.Addr {
	if s.inLn == nil {
		return nil
	}
	return s.inLn.Addr()
}

// ProxyAddr is the outbound proxy's address.
func (s *Sidecar) ProxyAddr() net.Addr { return s.proxyLn.Addr() }

// Registered returns the address the instance is registered at, "" while
// it is not.
func (s *Sidecar) Registered() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addr
}

// server returns an HTTP server with the gateway's bounds on a client's
// request head and idle connection.
func (s *Sidecar) server(h http.Handler) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: gateway.DefaultClientHeaderTimeout,
		IdleTimeout:       gateway.DefaultClientIdleTimeout,
		MaxHeaderBytes:    gateway.MaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
}

// accepting wraps ln in the accept loop of lanes' listeners: accept errors
// waited out, connections capped (a 503 over the cap).
func (s *Sidecar) accepting(name string, ln net.Listener) net.Listener {
	answer := accept.Answer("", fmt.Sprintf("lanes sidecar: the %s listener is at its limit of %d open connections (--max-conns); try again\n", name, s.cfg.MaxConns))
	return accept.Wrap(ln, accept.Options{Name: "sidecar " + name, MaxConns: s.cfg.MaxConns, Logger: s.log,
		Shed: func(c net.Conn) { c.Write(answer) }})
}

// Run prints the start-up lines, serves, and keeps the instance registered
// while the app answers, until ctx is done. Then it deregisters the
// instance, serves on for the drain, and shuts the listeners down. It
// returns nil after a clean stop.
func (s *Sidecar) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	served := make(chan error, 2)
	serve := func(srv *http.Server, ln net.Listener) {
		wg.Add(1)
		go func() { // owned by Run: it waits for it
			defer wg.Done()
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				served <- err
			}
		}()
	}
	if s.cfg.Direct {
		fmt.Fprintf(s.out, "sidecar: direct, app %s\n", s.cfg.App)
	} else {
		fmt.Fprintf(s.out, "sidecar: inbound %s -> app %s\n", s.inLn.Addr(), s.cfg.App)
		serve(s.inSrv, s.accepting("inbound", s.inLn))
	}
	proxy := s.proxyLn.Addr().String()
	fmt.Fprintf(s.out, "sidecar: outbound proxy %s (HTTP_PROXY=http://%s)\n", proxy, proxy)
	serve(s.proxySrv, s.accepting("outbound", s.proxyLn))

	rctx, cancel := context.WithCancel(ctx)
	wg.Add(1)
	go func() { // owned by Run, which waits for it: a listener that fails stops the sidecar
		defer wg.Done()
		select {
		case err := <-served:
			s.log.Error("lanes sidecar: a listener failed; stopping", "err", err)
			served <- err
			cancel()
		case <-rctx.Done():
		}
	}()
	s.keepRegistered(rctx)
	cancel()

	// Deregistered and drained: the inbound listener stops first, then the
	// proxy, which the app's requests in flight still use.
	var errs []error
	for _, srv := range []*http.Server{s.inSrv, s.proxySrv} {
		if srv == nil {
			continue
		}
		sctx, stop := context.WithTimeout(context.WithoutCancel(ctx), DefaultShutdownTimeout)
		if err := srv.Shutdown(sctx); err != nil {
			srv.Close()
			errs = append(errs, fmt.Errorf("sidecar: shutdown: %w", err))
		}
		stop()
	}
	wg.Wait()
	select {
	case err := <-served:
		errs = append(errs, err)
	default:
	}
	return errors.Join(errs...)
}

// keepRegistered registers the instance whenever the app answers, and
// deregisters it when the app stops answering, until ctx is done.
func (s *Sidecar) keepRegistered(ctx context.Context) {
	b := backoff.New(100*time.Millisecond, 5*time.Second)
	for ctx.Err() == nil {
		if !s.waitReady(ctx) {
			return
		}
		err := s.registered(ctx)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			s.log.Warn("lanes sidecar: registration ended; registering again", "err", err)
			if !b.Wait(ctx) {
				return
			}
			continue
		}
		b.Reset()
	}
}

// waitReady waits until the app answers; false when ctx is done first.
func (s *Sidecar) waitReady(ctx context.Context) bool {
	t := time.NewTicker(s.cfg.ReadyInterval)
	defer t.Stop()
	logged := false
	for {
		err := s.ready.check(ctx)
		if err == nil {
			return true
		}
		if !logged && ctx.Err() == nil {
			s.log.Info("lanes sidecar: waiting for the app to answer before registering", "app", s.cfg.App, "err", err)
			logged = true
		}
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
	}
}

// registered keeps the instance registered (serving.Run) until ctx is done
// or the app stops answering, and returns the error of a registration that
// failed or was lost.
func (s *Sidecar) registered(ctx context.Context) error {
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Add(1)
	go func() { // owned by registered: it waits for it
		defer wg.Done()
		s.watchReady(rctx, cancel)
	}()
	inst := registry.Instance{Service: s.cfg.Service, Lane: s.cfg.Lane, Addr: s.cfg.Advertise, Version: "lanes-sidecar"}
	lis := held{addr: s.advertised()}
	if s.cfg.Direct && inst.Addr == "" {
		inst.Addr = s.cfg.App
	}
	srv := &holding{stop: make(chan struct{})}
	defer s.setRegistered("")
	return serving.Run(rctx, announcing{Registry: s.reg, s: s}, inst, lis, srv, serving.Options{
		Name: "lanes sidecar", Stop: srv.Stop, Closed: http.ErrServerClosed,
		Lane: s.cfg.Lane, Getenv: s.getenv, TTL: s.cfg.TTL, Drain: s.cfg.Drain, Logger: s.log, Guard: s.guard,
	})
}

// watchReady cancels the registration when the app fails
// DefaultReadyFailures checks in a row.
func (s *Sidecar) watchReady(ctx context.Context, deregister context.CancelFunc) {
	t := time.NewTicker(s.cfg.ReadyInterval)
	defer t.Stop()
	failed := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		err := s.ready.check(ctx)
		if err == nil {
			failed = 0
			continue
		}
		if ctx.Err() != nil {
			return
		}
		if failed++; failed >= DefaultReadyFailures {
			s.log.Warn("lanes sidecar: the app stopped answering; deregistering", "app", s.cfg.App, "err", err, "checks_failed", failed)
			fmt.Fprintf(s.out, "sidecar: app %s stopped answering; deregistered %s\n", s.cfg.App, s.cfg.Service)
			deregister()
			return
		}
	}
}

// advertised is the address the instance's placement starts from: the
// inbound listener's (serving.Run replaces an unspecified IP), or with
// Direct the app's.
func (s *Sidecar) advertised() net.Addr {
	if s.inLn != nil {
		return s.inLn.Addr()
	}
	a, err := net.ResolveTCPAddr("tcp", s.cfg.App)
	if err != nil {
		return &net.TCPAddr{}
	}
	return a
}

// getenv reads the instance's LANES_* variables, but not LANES_LANE: the
// lane is --lane's, the baseline when it is empty.
func (s *Sidecar) getenv(k string) string {
	if k == registry.EnvLane {
		return ""
	}
	return s.cfg.Getenv(k)
}

func (s *Sidecar) setRegistered(addr string) {
	s.mu.Lock()
	s.addr = addr
	s.mu.Unlock()
}

// announcing is the sidecar's registry: it prints the registered line once
// a registration is in force. It reaches the store as the registry does
// (registry.Reacher), for the placement of an instance on an unspecified IP.
type announcing struct {
	registry.Registry
	s *Sidecar
}

func (a announcing) Register(ctx context.Context, inst registry.Instance, ttl time.Duration) (registry.Lease, error) {
	l, err := a.Registry.Register(ctx, inst, ttl)
	if err != nil {
		return l, err
	}
	in := l.Instance()
	a.s.setRegistered(in.Addr)
	where := "lane " + in.Lane
	if in.Lane == "" {
		where = "baseline"
	}
	fmt.Fprintf(a.s.out, "sidecar: registered %s %s at %s\n", in.Service, where, in.Addr)
	return l, nil
}

func (a announcing) LocalIP() net.IP {
	if r, ok := a.Registry.(registry.Reacher); ok {
		return r.LocalIP()
	}
	return nil
}

// held is the listener that serving.Run places the instance by: the
// sidecar's inbound listener (or the app's address), which the sidecar
// serves on its own for its whole run, across registrations.
type held struct{ addr net.Addr }

func (held) Accept() (net.Conn, error) { return nil, net.ErrClosed }
func (held) Close() error              { return nil }
func (h held) Addr() net.Addr          { return h.addr }

// holding stands for the server in serving.Run: the sidecar's servers
// outlive each registration, so serving a registration is holding it until
// it ends.
type holding struct {
	stop chan struct{}
	once sync.Once
}

func (h *holding) Serve(net.Listener) error {
	<-h.stop
	return http.ErrServerClosed
}

func (h *holding) Stop() error {
	h.once.Do(func() { close(h.stop) })
	return nil
}

// trimPort is host without a :port.
func trimPort(host string) string {
	if h, _, err := net.SplitHostPort(host); err == nil {
		return h
	}
	return strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
}
