// Package lanesenv connects a service to lanes from its environment, in one
// call:
//
//	env, err := lanesenv.Open(ctx) // reads LANES_REGISTRY and friends
//	if err != nil {
//		log.Fatal(err) // names the variable that is missing or wrong
//	}
//	defer env.Close()
//	// env.Engine routes calls; env.Registry registers the service's instances.
//
// LANES_REGISTRY says where the registry and the policy live, in one of two
// forms:
//
//   - etcd://host:port[,host:port...]: the etcd cluster of the control plane
//     (`lanes up` prints the line to export). LANES_ETCD_CA, LANES_ETCD_CERT
//     and LANES_ETCD_KEY (PEM files) turn on TLS; LANES_ETCD_USERNAME and
//     LANES_ETCD_PASSWORD (or LANES_ETCD_PASSWORD_FILE, a file that holds
//     it, as `lanes up` prints for its embedded etcd) authenticate;
//     LANES_ETCD_PREFIX is the key prefix of the installation (default
//     /lanes/).
//   - http://admin-address or https://admin-address: the admin API of
//     `lanes up`, with a registration token in LANES_TOKEN (`lanes token
//     create --lane L`). The process needs no etcd address or credentials,
//     and registers only where its token allows. LANES_CA_FILE (a PEM file)
//     verifies an https:// admin API, and an https:// LANES_TRACES, instead
//     of the system's roots.
//   - k8s://[?namespace=a,b&...]: the cluster's own registry (package
//     kubestore: instances are the ready endpoints of EndpointSlices, the
//     lane the pod's label lanes.dev/lane). The backend links client-go
//     in, so it is opt-in: the program adds
//     import _ "github.com/lanesdev/lanes/kubestore", else Open says so.
//     In a pod (KUBERNETES_SERVICE_HOST set) with no LANES_REGISTRY, a
//     program that imports it follows its cluster, and the Serve helpers
//     register nothing: the pod's endpoints are the registration. Without
//     the import such a process must be given LANES_REGISTRY.
//
// Either way the engine follows the policy in force (fallback chains, strict
// lanes, tag rules, canaries), so a process behind a token routes like any
// other. LANES_LOG_FORMAT (text or json) and LANES_LOG_LEVEL (debug, info,
// warn or error) set Env.Logger, which writes the control plane's format.
//
// LANES_NATS (the NATS server of lanes up, which it prints with
// LANES_REGISTRY) connects the service to NATS JetStream: Env.NATS makes
// lanesnats publishers and consumers. LANES_KAFKA (host:port[,host:port...]
// of Kafka brokers) and LANES_AMQP (amqp://user:password@host:port/vhost of
// a RabbitMQ broker) do the same for laneskafka (Env.Kafka) and lanesamqp
// (Env.AMQP).
//
// LANES_TRACES (the trace collector's address, which lanes up prints with
// LANES_REGISTRY) turns on tracing: Open sets up OpenTelemetry (Env.Tracing,
// lanestrace.FromEnv), and the transports then trace every call with its
// routing decision; log records written with a request's context carry its
// lane and trace id. OTEL_SERVICE_NAME, where set, names the service in
// traces; else the service and lane of the first instance the Serve helpers
// register (until then LANES_SERVICE, else the program's name).
//
// The instance itself is placed by the transports' Serve helpers from
// LANES_LANE, LANES_ZONE, LANES_ADDR and the other variables of
// registry.ApplyEnv.
package lanesenv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/lanesdev/lanes/adminapi"
	"github.com/lanesdev/lanes/adminclient"
	"github.com/lanesdev/lanes/etcdstore"
	"github.com/lanesdev/lanes/internal/lib/guard"
	"github.com/lanesdev/lanes/internal/lib/logs"
	"github.com/lanesdev/lanes/internal/lib/regopen"
	"github.com/lanesdev/lanes/internal/lib/tlsfiles"
	"github.com/lanesdev/lanes/lanesamqp"
	"github.com/lanesdev/lanes/laneskafka"
	"github.com/lanesdev/lanes/lanesnats"
	"github.com/lanesdev/lanes/lanestrace"
	"github.com/lanesdev/lanes/policy"
	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

