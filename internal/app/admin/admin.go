// Package admin is the lanes admin API: JSON over HTTP, served by `lanes up`
// on the admin address (docs/api.md).
//
// It lists services, instances and lanes; gets, puts and validates the
// policy; explains a route; sets lane lifetimes; manages registration tokens;
// registers instances (an etcd lease per registration, renewed by heartbeats)
// and client-IP claims for dev sessions. Health is at /healthz and
// Prometheus metrics at /metrics.
//
// Everything the API keeps lives in etcd, next to the registry and the policy
// (docs/etcd.md): the server holds no state of its own, so several control
// planes may serve one etcd prefix.
//
//	<prefix>tokens/<id>  a registration token: its scope and the SHA-256 of its secret
//	<prefix>claims/<ip>  a client-IP claim, attached to the lease of a registration
package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lanesdev/lanes/adminapi"
	"github.com/lanesdev/lanes/etcdstore"
	"github.com/lanesdev/lanes/internal/app/collector"
	"github.com/lanesdev/lanes/internal/lib/addrpolicy"
	"github.com/lanesdev/lanes/internal/lib/bearer"
	"github.com/lanesdev/lanes/internal/lib/tunnel"
	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

// Config configures a Server.
type Config struct {
	// Store is the etcd store of the registry and the policy. Required.
	Store *etcdstore.Store
	// Engine is the control plane's routing engine, following Registry. It
	// gives the policy in force. Required.
	Engine *routing.Engine
	// Registry is what GET /v1/instances/watch streams to the clients that
	// follow the fleet through the API: the registry the Engine follows
	// (default: Store's).
	Registry registry.Registry
	// AdminToken is the admin credential. Required.
	AdminToken string
	// Info is what GET /v1/info answers (the version is filled in).
	Info adminapi.Info
	// Claims, when set, is counted in the metrics.
	Claims *ClaimTable
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Now defaults to time.Now.
	Now func() time.Time
	// Limits bound what each registration token registers, unless the
	// token sets its own (DefaultLimits when zero; a zero field takes the
	// default's). Labels and InstanceBytes bound the admin token's
	// registrations too.
	Limits adminapi.Limits
	// Traces, when set, is the trace collector behind GET /v1/traces and
	// GET /v1/findings.
	Traces *collector.Collector
	// Gatherer, when set, is served at /metrics together with the API's own
	// metrics (for example prometheus.DefaultGatherer, which holds the
	// embedded etcd's).
	Gatherer prometheus.Gatherer
	// ClaimNets are the client addresses that a registration token may
	// claim for its lane (DefaultClaimNets when nil); the admin token
	// claims any. A claim moves every client behind the address into the
	// lane: behind a NAT, all of them.
	ClaimNets []netip.Prefix
	// Reserved are the control plane's own listeners: no instance address
	// may reach one, whoever registers it (addrpolicy).
	Reserved *addrpolicy.Reserved
	// XDS, when set, counts the clients of the xDS server that call a
	// service (route explain shows them): the xDS server of lanes up.
	XDS XDSCallers
	// AllowLinkLocal lets the admin token, and the tokens whose addresses
	// allow it, register link-local and cloud metadata addresses; without
	// it nobody may.
	AllowLinkLocal bool
	// TunnelHost is the host that the relays of `lanes dev`'s tunnels
	// listen on, where the environment's instances and the gateway reach
	// them; "" is the address the machine reached the admin API at.
	TunnelHost string
	// TunnelNATS, when set, is the NATS server (host:port) that tunnels
	// forward to.
	TunnelNATS string
	// MaxTunnels bounds the tunnels open at once per token
	// (DefaultMaxTunnels when 0).
	MaxTunnels int
	// ForkNamespaces are the Kubernetes namespaces where forks may be
	// made, the first for a fork that names none; none refuses forks (the
	// control plane runs no Kubernetes controller).
	ForkNamespaces []string
	// ForkLimits bound the forks of each lane (DefaultForkLimits for a
	// zero field).
	ForkLimits ForkLimits
	// ForkImages, when set, are the prefixes that the image of a lane
	// token's fork must start with (such as "registry.example.com/team/");
	// the admin token's forks may name any.
	ForkImages []string
}

