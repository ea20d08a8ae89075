package policy

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestParseFullDocument(t *testing.T) {
	doc := `
lanes:
  Alice:
    fallback: [Team-A]
    strict: false
  team-a: {strict: true}
tags:
  - service: orders
    lane: gray
    addrs: ["10.0.0.5:8080", "*:9090"]
  - service: orders
    lane: v2
    labels: {version: v2}
    enabled: false
canary:
  - {service: orders, lane: canary, percent: 10}
  - {service: orders, lane: canary-2, percent: 2.5}
locality:
  host: true
outlier:
  errors: 2
  window: 30s
  ejection: 1m
`
	p, err := Parse("p.yaml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	if got := p.Lanes["alice"].Fallback; len(got) != 1 || got[0] != "team-a" {
		t.Fatalf("lanes not normalised: %+v", p.Lanes)
	}
	if p.Tags[1].IsEnabled() || !p.Tags[0].IsEnabled() {
		t.Fatalf("enabled flags wrong: %+v", p.Tags)
	}
	if p.Canary[1].Percent != 2.5 {
		t.Fatalf("percent %v", p.Canary[1].Percent)
	}
	if !p.Locality.Host {
		t.Fatal("locality.host not read")
	}
	o := p.Outlier.WithDefaults()
	if o.Errors != 2 || o.Window.D() != 30*time.Second || o.Ejection.D() != time.Minute {
		t.Fatalf("outlier %+v", o)
	}
	chain, strict := p.Chain("alice")
	if strings.Join(chain, ",") != "alice,team-a" || !strict {
		t.Fatalf("chain %v strict %v; team-a is strict so the chain stops there", chain, strict)
	}
}

func TestParseJSON(t *testing.T) {
	p, err := Parse("p.json", []byte(`{"lanes":{"alice":{"fallback":["team-a"]}},"outlier":{"errors":3,"window":"10s"}}`))
	if err != nil {
		t.Fatal(err)
	}
	if p.Outlier.Errors != 3 || p.Outlier.Window.D() != 10*time.Second {
		t.Fatalf("%+v", p.Outlier)
	}
}

func TestParseEmpty(t *testing.T) {
	for _, doc := range []string{"", "{}", "# nothing\n", "---\n"} {
		p, err := Parse("p", []byte(doc))
		if err != nil || p == nil {
			t.Fatalf("%q: %v", doc, err)
		}
		if p.Locality.Host {
			t.Fatalf("%q: locality.host is on by default", doc)
		}
		if o := p.Outlier.WithDefaults(); o.Errors != DefaultErrors || o.Window.D() != DefaultWindow || o.Ejection.D() != DefaultEjection {
			t.Fatalf("defaults %+v", o)
		}
	}
}

// Every refusal names the file, the line, the field and the value.
func TestParseRefusals(t *testing.T) {
	for _, c := range []struct {
		name, doc, want string
	}{
		{"unknown top field", "lanez: {}\n", `p.yaml:1: field lanez: unknown field`},
		{"unknown lane field", "lanes:\n  alice:\n    fallbak: [x]\n", `p.yaml:3: field lanes.alice.fallbak: unknown field`},
		{"invalid lane key", "lanes:\n  Bad_Lane: {}\n", `p.yaml:2: field lanes.Bad_Lane: invalid lane "Bad_Lane"`},
		{"invalid fallback", "lanes:\n  alice:\n    fallback: [ok, \"-no\"]\n", `p.yaml:3: field lanes.alice.fallback[1]: invalid lane "-no"`},
		{"self cycle", "lanes:\n  alice: {fallback: [alice]}\n", `field lanes.alice.fallback: fallback cycle alice -> alice`},
		{"cycle", "lanes:\n  a: {fallback: [b]}\n  b: {fallback: [c]}\n  c: {fallback: [a]}\n", `fallback cycle a -> b -> c -> a`},
		{"duplicate fallback", "lanes:\n  a: {fallback: [b, B]}\n", `field lanes.a.fallback[1]: lane "b" is listed twice`},
		{"duplicate normalised lane", "lanes:\n  a: {}\n  A: {}\n", `lane "a" appears twice once normalised`},
		{"tag both", "tags:\n  - {service: s, lane: x, addrs: [\"1.2.3.4:80\"], labels: {a: b}}\n", `p.yaml:2: field tags[0]: has both addrs and labels`},
		{"tag neither", "tags:\n  - {service: s, lane: x}\n", `field tags[0]: has neither addrs nor labels`},
		{"tag bad addr", "tags:\n  - service: s\n    lane: x\n    addrs: [\"nohost\"]\n", `p.yaml:4: field tags[0].addrs[0]: invalid address "nohost"`},
		{"tag bad port", "tags:\n  - {service: s, lane: x, addrs: [\"*:99999\"]}\n", `field tags[0].addrs[0]: invalid address "*:99999": port "99999"`},
		{"tag bad lane", "tags:\n  - {service: s, lane: \"x y\", labels: {a: b}}\n", `field tags[0].lane: invalid lane "x y"`},
		{"tag bad service", "tags:\n  - {service: \"s/t\", lane: x, labels: {a: b}}\n", `field tags[0].service: invalid service "s/t"`},
		{"tag enabled not bool", "tags:\n  - {service: s, lane: x, labels: {a: b}, enabled: yes please}\n", `field tags[0].enabled: want a boolean, got "yes please"`},
		{"percent high", "canary:\n  - {service: s, lane: c, percent: 101}\n", `p.yaml:2: field canary[0].percent: percent 101 is outside 0..100`},
		{"percent negative", "canary:\n  - {service: s, lane: c, percent: -1}\n", `percent -1 is outside 0..100`},
		{"percent too fine", "canary:\n  - {service: s, lane: c, percent: 0.005}\n", `p.yaml:2: field canary[0].percent: percent 0.005 is finer than the granularity of canary splits, 0.01`},
		{"percent too fine 2", "canary:\n  - {service: s, lane: c, percent: 12.345}\n", `field canary[0].percent: percent 12.345 is finer than`},
		{"percent text", "canary:\n  - {service: s, lane: c, percent: ten}\n", `field canary[0].percent: want a number, got "ten"`},
		{"canary sum", "canary:\n  - {service: s, lane: c, percent: 60}\n  - {service: s, lane: d, percent: 50}\n", `field canary[1].percent: the canaries of service "s" add up to 110%`},
		{"canary twice", "canary:\n  - {service: s, lane: c, percent: 1}\n  - {service: s, lane: c, percent: 1}\n", `field canary[1]: a second canary`},
		{"errors zero", "outlier: {errors: 0}\n", `field outlier.errors: errors must be a positive count, got 0`},
		{"errors negative", "outlier: {errors: -2}\n", `errors must be a positive count, got -2`},
		{"window zero", "outlier: {window: 0s}\n", `field outlier.window: window must be a positive duration, got 0s`},
		{"window negative", "outlier: {window: -5s}\n", `window must be a positive duration, got -5s`},
		{"ejection zero", "outlier: {ejection: 0s}\n", `field outlier.ejection: ejection must be a positive duration`},
		{"bad duration", "outlier:\n  window: 30 seconds\n", `p.yaml:2: field outlier.window: bad duration "30 seconds"`},
		{"duration without unit", "outlier: {window: 30}\n", `bad duration "30"`},
		{"not a mapping", "- a\n- b\n", `want a mapping, got a list`},
		{"locality host not bool", "locality:\n  host: sometimes\n", `p.yaml:2: field locality.host: want a boolean, got "sometimes"`},
		{"locality unknown field", "locality: {zone: true}\n", `p.yaml:1: field locality.zone: unknown field`},
		{"locality not a mapping", "locality: [host]\n", `field locality: want a mapping, got a list`},
		{"strict not bool", "lanes:\n  a: {strict: 1}\n", `field lanes.a.strict: want a boolean, got "1"`},
		{"duplicate key", "lanes: {}\nlanes: {}\n", `p.yaml:2: field lanes: duplicate key`},
		{"syntax", "lanes: [\n", `malformed YAML`},
		{"two documents", "lanes: {}\n---\nlanes: {}\n", `more than one YAML document`},
		{"json unknown", `{"lanes":{},"extra":1}`, `field extra: unknown field`},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse("p.yaml", []byte(c.doc))
			if err == nil {
				t.Fatalf("accepted %q", c.doc)
			}
			var pe *Error
			if !errors.As(err, &pe) {
				t.Fatalf("error %T is not a *policy.Error: %v", err, err)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %q does not contain %q", err, c.want)
			}
		})
	}
}