// The environment variables that Open reads.
const (
	EnvRegistry     = "LANES_REGISTRY"      // etcd://host:port[,host:port...], http(s)://admin-address or k8s://
	EnvToken        = adminclient.EnvToken  // the registration token, for an http(s) LANES_REGISTRY
	EnvCAFile       = adminclient.EnvCAFile // PEM file of the CA of an https:// LANES_REGISTRY and LANES_TRACES
	EnvEtcdCA       = "LANES_ETCD_CA"       // PEM file of the etcd servers' CA: turns TLS on
	EnvEtcdCert     = "LANES_ETCD_CERT"     // PEM file of a client certificate for etcd
	EnvEtcdKey      = "LANES_ETCD_KEY"      // PEM file of its key
	EnvEtcdUsername = "LANES_ETCD_USERNAME" // etcd user, when etcd auth is on
	EnvEtcdPassword = "LANES_ETCD_PASSWORD" // etcd password
	// EnvEtcdPasswordFile is a file that holds the etcd password (its
	// first line), instead of EnvEtcdPassword: lanes up keeps its embedded
	// etcd's in <data-dir>/etcd-password.
	EnvEtcdPasswordFile = "LANES_ETCD_PASSWORD_FILE"
	EnvEtcdPrefix       = "LANES_ETCD_PREFIX" // key prefix of the installation (default /lanes/)
	// EnvNats is the NATS server's URL (nats://host:port, comma-separated
	// for several), as lanes up prints it: Open connects and sets Env.NATS.
	EnvNats = "LANES_NATS"
	// EnvKafka is the Kafka brokers' host:port list (comma-separated):
	// Open checks that one answers and sets Env.Kafka.
	EnvKafka = "LANES_KAFKA"
	// EnvAMQP is the RabbitMQ broker's URL (amqp:// or amqps://): Open
	// connects once to check it and sets Env.AMQP.
	EnvAMQP      = "LANES_AMQP"
	EnvLogFormat = "LANES_LOG_FORMAT" // text (default) or json
	EnvLogLevel  = "LANES_LOG_LEVEL"  // debug, info (default), warn or error
)

// envKubeHost is set in every Kubernetes pod.
const envKubeHost = "KUBERNETES_SERVICE_HOST"

// DefaultTimeout bounds Open: connecting, and reading the policy in force.
const DefaultTimeout = 10 * time.Second

// Error is a variable that is missing or has a value Open cannot use. Its
// message names the variable and the value (secrets hidden), and says what
// is expected.
type Error struct {
	Var   string
	Value string // "" when the variable is not set
	Msg   string
}

func (e *Error) Error() string {
	if e.Value == "" {
		return fmt.Sprintf("lanes: %s is not set: %s", e.Var, e.Msg)
	}
	return fmt.Sprintf("lanes: %s=%q: %s", e.Var, e.Value, e.Msg)
}

// Env is a service's connection to lanes.
type Env struct {
	// Engine routes the service's calls, on the registry and the policy of
	// LANES_REGISTRY. Give it to laneshttp.NewClient and lanesgrpc.NewClient.
	// The Serve helpers guard an instance they register in Registry with
	// it, unless told otherwise (WithGuard, WithoutGuard).
	Engine *routing.Engine
	// Registry is where the Serve helpers register the service's instances.
	Registry registry.Registry
	// Policy is the policy store the engine follows.
	Policy policy.Store
	// Logger writes in LANES_LOG_FORMAT at LANES_LOG_LEVEL, to stderr (or
	// the logger of WithLogger). slog.SetDefault(env.Logger) makes the Serve
	// helpers log alike.
	Logger *slog.Logger
	// NATS is the service's NATS JetStream connection, from LANES_NATS:
	// env.NATS.Publisher(topic) and env.NATS.Consumer(ctx, cfg, h) make
	// the lanes publishers and consumers of package lanesnats, on Registry
	// and Engine. It is nil without LANES_NATS, and its methods then return
	// lanesnats.ErrNoConnection.
	NATS *lanesnats.Client
	// Kafka makes laneskafka publishers and consumers, from LANES_KAFKA;
	// nil without it (its methods then return laneskafka.ErrNoConnection).
	Kafka *laneskafka.Client
	// AMQP makes lanesamqp publishers and consumers, from LANES_AMQP; nil
	// without it (its methods then return lanesamqp.ErrNoConnection).
	AMQP *lanesamqp.Client
	// Tracing is the service's OpenTelemetry set-up, from LANES_TRACES (the
	// trace collector of lanes up), OTEL_EXPORTER_OTLP_* and
	// LANES_TRACE_SAMPLE (see lanestrace.FromEnv): the transports trace with
	// it. Its provider is a no-op when none of them is set.
	Tracing *lanestrace.Tracing
	// Registry URL, as LANES_REGISTRY gave it, for messages.
	Source string

	close func() error
}