// XDSCallers counts the xDS server's clients that call a service now, by
// variant (xds.Server).
type XDSCallers interface {
	Callers(service string) (grpc, envoy int)
}

// DefaultClaimNets are the addresses a registration token may claim when
// the operator names none: loopback, the clients on the control plane's
// own machine.
var DefaultClaimNets = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}

// DefaultLimits are the limits of a registration token that sets none.
var DefaultLimits = adminapi.Limits{Instances: 100, Labels: 64, InstanceBytes: 16 << 10}

// Version is reported by GET /v1/info.
var Version = "dev"

// Server is the admin API, an http.Handler.
type Server struct {
	cfg     Config
	store   *etcdstore.Store
	regs    *etcdstore.Registrations
	cli     *clientv3.Client
	prefix  string
	engine  *routing.Engine
	fleet   registry.Registry // what the instance watch streams
	tokens  *Tokens
	forks   *ForkStore
	log     *slog.Logger
	now     func() time.Time
	mux     *http.ServeMux
	metrics *metrics
	handler http.Handler

	// streams is cancelled by Close: watch streams end with it.
	streams      context.Context
	cancelStream context.CancelFunc
	mu           sync.Mutex
	closed       bool
	wg           sync.WaitGroup // watch streams and tunnels
	tunnels      tunnels        // under mu
}

// New returns the admin API.
func New(cfg Config) (*Server, error) {
	if cfg.Store == nil || cfg.Engine == nil {
		return nil, errors.New("admin: Config.Store and Config.Engine are required")
	}
	if len(cfg.AdminToken) < 16 {
		return nil, errors.New("admin: the admin token must be at least 16 characters")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.ClaimNets == nil {
		cfg.ClaimNets = DefaultClaimNets
	}
	cfg.Info.Version = Version
	if cfg.MaxTunnels <= 0 {
		cfg.MaxTunnels = DefaultMaxTunnels
	}
	if cfg.ForkLimits.PerLane <= 0 {
		cfg.ForkLimits.PerLane = DefaultForkLimits.PerLane
	}
	if cfg.ForkLimits.Replicas <= 0 {
		cfg.ForkLimits.Replicas = DefaultForkLimits.Replicas
	}
	if cfg.Registry == nil {
		cfg.Registry = cfg.Store
	}
	if cfg.Limits.Instances <= 0 {
		cfg.Limits.Instances = DefaultLimits.Instances
	}
	if cfg.Limits.Labels <= 0 {
		cfg.Limits.Labels = DefaultLimits.Labels
	}
	if cfg.Limits.InstanceBytes <= 0 {
		cfg.Limits.InstanceBytes = DefaultLimits.InstanceBytes
	}
	s := &Server{
		cfg:    cfg,
		store:  cfg.Store,
		regs:   cfg.Store.Registrations(),
		cli:    cfg.Store.Client(),
		prefix: cfg.Store.Prefix(),
		engine: cfg.Engine,
		fleet:  cfg.Registry,
		tokens: NewTokens(cfg.Store, cfg.AdminToken, cfg.Logger),
		forks:  NewForkStore(cfg.Store),
		log:    cfg.Logger.With("component", "admin"),
		now:    cfg.Now,
		mux:    http.NewServeMux(),
	}
	s.streams, s.cancelStream = context.WithCancel(context.Background())
	s.metrics = newMetrics(cfg.Claims)
	s.routes()
	s.handler = s.metrics.instrument(s.mux)
	return s, nil
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.handler.ServeHTTP(w, r) }

// Close ends the watch streams in progress (so that an http.Server's
// Shutdown does not wait for them) and waits for their handlers.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.cancelStream()
	s.wg.Wait()
	return nil
}

// beginStream registers a watch stream that Close waits for; false once
// closed.
func (s *Server) beginStream() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.wg.Add(1)
	return true
}

// access says who may call an endpoint.
type access int

const (
	public  access = iota // no token
	anyone                // any valid token
	adminOn               // the admin token
)

