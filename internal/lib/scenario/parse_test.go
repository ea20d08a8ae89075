package scenario

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/lanesdev/lanes/internal/lib/strictyaml"
)

const oneInstance = "name: n\ninstances:\n  - {id: b1, service: orders, addr: 10.0.0.1:8080}\n"

// TestParseErrors checks that every format error is an *strictyaml.Error
// naming the file, the line and the field.
func TestParseErrors(t *testing.T) {
	for _, c := range []struct {
		name, doc string
		line      int
		field     string
		msg       string
	}{
		{"unknown top-level field", "name: n\nnmae: m\n", 2, "nmae", "unknown field"},
		{"unknown step field", oneInstance + "steps:\n  - request: {}\n    expect_lanes: alice\n", 6, "steps[0].expect_lanes", "unknown field"},
		{"unknown request field", oneInstance + "steps:\n  - request: {lane: a, header: x}\n", 5, "steps[0].request.header", "unknown field"},
		{"unknown instance field", "name: n\ninstances:\n  - {id: b1, service: orders, addr: 10.0.0.1:8080, port: 1}\n", 3, "instances[0].port", "unknown field"},
		{"duplicate key", oneInstance + "steps:\n  - request: {}\n    expect: [b1]\n    expect: [b1]\n", 7, "steps[0].expect", "duplicate key"},
		{"name missing", "instances:\n  - {id: b1, service: orders, addr: 10.0.0.1:8080}\nsteps:\n  - request: {}\n", 1, "name", "required"},
		{"instances missing", "name: n\nsteps:\n  - request: {}\n", 1, "instances", "required"},
		{"steps missing", oneInstance, 1, "steps", "required"},
		{"empty steps", oneInstance + "steps: []\n", 4, "steps", "required"},
		{"bad duration", oneInstance + "steps:\n  - at: 5\n    request: {}\n", 5, "steps[0].at", "bad duration"},
		{"bad duration unit", oneInstance + "steps:\n  - at: 5 parsecs\n    request: {}\n", 5, "steps[0].at", "bad duration"},
		{"negative at", oneInstance + "steps:\n  - at: -1s\n    request: {}\n", 5, "steps[0].at", "negative"},
		{"at decreases", oneInstance + "steps:\n  - at: 10s\n    request: {}\n  - request: {}\n  - at: 9s\n    request: {}\n", 8, "steps[2].at", "time goes back: 9s is before 10s"},
		{"both request and report", oneInstance + "steps:\n  - request: {}\n    report: {instance: b1, ok: true}\n", 5, "steps[0]", "has both"},
		{"neither request nor report", oneInstance + "steps:\n  - request: {}\n  - at: 1s\n    expect: [b1]\n", 6, "steps[1]", "has neither"},
		{"expectation on a report", oneInstance + "steps:\n  - report: {instance: b1, ok: false}\n    expect: [b1]\n", 6, "steps[0].expect", "a report step takes no expectation"},
		{"expect_error on a report", oneInstance + "steps:\n  - report: {instance: b1, ok: false}\n    expect_error: no_instance\n", 6, "steps[0].expect_error", "a report step takes no expectation"},
		{"unknown instance in report", oneInstance + "steps:\n  - report: {instance: b9, ok: false}\n", 5, "steps[0].report.instance", `unknown instance "b9"`},
		{"report without ok", oneInstance + "steps:\n  - report: {instance: b1}\n", 5, "steps[0].report.ok", "required"},
		{"report without instance", oneInstance + "steps:\n  - report: {ok: true}\n", 5, "steps[0].report.instance", "required"},
		{"report not a mapping", oneInstance + "steps:\n  - report:\n", 5, "steps[0].report", "want a mapping"},
		{"report of an ambiguous id", "name: n\ninstances:\n  - {id: x, service: orders, addr: 10.0.0.1:8080}\n  - {id: x, service: payments, addr: 10.0.0.2:8080}\nsteps:\n  - report: {instance: x, ok: false}\n", 6, "steps[0].report.instance", "several services"},
		{"report with a wrong service", oneInstance + "steps:\n  - report: {service: payments, instance: b1, ok: false}\n", 5, "steps[0].report.service", `unknown service "payments"`},
		{"duplicate instance id", "name: n\ninstances:\n  - {id: b1, service: orders, addr: 10.0.0.1:8080}\n  - {id: b1, service: orders, addr: 10.0.0.2:8080}\nsteps:\n  - request: {}\n", 4, "instances[1].id", `duplicate instance id "b1" in service "orders" (first at line 3)`},
		{"instance without addr", "name: n\ninstances:\n  - {id: b1, service: orders}\nsteps:\n  - request: {}\n", 3, "instances[0].addr", "required"},
		{"addr without port", "name: n\ninstances:\n  - id: b1\n    service: orders\n    addr: 10.0.0.1\nsteps:\n  - request: {}\n", 5, "instances[0].addr", "not host:port"},
		{"addr with a bad port", "name: n\ninstances:\n  - {id: b1, service: orders, addr: 10.0.0.1:99999}\nsteps:\n  - request: {}\n", 3, "instances[0].addr", "not within 1..65535"},
		{"invalid instance lane", "name: n\ninstances:\n  - id: b1\n    service: orders\n    addr: 10.0.0.1:8080\n    lane: -alice\nsteps:\n  - request: {}\n", 6, "instances[0].lane", "starts-or-ends"},
		{"invalid service name", "name: n\ninstances:\n  - {id: b1, service: or/ders, addr: 10.0.0.1:8080}\nsteps:\n  - request: {}\n", 3, "instances[0].service", "only letters"},
		{"negative weight", "name: n\ninstances:\n  - {id: b1, service: orders, addr: 10.0.0.1:8080, weight: -1}\nsteps:\n  - request: {}\n", 3, "instances[0].weight", "must be within"},
		{"weight not a number", "name: n\ninstances:\n  - {id: b1, service: orders, addr: 10.0.0.1:8080, weight: heavy}\nsteps:\n  - request: {}\n", 3, "instances[0].weight", "want a whole number"},
		{"service missing with several services", "name: n\ninstances:\n  - {id: b1, service: orders, addr: 10.0.0.1:8080}\n  - {id: p1, service: payments, addr: 10.0.0.2:8080}\nsteps:\n  - request: {lane: alice}\n", 6, "steps[0].request", "service is required: the scenario has several services (orders, payments)"},
		{"unknown service", oneInstance + "steps:\n  - request: {service: payments}\n", 5, "steps[0].request.service", `unknown service "payments"`},
		{"expect_error unknown", oneInstance + "steps:\n  - request: {}\n    expect_error: timeout\n", 6, "steps[0].expect_error", `unknown error "timeout"`},
		{"expect names an unknown instance", oneInstance + "steps:\n  - request: {}\n    expect:\n      - b1\n      - b2\n", 8, "steps[0].expect[1]", `unknown instance "b2"`},
		{"expect lists an id twice", oneInstance + "steps:\n  - request: {}\n    expect: [b1, b1]\n", 6, "steps[0].expect[1]", "listed twice"},
		{"expect empty", oneInstance + "steps:\n  - request: {}\n    expect: []\n", 6, "steps[0].expect", "use expect_error"},
		{"instance host with a line break", "name: n\ninstances:\n  - {id: b1, service: orders, addr: 10.0.0.1:8080, host: \"h\\n1\"}\nsteps:\n  - request: {}\n", 3, "instances[0].host", "must be at most 253 printable characters"},
		{"instance host not a string", "name: n\ninstances:\n  - {id: b1, service: orders, addr: 10.0.0.1:8080, host: [h1]}\nsteps:\n  - request: {}\n", 3, "instances[0].host", "want"},
		{"request host with a line break", oneInstance + "steps:\n  - request: {host: \"h\\r1\"}\n", 5, "steps[0].request.host", `invalid host "h\r1": must be at most 253 printable characters`},
		{"request host too long", oneInstance + "steps:\n  - request:\n      host: " + strings.Repeat("h", 254) + "\n", 6, "steps[0].request.host", "must be at most 253 printable characters"},
		{"request host not a string", oneInstance + "steps:\n  - request: {host: {name: h1}}\n", 5, "steps[0].request.host", "want"},
		{"expect with expect_error", oneInstance + "steps:\n  - request: {}\n    expect: [b1]\n    expect_error: no_instance\n", 6, "steps[0].expect", "contradicts expect_error"},
		{"expect_lane null", oneInstance + "steps:\n  - request: {}\n    expect_lane:\n", 6, "steps[0].expect_lane", "want a lane name"},
		{"expect_lane invalid", oneInstance + "steps:\n  - request: {}\n    expect_lane: al_ice\n", 6, "steps[0].expect_lane", "only a-z"},
		{"expect_request_lane invalid", oneInstance + "steps:\n  - request: {}\n    expect_request_lane: -x\n", 6, "steps[0].expect_request_lane", "must start and end"},
		{"expect_share missing lane", oneInstance + "steps:\n  - request: {}\n    expect_share: {percent: 10, tolerance: 3, samples: 100}\n", 6, "steps[0].expect_share.lane", "required"},
		{"expect_share missing percent", oneInstance + "steps:\n  - request: {}\n    expect_share: {lane: c, tolerance: 3, samples: 100}\n", 6, "steps[0].expect_share.percent", "required"},
		{"expect_share missing tolerance", oneInstance + "steps:\n  - request: {}\n    expect_share: {lane: c, percent: 10, samples: 100}\n", 6, "steps[0].expect_share.tolerance", "required"},
		{"expect_share missing samples", oneInstance + "steps:\n  - request: {}\n    expect_share:\n      lane: c\n      percent: 10\n      tolerance: 3\n", 6, "steps[0].expect_share.samples", "required"},
		{"expect_share percent out of range", oneInstance + "steps:\n  - request: {}\n    expect_share:\n      lane: c\n      percent: 110\n      tolerance: 3\n      samples: 10\n", 8, "steps[0].expect_share.percent", "outside 0..100"},
		{"expect_share zero samples", oneInstance + "steps:\n  - request: {}\n    expect_share: {lane: c, percent: 10, tolerance: 3, samples: 0}\n", 6, "steps[0].expect_share.samples", "within 1..1000000"},
		{"expect_share unknown field", oneInstance + "steps:\n  - request: {}\n    expect_share: {lane: c, percent: 10, tolerance: 3, samples: 9, seed: 1}\n", 6, "steps[0].expect_share.seed", "unknown field"},
		{"expect_share with a key", oneInstance + "steps:\n  - request: {key: k}\n    expect_share: {lane: c, percent: 10, tolerance: 3, samples: 9}\n", 5, "steps[0].request.key", "fresh random key"},
		{"expect_share with expect", oneInstance + "steps:\n  - request: {}\n    expect: [b1]\n    expect_share: {lane: c, percent: 10, tolerance: 3, samples: 9}\n", 6, "steps[0].expect", "cannot be combined with expect_share"},
		{"expect_sticky zero", oneInstance + "steps:\n  - request: {key: k}\n    expect_sticky: 0\n", 6, "steps[0].expect_sticky", "within 1..1000000"},
		{"expect_sticky with expect_error", oneInstance + "steps:\n  - request: {key: k}\n    expect_sticky: 5\n    expect_error: no_instance\n", 6, "steps[0].expect_sticky", "contradicts expect_error"},
		{"policy unknown field", "name: n\npolicy:\n  lanes:\n    alice:\n      fallbak: [x]\n" + "instances:\n  - {id: b1, service: orders, addr: 10.0.0.1:8080}\nsteps:\n  - request: {}\n", 5, "policy.lanes.alice.fallbak", "unknown field"},
		{"policy invalid fallback lane", "name: n\npolicy:\n  lanes:\n    alice:\n      fallback:\n        - ok\n        - Not_OK\n" + "instances:\n  - {id: b1, service: orders, addr: 10.0.0.1:8080}\nsteps:\n  - request: {}\n", 7, "policy.lanes.alice.fallback[1]", "invalid lane"},
		{"policy cycle", "name: n\npolicy:\n  lanes:\n    alice: {fallback: [bob]}\n\n    bob: {fallback: [alice]}\ninstances:\n  - {id: b1, service: orders, addr: 10.0.0.1:8080}\nsteps:\n  - request: {}\n", 4, "policy.lanes.alice.fallback", "fallback cycle alice -> bob -> alice"},
		{"policy bad percent", "name: n\npolicy: {canary: [{service: orders, lane: c,\n  percent: 101}]}\ninstances:\n  - {id: b1, service: orders, addr: 10.0.0.1:8080}\nsteps:\n  - request: {}\n", 3, "policy.canary[0].percent", "outside 0..100"},
		{"policy bad duration", "name: n\npolicy:\n  outlier:\n    window: 30\ninstances:\n  - {id: b1, service: orders, addr: 10.0.0.1:8080}\nsteps:\n  - request: {}\n", 4, "policy.outlier.window", "bad duration"},
		{"policy zero errors", "name: n\npolicy:\n  outlier:\n    errors: 0\ninstances:\n  - {id: b1, service: orders, addr: 10.0.0.1:8080}\nsteps:\n  - request: {}\n", 4, "policy.outlier.errors", "positive"},
		{"policy tag with both addrs and labels", "name: n\npolicy:\n  tags:\n    - service: orders\n      lane: gray\n      addrs: [\"*:80\"]\n      labels: {a: b}\ninstances:\n  - {id: b1, service: orders, addr: 10.0.0.1:8080}\nsteps:\n  - request: {}\n", 4, "policy.tags[0]", "both addrs and labels"},
		{"policy not a mapping", "name: n\npolicy: [1, 2]\ninstances:\n  - {id: b1, service: orders, addr: 10.0.0.1:8080}\nsteps:\n  - request: {}\n", 2, "policy", "want a mapping"},
		{"policy alias", "name: &n n\npolicy:\n  lanes:\n    *n : {strict: true}\ninstances:\n  - {id: b1, service: orders, addr: 10.0.0.1:8080}\nsteps:\n  - request: {}\n", 4, "policy.lanes", "got an alias"},
		{"alias in steps", oneInstance + "steps:\n  - &s {request: {}}\n  - *s\n", 6, "steps[1]", "aliases are not supported"},
		{"not a mapping", "- a\n- b\n", 1, "", "want a mapping"},
		{"YAML syntax error", "name: n\ninstances:\n  - {id: b1, service: orders, addr: 10.0.0.1:8080\nsteps: []\n", 2, "", "malformed YAML"},
		{"two documents", oneInstance + "steps:\n  - request: {}\n---\nname: again\n", 6, "", "more than one YAML document"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, err := Parse("f.yaml", []byte(c.doc))
			if err == nil {
				t.Fatalf("accepted: %+v", s)
			}
			var e *strictyaml.Error
			if !errors.As(err, &e) {
				t.Fatalf("error %T %v is not a *strictyaml.Error", err, err)
			}
			if e.File != "f.yaml" || e.Line != c.line || e.Field != c.field || !strings.Contains(e.Msg, c.msg) {
				t.Errorf("got  %v\nwant f.yaml:%d: field %s: ...%s...", err, c.line, c.field, c.msg)
			}
			want := fmt.Sprintf("f.yaml:%d: ", c.line)
			if c.field != "" {
				want += "field " + c.field + ": "
			}
			if !strings.HasPrefix(err.Error(), want) {
				t.Errorf("message %q does not start with %q", err.Error(), want)
			}
		})
	}
}

