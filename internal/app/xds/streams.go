package xds

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/lanesdev/lanes/internal/lib/bearer"
	"github.com/lanesdev/lanes/internal/lib/xdsroute"
)

// nodeHash groups clients by their variant (gRPC proxyless or Envoy, and
// Envoy's listener address) and locality: the clients of one variant, zone
// and host share one set of resources. A locality that is too long or not
// printable counts as unknown; once MaxGroups are kept, a new group gets
// the resources of no locality for its variant (Envoy's on its default
// address).
type nodeHash struct{ s *Server }

// group is what a set of resources is made for.
type group struct {
	caller  xdsroute.Caller
	variant xdsroute.Variant
	egress  netip.AddrPort // Envoy's listener
}

func (g group) key() string {
	k := g.variant.String() + "|" + g.caller.Zone + "|" + g.caller.Host
	if g.variant == xdsroute.Envoy {
		k += "|" + g.egress.String()
	}
	return k
}

func (h nodeHash) ID(node *corev3.Node) string {
	g := groupOf(node)
	key := g.key()
	s := h.s
	s.mu.Lock()
	_, known := s.groups[key]
	if !known {
		if len(s.groups) >= MaxGroups {
			g = group{variant: g.variant}
			if g.variant == xdsroute.Envoy {
				g.egress = xdsroute.DefaultEgress
			}
			key = g.key()
			_, known = s.groups[key]
		}
		if !known {
			s.groups[key] = g
		}
	}
	s.mu.Unlock()
	if !known {
		s.poke() // its resources are made at the next push
	}
	return key
}

// Node metadata that chooses the variant and Envoy's listener.
const (
	// MetaVariant names the variant: "grpc" or "envoy". Without it, a
	// node whose user_agent_name is "envoy" gets the Envoy variant, any
	// other the gRPC one.
	MetaVariant = "lanes.variant"
	// MetaEgress is the address ("127.0.0.1:15001") of the Envoy
	// variant's listener; without it, or when it is not an IP address
	// and port, xdsroute.DefaultEgress.
	MetaEgress = "lanes.egress"
)

func groupOf(node *corev3.Node) group {
	g := group{caller: xdsroute.Caller{Zone: localityPart(node.GetLocality().GetZone()), Host: localityPart(node.GetLocality().GetSubZone())}}
	md := node.GetMetadata().GetFields()
	switch v := md[MetaVariant].GetStringValue(); {
	case v == "envoy", v == "" && node.GetUserAgentName() == "envoy":
		g.variant = xdsroute.Envoy
		g.egress = xdsroute.DefaultEgress
		if a, err := netip.ParseAddrPort(md[MetaEgress].GetStringValue()); err == nil && a.Port() != 0 {
			g.egress = a
		}
	}
	return g
}

func localityPart(v string) string {
	if len(v) > MaxLocalityBytes || strings.ContainsFunc(v, func(r rune) bool { return r < 0x21 || r == 0x7f || r == '|' || r == utf8.RuneError }) {
		return ""
	}
	return v
}

// authenticate lets a stream in as Config.Auth says.
func (s *Server) authenticate(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	ctx := ss.Context()
	switch s.cfg.Auth {
	case AuthLoopback:
		p, ok := peer.FromContext(ctx)
		if !ok || !isLoopback(p.Addr) {
			s.m.refused.WithLabelValues("not_loopback").Inc()
			return status.Error(codes.PermissionDenied, "this xDS server takes clients on loopback addresses only (xds.auth: loopback)")
		}
	default:
		md, _ := metadata.FromIncomingContext(ctx)
		var tok string
		var ok bool
		if v := md.Get("authorization"); len(v) == 1 {
			tok, ok = bearer.Token(v[0])
		}
		if !ok {
			s.m.refused.WithLabelValues("no_token").Inc()
			return status.Error(codes.Unauthenticated, `this xDS server needs a token: send "authorization: Bearer <token>" in the stream's metadata`)
		}
		// gRPC's bootstrap sends a token by itself only as a JWT: in the
		// envelope of lanes token envelope.
		if inner, isEnvelope, err := bearer.Unwrap(tok, time.Now()); isEnvelope {
			if err != nil {
				s.m.refused.WithLabelValues("bad_token").Inc()
				return status.Error(codes.Unauthenticated, err.Error())
			}
			tok = inner
		}
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, _, err := s.cfg.Tokens.Check(cctx, tok)
		cancel()
		if err != nil {
			if s.cfg.IsUnauthorized == nil || s.cfg.IsUnauthorized(err) {
				s.m.refused.WithLabelValues("bad_token").Inc()
				return status.Error(codes.Unauthenticated, err.Error())
			}
			return status.Errorf(codes.Unavailable, "checking the token: %v", err)
		}
	}
	s.m.streams.Inc()
	defer s.m.streams.Dec()
	return h(srv, ss)
}

