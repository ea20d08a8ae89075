package registry

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"strconv"
	"strings"

	"github.com/lanesdev/lanes/lane"
)

// DefaultWeight is the weight of an instance that does not set one.
const DefaultWeight = 100

// MaxWeight bounds Instance.Weight so that weight sums cannot overflow.
const MaxWeight = 1_000_000

// Instance is one running copy of a service, as registered.
//
// An Instance is a value: the registry and the routing engine copy it and
// never change it after registration. Treat Labels as read-only once the
// instance has been handed to a Registry.
type Instance struct {
	ID      string            `json:"id"`                // unique within the service
	Service string            `json:"service"`           // for example "orders"
	Addr    string            `json:"addr"`              // host:port
	Lane    string            `json:"lane,omitempty"`    // "" is the baseline
	Zone    string            `json:"zone,omitempty"`    // for same-zone preference
	Weight  int               `json:"weight"`            // relative share; 0 means DefaultWeight
	Drain   bool              `json:"drain,omitempty"`   // drained: takes no new requests (the contract's weight 0)
	Labels  map[string]string `json:"labels,omitempty"`  // matched by dynamic tag rules
	Version string            `json:"version,omitempty"` // the build the instance runs
	Host    string            `json:"host,omitempty"`    // the machine or pod it runs on
	// Scope is the lane scope of the credential that registered the
	// instance, which bounds the lanes that dynamic tag rules may move it
	// into (MayJoin). The control plane sets it, whatever the client sent:
	// "" for an unrestricted registration (the admin token, or a process
	// with the registry's own credentials), ScopeBaseline for a baseline
	// token, or the lane of a lane token.
	Scope string `json:"scope,omitempty"`
}

// LabelPath is the label that says how an instance joined lanes: its
// data path, PathSDK (the Serve helpers set it), PathSidecar (lanes
// sidecar), PathDev (lanes dev) or PathTunnel (lanes dev through its
// tunnel, registered by the control plane at the tunnel's relay). Like every label it is the instance's
// own word: it informs (lanes route explain shows it) and decides nothing.
const LabelPath = "lanes.path"

// The values of LabelPath.
const (
	PathSDK     = "sdk"
	PathSidecar = "sidecar"
	PathDev     = "dev"
	PathTunnel  = "tunnel"
)

// The labels of an instance that the control plane registers for lanes
// dev's tunnel (with LabelPath PathTunnel): the address of the machine at
// the other end, as the control plane sees it (where the instance really
// runs), and since when (RFC 3339, UTC).
const (
	LabelTunnelFrom  = "lanes.tunnel.from"
	LabelTunnelSince = "lanes.tunnel.since"
)

// ScopeBaseline is the Scope of an instance registered with a baseline
// token. It is no lane name, so that it matches no lane.
const ScopeBaseline = "@baseline"

// MayJoin reports whether a dynamic tag rule may move the instance into lane
// l: any lane for an unrestricted registration, the token's own lane for a
// lane token's, none for a baseline token's. The credential that registered
// an instance chose its labels and its port, and so would choose the lanes
// that rules on them give it.
func (in Instance) MayJoin(l string) bool { return in.Scope == "" || in.Scope == l }

// EffectiveWeight is the weight the load balancer uses: 0 for a drained
// instance, DefaultWeight when Weight is unset.
func (in Instance) EffectiveWeight() int {
	switch {
	case in.Drain:
		return 0
	case in.Weight <= 0:
		return DefaultWeight
	default:
		return in.Weight
	}
}

// Baseline reports whether the instance is registered in the baseline.
func (in Instance) Baseline() bool { return in.Lane == "" }

// Clone returns a copy of in that shares no memory with it.
func (in Instance) Clone() Instance {
	in.Labels = maps.Clone(in.Labels)
	return in
}

// Equal reports whether two instances are registered identically.
func (in Instance) Equal(o Instance) bool {
	return in.ID == o.ID && in.Service == o.Service && in.Addr == o.Addr &&
		in.Lane == o.Lane && in.Zone == o.Zone && in.Weight == o.Weight &&
		in.Drain == o.Drain && in.Version == o.Version && in.Host == o.Host && in.Scope == o.Scope &&
		maps.Equal(in.Labels, o.Labels)
}

