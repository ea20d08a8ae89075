// Package etcdstore keeps lanes' registry and policy in etcd.
//
// A Store implements registry.Registry: every instance is a key under
// <prefix>instances/<service>/<id>, holding the instance as JSON and attached
// to an etcd lease that the registering process keeps alive. Store.Policy
// returns the policy.Store, which keeps the one policy document, as the text
// that was submitted, at <prefix>policy. The default prefix is "/lanes/".
//
// Watches follow the pattern of etcd's naming/endpoints package: list the
// keys, then watch from the revision of that list, so that no change is
// missed or reordered. A watch that breaks (etcd restarted, the member lost
// its leader) resumes from the last revision it delivered; only when etcd
// has compacted that revision away does it list again and send a reset
// batch. See docs/etcd.md for the key layout and the details.
package etcdstore

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	grpcbackoff "google.golang.org/grpc/backoff"

	"github.com/lanesdev/lanes/internal/lib/gogroup"
	"github.com/lanesdev/lanes/internal/lib/localip"
	"github.com/lanesdev/lanes/policy"
	"github.com/lanesdev/lanes/registry"
)

// DefaultPrefix is the key prefix used when Options.Prefix is empty.
const DefaultPrefix = "/lanes/"

// The defaults of Config.
const (
	// DefaultDialTimeout bounds the first connection of Open.
	DefaultDialTimeout = 5 * time.Second
	// DefaultKeepAliveTime is how long a connection to a member may stay
	// silent before the client pings it. gRPC allows no less than 10s, and
	// etcd refuses pings more frequent than its --grpc-keepalive-min-time
	// (5s by default).
	DefaultKeepAliveTime = 10 * time.Second
	// DefaultKeepAliveTimeout is how long the client waits for the answer
	// to a ping before it closes the connection.
	DefaultKeepAliveTimeout = 3 * time.Second
	// DefaultRequestTimeout bounds each attempt of a request.
	DefaultRequestTimeout = 2 * time.Second
	// DefaultMemberTimeout is how long a member may take to answer a
	// check.
	DefaultMemberTimeout = time.Second
	// DefaultQuorumTimeout is how long the cluster may be without a
	// leader before requests fail with ErrNoQuorum.
	DefaultQuorumTimeout = 5 * time.Second
)

// opTimeout bounds the etcd calls that the Store makes on its own behalf
// (re-registering a lost lease, revoking a lease on Close). The client waits
// for a connection rather than failing fast, so every such call needs one.
const opTimeout = 5 * time.Second

// Options configure a Store.
type Options struct {
	// Prefix is prepended to every key (DefaultPrefix when empty). A
	// trailing "/" is added when missing. Give each lanes installation
	// sharing an etcd cluster its own prefix.
	Prefix string
	// Logger receives the Store's diagnostics: lost leases, broken
	// watches, invalid values found in etcd (slog.Default() when nil).
	Logger *slog.Logger
}

// Config says how Open connects to etcd.
type Config struct {
	// Endpoints are the client URLs of the etcd members, for example
	// "https://etcd-1.internal:2379". At least one is required.
	Endpoints []string
	// TLS, when set, is used for every connection (server verification and,
	// with Certificates, client certificates). Use https endpoints with it.
	TLS *tls.Config
	// Username and Password authenticate to etcd when auth is enabled.
	Username string
	Password string
	// DialTimeout bounds connecting and the first request of Open
	// (DefaultDialTimeout when zero).
	DialTimeout time.Duration
	// KeepAliveTime and KeepAliveTimeout are the gRPC keepalive of every
	// connection (DefaultKeepAliveTime and DefaultKeepAliveTimeout when
	// zero): a connection that stays silent for KeepAliveTime is pinged,
	// and closed when the ping is not answered within KeepAliveTimeout.
	KeepAliveTime    time.Duration
	KeepAliveTimeout time.Duration
	// RequestTimeout bounds each attempt of an etcd request whose context
	// allows longer, and of a lease renewal (DefaultRequestTimeout when
	// zero; a renewal's at most a quarter of the lease's TTL). An attempt
	// that runs out of time is tried again on another member while the
	// context lasts.
	RequestTimeout time.Duration
	// MemberTimeout is how long each member may take to answer the Store's
	// checks, made on connections of their own twice per MemberTimeout
	// (DefaultMemberTimeout when zero; negative turns the checks off). A
	// member that misses a check while another answers (one paused,
	// overloaded or cut off from its cluster) is avoided: the client's
	// connections to it are closed, which moves its watches, lease
	// renewals and requests to the other members, and none is opened
	// again until it answers. Store.Health reports the checks.
	MemberTimeout time.Duration
	// QuorumTimeout is how long the cluster may have no leader (or no
	// member may answer) before every request fails within MemberTimeout
	// with ErrNoQuorum instead of waiting (DefaultQuorumTimeout when zero). Keep
	// it above the time an election takes (a few election timeouts). Only
	// with the member checks.
	QuorumTimeout time.Duration

	Options
}

