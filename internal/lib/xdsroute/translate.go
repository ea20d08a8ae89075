// Package xdsroute translates the fleet (the registry's instances) and the
// policy into xDS resources for gRPC's proxyless clients: per service a
// Listener, a RouteConfiguration, the clusters of its lanes and of its lane
// chains, and their endpoints; and, from those, the variant an Envoy proxy
// takes (ForEnvoy). It is a pure function, apart from serving
// (internal/app/xds serves what it makes): the same fleet, policy, caller
// and time make the same resources.
//
// What the resources can and cannot say of the routing contract is listed
// in docs/xds.md.
package xdsroute

import (
	"cmp"
	"fmt"
	"math"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	aggregatev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/clusters/aggregate/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/policy"
	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

// Fleet is what the resources are made from: the policy in force, the
// instances of every service, and the time (lanes expire).
type Fleet struct {
	Policy    *policy.Policy // nil is the empty policy
	Instances []registry.Instance
	Now       time.Time
}

// Caller is where the client that asks runs, from its xDS node's locality:
// its zone, and its host as the locality's sub-zone. Only the endpoints'
// priorities depend on it.
type Caller struct {
	Zone, Host string
}

// Resources are the xDS resources of a fleet, for one caller.
type Resources struct {
	Listeners []*listenerv3.Listener
	Routes    []*routev3.RouteConfiguration
	Clusters  []*clusterv3.Cluster
	Endpoints []*endpointv3.ClusterLoadAssignment
}

// MetadataKey is the filter-metadata key under which clusters carry their
// service and lane, and endpoints their instance id (clients ignore it; it
// tells a reader, and the tests, what each resource is).
const MetadataKey = "lanes"

// Cluster names. A service's names are its own: nothing else starts with
// "<service>/". The listener and the route configuration of a service, and
// its one virtual host, are named after it: a client asks for
// xds:///<service>.
func laneCluster(svc, l string) string   { return svc + "/lane/" + l }
func baselineCluster(svc string) string  { return svc + "/baseline" }
func chainCluster(svc, l string) string  { return svc + "/chain/" + l }
func canaryCluster(svc, l string) string { return svc + "/canary/" + l }

// The names of the filter and the cluster type, as clients know them.
const (
	routerFilter         = "envoy.filters.http.router"
	aggregateClusterType = "envoy.clusters.aggregate"
)

// regexOfLaneValue matches an x-lane value naming lane l.
func regexOfLaneValue(l string) string { return ows + caseless(l) + ows }

// regexOfBaggageLane matches a baggage list whose last lane member's value
// matches value.
func regexOfBaggageLane(value string) string {
	return `(?:.*,)?` + ows + lane.BaggageKey + ows + `=` + ows + value + ows + `(?:;[^,]*)?` + notLaneMembers
}

// Header names, as routing.md writes them.
const (
	headerLane    = lane.Header
	headerBaggage = lane.BaggageHeader
)

// The regular expressions (RE2, matched whole) of the lane sources. The
// lane-name rule: trimmed of spaces and tabs, then 1 to 63 characters of
// a-z, 0-9 and '-' in either case, starting and ending with a letter or
// digit. Case is spelled out per letter: RE2's (?i) folds Unicode, so that
// it would take the Kelvin sign for a k.
const (
	ows       = `[ \t]*`
	validName = `[a-zA-Z0-9](?:[a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?`
	// notLaneMembers is the rest of a baggage list after its lane member:
	// members of other keys only (of several lane members, the last counts).
	notLaneMembers = `(?:,` + ows + `(?:[^l, \t][^,]*|l(?:[^a,][^,]*)?|la(?:[^n,][^,]*)?|lan(?:[^e,][^,]*)?|lane[^ \t=,][^,]*|lane[ \t]+[^ \t=,][^,]*)?)*`
)

func caseless(l string) string {
	var b strings.Builder
	for i := 0; i < len(l); i++ {
		c := l[i]
		if 'a' <= c && c <= 'z' {
			b.WriteString("[" + string(c) + string(c-'a'+'A') + "]")
		} else {
			b.WriteByte(c) // a digit or '-': no meaning in RE2 outside a class
		}
	}
	return b.String()
}

// Translate makes the resources of fleet f for a client at caller.
//
// Per service S:
//   - the Listener S (the name of the target xds:///S): an API listener
//     whose HttpConnectionManager takes the RouteConfiguration S over ADS
//     and runs the router filter;
//   - the RouteConfiguration S, whose routes, in order, send a request
//     with x-lane naming lane L to the chain cluster of L; a request with
//     any other valid lane name in x-lane to the baseline; a request with
//     x-lane present but invalid, as a baseline request (the canary split);
//     then the same for the baggage member lane when x-lane is absent (the
//     first source present decides); and every other request, as a baseline
//     request;
//   - per lane L, the EDS cluster S/lane/L of its instances (after the
//     policy's tag rules), and the aggregate cluster S/chain/L of its chain
//     [L, fallbacks..., S/baseline] (without the baseline for a strict
//     chain); the client takes the first of them that has an endpoint
//     ready;
//   - the EDS cluster S/baseline, of the instances in no lane;
//   - per canary rule of S, the aggregate cluster S/canary/C [S/lane/C,
//     S/baseline], the rule's weight of a baseline request's route (in
//     hundredths of a percent; the baseline takes the rest).
//
// Drained instances and those of an expired lane are left out. Each
// cluster's endpoints are in localities by zone and host (the sub-zone),
// in priorities: the caller's host first (when the policy turns host
// locality on), then its zone, then the rest.
func Translate(f Fleet, caller Caller) *Resources { return Prepare(f).For(caller) }

// Prepared is a fleet's resources made but for the endpoints, which depend
// on the caller: For makes them, for each caller, sharing the rest.
type Prepared struct {
	shared   Resources // without endpoints
	services []*serviceTranslation
}

// Prepare makes the resources of f that every caller shares.
func Prepare(f Fleet) *Prepared {
	p := f.Policy
	if p == nil {
		p = &policy.Policy{}
	}
	// The lane of each instance is the engine's (the tag rules and the
	// scopes of the credentials that registered the instances).
	eng := routing.New()
	eng.SetPolicy(p)
	defer func() { _ = eng.Close() }()

	bySvc := map[string][]member{}
	for _, in := range f.Instances {
		l := eng.LaneOf(in)
		m := member{in: in, lane: l, live: !in.Drain && in.EffectiveWeight() > 0 && !p.Expired(l, f.Now)}
		bySvc[in.Service] = append(bySvc[in.Service], m)
	}
	services := make([]string, 0, len(bySvc))
	for s := range bySvc {
		services = append(services, s)
	}
	slices.Sort(services)

	od := p.Outlier.WithDefaults()
	pr := &Prepared{}
	for _, svc := range services {
		t := &serviceTranslation{svc: svc, pol: p, members: bySvc[svc], od: od}
		t.build(&pr.shared)
		pr.services = append(pr.services, t)
	}
	return pr
}

// For returns the resources for a client at caller: the shared ones, and
// the endpoints in priorities for the caller. The shared resources are the
// same values in every answer: treat them as read-only.
func (pr *Prepared) For(caller Caller) *Resources {
	r := pr.shared
	r.Endpoints = nil
	for _, t := range pr.services {
		for _, c := range t.eds {
			r.Endpoints = append(r.Endpoints, t.assignment(c.name, c.locs, caller))
		}
	}
	return &r
}

type member struct {
	in   registry.Instance
	lane string
	live bool // not drained, its lane not expired
}

type serviceTranslation struct {
	svc     string
	pol     *policy.Policy
	members []member
	od      policy.Outlier
	eds     []edsOf // the EDS clusters, for the endpoints of each caller
}

type edsOf struct {
	name string
	locs []locality
}

// lanes are the lanes the service's routes know: those of its instances
// and those the policy names.
func (t *serviceTranslation) lanes() []string {
	set := map[string]bool{}
	for _, m := range t.members {
		if m.lane != "" {
			set[m.lane] = true
		}
	}
	for l, s := range t.pol.Lanes {
		set[l] = true
		for _, f := range s.Fallback {
			set[f] = true
		}
	}
	for _, c := range t.pol.Canary {
		if c.Service == t.svc {
			set[c.Lane] = true
		}
	}
	for _, tr := range t.pol.Tags {
		if tr.Service == t.svc {
			set[tr.Lane] = true
		}
	}
	out := make([]string, 0, len(set))
	for l := range set {
		out = append(out, l)
	}
	slices.Sort(out)
	return out
}

func (t *serviceTranslation) build(r *Resources) {
	svc := t.svc
	lanes := t.lanes()

	// Leaf clusters: the baseline and each lane.
	r.Clusters = append(r.Clusters, t.edsCluster(baselineCluster(svc), "", t.baselineEjectionPercent()))
	t.eds = append(t.eds, edsOf{baselineCluster(svc), t.localities("")})
	for _, l := range lanes {
		r.Clusters = append(r.Clusters, t.edsCluster(laneCluster(svc, l), l, 100))
		t.eds = append(t.eds, edsOf{laneCluster(svc, l), t.localities(l)})
	}

	// The chain of each lane, and its routes.
	var xlane, bag []*routev3.Route
	for _, l := range lanes {
		chain, strict := t.pol.Chain(l)
		var members []string
		for _, c := range chain {
			members = append(members, laneCluster(svc, c))
		}
		if !strict {
			members = append(members, baselineCluster(svc))
		}
		r.Clusters = append(r.Clusters, aggregate(chainCluster(svc, l), svc, l, members))
		to := clusterAction(chainCluster(svc, l))
		xlane = append(xlane, route("lane "+l+" by "+headerLane, headerRegex(headerLane, regexOfLaneValue(l)), to))
		bag = append(bag, route("lane "+l+" by "+headerBaggage, headerRegex(headerBaggage, regexOfBaggageLane(caseless(l))), to))
	}

	// A baseline request: the canary split, else the baseline.
	split := t.baselineRequest(r)
	toBaseline := clusterAction(baselineCluster(svc))
	routes := xlane
	routes = append(routes,
		// Another valid lane: its chain is [L, baseline].
		route("another lane by "+headerLane, headerRegex(headerLane, ows+validName+ows), toBaseline),
		// x-lane present decides, even when invalid: a baseline request.
		route("invalid lane by "+headerLane, headerPresent(headerLane), split),
	)
	routes = append(routes, bag...)
	routes = append(routes,
		route("another lane by "+headerBaggage, headerRegex(headerBaggage, regexOfBaggageLane(validName)), toBaseline),
		route("baseline", nil, split),
	)
	r.Routes = append(r.Routes, &routev3.RouteConfiguration{
		Name: svc,
		VirtualHosts: []*routev3.VirtualHost{{
			Name:    svc,
			Domains: []string{"*"},
			Routes:  routes,
		}},
	})
	r.Listeners = append(r.Listeners, apiListener(svc))
}

// baselineRequest is the action of a baseline request: the service's canary
// rules in order, each to its canary cluster with its share, and the
// baseline with the rest.
func (t *serviceTranslation) baselineRequest(r *Resources) *routev3.Route_Route {
	svc := t.svc
	var wcs []*routev3.WeightedCluster_ClusterWeight
	left := uint32(10000)
	seen := map[string]bool{}
	for _, c := range t.pol.Canary {
		w := min(uint32(math.Round(c.Percent*100)), left)
		if c.Service != svc || w == 0 || seen[c.Lane] {
			continue
		}
		seen[c.Lane] = true
		left -= w
		name := canaryCluster(svc, c.Lane)
		r.Clusters = append(r.Clusters, aggregate(name, svc, c.Lane, []string{laneCluster(svc, c.Lane), baselineCluster(svc)}))
		wcs = append(wcs, &routev3.WeightedCluster_ClusterWeight{Name: name, Weight: wrapperspb.UInt32(w)})
	}
	if len(wcs) == 0 {
		return clusterAction(baselineCluster(svc))
	}
	if left > 0 {
		wcs = append(wcs, &routev3.WeightedCluster_ClusterWeight{Name: baselineCluster(svc), Weight: wrapperspb.UInt32(left)})
	}
	return &routev3.Route_Route{Route: &routev3.RouteAction{
		ClusterSpecifier: &routev3.RouteAction_WeightedClusters{WeightedClusters: &routev3.WeightedCluster{Clusters: wcs}},
	}}
}

// baselineEjectionPercent keeps at least one baseline instance out of
// ejection: the contract's baseline is never emptied by outlier detection.
func (t *serviceTranslation) baselineEjectionPercent() uint32 {
	n := 0
	for _, m := range t.members {
		if m.live && m.lane == "" {
			n++
		}
	}
	if n <= 1 {
		return 0
	}
	return uint32(100 * (n - 1) / n)
}

// locality is the live instances of one lane in one zone and host, as
// endpoints, made once for every caller.
type locality struct {
	zone, host string
	endpoints  []*endpointv3.LbEndpoint // in id order
	weight     uint64                   // their sum, at most 2^32-1
}

// localities are the live instances of lane l (the baseline for ""), in
// localities by zone and host, in zone and host order.
func (t *serviceTranslation) localities(l string) []locality {
	type loc struct{ zone, host string }
	groups := map[loc][]registry.Instance{}
	for _, m := range t.members {
		if m.live && m.lane == l {
			k := loc{m.in.Zone, m.in.Host}
			groups[k] = append(groups[k], m.in)
		}
	}
	out := make([]locality, 0, len(groups))
	for k, insts := range groups {
		slices.SortFunc(insts, func(a, b registry.Instance) int { return strings.Compare(a.ID, b.ID) })
		weights := make([]uint64, len(insts))
		for i, in := range insts {
			weights[i] = uint64(in.EffectiveWeight())
		}
		lc := locality{zone: k.zone, host: k.host}
		for i, w := range fitWeights(weights) {
			lc.weight += w
			lc.endpoints = append(lc.endpoints, lbEndpoint(insts[i], uint32(w)))
		}
		out = append(out, lc)
	}
	slices.SortFunc(out, func(a, b locality) int { return cmp.Or(cmp.Compare(a.zone, b.zone), cmp.Compare(a.host, b.host)) })
	return out
}

// assignment is the ClusterLoadAssignment of cluster name, of the
// localities locs, in priorities for the caller.
func (t *serviceTranslation) assignment(name string, locs []locality, caller Caller) *endpointv3.ClusterLoadAssignment {
	level := func(lc *locality) int {
		switch {
		case t.pol.Locality.Host && caller.Host != "" && lc.host == caller.Host:
			return 0
		case caller.Zone != "" && lc.zone == caller.Zone:
			return 1
		default:
			return 2
		}
	}
	// Priorities are numbered densely from 0, as clients require.
	var used [3]bool
	for i := range locs {
		used[level(&locs[i])] = true
	}
	var prio [3]uint32
	n := uint32(0)
	for i, u := range used {
		prio[i] = n
		if u {
			n++
		}
	}
	cla := &endpointv3.ClusterLoadAssignment{ClusterName: name}
	for p := range n {
		var idx []int
		var ws []uint64
		for i := range locs {
			if prio[level(&locs[i])] == p {
				idx = append(idx, i)
				ws = append(ws, locs[i].weight)
			}
		}
		// The localities' weights of one priority sum to at most 2^32-1.
		for j, w := range fitWeights(ws) {
			lc := &locs[idx[j]]
			cla.Endpoints = append(cla.Endpoints, &endpointv3.LocalityLbEndpoints{
				Locality:            &corev3.Locality{Zone: lc.zone, SubZone: lc.host},
				Priority:            p,
				LbEndpoints:         lc.endpoints,
				LoadBalancingWeight: wrapperspb.UInt32(uint32(w)),
			})
		}
	}
	return cla
}

// fitWeights scales ws down, where their sum exceeds 2^32-1, so that it
// does not, keeping each at least 1.
func fitWeights(ws []uint64) []uint64 {
	var sum uint64
	for _, w := range ws {
		sum += w
	}
	if sum <= math.MaxUint32 {
		return ws
	}
	out := make([]uint64, len(ws))
	limit := uint64(math.MaxUint32) - uint64(len(ws)) // room for the rounding up to 1
	for i, w := range ws {
		out[i] = max(1, uint64(float64(w)*float64(limit)/float64(sum)))
	}
	return out
}

func lbEndpoint(in registry.Instance, w uint32) *endpointv3.LbEndpoint {
	host, port, _ := net.SplitHostPort(in.Addr)
	pn, _ := strconv.ParseUint(port, 10, 16)
	return &endpointv3.LbEndpoint{
		HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
			Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
				Address:       host,
				PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: uint32(pn)},
			}}},
		}},
		HealthStatus:        corev3.HealthStatus_HEALTHY,
		LoadBalancingWeight: wrapperspb.UInt32(w),
		Metadata:            metadata(map[string]string{"id": in.ID}),
	}
}

