package lanesgrpc

import (
	"google.golang.org/grpc/resolver"

	"github.com/lanesdev/lanes/lanesmetrics"
	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

// instanceKey is the key of the registry.Instance attribute of an endpoint.
type instanceKey struct{}

// serviceKey is the key of the *routing.Service attribute of a resolver
// state.
type serviceKey struct{}

// instanceAttr wraps an instance so that attributes.Attributes can compare
// it: registry.Instance holds a map and is not comparable with ==.
type instanceAttr struct{ inst registry.Instance }

// Equal reports whether o is an instanceAttr holding an identical
// registration; attributes.Attributes.Equal calls it.
func (a instanceAttr) Equal(o any) bool {
	b, ok := o.(instanceAttr)
	return ok && a.inst.Equal(b.inst)
}

// setInstance returns a copy of ep that carries inst, the registration the
// endpoint was resolved from. The lanes resolver sets it on every endpoint it
// produces; inst must not be modified afterwards.
func setInstance(ep resolver.Endpoint, inst registry.Instance) resolver.Endpoint {
	ep.Attributes = ep.Attributes.WithValue(instanceKey{}, instanceAttr{inst})
	return ep
}

// instanceFromEndpoint returns the registration stored in ep by setInstance,
// and false if there is none. The returned Instance shares its Labels with
// the attribute: treat it as read-only.
func instanceFromEndpoint(ep resolver.Endpoint) (registry.Instance, bool) {
	a, ok := ep.Attributes.Value(instanceKey{}).(instanceAttr)
	return a.inst, ok
}

// setService returns a copy of s that carries the routing handle of the
// service it lists. The lanes balancer picks through this handle; the lanes
// resolver sets it on every state it produces.
func setService(s resolver.State, svc *routing.Service) resolver.State {
	s.Attributes = s.Attributes.WithValue(serviceKey{}, svc)
	return s
}

// engineKey is the key of the *routing.Engine attribute of a resolver
// state.
type engineKey struct{}

// setEngine returns a copy of s that carries the engine of its service. The
// lanes balancer reads the engine's outlier policy to eject at once an
// instance whose connection fails (see routedcall.MarkFailing); the lanes
// resolver sets it on every state it produces.
func setEngine(s resolver.State, e *routing.Engine) resolver.State {
	s.Attributes = s.Attributes.WithValue(engineKey{}, e)
	return s
}

// engineFromState returns the engine stored in s by setEngine, or nil.
func engineFromState(s resolver.State) *routing.Engine {
	e, _ := s.Attributes.Value(engineKey{}).(*routing.Engine)
	return e
}

// serviceFromState returns the routing handle stored in s by setService, or
// nil.
func serviceFromState(s resolver.State) *routing.Service {
	svc, _ := s.Attributes.Value(serviceKey{}).(*routing.Service)
	return svc
}

// metricsKey is the key of the *lanesmetrics.Requests attribute of a resolver state.
type metricsKey struct{}

// setMetrics returns a copy of s that carries the request counter of its calls (WithMetrics); the
// lanes picker counts every pick in it.
func setMetrics(s resolver.State, m *lanesmetrics.Requests) resolver.State {
	if m == nil {
		return s
	}
	s.Attributes = s.Attributes.WithValue(metricsKey{}, m)
	return s
}

// metricsFromState returns the counter stored in s by setMetrics, or nil.
func metricsFromState(s resolver.State) *lanesmetrics.Requests {
	m, _ := s.Attributes.Value(metricsKey{}).(*lanesmetrics.Requests)
	return m
}
