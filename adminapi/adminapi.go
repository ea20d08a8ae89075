// Package adminapi holds the JSON documents of the lanes admin API
// (docs/api.md): the requests, the answers, the error document and its
// codes. The server (internal/app/admin) and the Go client (adminclient)
// both use these types, so the two cannot drift, and the server does not
// depend on its client.
package adminapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/lanesdev/lanes/policy"
	"github.com/lanesdev/lanes/registry"
)

// Duration is a time.Duration written in JSON as a Go duration string
// ("10s", "1h30m").
type Duration time.Duration

// D returns d as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

func (d Duration) String() string { return time.Duration(d).String() }

// MarshalJSON writes d as a duration string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(d.String()) }

// UnmarshalJSON reads a duration string, or a number of seconds.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		var n float64
		if err := json.Unmarshal(b, &n); err != nil {
			return fmt.Errorf("want a duration string such as \"10s\"")
		}
		*d = Duration(n * float64(time.Second))
		return nil
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("bad duration %q: want a number with a unit, such as \"10s\"", s)
	}
	*d = Duration(v)
	return nil
}

// Error is the error document of every refusal:
//
//	{"error": {"code": "forbidden", "message": "...", "field": "lane", "value": "bob"}}
//
// As a Go error it also carries the HTTP status.
type Error struct {
	Status  int    `json:"-"`
	Code    string `json:"code"`
	Message string `json:"message"`
	// Field names the request field (or, for a policy document, the dotted
	// path in the document) that is wrong, and Value its value.
	Field string `json:"field,omitempty"`
	Value string `json:"value,omitempty"`
	// Line is the line of a policy document the error points at (1-based).
	Line int `json:"line,omitempty"`
}

func (e *Error) Error() string {
	var b strings.Builder
	if e.Line > 0 {
		b.WriteString("line ")
		b.WriteString(strconv.Itoa(e.Line))
		b.WriteString(": ")
	}
	b.WriteString(e.Message)
	if e.Code != "" {
		b.WriteString(" (")
		b.WriteString(e.Code)
		if e.Status != 0 {
			b.WriteString(", HTTP ")
			b.WriteString(strconv.Itoa(e.Status))
		}
		b.WriteString(")")
	}
	return b.String()
}

// Is makes errors.Is(err, &Error{Code: c}) match any *Error with code c.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code
}

// IsCode reports whether err is an *Error with the given code.
func IsCode(err error, code string) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == code
}

// ErrorBody wraps Error on the wire.
type ErrorBody struct {
	Error *Error `json:"error"`
}

// Error codes.
const (
	CodeBadRequest    = "bad_request"     // 400: malformed request or invalid field
	CodeUnauthorized  = "unauthorized"    // 401: no token, or an unknown one
	CodeForbidden     = "forbidden"       // 403: the token's scope does not allow this
	CodeLaneExpired   = "lane_expired"    // 403 on register, 410 on heartbeat: the lane has expired
	CodeNotFound      = "not_found"       // 404
	CodeConflict      = "conflict"        // 409: held by another lane or registration
	CodeLimit         = "limit_exceeded"  // 403 (instances) or 413 (labels, bytes): over a token's limits
	CodeAddress       = "address_refused" // 403: an instance address that no instance may have, or outside the token's addresses
	CodeInvalidPolicy = "invalid_policy"  // 422: the policy document is refused; field and line say where
	CodeUnavailable   = "unavailable"     // 503: etcd cannot be reached
	CodeInternal      = "internal"        // 500
)

// Info describes a running control plane (GET /v1/info).
type Info struct {
	Version string      `json:"version"`
	Etcd    EtcdInfo    `json:"etcd"`
	Admin   AdminInfo   `json:"admin"`
	Gateway GatewayInfo `json:"gateway"`
}

// EtcdInfo says where the control plane keeps its state.
type EtcdInfo struct {
	Endpoints []string `json:"endpoints"`
	Embedded  bool     `json:"embedded"`
	Prefix    string   `json:"prefix"`
}

// AdminInfo describes the admin API.
type AdminInfo struct {
	URL string `json:"url"`
}

// GatewayInfo describes the gateway, so that tools can print the request
// that reaches a lane.
type GatewayInfo struct {
	URL            string   `json:"url"`    // "" when the control plane runs no gateway
	Domain         string   `json:"domain"` // <lane>.<domain> hosts select a lane
	Routes         []Route  `json:"routes"`
	TrustedProxies []string `json:"trusted_proxies,omitempty"`
	Zone           string   `json:"zone,omitempty"`
}

