package xdsroute_test

import (
	"fmt"
	"regexp"
	"slices"
	"strings"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	aggregatev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/clusters/aggregate/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"

	"github.com/lanesdev/lanes/internal/lib/xdsroute"
	"github.com/lanesdev/lanes/internal/testkit/oracle"
)

// evaluator answers a request as a gRPC proxyless client reads the
// resources: the listener of the target, its route configuration, the
// first route whose header matchers all match (RE2, whole value; present),
// its cluster or one of its weighted clusters, an aggregate cluster's
// members in order, and of the first leaf cluster that has an endpoint,
// the endpoints of its first priority. It is written from the xDS
// semantics, not from the translation.
//
// One liberty: a client picks among weighted clusters at random; the
// evaluator picks by the request key's bucket over the weights in order, as
// the model splits keys, so that a split with the right weights in the
// right order answers each key as the model does.
//
// The Envoy variant is read as Envoy reads it: its one listener's
// connection manager, the virtual host whose domains hold the authority the
// service calls (S), then the same. An aggregate cluster must carry
// CLUSTER_PROVIDED there, and must not for gRPC.
type evaluator struct {
	variant   xdsroute.Variant
	egress    *hcmv3.HttpConnectionManager // the Envoy variant's listener's
	listeners map[string]*hcmv3.HttpConnectionManager
	routes    map[string]*routev3.RouteConfiguration
	clusters  map[string]*clusterv3.Cluster
	endpoints map[string]*endpointv3.ClusterLoadAssignment
}

func newEvaluator(r *xdsroute.Resources) (*evaluator, error) {
	e := &evaluator{listeners: map[string]*hcmv3.HttpConnectionManager{}, routes: map[string]*routev3.RouteConfiguration{},
		clusters: map[string]*clusterv3.Cluster{}, endpoints: map[string]*endpointv3.ClusterLoadAssignment{}}
	for _, l := range r.Listeners {
		hcm := &hcmv3.HttpConnectionManager{}
		if l.GetApiListener() == nil {
			// Envoy's: a socket listener, one filter chain, one filter.
			if len(r.Listeners) != 1 || len(l.FilterChains) != 1 || len(l.FilterChains[0].Filters) != 1 {
				return nil, fmt.Errorf("listener %s: want Envoy's one listener with one filter", l.Name)
			}
			if err := l.FilterChains[0].Filters[0].GetTypedConfig().UnmarshalTo(hcm); err != nil {
				return nil, fmt.Errorf("listener %s: %v", l.Name, err)
			}
			e.variant, e.egress = xdsroute.Envoy, hcm
			continue
		}
		if err := l.GetApiListener().GetApiListener().UnmarshalTo(hcm); err != nil {
			return nil, fmt.Errorf("listener %s: %v", l.Name, err)
		}
		e.listeners[l.Name] = hcm
	}
	for _, rc := range r.Routes {
		e.routes[rc.Name] = rc
		for _, vh := range rc.VirtualHosts {
			for _, rt := range vh.Routes {
				for _, hm := range rt.GetMatch().GetHeaders() {
					//lint:ignore SA1019 the field the gRPC variant writes, and Envoy's must not
					if e.variant == xdsroute.Envoy && hm.GetSafeRegexMatch() != nil {
						return nil, fmt.Errorf("route %q of the Envoy variant has a safe_regex_match", rt.Name)
					}
				}
			}
		}
	}
	for _, c := range r.Clusters {
		if provided := c.LbPolicy == clusterv3.Cluster_CLUSTER_PROVIDED; c.GetClusterType() != nil && provided != (e.variant == xdsroute.Envoy) {
			return nil, fmt.Errorf("aggregate cluster %s of the %s variant has lb_policy %v", c.Name, e.variant, c.LbPolicy)
		}
		e.clusters[c.Name] = c
	}
	for _, a := range r.Endpoints {
		e.endpoints[a.ClusterName] = a
	}
	return e, nil
}

// headers are a request's metadata: a name, its values.
type headers map[string][]string

func (e *evaluator) eval(target string, h headers, key string) (oracle.Answer, error) {
	vh, err := e.virtualHost(target)
	if err != nil {
		return oracle.Answer{}, err
	}
	for _, rt := range vh.Routes {
		ok, err := matches(rt.GetMatch(), h)
		if err != nil {
			return oracle.Answer{}, err
		}
		if !ok {
			continue
		}
		a := rt.GetRoute()
		if a == nil {
			return oracle.Answer{}, fmt.Errorf("route %q has no route action", rt.Name)
		}
		name := a.GetCluster()
		if wc := a.GetWeightedClusters(); wc != nil {
			var total uint64
			for _, c := range wc.Clusters {
				total += uint64(c.GetWeight().GetValue())
			}
			if total == 0 {
				return oracle.Answer{}, fmt.Errorf("route %q: weighted clusters of total weight 0", rt.Name)
			}
			b := oracle.Bucket(key) * total / 10000
			for _, c := range wc.Clusters {
				if w := uint64(c.GetWeight().GetValue()); b < w {
					name = c.Name
					break
				} else {
					b -= w
				}
			}
		}
		return e.serve(name)
	}
	return oracle.Answer{}, fmt.Errorf("no route matched %v", h)
}

