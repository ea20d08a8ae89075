package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/lanesdev/lanes/registry"
)

// ErrNoQuorum is the error of every etcd request the Store's client makes
// while the cluster has had no leader, or no member has answered, for
// longer than Config.QuorumTimeout: the request fails within
// Config.MemberTimeout instead of waiting. Errors wrapping it name each member and what it answered.
var ErrNoQuorum = errors.New("etcd has no quorum")

// ErrUnreachable is ErrNoQuorum when no member answers at all: etcd cannot
// be reached (a wrong address, a firewall, a cluster that is down), which
// is no election trouble. Errors wrapping it name the endpoints; they match
// ErrNoQuorum too.
var ErrUnreachable = errors.New("etcd cannot be reached")

// unreachableError is the refusal while no member answers: it matches
// ErrUnreachable and ErrNoQuorum.
type unreachableError struct{ msg string }

func (e *unreachableError) Error() string { return e.msg }

func (e *unreachableError) Is(target error) bool {
	return target == ErrUnreachable || target == ErrNoQuorum
}

// Health is what the Store knows of its etcd cluster, from checking every
// member (see Config.MemberTimeout).
type Health struct {
	// State is HealthOK (every member answers and has a leader),
	// HealthDegraded (some member does not: the client avoids it) or
	// HealthNoQuorum (no member has a leader, or none answers).
	State string
	// Since is when State began.
	Since time.Time
	// Members lists every endpoint, in the order of Config.Endpoints.
	Members []MemberHealth
}

// The states of Health.
const (
	HealthOK       = "ok"
	HealthDegraded = "degraded"
	HealthNoQuorum = "no_quorum"
)

// MemberHealth is the state of one member.
type MemberHealth struct {
	Endpoint string
	// State is MemberUp (answers, has a leader), MemberNoLeader (answers
	// without a leader), MemberDown (did not answer its last check within
	// Config.MemberTimeout) or MemberUnknown (not checked yet).
	State string
	// Err is the last check's error ("" when it answered).
	Err string
	// Avoided reports whether the client keeps off the member: its
	// connections were closed and none is made until it answers again.
	Avoided bool
}

// The states of MemberHealth.
const (
	MemberUp       = "up"
	MemberNoLeader = "no_leader"
	MemberDown     = "down"
	MemberUnknown  = "unknown"
)

// members checks every member of the cluster on a connection of its own
// and steers the Store's client away from the members that do not answer.
//
// A member that the operating system keeps alive but that does not answer
// (paused with SIGSTOP, swapped out, stuck on its disk) accepts connections
// and requests and never replies: gRPC keeps its connection ready (its
// keepalive pings are at least 10s apart and then wait for their timeout),
// so the client's round-robin balancer keeps sending a share of requests and
// watch and lease streams to it. When a member misses a check while another
// member answers, members closes the client's connections to it, which
// fails its requests and streams at once (the client retries reads, resumes
// watches, and tries lease renewals again on the members that answer), and
// its dialer refuses that member until it answers a check again.
//
// When no member has a leader, or none answers, for longer than
// quorumTimeout, requests fail with ErrNoQuorum after one check instead of
// waiting.
type members struct {
	log      *slog.Logger
	timeout  time.Duration // of one check
	interval time.Duration // between the starts of two checks of a member
	quorum   time.Duration // no leader for this long: ErrNoQuorum
	request  time.Duration // bounds each attempt of a unary request
	key      string        // read by the checks
	probes   []*probe

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu          sync.Mutex
	conns       map[string]map[*trackedConn]struct{} // by dial address
	avoided     map[string]bool                      // by dial address
	state       string
	since       time.Time
	noLeader    time.Time     // since when no member has had a leader; zero while one has
	refusing    bool          // failing requests with ErrNoQuorum
	back        chan struct{} // while refusing; closed when a member has a leader again
	refusalText string
	// unreachable: no member answered when the refusal began or since
	// (ErrUnreachable rather than ErrNoQuorum).
	unreachable bool
	client      *grpc.ClientConn      // the Store's client's, to reconnect at once to a member back
	outages     *registry.OutageClock // the Store's: marked while a member does not answer, and when one is back
	logins      int                   // log-ins sent on the checks' connections, to take turns
}

// probe checks one member.
type probe struct {
	endpoint string
	addr     string // the member's address as the client's dialer sees it
	client   *clientv3.Client
	kv       pb.KVClient

	// under members.mu
	state string
	err   error
}

