package xdsroute

import (
	"net/netip"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// Variant is the kind of xDS client the resources are made for: gRPC's
// proxyless clients and Envoy read the same routes and clusters, but not
// the same listeners, and disagree on one field of an aggregate cluster.
type Variant uint8

const (
	// GRPC is the variant of gRPC's proxyless clients (grpc-go, grpc-java,
	// grpc-js with grpc-js-xds, grpcio): an API listener per service, named
	// after it (the target xds:///S), and aggregate clusters without an
	// lb_policy (gRPC clients refuse CLUSTER_PROVIDED).
	GRPC Variant = iota
	// Envoy is the variant of an Envoy proxy beside a service, as its
	// egress: one listener on the proxy's address, whose one route
	// configuration holds a virtual host per service (by the Host or
	// :authority the service calls: S or S:port), header matchers as
	// string_match (Envoy's current form), aggregate clusters with
	// lb_policy CLUSTER_PROVIDED (which Envoy requires), and upstream
	// HTTP/2 where the downstream request was HTTP/2 (gRPC), HTTP/1.1
	// otherwise.
	Envoy
)

func (v Variant) String() string {
	if v == Envoy {
		return "envoy"
	}
	return "grpc"
}

// EgressName is the name of the Envoy variant's listener and of its route
// configuration.
const EgressName = "lanes-egress"

// DefaultEgress is the address of the Envoy variant's listener where the
// node does not name one.
var DefaultEgress = netip.MustParseAddrPort("127.0.0.1:15001")

// The names Envoy knows the filter and the protocol options by.
const (
	hcmFilter            = "envoy.filters.network.http_connection_manager"
	httpProtocolOptionsK = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
)

// ForEnvoy returns r as an Envoy proxy takes them, with its one listener
// on egress. The routes, the clusters' members and the endpoints are r's
// (shared, read-only); the listener, the route configuration and the
// clusters are new values.
func ForEnvoy(r *Resources, egress netip.AddrPort) *Resources {
	out := &Resources{Endpoints: r.Endpoints}
	rc := &routev3.RouteConfiguration{Name: EgressName}
	for _, c := range r.Routes {
		for _, vh := range c.VirtualHosts {
			// One virtual host per service, by the authority the service
			// calls: its name, with or without a port. Envoy refuses a
			// domain twice, and a service's name is unique.
			routes := make([]*routev3.Route, len(vh.Routes))
			for i, rt := range vh.Routes {
				routes[i] = envoyRoute(rt)
			}
			rc.VirtualHosts = append(rc.VirtualHosts, &routev3.VirtualHost{
				Name:    vh.Name,
				Domains: []string{c.Name, c.Name + ":*"},
				Routes:  routes,
			})
		}
	}
	out.Routes = []*routev3.RouteConfiguration{rc}
	out.Listeners = []*listenerv3.Listener{egressListener(egress)}
	protocol := map[string]*anypb.Any{httpProtocolOptionsK: mustAny(&upstreamhttpv3.HttpProtocolOptions{
		UpstreamProtocolOptions: &upstreamhttpv3.HttpProtocolOptions_UseDownstreamProtocolConfig{
			UseDownstreamProtocolConfig: &upstreamhttpv3.HttpProtocolOptions_UseDownstreamHttpConfig{
				HttpProtocolOptions:  &corev3.Http1ProtocolOptions{},
				Http2ProtocolOptions: &corev3.Http2ProtocolOptions{},
			},
		},
	})}
	for _, c := range r.Clusters {
		c = proto.Clone(c).(*clusterv3.Cluster)
		if c.GetClusterType() != nil {
			c.LbPolicy = clusterv3.Cluster_CLUSTER_PROVIDED
		} else {
			c.TypedExtensionProtocolOptions = protocol
		}
		out.Clusters = append(out.Clusters, c)
	}
	return out
}

// envoyRoute is rt with its header matchers in the form Envoy reads
// without a deprecation warning: string_match, where the gRPC variant
// writes safe_regex_match for older gRPC clients (headerRegex).
func envoyRoute(rt *routev3.Route) *routev3.Route {
	out := rt
	for i, h := range rt.GetMatch().GetHeaders() {
		//lint:ignore SA1019 the field the gRPC variant writes (headerRegex)
		re := h.GetSafeRegexMatch()
		if re == nil {
			continue
		}
		if out == rt {
			out = proto.Clone(rt).(*routev3.Route)
		}
		out.Match.Headers[i] = &routev3.HeaderMatcher{Name: h.Name, HeaderMatchSpecifier: &routev3.HeaderMatcher_StringMatch{
			StringMatch: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_SafeRegex{SafeRegex: &matcherv3.RegexMatcher{Regex: re.Regex}}},
		}}
	}
	return out
}

func egressListener(egress netip.AddrPort) *listenerv3.Listener {
	hcm := &hcmv3.HttpConnectionManager{
		StatPrefix: EgressName,
		CodecType:  hcmv3.HttpConnectionManager_AUTO,
		RouteSpecifier: &hcmv3.HttpConnectionManager_Rds{Rds: &hcmv3.Rds{
			ConfigSource:    ads(),
			RouteConfigName: EgressName,
		}},
		HttpFilters: []*hcmv3.HttpFilter{{
			Name:       routerFilter,
			ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(&routerv3.Router{})},
		}},
	}
	return &listenerv3.Listener{
		Name: EgressName,
		Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
			Address:       egress.Addr().String(),
			PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: uint32(egress.Port())},
		}}},
		FilterChains: []*listenerv3.FilterChain{{
			Filters: []*listenerv3.Filter{{
				Name:       hcmFilter,
				ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: mustAny(hcm)},
			}},
		}},
	}
}