type handlerFunc func(w http.ResponseWriter, r *http.Request, p *principal) error

func (s *Server) routes() {
	h := func(pattern string, a access, f handlerFunc) {
		s.mux.Handle(pattern, s.metrics.label(pattern, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			var p *principal
			if a != public {
				var err error
				if p, err = s.authenticate(r); err != nil {
					s.writeError(w, r, err)
					return
				}
				if a == adminOn && !p.admin {
					s.writeError(w, r, forbidden("", "", "this endpoint needs the admin token"))
					return
				}
			}
			if err := f(w, r, p); err != nil {
				s.writeError(w, r, err)
			}
		})))
	}
	h("GET /healthz", public, s.health)
	s.mux.Handle("GET /metrics", promhttp.HandlerFor(s.metrics.gatherer(s.cfg.Gatherer), promhttp.HandlerOpts{}))
	h("GET /v1/info", anyone, s.info)
	h("GET /v1/services", anyone, s.listServices)
	h("GET /v1/instances", anyone, s.listInstances)
	h("POST /v1/instances", anyone, s.register)
	h("POST /v1/instances/{service}/{id}/heartbeat", anyone, s.heartbeat)
	h("DELETE /v1/instances/{service}/{id}", anyone, s.deregister)
	h("GET /v1/watch/instances", anyone, s.watchInstances)
	h("GET /v1/lanes", anyone, s.listLanes)
	h("GET /v1/traces", anyone, s.listTraces)
	h("GET /v1/traces/{id}", anyone, s.getTrace)
	h("GET /v1/findings", anyone, s.listFindings)
	h("GET /v1/graph", anyone, s.getGraph)
	h("GET /v1/lanes/{lane}", anyone, s.getLane)
	h("PUT /v1/lanes/{lane}", adminOn, s.putLane)
	h("GET /v1/policy", anyone, s.getPolicy)
	h("PUT /v1/policy", adminOn, s.putPolicy)
	h("POST /v1/policy/validate", anyone, s.validatePolicy)
	h("GET /v1/policy/history", anyone, s.policyHistory)
	h("GET /v1/watch/policy", anyone, s.watchPolicy)
	h("GET /v1/explain", anyone, s.explain)
	h("GET /v1/forks", anyone, s.listForks)
	h("POST /v1/forks", anyone, s.createFork)
	h("DELETE /v1/forks/{lane}/{namespace}/{deployment}", anyone, s.deleteFork)
	h("GET /v1/tokens", adminOn, s.listTokens)
	h("POST /v1/tokens", adminOn, s.createToken)
	h("DELETE /v1/tokens/{id}", adminOn, s.revokeToken)
	// A tunnel's answer is an upgrade, which the metrics' writer would hide.
	s.mux.Handle("GET "+tunnel.Path, http.HandlerFunc(s.openTunnel))
	h("GET /v1/claims", anyone, s.listClaims)
	h("POST /v1/claims", anyone, s.createClaim)
	h("DELETE /v1/claims/{ip}", anyone, s.deleteClaim)
	h("/", public, func(w http.ResponseWriter, r *http.Request, _ *principal) error {
		return &apiError{status: http.StatusNotFound, body: adminapi.Error{Code: adminapi.CodeNotFound,
			Message: fmt.Sprintf("no endpoint %s %s; see docs/api.md", r.Method, r.URL.Path)}}
	})
}

// principal is who called: the admin, or the holder of a registration token.
type principal struct {
	admin bool
	token adminapi.Token // when not admin
}

// allows reports whether p may act on lane l ("" for the baseline).
func (p *principal) allows(l string) bool {
	if p.admin {
		return true
	}
	if l == "" {
		return p.token.Baseline
	}
	return !p.token.Baseline && p.token.Lane == l
}

// scope is the registry.Instance.Scope of the instances p registers.
func (p *principal) scope() string {
	switch {
	case p.admin:
		return ""
	case p.token.Baseline:
		return registry.ScopeBaseline
	}
	return p.token.Lane
}

// owner names p as the owner of the registrations it makes.
func (p *principal) owner() string {
	if p.admin {
		return "admin"
	}
	return p.token.ID
}