func newMembers(cfg Config, log *slog.Logger) *members {
	m := &members{
		log:      log,
		timeout:  cfg.MemberTimeout,
		interval: cfg.MemberTimeout / 2,
		quorum:   cfg.QuorumTimeout,
		request:  cfg.RequestTimeout,
		conns:    map[string]map[*trackedConn]struct{}{},
		avoided:  map[string]bool{},
		state:    HealthOK,
		since:    time.Now(),
	}
	for _, ep := range cfg.Endpoints {
		m.probes = append(m.probes, &probe{endpoint: ep, addr: dialAddr(ep), state: MemberUnknown})
	}
	m.ctx, m.cancel = context.WithCancel(context.Background())
	return m
}

// dialOptions are the gRPC options of the Store's client: the dialer that
// keeps track of connections, and the unary interceptor (which runs inside
// the etcd client's retrying one, so once per attempt).
func (m *members) dialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithContextDialer(m.dial),
		grpc.WithChainUnaryInterceptor(m.unary),
	}
}

// start begins checking the members, on connections of their own with the
// TLS settings of cfg, reading key.
func (m *members) start(cfg Config, key string, client *grpc.ClientConn) error {
	if m.timeout <= 0 {
		return nil
	}
	m.key, m.client = key, client
	for _, p := range m.probes {
		// No credentials: with etcd auth on, the check is refused, which
		// proves as well as an answer that the member runs and has a
		// leader (the leader is checked first). A client with credentials
		// would have to log in through a member that may be down.
		c, err := clientv3.New(clientv3.Config{
			Endpoints:            []string{p.endpoint},
			DialTimeout:          cfg.DialTimeout,
			DialKeepAliveTime:    cfg.KeepAliveTime,
			DialKeepAliveTimeout: cfg.KeepAliveTimeout,
			TLS:                  cfg.TLS,
			Logger:               zap.NewNop(),
			// A member back from an outage is checked (and used) again
			// within 2s, not after gRPC's backoff of up to two minutes.
			DialOptions: []grpc.DialOption{reconnectParams(cfg.DialTimeout)},
			// One attempt per check: the etcd client would retry a read on
			// the same (only) member.
			MaxUnaryRetries: 1,
		})
		if err != nil {
			m.close()
			return fmt.Errorf("member check of %s: %w", p.endpoint, err)
		}
		p.client, p.kv = c, pb.NewKVClient(c.ActiveConnection())
	}
	for _, p := range m.probes {
		m.wg.Add(1)
		go m.check(p) // owned by m: close waits for it
	}
	return nil
}

// close stops the checks and closes their clients.
func (m *members) close() {
	m.cancel()
	m.wg.Wait()
	for _, p := range m.probes {
		if p.client != nil {
			p.client.Close()
		}
	}
}

// check checks p every interval until m closes.
func (m *members) check(p *probe) {
	defer m.wg.Done()
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-m.ctx.Done():
			return
		case <-t.C:
		}
		start := time.Now()
		ctx, cancel := context.WithTimeout(clientv3.WithRequireLeader(m.ctx), m.timeout)
		// Without waiting for a connection: a member that refuses it is
		// down at once.
		_, err := p.kv.Range(ctx, &pb.RangeRequest{Key: []byte(m.key), Serializable: true, CountOnly: true}, grpc.WaitForReady(false))
		cancel()
		err = rpctypes.Error(err)
		if m.ctx.Err() != nil {
			return
		}
		st := memberState(err)
		if st == MemberDown {
			// Try to connect again before the next check rather than
			// after gRPC's backoff, so that a member back is seen at once.
			p.client.ActiveConnection().ResetConnectBackoff()
		}
		m.report(p, st, err)
		t.Reset(max(0, m.interval-time.Since(start)))
	}
}

// memberState classifies the answer to a check.
func memberState(err error) string {
	if err == nil {
		return MemberUp
	}
	if errors.Is(err, rpctypes.ErrNoLeader) {
		return MemberNoLeader
	}
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) && ee.Code() != codes.Unavailable && ee.Code() != codes.DeadlineExceeded {
		// The member answered (say, that the check has no credentials);
		// it checks for a leader first.
		return MemberUp
	}
	return MemberDown
}