// Store keeps lanes' registry and policy in etcd. It implements
// registry.Registry; Policy returns its policy.Store. It is safe for
// concurrent use.
type Store struct {
	client *clientv3.Client
	owned  bool // Close closes client
	prefix string
	// instances is InstancesPrefix, made once: every watch event's key is
	// checked against it.
	instances []byte
	log       *slog.Logger
	policy    *policyStore
	// members checks the cluster's members (Open's clients only).
	members *members
	// renewals renews leases (see Registrations.renew); nil for a
	// client without a connection of its own.
	renewals *renewals
	// attempt bounds each attempt of a renewal: Config.RequestTimeout
	// for a Store of Open, DefaultRequestTimeout for one of New.
	attempt time.Duration
	// renewed, when set (by tests), is told of every grant and renewal of
	// a Lease of Register: the instance's key, the lease, and when the
	// request that etcd answered was sent.
	renewed func(key string, lease clientv3.LeaseID, sent time.Time)
	// outages records when the Store last could not reach etcd, or
	// found it back (LastOutage).
	outages registry.OutageClock

	g *gogroup.Group // the lease and watch goroutines; its context is the parent of every lease and watch
}

var (
	_ registry.Registry = (*Store)(nil)
	_ registry.Outages  = (*Store)(nil)
)

// LastOutage implements registry.Outages: it returns when the Store last
// found etcd unreachable or found it back: no member answered with a
// leader, a member that did not answer answers again, a lease could not be
// renewed. A routing engine on the Store holds the instances deleted
// shortly after (etcd expires every lease it could not renew at once).
func (s *Store) LastOutage() time.Time { return s.outages.Last() }

// Open connects to the etcd cluster of cfg and returns a Store that owns the
// connection: Close closes it. It fails when no endpoint answers a read of
// the lanes keys within cfg.DialTimeout (or before ctx is done), so that a
// wrong address, certificate or password is reported here.
func Open(ctx context.Context, cfg Config) (*Store, error) {
	if len(cfg.Endpoints) == 0 {
		return nil, errors.New("etcdstore: no endpoints")
	}
	cfg = cfg.withDefaults()
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	m := newMembers(cfg, log.With("component", "etcdstore"))
	c, err := clientv3.New(clientv3.Config{
		Endpoints:   cfg.Endpoints,
		DialTimeout: cfg.DialTimeout,
		// Detect a dead connection (a member that vanished without closing
		// it) within seconds rather than the TCP timeout. No pings without
		// streams: etcd closes the connection of a client that sends them.
		DialKeepAliveTime:    cfg.KeepAliveTime,
		DialKeepAliveTimeout: cfg.KeepAliveTimeout,
		DialOptions:          append(m.dialOptions(), reconnectParams(cfg.DialTimeout)),
		TLS:                  cfg.TLS,
		Username:             cfg.Username,
		Password:             cfg.Password,
		// The client's own logging is silenced: every failure it would
		// report reaches the Store, which logs it with slog or returns it.
		Logger: zap.NewNop(),
	})
	if err != nil {
		return nil, fmt.Errorf("etcdstore: connect to %s: %w", strings.Join(cfg.Endpoints, ","), err)
	}
	s, err := New(c, cfg.Options)
	if err != nil {
		c.Close()
		return nil, err
	}
	s.owned = true
	s.attempt = cfg.RequestTimeout
	m.outages = &s.outages
	if err := m.start(cfg, s.policy.key, c.ActiveConnection()); err != nil {
		s.Close()
		return nil, fmt.Errorf("etcdstore: %w", err)
	}
	s.members = m
	cctx, cancel := context.WithTimeout(context.WithValue(ctx, oneAttemptKey{}, true), cfg.DialTimeout)
	defer cancel()
	if _, err := c.Get(cctx, s.policy.key, clientv3.WithCountOnly()); err != nil {
		detail, none := m.noneAnswers()
		s.Close()
		if none && !errors.Is(err, context.Canceled) {
			return nil, &unreachableError{fmt.Sprintf("etcdstore: %v at %s within %s: %s", ErrUnreachable, strings.Join(cfg.Endpoints, ", "), cfg.DialTimeout, detail)}
		}
		return nil, fmt.Errorf("etcdstore: connect to %s: %w", strings.Join(cfg.Endpoints, ","), err)
	}
	return s, nil
}