func TestParseScenario(t *testing.T) {
	doc := `name: "  every\nthing  "
policy:
  lanes:
    Alice: {fallback: [team-a]}
instances:
  - {id: b1, service: orders, addr: 10.0.0.1:8080}
  - {id: b2, service: orders, addr: 10.0.0.2:8080, weight: 0}
  - {id: a1, service: payments, addr: 10.0.9.1:8080, lane: " Alice ", zone: az1, host: h1, weight: 7, labels: {version: v2}}
  - {id: b1, service: payments, addr: 10.0.0.3:8080}
steps:
  - at: 1s
    request: {service: orders, lane: " ALICE ", zone: az2, host: h2, key: k}
    expect: [b1]
    expect_lane: ""
    expect_request_lane: Alice
  - request:
      service: payments
    expect_sticky: 3
  - at: 2m
    report: {service: payments, instance: b1, ok: false}
  - request: {service: orders}
  - request: {service: orders}
    expect_share: {lane: "", percent: 100, tolerance: 0, samples: 10}
`
	s, err := Parse("x.yaml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	if s.Name != "every thing" || s.File != "x.yaml" {
		t.Errorf("name %q file %q", s.Name, s.File)
	}
	if s.Policy == nil || len(s.Policy.Lanes["alice"].Fallback) != 1 {
		t.Errorf("policy not parsed and normalised: %+v", s.Policy)
	}
	if got := strings.Join(s.Services, ","); got != "orders,payments" {
		t.Errorf("services %q", got)
	}
	if b2 := s.Instances[1]; !b2.Drain || b2.EffectiveWeight() != 0 {
		t.Errorf("weight 0 did not drain: %+v", b2)
	}
	if b1 := s.Instances[0]; b1.Drain || b1.EffectiveWeight() != 100 {
		t.Errorf("absent weight is not the default: %+v", b1)
	}
	if a1 := s.Instances[2]; a1.Lane != "alice" || a1.Weight != 7 || a1.Zone != "az1" || a1.Host != "h1" || a1.Labels["version"] != "v2" {
		t.Errorf("a1 = %+v", a1)
	}
	st := s.Steps
	if len(st) != 5 {
		t.Fatalf("%d steps", len(st))
	}
	if st[0].Line != 11 || st[0].At.String() != "1s" || st[0].Request.Lane != " ALICE " || st[0].Request.Key != "k" || st[0].Request.Host != "h2" || st[0].Request.Zone != "az2" ||
		*st[0].ExpectLane != "" || *st[0].ExpectRequestLane != "alice" || !st[0].HasExpectation() {
		t.Errorf("step 1 = %+v", st[0])
	}
	if st[1].At.String() != "1s" || st[1].ExpectSticky != 3 || st[1].Expect != nil || st[1].ExpectLane != nil {
		t.Errorf("step 2 = %+v", st[1])
	}
	if r := st[2].Report; r == nil || r.Service != "payments" || r.Instance != "b1" || r.OK || st[2].At.String() != "2m0s" {
		t.Errorf("step 3 = %+v", st[2])
	}
	if st[3].HasExpectation() || st[3].At.String() != "2m0s" {
		t.Errorf("step 4 = %+v", st[3])
	}
	if sh := st[4].ExpectShare; sh == nil || sh.Lane != "" || sh.Percent != 100 || sh.Samples != 10 {
		t.Errorf("step 5 = %+v", st[4])
	}
}

// A scenario with one service may leave it out of requests, and a null
// request is the empty one.
func TestParseDefaults(t *testing.T) {
	s, err := Parse("x.yaml", []byte(oneInstance+"steps:\n  - request:\n"))
	if err != nil {
		t.Fatal(err)
	}
	if s.Steps[0].Request == nil || s.Steps[0].Request.Service != "orders" || s.Policy != nil {
		t.Errorf("%+v", s.Steps[0])
	}
}