// Route sends the requests for a host or under a path prefix to a service.
// It is both the gateway's setting and what GET /v1/info shows. At least one
// of Host and Prefix should be set; a route with neither matches every
// request (a default route, useful last).
type Route struct {
	// Host matches the request's host exactly, without the port and
	// ignoring case, for example "orders.example.com". For a lane host
	// (<lane>.<domain>) it is compared with the host less its lane label.
	Host string `json:"host,omitempty"`
	// Prefix matches paths that start with it at a segment boundary:
	// "/orders/" and "/orders" both match "/orders" and "/orders/42". It
	// must start with "/".
	Prefix string `json:"prefix,omitempty"`
	// StripPrefix removes Prefix from the path before the request goes
	// upstream, keeping a leading "/".
	StripPrefix bool `json:"strip_prefix,omitempty"`
	// Service is the service the route sends requests to.
	Service string `json:"service"`
}

func (r Route) String() string {
	if r.Host != "" {
		return r.Host + r.Prefix + "=" + r.Service
	}
	return r.Prefix + "=" + r.Service
}

// Service summarises one service (GET /v1/services).
type Service struct {
	Name      string `json:"name"`
	Instances int    `json:"instances"`
	// Lanes lists the effective lanes that have instances of the service,
	// "" standing for the baseline.
	Lanes []string `json:"lanes"`
}

// Instance is a registered instance as the admin API shows it.
type Instance struct {
	registry.Instance
	// EffectiveLane is the lane after the policy's dynamic tag rules.
	EffectiveLane string `json:"effective_lane"`
	// TagsRefused says, for each enabled tag rule that matches the instance
	// but does not apply to it, why: the credential that registered it may
	// not register in the rule's lane (registry.Instance.MayJoin).
	TagsRefused []string `json:"tags_refused,omitempty"`
	// State is "ready", "drained", or "expired" (its lane has expired).
	State string `json:"state"`
	// Registration is the etcd lease that keeps the instance alive, in hex.
	Registration string `json:"registration,omitempty"`
	// Outlier is set while the control plane's outlier detection (the
	// gateway's calls) holds the instance out, or probes it back in.
	Outlier *Outlier `json:"outlier,omitempty"`
}

// Outlier is the outlier-detection state of an instance as the control
// plane's routing engine sees it.
type Outlier struct {
	// State is "ejected", "half-open" (the next request probes it) or
	// "probing".
	State string `json:"state"`
	// Until is when an ejection ends, or a probe is given up.
	Until *time.Time `json:"until,omitempty"`
}

// Lane describes one lane: from the policy, the registry and the claims
// (GET /v1/lanes).
type Lane struct {
	Name      string     `json:"name"`
	Instances int        `json:"instances"`
	Services  []string   `json:"services"`
	Fallback  []string   `json:"fallback,omitempty"`
	Strict    bool       `json:"strict,omitempty"`
	Expires   *time.Time `json:"expires,omitempty"`
	Expired   bool       `json:"expired,omitempty"`
	Clients   []string   `json:"clients,omitempty"` // from the policy
	Claims    []string   `json:"claims,omitempty"`  // client IPs claimed by dev sessions
	InPolicy  bool       `json:"in_policy"`
}

// LaneUpdate is the body of PUT /v1/lanes/{lane}. Exactly one of Expires,
// ExpiresIn and NoExpiry is set.
type LaneUpdate struct {
	Expires   *time.Time `json:"expires,omitempty"`
	ExpiresIn Duration   `json:"expires_in,omitempty"`
	NoExpiry  bool       `json:"no_expiry,omitempty"`
}

// PolicyDocument is the policy in force (GET /v1/policy) or the answer to
// PUT /v1/policy and POST /v1/policy/validate. The answer to PUT and
// validate is the document as it is (or would be) stored: a lane lifetime
// in force that the submitted document does not set is kept, added to Raw
// and listed in Kept.
type PolicyDocument struct {
	Revision int64          `json:"revision"`
	Raw      string         `json:"raw"`
	Policy   *policy.Policy `json:"policy"`
	Kept     []KeptLifetime `json:"kept,omitempty"`
}

// KeptLifetime is a lane lifetime (lanes.<lane>.expires) in force that a
// submitted policy document did not set, and that applying it keeps.
type KeptLifetime struct {
	Lane    string    `json:"lane"`
	Expires time.Time `json:"expires"`
}

// ExplainRequest is the request that GET /v1/explain explains.
type ExplainRequest struct {
	Service string
	Lane    string // the request lane as received; "" for a baseline request
	Zone    string // the caller's zone; "" when unknown
	Host    string // the caller's host; "" when unknown
	Key     string // the request key of sticky canary splits
}