func isLoopback(a net.Addr) bool {
	ap, err := netip.ParseAddrPort(a.String())
	return err == nil && ap.Addr().Unmap().IsLoopback()
}

// callbacks bound what clients send, log and count NACKs, and keep a NACK
// from being answered with the resources it refused.
func (s *Server) callbacks() serverv3.Callbacks {
	return serverv3.CallbackFuncs{
		StreamRequestFunc: func(id int64, req *discoverygrpc.DiscoveryRequest) error {
			if err := checkRequest(req.GetNode(), req.GetResourceNames()); err != nil {
				s.m.refused.WithLabelValues("bad_request").Inc()
				return err
			}
			if req.GetTypeUrl() == resource.ListenerType {
				s.subscribe(streamID{id: id}, req.GetNode(), req.GetResourceNames(), nil, true)
			}
			if req.GetErrorDetail() == nil {
				return nil
			}
			k := streamType{id, req.GetTypeUrl()}
			s.mu.Lock()
			last, ok := s.sent[k]
			first := ok && !last.nacked
			if first {
				last.nacked = true
				s.sent[k] = last
			}
			s.mu.Unlock()
			if !ok || last.nonce != req.GetResponseNonce() {
				return nil // a stale NACK: the server ignores it
			}
			if first { // logged and counted once per response
				s.nack(req, last.version)
			}
			// A client asks again at once after a NACK, with the version
			// it had before. Taken as holding the version it refused, it
			// is answered at the next change, not now with the same
			// resources (which it would refuse again, at once, forever).
			req.VersionInfo = last.version
			return nil
		},
		StreamResponseFunc: func(_ context.Context, id int64, req *discoverygrpc.DiscoveryRequest, resp *discoverygrpc.DiscoveryResponse) {
			s.mu.Lock()
			s.sent[streamType{id, resp.GetTypeUrl()}] = sentResponse{nonce: resp.GetNonce(), version: resp.GetVersionInfo()}
			s.mu.Unlock()
		},
		StreamClosedFunc: func(id int64, _ *corev3.Node) {
			s.mu.Lock()
			for k := range s.sent {
				if k.stream == id {
					delete(s.sent, k)
				}
			}
			delete(s.subs, streamID{id: id})
			s.mu.Unlock()
		},
		DeltaStreamClosedFunc: func(id int64, _ *corev3.Node) {
			s.mu.Lock()
			delete(s.subs, streamID{id: id, delta: true})
			s.mu.Unlock()
		},
		DeltaStreamOpenFunc: func(context.Context, int64, string) error { return nil },
		StreamDeltaRequestFunc: func(id int64, req *discoverygrpc.DeltaDiscoveryRequest) error {
			names := slices.Concat(req.GetResourceNamesSubscribe(), req.GetResourceNamesUnsubscribe())
			if err := checkRequest(req.GetNode(), names); err != nil {
				s.m.refused.WithLabelValues("bad_request").Inc()
				return err
			}
			if req.GetTypeUrl() == resource.ListenerType {
				s.subscribe(streamID{id: id, delta: true}, req.GetNode(), req.GetResourceNamesSubscribe(), req.GetResourceNamesUnsubscribe(), false)
			}
			if req.GetErrorDetail() != nil {
				s.nack(&discoverygrpc.DiscoveryRequest{Node: req.GetNode(), TypeUrl: req.GetTypeUrl(),
					ResponseNonce: req.GetResponseNonce(), ErrorDetail: req.GetErrorDetail()}, "")
			}
			return nil
		},
	}
}

// MaxSubscribedNames bounds the listener names kept per stream for
// Callers: a stream that asks for more counts as asking for every one.
const MaxSubscribedNames = 256

// streamID names a stream: the state-of-the-world and the incremental
// streams are numbered apart.
type streamID struct {
	id    int64
	delta bool
}

// subscription is what a stream asks for of the listeners: which services
// its client calls (nil names: every one, as Envoy asks).
type subscription struct {
	variant xdsroute.Variant
	names   map[string]bool
}

