package collector

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/lanesdev/lanes/internal/lib/bearer"
)

// Who may send spans to the receivers (Config.Auth).
const (
	// AuthToken: every request carries "Authorization: Bearer <token>" with a token that
	// Config.Authenticate accepts. It is the default.
	AuthToken = "token"
	// AuthLoopback: requests from loopback addresses only, with no token.
	AuthLoopback = "loopback"
	// AuthOpen: anyone who reaches the receivers, with no token.
	AuthOpen = "open"
)

// Sender is who sent a request of spans, as the receivers found it: a credential trusted with any
// span (the telemetry token, the admin token, or anyone where the receivers need no token), or a
// registration token, which may send only the spans of what it owns.
type Sender struct {
	Trusted  bool
	Baseline bool   // a registration token of the baseline
	Lane     string // the lane of a lane token
	ID       string // the token's id, for messages
}

// scope names the sender's credential on the spans it sent ("" for a trusted one).
func (s Sender) scope() string {
	switch {
	case s.Trusted:
		return ""
	case s.Baseline:
		return "baseline"
	}
	return "lane:" + s.Lane
}

func (s Sender) String() string {
	switch {
	case s.Trusted:
		return "a trusted sender"
	case s.Baseline:
		return fmt.Sprintf("token %s (scope: baseline)", s.ID)
	}
	return fmt.Sprintf("token %s (scope: lane %s)", s.ID, s.Lane)
}

// ErrUnauthenticated is the error of a request whose token is missing, unknown or wrong. An
// Authenticator wraps it for a token it refuses; any other error is taken as the credential store
// being unavailable.
var ErrUnauthenticated = errors.New("unauthenticated")

// Authenticator checks the token of a request of spans and says who sent it.
type Authenticator func(ctx context.Context, token string) (Sender, error)

// authenticate says who sent a request from peer (host:port) with the Authorization value
// header, or why it is refused.
func (c *Collector) authenticate(ctx context.Context, peer, header string) (Sender, error) {
	switch c.cfg.Auth {
	case AuthOpen:
		return Sender{Trusted: true}, nil
	case AuthLoopback:
		if !isLoopback(peer) {
			return Sender{}, fmt.Errorf("%w: this receiver takes spans from loopback addresses only (traces.receiver_auth: loopback), not from %s", ErrUnauthenticated, peer)
		}
		return Sender{Trusted: true}, nil
	}
	tok, ok := bearer.Token(header)
	if !ok {
		return Sender{}, fmt.Errorf("%w: send spans with the header \"Authorization: Bearer <token>\": the service's registration token (LANES_TOKEN) or the telemetry token that lanes up prints", ErrUnauthenticated)
	}
	if c.cfg.Authenticate == nil {
		return Sender{}, fmt.Errorf("%w: this collector knows no tokens", ErrUnauthenticated)
	}
	return c.cfg.Authenticate(ctx, tok)
}

func isLoopback(hostport string) bool {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		host = hostport
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.Unmap().IsLoopback()
}

// allows says why sender may not send sp, or nil when it may. A registration token speaks only
// for instances it could register: a server or consumer span must be of an instance of its own
// lane (the baseline, for a baseline token), and a client or producer span of a lane token must
// carry a request its lane may serve (its own lane, the baseline, or a lane whose chain reaches
// it). Spans that lanes did not write carry no lane and are let through.
func (c *Collector) allows(s Sender, sp *Span) error {
	if s.Trusted || !sp.HasLane {
		return nil
	}
	own := s.Lane
	if s.Baseline {
		own = ""
	}
	switch sp.Kind {
	case KindServer, KindConsumer:
		if sp.InstanceLane != own {
			return fmt.Errorf("%s may not send a %s span of an instance of %s", s, sp.Kind, laneName(sp.InstanceLane))
		}
	default:
		if s.Baseline || sp.Requested == "" || sp.Requested == own {
			return nil
		}
		if c.cfg.Fleet != nil && c.cfg.Fleet.Reaches(sp.Requested, own) {
			return nil
		}
		return fmt.Errorf("%s may not send a %s span of a request in lane %q, which its lane does not serve", s, sp.Kind, sp.Requested)
	}
	return nil
}