// Explanation answers GET /v1/explain: how a request of a lane, from a
// zone and a host, reaches a service.
type Explanation struct {
	Service string `json:"service"`
	// Lane is the request lane, normalised ("" for a baseline request).
	Lane string `json:"lane"`
	Zone string `json:"zone,omitempty"`
	Host string `json:"host,omitempty"`
	Key  string `json:"key,omitempty"`
	// HostFirst says the policy turns on locality.host.
	HostFirst bool `json:"host_first,omitempty"`
	// Strict says the chain stops before the baseline.
	Strict bool `json:"strict,omitempty"`
	// Steps walks the chain: the lane, each fallback, the baseline.
	Steps []ExplainStep `json:"steps"`
	// Canaries lists the canary splits of the service (baseline requests
	// only).
	Canaries []ExplainCanary `json:"canaries,omitempty"`
	// Decision is the engine's answer; Error is set instead when no
	// instance may serve the request.
	Decision *Decision `json:"decision,omitempty"`
	Error    *Error    `json:"error,omitempty"`
	// Paths are the data paths the service is on: how its instances
	// joined (by the SDK, behind lanes sidecar, through lanes dev), and
	// how its callers route to it (the SDK and the sidecar by this
	// decision; xDS clients by the resources, with the differences of
	// routing.md's table).
	Paths []ExplainPath `json:"paths,omitempty"`
	Notes []string      `json:"notes,omitempty"`
}

// ExplainPath is one data path of a service.
type ExplainPath struct {
	// Side is "instances" (how they joined) or "callers" (how calls reach
	// the service).
	Side string `json:"side"`
	// Path is "sdk", "sidecar", "dev" or "unknown" for instances, "xds"
	// or "envoy" for callers.
	Path  string `json:"path"`
	Count int    `json:"count"`
}

// ExplainStep is one lane of the chain.
type ExplainStep struct {
	Lane string `json:"lane"` // "" for the baseline
	// Role is "lane", "fallback" or "baseline".
	Role      string            `json:"role"`
	Expired   bool              `json:"expired,omitempty"`
	Instances []ExplainInstance `json:"instances"`
	// Eligible lists the instances of the step that may serve, after the
	// host and zone preferences.
	Eligible []string `json:"eligible"`
	// Outcome is "serves", "empty" (the chain goes on), "stops" (a strict
	// chain ends here) or "not reached".
	Outcome string `json:"outcome"`
	Note    string `json:"note,omitempty"`
}

// ExplainInstance is an instance as one step sees it.
type ExplainInstance struct {
	ID   string `json:"id"`
	Addr string `json:"addr"`
	Zone string `json:"zone,omitempty"`
	Host string `json:"host,omitempty"`
	// RegisteredLane is set when a tag rule moved the instance into this
	// step's lane from another.
	RegisteredLane string `json:"registered_lane,omitempty"`
	// State is "eligible", "drained", "expired", "other-host" or
	// "other-zone".
	State string `json:"state"`
}

// ExplainCanary is one canary split of the service.
type ExplainCanary struct {
	Lane      string  `json:"lane"`
	Percent   float64 `json:"percent"`
	Instances int     `json:"instances"` // 0: the split takes no share
}

// Decision is the routing engine's decision for the request.
type Decision struct {
	Lane        string   `json:"lane"`
	RequestLane string   `json:"request_lane"`
	Reason      string   `json:"reason"`
	Eligible    []string `json:"eligible"`
}

// Token is a registration credential (GET/POST /v1/tokens). Exactly one of
// Lane and Baseline is set: a token registers instances in that lane only,
// or in the baseline only.
type Token struct {
	ID       string    `json:"id"`
	Name     string    `json:"name,omitempty"`
	Lane     string    `json:"lane,omitempty"`
	Baseline bool      `json:"baseline,omitempty"`
	Created  time.Time `json:"created"`
	// Limits bound what the token registers; nil, or a zero field, means
	// the control plane's default.
	Limits *Limits `json:"limits,omitempty"`
	// Addresses bound the instance addresses the token registers; nil
	// means any address but the refused ones (see AddressScope).
	Addresses *AddressScope `json:"addresses,omitempty"`
	// Secret is the token itself, returned once by POST /v1/tokens and
	// never stored.
	Secret string `json:"token,omitempty"`
}

// Scope names the token's scope: "lane:<name>" or "baseline".
func (t Token) Scope() string {
	if t.Baseline {
		return "baseline"
	}
	return "lane:" + t.Lane
}

// TokenRequest is the body of POST /v1/tokens.
type TokenRequest struct {
	Name     string  `json:"name,omitempty"`
	Lane     string  `json:"lane,omitempty"`
	Baseline bool    `json:"baseline,omitempty"`
	Limits   *Limits `json:"limits,omitempty"`
	// Addresses, when set, scope the instance addresses of the token.
	Addresses *AddressScope `json:"addresses,omitempty"`
}