// Close stops the engine and closes the registry. Close the leases (stop the
// Serve helpers) first, so that the instances are deregistered.
func (e *Env) Close() error {
	if e == nil || e.close == nil {
		return nil
	}
	return e.close()
}

// Option configures Open.
type Option func(*options)

type options struct {
	getenv  func(string) string
	log     *slog.Logger
	stderr  io.Writer
	timeout time.Duration
	routing []routing.Option
}

// WithGetenv sets the function the variables are read with (default
// os.Getenv), for tests and for processes that keep settings elsewhere.
func WithGetenv(getenv func(string) string) Option {
	return func(o *options) {
		if getenv != nil {
			o.getenv = getenv
		}
	}
}

// WithLogger sets Env.Logger, instead of the one LANES_LOG_FORMAT and
// LANES_LOG_LEVEL describe.
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.log = l } }

// WithTimeout bounds Open (default DefaultTimeout, within ctx).
func WithTimeout(d time.Duration) Option { return func(o *options) { o.timeout = d } }

// WithRoutingOptions adds options to the routing engine, for example
// routing.WithClock in tests.
func WithRoutingOptions(opts ...routing.Option) Option {
	return func(o *options) { o.routing = append(o.routing, opts...) }
}

// Settings are the parsed variables. Parse returns them without connecting
// to anything.
type Settings struct {
	// Etcd endpoints (etcd://...), or else Admin (http(s)://...), or
	// else Backend: a LANES_REGISTRY of a backend that a blank import
	// links in (k8s://, package kubestore), or the one a pod follows
	// without LANES_REGISTRY.
	Etcd    []string
	Admin   string
	Backend string
	Token   string
	// CAFile verifies an https:// admin API (LANES_CA_FILE).
	CAFile   string
	CA       string
	Cert     string
	Key      string
	Username string
	Password string
	Prefix   string
	// Nats is LANES_NATS: the NATS server URLs, "" for none.
	Nats string
	// Kafka is LANES_KAFKA, split: the brokers' host:port, nil for none.
	Kafka []string
	// AMQP is LANES_AMQP: the broker's URL, "" for none.
	AMQP string
	// LogLevel and LogFormat as given.
	LogLevel  string
	LogFormat string
}