// subscribe keeps the listeners a stream asks for: a state-of-the-world
// request names them all (none: every one); an incremental one adds and
// removes ("*": every one).
func (s *Server) subscribe(id streamID, node *corev3.Node, add, remove []string, sotw bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sub := s.subs[id]
	if sub == nil || sotw {
		sub = &subscription{variant: groupOf(node).variant, names: map[string]bool{}}
		s.subs[id] = sub
		if sotw && len(add) == 0 {
			sub.names = nil
		}
	}
	if sub.names == nil {
		return
	}
	for _, n := range remove {
		delete(sub.names, n)
	}
	for _, n := range add {
		if n == "*" || len(sub.names) >= MaxSubscribedNames {
			sub.names = nil
			return
		}
		sub.names[n] = true
	}
}

// Callers counts the streams open now whose clients call service, by
// variant: a gRPC client's stream asks for its listener (xds:///service);
// an Envoy's asks for every listener, and counts for every service.
func (s *Server) Callers(service string) (grpc, envoy int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, sub := range s.subs {
		if sub.names != nil && !sub.names[service] {
			continue
		}
		if sub.variant == xdsroute.Envoy {
			envoy++
		} else {
			grpc++
		}
	}
	return grpc, envoy
}

// nack logs and counts a client's refusal of resources, bounded.
func (s *Server) nack(req *discoverygrpc.DiscoveryRequest, version string) {
	names := req.GetResourceNames()
	more := 0
	if len(names) > 8 {
		names, more = names[:8], len(names)-8
	}
	s.m.nacks.WithLabelValues(typeLabel(req.GetTypeUrl())).Inc()
	s.log.Warn("a client refused xDS resources (NACK)", "node", clip(req.GetNode().GetId(), 128),
		"type", clip(req.GetTypeUrl(), 128), "version", version, "resources", clipAll(names), "more_resources", more,
		"error", clip(req.GetErrorDetail().GetMessage(), 512))
}

func checkRequest(node *corev3.Node, names []string) error {
	if len(node.GetId()) > MaxNodeIDBytes {
		return status.Errorf(codes.InvalidArgument, "node id of %d bytes: at most %d", len(node.GetId()), MaxNodeIDBytes)
	}
	if len(names) > MaxResourceNames {
		return status.Errorf(codes.InvalidArgument, "%d resource names: at most %d", len(names), MaxResourceNames)
	}
	for _, n := range names {
		if len(n) > MaxResourceNameBytes {
			return status.Errorf(codes.InvalidArgument, "a resource name of %d bytes: at most %d", len(n), MaxResourceNameBytes)
		}
	}
	return nil
}

func clip(v string, n int) string {
	if len(v) > n {
		return fmt.Sprintf("%q... (%d bytes)", v[:n], len(v))
	}
	return fmt.Sprintf("%q", v)
}

func clipAll(vs []string) []string {
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i] = clip(v, 128)
	}
	return out
}

// typeLabel is a bounded label for a resource type.
func typeLabel(typeURL string) string {
	switch typeURL {
	case resource.ListenerType:
		return "listener"
	case resource.RouteType:
		return "route"
	case resource.ClusterType:
		return "cluster"
	case resource.EndpointType:
		return "endpoint"
	}
	return "other"
}

type metrics struct {
	nacks   *prometheus.CounterVec
	refused *prometheus.CounterVec
	streams prometheus.Gauge
	pushes  prometheus.Counter
}

func newMetrics(r prometheus.Registerer) metrics {
	m := metrics{
		nacks: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "lanes_xds_nacks_total",
			Help: "xDS responses that clients refused, by resource type."}, []string{"type"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "lanes_xds_refused_total",
			Help: "xDS streams and requests refused, by reason (not_loopback, no_token, bad_token, bad_request)."}, []string{"reason"}),
		streams: prometheus.NewGauge(prometheus.GaugeOpts{Name: "lanes_xds_streams", Help: "xDS streams open."}),
		pushes:  prometheus.NewCounter(prometheus.CounterOpts{Name: "lanes_xds_pushes_total", Help: "Times the xDS resources were made again and set."}),
	}
	if r != nil {
		r.MustRegister(m.nacks, m.refused, m.streams, m.pushes)
	}
	return m
}

// cacheLogger sends the cache's lines to the server's logger, at debug
// level but for its errors.
type cacheLogger struct {
	l interface {
		Debug(string, ...any)
		Error(string, ...any)
	}
}

func (c cacheLogger) Debugf(f string, a ...any) { c.l.Debug(fmt.Sprintf(f, a...)) }
func (c cacheLogger) Infof(f string, a ...any)  { c.l.Debug(fmt.Sprintf(f, a...)) }
func (c cacheLogger) Warnf(f string, a ...any)  { c.l.Debug(fmt.Sprintf(f, a...)) }
func (c cacheLogger) Errorf(f string, a ...any) { c.l.Error(fmt.Sprintf(f, a...)) }