// reconnectParams is the reconnect backoff of the Store's connections.
// gRPC's default grows to two minutes. After an etcd outage, leases must be
// renewed within their TTL of etcd's return, so retry at least every two
// seconds.
func reconnectParams(dialTimeout time.Duration) grpc.DialOption {
	return grpc.WithConnectParams(grpc.ConnectParams{
		Backoff:           grpcbackoff.Config{BaseDelay: 200 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 2 * time.Second},
		MinConnectTimeout: dialTimeout,
	})
}

// withDefaults fills in the zero durations.
func (cfg Config) withDefaults() Config {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	if cfg.DialTimeout < 0 {
		cfg.DialTimeout = 0
	}
	def(&cfg.DialTimeout, DefaultDialTimeout)
	def(&cfg.KeepAliveTime, DefaultKeepAliveTime)
	def(&cfg.KeepAliveTimeout, DefaultKeepAliveTimeout)
	def(&cfg.RequestTimeout, DefaultRequestTimeout)
	def(&cfg.MemberTimeout, DefaultMemberTimeout)
	def(&cfg.QuorumTimeout, DefaultQuorumTimeout)
	return cfg
}

// New returns a Store that uses an existing client. Close does not close
// the client; close it after the Store.
func New(client *clientv3.Client, opts Options) (*Store, error) {
	if client == nil {
		return nil, errors.New("etcdstore: nil client")
	}
	prefix := opts.Prefix
	if prefix == "" {
		prefix = DefaultPrefix
	}
	if !strings.HasSuffix(prefix, "/") {
		prefix += "/"
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	s := &Store{
		client:    client,
		prefix:    prefix,
		instances: []byte(prefix + "instances/"),
		log:       log.With("component", "etcdstore"),
		attempt:   DefaultRequestTimeout,
		g:         gogroup.New(),
	}
	if conn := client.ActiveConnection(); conn != nil {
		s.renewals = newRenewals(s.g.Context(), pb.NewLeaseClient(conn))
	}
	s.policy = &policyStore{s: s, key: s.PolicyKey()}
	return s, nil
}

// Client returns the etcd client the Store uses.
func (s *Store) Client() *clientv3.Client { return s.client }

// Prefix returns the key prefix of the Store, ending in "/".
func (s *Store) Prefix() string { return s.prefix }

// Policy returns the policy store, kept at <prefix>policy.
func (s *Store) Policy() policy.Store { return s.policy }

// LocalIP implements registry.Reacher: the local IP address of this host's
// route to the first etcd endpoint that has one.
func (s *Store) LocalIP() net.IP {
	for _, ep := range s.client.Endpoints() {
		if !strings.Contains(ep, "://") {
			ep = "etcd://" + ep
		}
		if ip := localip.Toward(ep); ip != nil {
			return ip
		}
	}
	return nil
}

// Close ends every watch (their Next returns ErrClosed) and stops renewing
// every lease still open, without revoking them: the instances disappear
// when their TTL runs out, as if the process had died. It waits for the
// Store's goroutines, then closes the client if Open created it. It is safe
// to call more than once.
func (s *Store) Close() error {
	if !s.g.Close() {
		return nil
	}
	var err error
	if s.owned {
		if cerr := s.client.Close(); cerr != nil && !errors.Is(cerr, context.Canceled) {
			err = cerr
		}
	}
	if s.members != nil {
		s.members.close()
	}
	return err
}

// Health reports the state of the etcd cluster as the Store's checks of its
// members see it (see Config.MemberTimeout). ok is false for a Store made
// with New, or with the checks turned off: it knows nothing of the members.
func (s *Store) Health() (h Health, ok bool) {
	if s.members == nil || s.members.timeout <= 0 {
		return Health{}, false
	}
	return s.members.health(), true
}

// PolicyKey is the key that holds the policy document.
func (s *Store) PolicyKey() string { return s.prefix + "policy" }