// report records the result of a check and acts on what changed.
func (m *members) report(p *probe, state string, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if state == MemberUp {
		err = nil
	}
	p.state, p.err = state, err
	anyUp, anyAnswer, anyTrouble := false, false, false
	for _, q := range m.probes {
		anyUp = anyUp || q.state == MemberUp
		anyAnswer = anyAnswer || q.state == MemberUp || q.state == MemberNoLeader
		anyTrouble = anyTrouble || q.state == MemberDown || q.state == MemberNoLeader
	}
	// Avoid the members that do not answer (or answer without a leader)
	// while another answers with one: the trouble is theirs, not ours.
	// While none does, change nothing: there is no better member to go to.
	for _, q := range m.probes {
		avoid := q.state == MemberDown || q.state == MemberNoLeader
		if !anyUp || avoid == m.avoided[q.addr] {
			continue
		}
		m.avoided[q.addr] = avoid
		if avoid {
			n := len(m.conns[q.addr])
			for c := range m.conns[q.addr] {
				c.Conn.Close()
			}
			m.log.Warn("etcd member does not answer; the client avoids it until it does", "endpoint", q.endpoint, "state", q.state, "err", errText(q.err), "connections_closed", n)
		} else {
			m.markOutage()
			m.log.Info("etcd member answers again", "endpoint", q.endpoint)
			if m.client != nil {
				m.client.ResetConnectBackoff()
			}
		}
	}
	now := time.Now()
	// An outage while none answers with a leader, or one is back; and
	// while any member does not answer: a leader paused past the leases'
	// TTL revokes them as it resumes, before it learns that another was
	// elected (etcd-io/etcd#15247, fixed in 3.4.31 and 3.5.13), and the
	// check that finds it back may come after the deletions do. Routing
	// holds what is deleted then, for a grace (routing.WithExpiryGrace).
	if !anyUp || !m.noLeader.IsZero() || anyTrouble {
		m.markOutage()
	}
	switch {
	case anyUp:
		m.noLeader = time.Time{}
		if m.refusing {
			m.refusing = false
			close(m.back)
			m.back = nil
			m.log.Info("etcd has a quorum again; requests go through")
		}
	case m.noLeader.IsZero():
		m.noLeader = now
	case !m.refusing && now.Sub(m.noLeader) >= m.quorum:
		m.refusing = true
		m.back = make(chan struct{})
		m.refusalText = m.describeLocked(anyAnswer)
		m.unreachable = !anyAnswer
		if m.unreachable {
			m.log.Error("etcd cannot be reached at "+m.endpointsLocked()+"; lanes refuses registrations and changes until a member answers, and routes from the last state it saw", "detail", m.refusalText, "for", now.Sub(m.noLeader).Round(time.Millisecond).String())
		} else {
			m.log.Error("etcd has no quorum; lanes refuses registrations and changes until it is back, and routes from the last state it saw", "detail", m.refusalText, "for", now.Sub(m.noLeader).Round(time.Millisecond).String())
		}
	case m.refusing:
		m.refusalText = m.describeLocked(anyAnswer)
		m.unreachable = !anyAnswer
	}
	st := HealthOK
	switch {
	case m.refusing:
		st = HealthNoQuorum
	case !anyUp:
		st = HealthDegraded // no leader, within the grace of an election
	default:
		for _, q := range m.probes {
			if q.state != MemberUp {
				st = HealthDegraded
			}
		}
	}
	if st != m.state {
		m.state, m.since = st, now
	}
}

// markOutage records an outage of etcd, or its end, now.
func (m *members) markOutage() {
	if m.outages != nil {
		m.outages.Mark(time.Now())
	}
}

// describeLocked says what each member answered, for ErrNoQuorum.
func (m *members) describeLocked(anyAnswer bool) string {
	var parts []string
	for _, q := range m.probes {
		switch q.state {
		case MemberNoLeader:
			parts = append(parts, q.endpoint+" answers without a leader")
		case MemberUnknown:
			parts = append(parts, q.endpoint+" not checked yet")
		default:
			parts = append(parts, q.endpoint+" does not answer ("+errText(q.err)+")")
		}
	}
	what := "no member has a leader"
	if !anyAnswer {
		what = "no member answers"
	}
	return what + ": " + strings.Join(parts, "; ")
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return "no answer within the check's timeout"
	}
	return err.Error()
}

// health returns the cluster's health.
func (m *members) health() Health {
	m.mu.Lock()
	defer m.mu.Unlock()
	h := Health{State: m.state, Since: m.since}
	for _, q := range m.probes {
		h.Members = append(h.Members, MemberHealth{Endpoint: q.endpoint, State: q.state, Err: errText(q.err), Avoided: m.avoided[q.addr]})
	}
	return h
}