func metadata(kv map[string]string) *corev3.Metadata {
	fields := map[string]*structpb.Value{}
	for k, v := range kv {
		fields[k] = structpb.NewStringValue(v)
	}
	return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{MetadataKey: {Fields: fields}}}
}

func clusterMetadata(svc, l, kind string) *corev3.Metadata {
	return metadata(map[string]string{"service": svc, "lane": l, "kind": kind})
}

// ads is the config source of the resources a resource names: the same
// ADS stream.
func ads() *corev3.ConfigSource {
	return &corev3.ConfigSource{
		ResourceApiVersion:    corev3.ApiVersion_V3,
		ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}},
	}
}

func (t *serviceTranslation) edsCluster(name, l string, ejectionPercent uint32) *clusterv3.Cluster {
	od := outlierDetectionProto(t.od, ejectionPercent)
	kind := "lane"
	if l == "" {
		kind = "baseline"
	}
	return &clusterv3.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
		EdsClusterConfig:     &clusterv3.Cluster_EdsClusterConfig{EdsConfig: ads(), ServiceName: name},
		LbPolicy:             clusterv3.Cluster_ROUND_ROBIN,
		OutlierDetection:     od,
		Metadata:             clusterMetadata(t.svc, l, kind),
	}
}

// aggregate is an aggregate cluster of members, tried in order. Its
// lb_policy stays unset (ROUND_ROBIN): gRPC clients refuse
// CLUSTER_PROVIDED, which Envoy wants there (ForEnvoy sets it).
func aggregate(name, svc, l string, members []string) *clusterv3.Cluster {
	kind := "chain"
	if strings.Contains(name, "/canary/") {
		kind = "canary"
	}
	return &clusterv3.Cluster{
		Name: name,
		ClusterDiscoveryType: &clusterv3.Cluster_ClusterType{ClusterType: &clusterv3.Cluster_CustomClusterType{
			Name:        aggregateClusterType,
			TypedConfig: mustAny(&aggregatev3.ClusterConfig{Clusters: members}),
		}},
		Metadata: clusterMetadata(svc, l, kind),
	}
}