// AddressScope bounds the addresses of the instances that a token
// registers. Whatever the scope, no instance may have an address that
// reaches one of the control plane's own listeners (etcd, the admin API,
// the gateway, the collector, NATS), by any IP that reaches it; nor a
// link-local or cloud metadata address unless LinkLocal is set.
type AddressScope struct {
	// CIDRs, when not empty, are the networks an instance's IP must be in,
	// such as "10.0.0.0/8" or "2001:db8::/32".
	CIDRs []string `json:"cidrs,omitempty"`
	// Ports, when not empty, are the ports an instance may have: "8080",
	// or a range "8000-8999".
	Ports []string `json:"ports,omitempty"`
	// LinkLocal allows link-local addresses (169.254.0.0/16, fe80::/10)
	// and cloud metadata addresses (169.254.169.254, fd00:ec2::254,
	// 100.100.100.200); the control plane must allow them too
	// (allow_link_local), or the gateway would not dial them.
	LinkLocal bool `json:"link_local,omitempty"`
}

// Limits bound what one registration token may register. A zero field
// takes the control plane's default for it.
type Limits struct {
	// Instances is how many registrations of the token may be alive at
	// once.
	Instances int `json:"instances,omitempty"`
	// Labels is how many labels one instance may carry.
	Labels int `json:"labels,omitempty"`
	// InstanceBytes bounds the size of one instance, as JSON.
	InstanceBytes int `json:"instance_bytes,omitempty"`
}

// RegisterRequest is the body of POST /v1/instances.
type RegisterRequest struct {
	Instance registry.Instance `json:"instance"`
	TTL      Duration          `json:"ttl,omitempty"`
	// Registration, when set, updates the instance under that registration
	// (which must still hold it; otherwise nothing changes and Held is
	// false in the answer).
	Registration string `json:"registration,omitempty"`
	// IfAbsent registers only when no registration holds the instance's
	// key; used to re-register after a lost lease without overwriting a
	// newer registration.
	IfAbsent bool `json:"if_absent,omitempty"`
}

// Registration is the answer to POST /v1/instances and to heartbeats.
type Registration struct {
	Instance     registry.Instance `json:"instance"`
	Registration string            `json:"registration"`
	TTL          Duration          `json:"ttl"`
	// Held reports whether the registration holds the instance's key.
	Held bool `json:"held"`
}

// HeartbeatRequest is the body of POST /v1/instances/{service}/{id}/heartbeat.
type HeartbeatRequest struct {
	Registration string `json:"registration"`
}

// Claim puts the requests of one client IP in a lane at the gateway, for as
// long as the registration it is attached to lives (GET/POST /v1/claims).
type Claim struct {
	IP   string `json:"ip"`
	Lane string `json:"lane"`
	// Registration is shown to the token that made the registration and
	// to the admin only.
	Registration string    `json:"registration,omitempty"`
	Created      time.Time `json:"created"`
}

// ClaimRequest is the body of POST /v1/claims. IP defaults to the address
// the request comes from; a lane token may claim only that one.
type ClaimRequest struct {
	Lane         string `json:"lane"`
	IP           string `json:"ip,omitempty"`
	Registration string `json:"registration"`
}

// WatchKeepAlive is how often an idle watch stream (GET /v1/watch/...)
// sends a keep-alive line. A client that hears nothing for much longer
// knows that the control plane stalled (see adminclient.BatchStream.Gap).
const WatchKeepAlive = 5 * time.Second

// Batch is one line of GET /v1/watch/instances: registry.Batch on the wire.
type Batch struct {
	Reset    bool    `json:"reset,omitempty"`
	Revision int64   `json:"revision"`
	Events   []Event `json:"events"`
}

// Event is one change in a Batch.
type Event struct {
	Type     string            `json:"type"` // "put" or "delete"
	Instance registry.Instance `json:"instance"`
	Revision int64             `json:"revision"`
}

// Listing is what `lanes ls -o json` prints.
type Listing struct {
	Services  []Service  `json:"services"`
	Instances []Instance `json:"instances"`
	Lanes     []Lane     `json:"lanes"`
}

// PolicyRevision is one applied policy document in the history (GET
// /v1/policy/history).
type PolicyRevision struct {
	Revision int64     `json:"revision"`
	Raw      string    `json:"raw"`
	Applied  time.Time `json:"applied"`
	By       string    `json:"by,omitempty"` // the credential that applied it
}

// PolicyHistory answers GET /v1/policy/history: the documents the API
// applied, newest first, the last 20 at most.
type PolicyHistory struct {
	Revisions []PolicyRevision `json:"revisions"`
}