func (p *principal) String() string {
	if p.admin {
		return "the admin token"
	}
	if p.token.Baseline {
		return fmt.Sprintf("token %s (scope: baseline)", p.token.ID)
	}
	return fmt.Sprintf("token %s (scope: lane %s)", p.token.ID, p.token.Lane)
}

// authenticate reads the bearer token of r.
func (s *Server) authenticate(r *http.Request) (*principal, error) {
	tok, ok := bearer.Token(r.Header.Get("Authorization"))
	if !ok {
		return nil, unauthorized("this endpoint needs a token: send \"Authorization: Bearer <token>\"")
	}
	admin, t, err := s.tokens.Check(r.Context(), tok)
	if err != nil {
		return nil, err
	}
	return &principal{admin: admin, token: t}, nil
}

// apiError is an error answer.
type apiError struct {
	status int
	body   adminapi.Error
}

func (e *apiError) Error() string { return e.body.Error() }

func errorf(status int, code, field, value, format string, args ...any) *apiError {
	return &apiError{status: status, body: adminapi.Error{Code: code, Field: field, Value: value, Message: fmt.Sprintf(format, args...)}}
}

func badRequest(field, value, format string, args ...any) *apiError {
	return errorf(http.StatusBadRequest, adminapi.CodeBadRequest, field, value, format, args...)
}

func forbidden(field, value, format string, args ...any) *apiError {
	return errorf(http.StatusForbidden, adminapi.CodeForbidden, field, value, format, args...)
}

func unauthorized(msg string) *apiError {
	return errorf(http.StatusUnauthorized, adminapi.CodeUnauthorized, "", "", "%s", msg)
}

func notFound(field, value, format string, args ...any) *apiError {
	return errorf(http.StatusNotFound, adminapi.CodeNotFound, field, value, format, args...)
}

func conflict(field, value, format string, args ...any) *apiError {
	return errorf(http.StatusConflict, adminapi.CodeConflict, field, value, format, args...)
}

// etcdError is the answer for a failed etcd call.
func etcdError(what string, err error) error {
	if errors.Is(err, context.Canceled) {
		return err
	}
	return errorf(http.StatusServiceUnavailable, adminapi.CodeUnavailable, "", "", "%s: %v", what, err)
}