// FieldError names the field of a registration that is wrong and why.
type FieldError struct {
	Field string // for example "lane" or "labels.version"
	Value string
	Msg   string
}

func (e *FieldError) Error() string {
	return fmt.Sprintf("instance field %s: %q: %s", e.Field, e.Value, e.Msg)
}

// Normalize validates in and returns it with its lane normalised and its
// weight defaulted. Every backend calls it on Register, so that the rest of
// the system sees only valid instances.
func Normalize(in Instance) (Instance, error) {
	in = in.Clone()
	if err := checkName("service", in.Service); err != nil {
		return in, err
	}
	if err := checkName("id", in.ID); err != nil {
		return in, err
	}
	if err := CheckAddr(in.Addr); err != nil {
		return in, &FieldError{Field: "addr", Value: in.Addr, Msg: err.Error()}
	}
	if in.Lane != "" {
		l, err := lane.Parse(in.Lane)
		if err != nil {
			msg := err.Error()
			var ne *lane.NameError
			if errors.As(err, &ne) {
				msg = "breaks the lane-name rule " + string(ne.Rule)
			}
			return in, &FieldError{Field: "lane", Value: in.Lane, Msg: msg}
		}
		in.Lane = l
	}
	if in.Scope != "" && in.Scope != ScopeBaseline && !lane.Valid(in.Scope) {
		return in, &FieldError{Field: "scope", Value: in.Scope, Msg: "must be a lane name or " + ScopeBaseline}
	}
	if in.Weight < 0 || in.Weight > MaxWeight {
		return in, &FieldError{Field: "weight", Value: strconv.Itoa(in.Weight), Msg: fmt.Sprintf("must be within 0..%d", MaxWeight)}
	}
	if in.Weight == 0 {
		in.Weight = DefaultWeight
	}
	for _, f := range []struct{ name, v string }{{"zone", in.Zone}, {"version", in.Version}, {"host", in.Host}} {
		if len(f.v) > 253 || strings.ContainsAny(f.v, "\x00\r\n") {
			return in, &FieldError{Field: f.name, Value: f.v, Msg: "must be at most 253 printable characters"}
		}
	}
	for k, v := range in.Labels {
		if k == "" || len(k) > 253 || strings.ContainsAny(k, "\x00\r\n") {
			return in, &FieldError{Field: "labels", Value: k, Msg: "a label key must be 1 to 253 printable characters"}
		}
		if len(v) > 1024 || strings.ContainsAny(v, "\x00") {
			return in, &FieldError{Field: "labels." + k, Value: v, Msg: "a label value must be at most 1024 characters"}
		}
	}
	return in, nil
}

// CheckUpdate validates next as the new registration of the lease that holds
// cur: it returns next normalised, or an error when next is invalid or tries
// to change the service or the id. Every backend's Lease.Update calls it.
func CheckUpdate(cur, next Instance) (Instance, error) {
	next, err := Normalize(next)
	if err != nil {
		return next, err
	}
	if next.ID != cur.ID || next.Service != cur.Service {
		return next, &FieldError{Field: "id", Value: next.Service + "/" + next.ID, Msg: "a lease cannot change its service or id"}
	}
	return next, nil
}

// checkName accepts the characters that are safe in an etcd key segment and a
// URL host: letters, digits, '-', '_' and '.'.
func checkName(field, v string) error {
	if v == "" || len(v) > 253 {
		return &FieldError{Field: field, Value: v, Msg: "must be 1 to 253 characters"}
	}
	for i := 0; i < len(v); i++ {
		c := v[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return &FieldError{Field: field, Value: v, Msg: "only letters, digits, '-', '_' and '.' are allowed"}
		}
	}
	if v == "." || v == ".." {
		return &FieldError{Field: field, Value: v, Msg: "must not be a dot segment"}
	}
	return nil
}

// CheckService validates a service name as Normalize does.
func CheckService(name string) error { return checkName("service", name) }

// CheckAddr checks that addr is host:port with a port in 1..65535.
func CheckAddr(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("not host:port")
	}
	if host == "" {
		return fmt.Errorf("empty host")
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 1 || p > 65535 {
		return fmt.Errorf("port %q is not within 1..65535", port)
	}
	return nil
}