// refusal returns the error for requests while there is no quorum. It waits
// for one check (at most MemberTimeout) first, so that a request made as
// the quorum comes back goes through.
func (m *members) refusal(ctx context.Context) error {
	m.mu.Lock()
	refusing, back := m.refusing, m.back
	m.mu.Unlock()
	if !refusing {
		return nil
	}
	t := time.NewTimer(m.timeout)
	defer t.Stop()
	select {
	case <-back:
		return nil
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	case <-t.C:
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.refusing {
		return nil
	}
	if m.unreachable {
		return &unreachableError{fmt.Sprintf("%v at %s (%s); requests fail until a member answers", ErrUnreachable, m.endpointsLocked(), m.refusalText)}
	}
	return fmt.Errorf("%w (%s); requests fail until a majority of members is back", ErrNoQuorum, m.refusalText)
}

// endpointsLocked lists the members' endpoints, for messages.
func (m *members) endpointsLocked() string {
	eps := make([]string, len(m.probes))
	for i, q := range m.probes {
		eps[i] = q.endpoint
	}
	return strings.Join(eps, ", ")
}

// noneAnswers returns, when no member has answered its last check, what
// each answered; ok is false when one did or none was checked.
func (m *members) noneAnswers() (detail string, ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, q := range m.probes {
		if q.state != MemberDown {
			return "", false
		}
	}
	return m.describeLocked(false), len(m.probes) > 0
}

// authenticateMethod is etcd's log-in, which hashes the password with
// bcrypt on the member: it may take seconds on a loaded member, and the
// client bounds it by its DialTimeout.
const authenticateMethod = "/etcdserverpb.Auth/Authenticate"

// oneAttemptKey marks the context of a request whose whole deadline is one
// attempt: Open's first read, bounded by the dial timeout, which a member
// still starting (or logging the client in) may need whole.
type oneAttemptKey struct{}

// unary bounds each attempt of a unary request by the request timeout
// (unless its context ends sooner), so that an attempt stuck on a member
// gives way to another attempt, which the balancer sends to another member
// (all but Authenticate). The etcd client retries an attempt that ran out of
// its own time while the caller's context is live. Without a quorum, it
// fails within one check.
//
// A log-in goes on the connection of the checks of a member that answered
// its last check, if there is one (see logInConn).
func (m *members) unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if err := m.refusal(ctx); err != nil {
		return err
	}
	if method == authenticateMethod {
		if conn := m.logInConn(); conn != nil {
			return conn.Invoke(ctx, method, req, reply, opts...)
		}
	}
	if dl, ok := ctx.Deadline(); m.request > 0 && method != authenticateMethod && ctx.Value(oneAttemptKey{}) == nil && (!ok || time.Until(dl) > m.request) {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, m.request)
		defer cancel()
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

// logInConn returns the connection of the checks of a member that answered
// its last check (taking turns among them), or nil before the checks start
// or when none did. It carries no auth token, unlike the client's own
// connections, on which the etcd client sends its log-in with the token it
// replaces: an etcd 3.4 member refuses that log-in once the token has
// expired or been revoked, and the client, which logs in again on that
// refusal, did so in a loop (thousands of log-ins a second, each a bcrypt
// hash on the member) until the request's deadline, every request failing
// until the process restarted.
func (m *members) logInConn() *grpc.ClientConn {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := len(m.probes)
	for i := range n {
		p := m.probes[(m.logins+i)%n]
		if p.state == MemberUp && p.client != nil {
			m.logins++
			return p.client.ActiveConnection()
		}
	}
	return nil
}

// dial connects to a member for the client's balancer, unless the member is
// avoided; it keeps track of the connection so that avoiding the member can
// close it.
func (m *members) dial(ctx context.Context, addr string) (net.Conn, error) {
	if m.isAvoided(addr) {
		return nil, fmt.Errorf("etcd member %s is avoided: it did not answer its last check", addr)
	}
	network, a := "tcp", addr
	if rest, ok := strings.CutPrefix(addr, "unix:"); ok {
		network, a = "unix", strings.TrimPrefix(rest, "//")
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, network, a)
	if err != nil {
		return nil, err
	}
	tc := &trackedConn{Conn: c, m: m, addr: addr}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.avoided[addr] {
		c.Close()
		return nil, fmt.Errorf("etcd member %s is avoided: it did not answer its last check", addr)
	}
	if m.conns[addr] == nil {
		m.conns[addr] = map[*trackedConn]struct{}{}
	}
	m.conns[addr][tc] = struct{}{}
	return tc, nil
}

func (m *members) isAvoided(addr string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.avoided[addr]
}

// trackedConn is a connection of the client's, known to members.
type trackedConn struct {
	net.Conn
	m    *members
	addr string
	once sync.Once
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.m.mu.Lock()
		delete(c.m.conns[c.addr], c)
		c.m.mu.Unlock()
	})
	return c.Conn.Close()
}

// dialAddr is the address the etcd client's balancer dials for endpoint ep
// (the host:port of an http or https URL, a unix socket as gRPC names it).
func dialAddr(ep string) string {
	for _, scheme := range []string{"unix", "unixs"} {
		if rest, ok := strings.CutPrefix(ep, scheme+"://"); ok {
			if strings.HasPrefix(rest, "/") {
				return "unix://" + rest
			}
			return "unix:" + rest
		}
		if rest, ok := strings.CutPrefix(ep, scheme+":"); ok {
			return "unix:" + rest
		}
	}
	if _, rest, ok := strings.Cut(ep, "://"); ok {
		host, _, _ := strings.Cut(rest, "/")
		return host
	}
	return ep
}