// outlierDetectionProto maps the policy's outlier settings with every field
// set: a client that reads a field it finds unset
// may take it for a value of its own (grpc-js failed on unset success-rate
// fields).
func outlierDetectionProto(o policy.Outlier, ejectionPercent uint32) *clusterv3.OutlierDetection {
	errs := uint32(min(o.Errors, math.MaxUint32))
	u := wrapperspb.UInt32
	return &clusterv3.OutlierDetection{
		// Envoy: errors consecutive failures eject.
		Consecutive_5Xx:                        u(errs),
		EnforcingConsecutive_5Xx:               u(100),
		ConsecutiveGatewayFailure:              u(errs),
		EnforcingConsecutiveGatewayFailure:     u(100),
		SplitExternalLocalOriginErrors:         false,
		ConsecutiveLocalOriginFailure:          u(errs),
		EnforcingConsecutiveLocalOriginFailure: u(100),
		EnforcingLocalOriginSuccessRate:        u(0),
		// The window is the interval the failures are counted in; an
		// ejection lasts `ejection`, every time (no growth).
		Interval:              durationpb.New(o.Window.D()),
		BaseEjectionTime:      durationpb.New(o.Ejection.D()),
		MaxEjectionTime:       durationpb.New(o.Ejection.D()),
		MaxEjectionTimeJitter: durationpb.New(0),
		MaxEjectionPercent:    u(ejectionPercent),
		// gRPC (which has no consecutive-failure detector): an instance
		// that failed more than half of at least `errors` calls in the
		// interval is ejected, whatever the others do.
		FailurePercentageThreshold:            u(50),
		EnforcingFailurePercentage:            u(100),
		EnforcingFailurePercentageLocalOrigin: u(100),
		FailurePercentageMinimumHosts:         u(1),
		FailurePercentageRequestVolume:        u(errs),
		// Success rate: set in full, enforced never.
		EnforcingSuccessRate:     u(0),
		SuccessRateMinimumHosts:  u(5),
		SuccessRateRequestVolume: u(100),
		SuccessRateStdevFactor:   u(1900),
		// No active health checks; no degraded hosts.
		SuccessfulActiveHealthCheckUnejectHost: wrapperspb.Bool(false),
		AlwaysEjectOneHost:                     wrapperspb.Bool(false),
		DetectDegradedHosts:                    wrapperspb.Bool(false),
	}
}