// virtualHost is the virtual host a call to target takes: gRPC's, the one
// of the listener named target; Envoy's, the one of its listener's route
// configuration whose domains hold target (exactly, or with a port).
func (e *evaluator) virtualHost(target string) (*routev3.VirtualHost, error) {
	if e.variant == xdsroute.Envoy {
		rc := e.routes[e.egress.GetRds().GetRouteConfigName()]
		if rc == nil {
			return nil, fmt.Errorf("no route configuration %q", e.egress.GetRds().GetRouteConfigName())
		}
		var found *routev3.VirtualHost
		for _, vh := range rc.VirtualHosts {
			if slices.Contains(vh.Domains, target) && slices.Contains(vh.Domains, target+":*") {
				if found != nil {
					return nil, fmt.Errorf("two virtual hosts for %q", target)
				}
				found = vh
			}
		}
		if found == nil {
			return nil, fmt.Errorf("no virtual host for %q", target)
		}
		return found, nil
	}
	hcm := e.listeners[target]
	if hcm == nil {
		return nil, fmt.Errorf("no listener %q", target)
	}
	rc := e.routes[hcm.GetRds().GetRouteConfigName()]
	if rc == nil || len(rc.VirtualHosts) != 1 {
		return nil, fmt.Errorf("no route configuration with one virtual host for %q", target)
	}
	return rc.VirtualHosts[0], nil
}

func matches(m *routev3.RouteMatch, h headers) (bool, error) {
	if m.GetPrefix() != "" {
		return false, fmt.Errorf("route prefix %q: every gRPC method should match", m.GetPrefix())
	}
	for _, hm := range m.Headers {
		vals, present := h[hm.Name]
		value := strings.Join(vals, ",") // gRPC matches several values joined by commas
		switch {
		case hm.GetPresentMatch():
			if !present {
				return false, nil
			}
		case safeRegex(hm) != "":
			re, err := regexp.Compile(`^(?:` + safeRegex(hm) + `)$`)
			if err != nil {
				return false, err
			}
			if !present || !re.MatchString(value) {
				return false, nil
			}
		default:
			return false, fmt.Errorf("header matcher %v not understood", hm)
		}
	}
	return true, nil
}

// serve follows cluster name to the endpoints that serve.
func (e *evaluator) serve(name string) (oracle.Answer, error) {
	leaves, err := e.leaves(name, 0)
	if err != nil {
		return oracle.Answer{}, err
	}
	baseline := false
	for _, c := range leaves {
		md := c.GetMetadata().GetFilterMetadata()[xdsroute.MetadataKey].GetFields()
		if md["kind"].GetStringValue() == "baseline" {
			baseline = true
		}
		cla := e.endpoints[c.GetEdsClusterConfig().GetServiceName()]
		if cla == nil {
			return oracle.Answer{}, fmt.Errorf("no endpoints for cluster %q", c.Name)
		}
		// The first priority that has an endpoint.
		var ids []string
		for p := uint32(0); len(ids) == 0 && p < uint32(len(cla.Endpoints)); p++ {
			for _, le := range cla.Endpoints {
				if le.Priority != p || le.GetLoadBalancingWeight().GetValue() == 0 {
					continue
				}
				for _, ep := range le.LbEndpoints {
					ids = append(ids, ep.GetMetadata().GetFilterMetadata()[xdsroute.MetadataKey].GetFields()["id"].GetStringValue())
				}
			}
		}
		if len(ids) > 0 {
			slices.Sort(ids)
			return oracle.Answer{Eligible: ids, Lane: md["lane"].GetStringValue()}, nil
		}
	}
	if baseline {
		return oracle.Answer{Error: "no_instance"}, nil
	}
	return oracle.Answer{Error: "lane_unavailable"}, nil
}

// leaves are the EDS clusters of cluster name in order: itself, or an
// aggregate's members', depth first.
func (e *evaluator) leaves(name string, depth int) ([]*clusterv3.Cluster, error) {
	c := e.clusters[name]
	if c == nil {
		return nil, fmt.Errorf("no cluster %q", name)
	}
	if depth > 16 {
		return nil, fmt.Errorf("aggregate clusters nested too deep at %q", name)
	}
	ct := c.GetClusterType()
	if ct == nil {
		if c.GetType() != clusterv3.Cluster_EDS {
			return nil, fmt.Errorf("cluster %q is neither EDS nor aggregate", name)
		}
		return []*clusterv3.Cluster{c}, nil
	}
	agg := &aggregatev3.ClusterConfig{}
	if err := ct.GetTypedConfig().UnmarshalTo(agg); err != nil {
		return nil, fmt.Errorf("cluster %q: %v", name, err)
	}
	var out []*clusterv3.Cluster
	for _, m := range agg.Clusters {
		l, err := e.leaves(m, depth+1)
		if err != nil {
			return nil, err
		}
		out = append(out, l...)
	}
	return out, nil
}

// safeRegex is the regular expression of a header matcher that headerRegex made, or "".
func safeRegex(hm *routev3.HeaderMatcher) string {
	if re := hm.GetStringMatch().GetSafeRegex(); re != nil {
		return re.Regex // the Envoy variant's
	}
	//lint:ignore SA1019 the field that translate writes, for older gRPC clients
	return hm.GetSafeRegexMatch().GetRegex()
}