// Parse reads and checks the variables through getenv (os.Getenv when nil).
// It connects to nothing; every error is an *Error.
func Parse(getenv func(string) string) (Settings, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	get := func(k string) string { return strings.TrimSpace(getenv(k)) }
	s := Settings{
		Token: get(EnvToken), CAFile: get(EnvCAFile), CA: get(EnvEtcdCA), Cert: get(EnvEtcdCert), Key: get(EnvEtcdKey),
		Username: get(EnvEtcdUsername), Password: get(EnvEtcdPassword), Prefix: get(EnvEtcdPrefix),
		LogLevel: get(EnvLogLevel), LogFormat: get(EnvLogFormat), Nats: get(EnvNats),
	}
	for i, u := range strings.Split(s.Nats, ",") {
		if s.Nats == "" {
			break
		}
		u = strings.TrimSpace(u)
		if !strings.Contains(u, "://") {
			u = "nats://" + u
		}
		pu, err := url.Parse(u)
		if err != nil || pu.Host == "" || pu.Port() == "" {
			return s, &Error{Var: EnvNats, Value: redactNats(s.Nats), Msg: fmt.Sprintf("server %d: want nats://host:port[,nats://host:port...] (the line lanes up prints)", i+1)}
		}
	}
	if v := get(EnvKafka); v != "" {
		for i, b := range strings.Split(v, ",") {
			b = strings.TrimSpace(b)
			if _, port, err := net.SplitHostPort(b); err != nil || port == "" {
				return s, &Error{Var: EnvKafka, Value: v, Msg: fmt.Sprintf("broker %d %q: want host:port[,host:port...]", i+1, b)}
			}
			s.Kafka = append(s.Kafka, b)
		}
	}
	if s.AMQP = get(EnvAMQP); s.AMQP != "" {
		u, err := url.Parse(s.AMQP)
		if err != nil || (u.Scheme != "amqp" && u.Scheme != "amqps") || u.Host == "" {
			return s, &Error{Var: EnvAMQP, Value: redactURL(s.AMQP), Msg: "want amqp://user:password@host:port/vhost (or amqps://)"}
		}
	}
	if _, err := logs.ParseLevel(s.LogLevel); err != nil {
		return s, &Error{Var: EnvLogLevel, Value: s.LogLevel, Msg: err.Error()}
	}
	if err := logs.CheckFormat(s.LogFormat); err != nil {
		return s, &Error{Var: EnvLogFormat, Value: s.LogFormat, Msg: err.Error()}
	}
	raw := get(EnvRegistry)
	if raw == "" {
		if get(envKubeHost) != "" {
			// In a pod: follow the cluster if its backend is linked in.
			for _, b := range regopen.All() {
				if v, ok := b.InCluster(getenv); ok {
					s.Backend = v
					return s, nil
				}
			}
			return s, &Error{Var: EnvRegistry, Msg: "this process runs in a Kubernetes pod: add import _ \"github.com/lanesdev/lanes/kubestore\" to follow the cluster's EndpointSlices, or set it to the admin API of lanes up (http(s)://admin-address) with " + EnvToken}
		}
		return s, &Error{Var: EnvRegistry, Msg: "set it to etcd://host:port (the line `lanes up` prints) or to http(s)://admin-address with " + EnvToken}
	}
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return s, &Error{Var: EnvRegistry, Value: raw, Msg: "want etcd://host:port[,host:port...] or http(s)://admin-address"}
	}
	switch strings.ToLower(scheme) {
	case "etcd":
		rest = strings.TrimSuffix(rest, "/")
		for i, ep := range strings.Split(rest, ",") {
			ep = strings.TrimSpace(ep)
			host, port, err := net.SplitHostPort(ep)
			if err != nil || host == "" || port == "" || strings.ContainsAny(ep, "/?#@") {
				return s, &Error{Var: EnvRegistry, Value: raw, Msg: fmt.Sprintf("endpoint %d %q: want etcd://host:port[,host:port...]", i+1, ep)}
			}
			s.Etcd = append(s.Etcd, ep)
		}
		if (s.Cert == "") != (s.Key == "") {
			v, val := EnvEtcdCert, s.Cert
			if s.Cert == "" {
				v, val = EnvEtcdKey, s.Key
			}
			return s, &Error{Var: v, Value: val, Msg: "set " + EnvEtcdCert + " and " + EnvEtcdKey + " together"}
		}
		if f := get(EnvEtcdPasswordFile); f != "" {
			if s.Password != "" {
				return s, &Error{Var: EnvEtcdPasswordFile, Value: f, Msg: EnvEtcdPassword + " is set too: set one of them"}
			}
			data, err := os.ReadFile(f)
			if err != nil {
				return s, &Error{Var: EnvEtcdPasswordFile, Value: f, Msg: err.Error()}
			}
			line, _, _ := strings.Cut(string(data), "\n")
			if s.Password = strings.TrimSpace(line); s.Password == "" {
				return s, &Error{Var: EnvEtcdPasswordFile, Value: f, Msg: "the file holds no password"}
			}
		}
		if (s.Username == "") != (s.Password == "") {
			if s.Username == "" {
				return s, &Error{Var: EnvEtcdUsername, Msg: EnvEtcdPassword + " is set: set the user too"}
			}
			return s, &Error{Var: EnvEtcdPassword, Msg: EnvEtcdUsername + " is set: set the password too"}
		}
		if s.Prefix != "" && !strings.HasPrefix(s.Prefix, "/") {
			return s, &Error{Var: EnvEtcdPrefix, Value: s.Prefix, Msg: "want a key prefix starting with /, such as /lanes/"}
		}
	case "http", "https":
		u, err := url.Parse(raw)
		if err != nil || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
			return s, &Error{Var: EnvRegistry, Value: raw, Msg: "want http(s)://host:port of the admin API"}
		}
		s.Admin = raw
		if s.Token == "" {
			return s, &Error{Var: EnvToken, Msg: EnvRegistry + " is the admin API: give a registration token (lanes token create --lane L, or --baseline)"}
		}
		for _, v := range []string{EnvEtcdCA, EnvEtcdCert, EnvEtcdKey, EnvEtcdUsername, EnvEtcdPassword, EnvEtcdPasswordFile, EnvEtcdPrefix} {
			if get(v) != "" {
				return s, &Error{Var: v, Value: shown(v, get(v)), Msg: "only for an etcd:// " + EnvRegistry + "; the admin API needs only " + EnvToken}
			}
		}
	case "k8s":
		b, ok := regopen.Get(scheme)
		if !ok {
			return s, &Error{Var: EnvRegistry, Value: raw, Msg: "the Kubernetes registry is not linked in: add import _ \"github.com/lanesdev/lanes/kubestore\" to the program"}
		}
		if err := b.Check(raw); err != nil {
			return s, &Error{Var: EnvRegistry, Value: raw, Msg: err.Error()}
		}
		s.Backend = raw
	default:
		return s, &Error{Var: EnvRegistry, Value: raw, Msg: fmt.Sprintf("scheme %q: want etcd://host:port[,host:port...], http(s)://admin-address or k8s://", scheme)}
	}
	return s, nil
}