func apiListener(svc string) *listenerv3.Listener {
	hcm := &hcmv3.HttpConnectionManager{
		StatPrefix: svc,
		RouteSpecifier: &hcmv3.HttpConnectionManager_Rds{Rds: &hcmv3.Rds{
			ConfigSource:    ads(),
			RouteConfigName: svc,
		}},
		HttpFilters: []*hcmv3.HttpFilter{{
			Name:       routerFilter,
			ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(&routerv3.Router{})},
		}},
	}
	return &listenerv3.Listener{
		Name:        svc,
		ApiListener: &listenerv3.ApiListener{ApiListener: mustAny(hcm)},
	}
}

func route(name string, h *routev3.HeaderMatcher, action *routev3.Route_Route) *routev3.Route {
	m := &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: ""}}
	if h != nil {
		m.Headers = []*routev3.HeaderMatcher{h}
	}
	return &routev3.Route{Name: name, Match: m, Action: action}
}

func clusterAction(name string) *routev3.Route_Route {
	return &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: name}}}
}

func headerRegex(name, re string) *routev3.HeaderMatcher {
	// safe_regex_match rather than string_match, its successor: gRPC C-core before 1.56 (Python's
	// grpcio 1.51 in Debian 12, for one) refuses a route configuration with a string_match
	// ("Invalid route header matcher specified"); every gRPC client reads safe_regex_match.
	//lint:ignore SA1019 the field that older gRPC clients read (above)
	return &routev3.HeaderMatcher{Name: name, HeaderMatchSpecifier: &routev3.HeaderMatcher_SafeRegexMatch{SafeRegexMatch: &matcherv3.RegexMatcher{Regex: re}}}
}

func headerPresent(name string) *routev3.HeaderMatcher {
	return &routev3.HeaderMatcher{Name: name, HeaderMatchSpecifier: &routev3.HeaderMatcher_PresentMatch{PresentMatch: true}}
}

func mustAny(m proto.Message) *anypb.Any {
	a, err := anypb.New(m)
	if err != nil {
		panic(fmt.Sprintf("xdsroute: marshalling %T: %v", m, err)) // a message of ours: cannot fail
	}
	return a
}

// NextChange is when the resources of f change by time alone: the next
// lane expiry after f.Now (the zero time for none).
func NextChange(f Fleet) time.Time {
	var next time.Time
	if f.Policy == nil {
		return next
	}
	for _, s := range f.Policy.Lanes {
		if e := s.Expires; e != nil && e.After(f.Now) && (next.IsZero() || e.Before(next)) {
			next = *e
		}
	}
	return next
}