func TestValidateGoPolicy(t *testing.T) {
	p := &Policy{Lanes: map[string]LaneSettings{"Alice": {Fallback: []string{"B"}}}}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	if _, ok := p.Lanes["alice"]; !ok || p.Lanes["alice"].Fallback[0] != "b" {
		t.Fatalf("not normalised: %+v", p.Lanes)
	}
	bad := &Policy{Canary: []CanaryRule{{Service: "s", Lane: "c", Percent: 200}}}
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "canary[0].percent") {
		t.Fatalf("got %v", err)
	}
}

func TestParseGatewayAndLifetimes(t *testing.T) {
	p, err := Parse("p.yaml", []byte(`
lanes:
  alice:
    expires: 2026-12-24T18:00:00Z
    clients: ["10.1.2.3", "10.9.0.0/16", "::1"]
gateway:
  lane_choice: allowlist
  allow: ["127.0.0.0/8"]
`))
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 12, 24, 18, 0, 0, 0, time.UTC)
	if p.Expired("alice", at.Add(-time.Second)) || !p.Expired("alice", at) || p.Expired("bob", at) {
		t.Fatal("Expired is wrong around the expiry")
	}
	if p.Gateway.Choice() != ChoiceAllowlist || (&Policy{}).Gateway.Choice() != ChoiceAll {
		t.Fatal("lane choice default")
	}
	for doc, want := range map[string]string{
		"lanes:\n  a: {expires: tomorrow}\n":              `field lanes.a.expires`,
		"lanes:\n  a: {clients: [\"10.0.0.300\"]}\n":      `field lanes.a.clients[0]: invalid client address "10.0.0.300"`,
		"gateway: {lane_choice: some}\n":                  `field gateway.lane_choice: unknown lane choice "some"`,
		"gateway: {lane_choice: allowlist, allow: [x]}\n": `field gateway.allow[0]: invalid client address "x"`,
		"gateway: {allow: [\"10.0.0.0/8\"]}\n":            `field gateway.allow: allow is used only with lane_choice: allowlist`,
	} {
		if _, err := Parse("p.yaml", []byte(doc)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: got %v, want %q", doc, err, want)
		}
	}
}

// TestCanaryPercentSteps: every whole number of 0.01% steps is accepted,
// even where float64 cannot hold it exactly.
func TestCanaryPercentSteps(t *testing.T) {
	for _, pc := range []string{"0", "0.01", "0.1", "0.07", "12.34", "33.33", "57.29", "99.99", "100", "1e-2"} {
		doc := "canary:\n  - {service: s, lane: c, percent: " + pc + "}\n"
		if _, err := Parse("p.yaml", []byte(doc)); err != nil {
			t.Errorf("percent %s: %v", pc, err)
		}
	}
}