// serviceName names the service in its traces: OTEL_SERVICE_NAME, else LANES_SERVICE, else the
// program's name.
func serviceName(getenv func(string) string) string {
	for _, v := range []string{"OTEL_SERVICE_NAME", "LANES_SERVICE"} {
		if s := strings.TrimSpace(getenv(v)); s != "" {
			return s
		}
	}
	return filepath.Base(os.Args[0])
}

// redactNats hides the credentials of NATS URLs (user:password@), for
// messages.
func redactNats(urls string) string {
	parts := strings.Split(urls, ",")
	for i, p := range parts {
		if j, k := strings.Index(p, "://"), strings.LastIndex(p, "@"); k > j {
			parts[i] = p[:max(j+3, 0)] + "xxxxx" + p[k:]
		}
	}
	return strings.Join(parts, ",")
}

func shown(v, val string) string {
	if v == EnvEtcdPassword || v == EnvToken {
		return "(hidden)"
	}
	return val
}

// Open reads the environment (see the package documentation), connects to
// the registry and the policy, and returns an engine that follows both. It
// returns once the policy in force has been read, so that the first calls
// and the guard already apply it. A missing or wrong variable is an *Error
// naming it; a registry that cannot be reached is an error naming
// LANES_REGISTRY and its value.
func Open(ctx context.Context, opts ...Option) (*Env, error) {
	o := options{getenv: os.Getenv, stderr: os.Stderr, timeout: DefaultTimeout}
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	s, err := Parse(o.getenv)
	if err != nil {
		return nil, err
	}
	log := o.log
	if log == nil {
		log = logs.Must(o.stderr, s.LogLevel, s.LogFormat)
	}
	if o.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.timeout)
		defer cancel()
	}
	raw := strings.TrimSpace(o.getenv(EnvRegistry))
	unreachable := func(what string, err error) error {
		return fmt.Errorf("lanes: %s=%q: %s: %w", EnvRegistry, raw, what, err)
	}

	env := &Env{Logger: log, Source: raw}
	var closeReg func() error
	via := "etcd"
	if s.Backend != "" {
		scheme, _, _ := strings.Cut(s.Backend, "://")
		b, _ := regopen.Get(scheme)
		opened, err := b.Open(ctx, s.Backend, o.getenv, log)
		if err != nil {
			return nil, &Error{Var: EnvRegistry, Value: s.Backend, Msg: err.Error()}
		}
		env.Registry, env.Policy, closeReg, via = opened.Registry, opened.Policy, opened.Close, opened.Via
		env.Source = s.Backend
	} else if len(s.Etcd) > 0 {
		cfg := etcdstore.Config{Endpoints: s.Etcd, Username: s.Username, Password: s.Password, DialTimeout: o.timeout,
			Options: etcdstore.Options{Prefix: s.Prefix, Logger: log}}
		if s.CA != "" || s.Cert != "" {
			tc, err := etcdstore.TLSFiles(s.CA, s.Cert, s.Key)
			if err != nil {
				return nil, &Error{Var: EnvEtcdCA, Value: s.CA, Msg: err.Error()}
			}
			cfg.TLS = tc
			for i, ep := range cfg.Endpoints {
				cfg.Endpoints[i] = "https://" + ep
			}
		}
		st, err := etcdstore.Open(ctx, cfg)
		if err != nil {
			return nil, unreachable("cannot reach etcd", err)
		}
		env.Registry, env.Policy, closeReg = st, st.Policy(), st.Close
	} else {
		c, err := adminclient.New(s.Admin, s.Token, adminclient.WithCAFile(s.CAFile))
		if err != nil {
			if ce := (*tlsfiles.CAError)(nil); errors.As(err, &ce) {
				return nil, &Error{Var: EnvCAFile, Value: s.CAFile, Msg: err.Error()}
			}
			return nil, &Error{Var: EnvRegistry, Value: raw, Msg: err.Error()}
		}
		if _, err := c.Info(ctx); err != nil {
			c.Close()
			if adminapi.IsCode(err, adminapi.CodeUnauthorized) {
				return nil, &Error{Var: EnvToken, Value: "(hidden)", Msg: "the admin API refused the token: " + err.Error()}
			}
			return nil, unreachable("cannot reach the admin API", err)
		}
		reg := adminclient.NewRegistry(c, adminclient.WithLogger(log))
		env.Registry, env.Policy = reg, reg.Policy()
		closeReg = func() error {
			err := reg.Close()
			c.Close()
			return err
		}
	}
	ropts := append([]routing.Option{routing.WithRegistry(env.Registry), routing.WithPolicyStore(env.Policy), routing.WithLogger(log)}, o.routing...)
	env.Engine = routing.New(ropts...)
	unbind := guard.Bind(env.Registry, env.Engine) // the Serve helpers' default guard
	var nc *nats.Conn
	env.close = func() error {
		unbind()
		if nc != nil {
			nc.Close()
		}
		env.Kafka.Close()
		env.Engine.Close()
		err := closeReg()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return errors.Join(err, env.Tracing.Shutdown(sctx)) // flushes the last spans
	}
	select {
	case <-env.Engine.PolicyReady():
	case <-ctx.Done():
		env.Close()
		return nil, unreachable("the policy in force could not be read", context.Cause(ctx))
	}
	if env.Tracing, err = lanestrace.FromEnv(ctx, serviceName(o.getenv), o.getenv); err != nil {
		env.Close()
		return nil, err
	}
	if s.Nats != "" {
		timeout := o.timeout
		if dl, ok := ctx.Deadline(); ok {
			timeout = time.Until(dl)
		}
		if nc, err = nats.Connect(s.Nats, nats.Name(serviceName(o.getenv)), nats.Timeout(timeout), nats.MaxReconnects(-1)); err != nil {
			env.Close()
			return nil, &Error{Var: EnvNats, Value: redactNats(s.Nats), Msg: "cannot connect: " + err.Error()}
		}
		if env.NATS, err = lanesnats.NewClient(nc, env.Registry, env.Engine); err != nil {
			env.Close()
			return nil, &Error{Var: EnvNats, Value: redactNats(s.Nats), Msg: err.Error()}
		}
	}
	if err := openMQ(ctx, env, s, o.timeout, serviceName(o.getenv)); err != nil {
		env.Close()
		return nil, err
	}
	if s.Admin != "" {
		via = "admin API"
	}
	log.Info("lanes: connected", "registry", env.Source, "via", via)
	return env, nil
}