func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	var ae *apiError
	if !errors.As(err, &ae) {
		if errors.Is(err, context.Canceled) && r.Context().Err() != nil {
			return // the client went away
		}
		s.log.Error("admin request failed", "method", r.Method, "path", r.URL.Path, "err", err)
		ae = errorf(http.StatusInternalServerError, adminapi.CodeInternal, "", "", "%v", err)
	}
	if ae.status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="lanes"`)
	}
	writeJSON(w, ae.status, adminapi.ErrorBody{Error: &ae.body})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}

// maxBody bounds JSON request bodies.
const maxBody = 1 << 20

// decode reads a strict JSON body into v; a bad field is a 400 naming it.
func decode(r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, maxBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var te *json.UnmarshalTypeError
		var se *json.SyntaxError
		switch {
		case errors.Is(err, io.EOF):
			return badRequest("", "", "the request needs a JSON body")
		case errors.As(err, &te):
			return badRequest(te.Field, te.Value, "field %s: want %s, got %s", te.Field, te.Type, te.Value)
		case errors.As(err, &se):
			return badRequest("", "", "malformed JSON at byte %d: %v", se.Offset, err)
		case strings.HasPrefix(err.Error(), "json: unknown field "):
			f, _ := strconv.Unquote(strings.TrimPrefix(err.Error(), "json: unknown field "))
			return badRequest(f, "", "unknown field %q", f)
		default:
			return badRequest("", "", "malformed JSON body: %v", err)
		}
	}
	if dec.More() {
		return badRequest("", "", "more than one JSON value in the body")
	}
	return nil
}

// remoteIP is the address the request comes from (the TCP peer; the admin
// API does not trust forwarding headers).
func remoteIP(r *http.Request) netip.Addr {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	a, _ := netip.ParseAddr(host)
	return a.Unmap()
}

// healthBody is the answer of /healthz.
type healthBody struct {
	Status string `json:"status"` // ok, degraded, no_quorum, unavailable
	Etcd   string `json:"etcd"`
	// Members are the etcd members as the store's checks see them.
	Members []healthMember `json:"members,omitempty"`
}

type healthMember struct {
	Endpoint string `json:"endpoint"`
	State    string `json:"state"` // up, no_leader, down, unknown
	Error    string `json:"error,omitempty"`
	Avoided  bool   `json:"avoided,omitempty"`
}

// health answers 200 while etcd has a quorum ("degraded" when a member does
// not answer), 503 without one (the gateway routes from the last state it
// saw; registrations are refused) or when etcd cannot be read.
func (s *Server) health(w http.ResponseWriter, r *http.Request, _ *principal) error {
	body := healthBody{Status: "ok", Etcd: "ok"}
	h, checked := s.store.Health()
	if checked {
		for _, m := range h.Members {
			body.Members = append(body.Members, healthMember{Endpoint: m.Endpoint, State: m.State, Error: m.Err, Avoided: m.Avoided})
		}
		switch h.State {
		case etcdstore.HealthNoQuorum:
			body.Status = "no_quorum"
			body.Etcd = "no quorum since " + h.Since.UTC().Format(time.RFC3339) + ": the gateway routes from the last state it saw; registrations and changes are refused until a majority of etcd members is back"
			writeJSON(w, http.StatusServiceUnavailable, body)
			return nil
		case etcdstore.HealthDegraded:
			body.Status = "degraded"
			body.Etcd = "degraded since " + h.Since.UTC().Format(time.RFC3339) + ": some etcd members do not answer (see members); the others serve"
		}
	}
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	if _, err := s.cli.Get(ctx, s.store.PolicyKey(), clientv3.WithCountOnly()); err != nil {
		body.Status, body.Etcd = "unavailable", err.Error()
		writeJSON(w, http.StatusServiceUnavailable, body)
		return nil
	}
	writeJSON(w, http.StatusOK, body)
	return nil
}

func (s *Server) info(w http.ResponseWriter, r *http.Request, _ *principal) error {
	writeJSON(w, http.StatusOK, s.cfg.Info)
	return nil
}

// keepAliveEvery is how often an idle watch stream sends a keep-alive line.
// It is atomic so that tests can change it while streams of other servers run.
var keepAliveEvery atomic.Int64

func init() { keepAliveEvery.Store(int64(adminapi.WatchKeepAlive)) }

// watcher is what a watch stream serves: a registry.Watcher or a
// policy.Watcher.
type watcher[T any] interface {
	Next(ctx context.Context) (T, error)
	Close() error
}

// serveStream serves a watch as newline-delimited JSON: encode(v) for every
// value of the watcher that open starts, and keepAlive() after
// keepAliveEvery of silence, so that proxies keep the connection open. It
// ends when the client leaves, the watch ends, or the server closes; the
// client then watches again.
func serveStream[T any](s *Server, w http.ResponseWriter, r *http.Request, what string, open func(context.Context) (watcher[T], error), encode func(T) any, keepAlive func() any) error {
	if !s.beginStream() {
		return errorf(http.StatusServiceUnavailable, adminapi.CodeUnavailable, "", "", "the control plane is shutting down")
	}
	defer s.wg.Done()
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	stop := context.AfterFunc(s.streams, cancel)
	defer stop()
	wt, err := open(ctx)
	if err != nil {
		return etcdError(what, err)
	}
	defer wt.Close()
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	enc := json.NewEncoder(w)
	for {
		nctx, ncancel := context.WithTimeout(ctx, time.Duration(keepAliveEvery.Load()))
		v, err := wt.Next(nctx)
		ncancel()
		var out any
		switch {
		case err == nil:
			out = encode(v)
		case errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil:
			out = keepAlive()
		default:
			return nil
		}
		if err := enc.Encode(out); err != nil {
			return nil
		}
		if err := rc.Flush(); err != nil {
			return nil
		}
	}
}