// openMQ sets Env.Kafka and Env.AMQP from LANES_KAFKA and LANES_AMQP,
// checking that the brokers answer within timeout.
func openMQ(ctx context.Context, env *Env, s Settings, timeout time.Duration, name string) error {
	if dl, ok := ctx.Deadline(); ok {
		timeout = time.Until(dl)
	}
	if len(s.Kafka) > 0 {
		c, err := laneskafka.NewClient(env.Registry, env.Engine, kgo.SeedBrokers(s.Kafka...))
		if err != nil {
			return &Error{Var: EnvKafka, Value: strings.Join(s.Kafka, ","), Msg: err.Error()}
		}
		pctx, cancel := context.WithTimeout(ctx, timeout)
		err = c.Producer.Ping(pctx)
		cancel()
		if err != nil {
			c.Close()
			return &Error{Var: EnvKafka, Value: strings.Join(s.Kafka, ","), Msg: "no broker answers: " + err.Error()}
		}
		env.Kafka = c
	}
	if s.AMQP != "" {
		dial := lanesamqp.DialURL(s.AMQP, amqp.Config{Properties: amqp.Table{"connection_name": name}})
		dctx, cancel := context.WithTimeout(ctx, timeout)
		conn, err := dial(dctx)
		cancel()
		if err != nil {
			return &Error{Var: EnvAMQP, Value: redactURL(s.AMQP), Msg: "cannot connect: " + err.Error()}
		}
		conn.Close()
		if env.AMQP, err = lanesamqp.NewClient(dial, lanesamqp.BrokerAddr(s.AMQP), env.Registry, env.Engine); err != nil {
			return &Error{Var: EnvAMQP, Value: redactURL(s.AMQP), Msg: err.Error()}
		}
	}
	return nil
}

// redactURL hides the password of a URL, for messages.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable)"
	}
	return u.Redacted()
}
