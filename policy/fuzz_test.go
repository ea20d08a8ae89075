package policy

import (
	"encoding/json"
	"errors"
	"testing"
)

var policySeeds = []string{
	"",
	"lanes:\n  alice: {fallback: [team-a], strict: false}\n",
	"lanes:\n  a: {fallback: [b]}\n  b: {fallback: [a]}\n",
	"tags:\n  - {service: orders, lane: gray, addrs: [\"10.0.0.5:8080\", \"*:9090\"]}\n  - {service: orders, lane: v2, labels: {version: v2}, enabled: false}\n",
	"canary:\n  - {service: orders, lane: canary, percent: 10}\n",
	"outlier: {errors: 2, window: 30s, ejection: 60s}\n",
	"locality: {host: true}\n",
	"locality: {host: false}\nlanes: {alice: {strict: true}}\n",
	`{"lanes":{"alice":{"fallback":["team-a"]}},"outlier":{"window":"1s"}}`,
	"lanes: &a {x: *a}\n",
	"lanes:\n  alice:\n    fallback: [[[[]]]]\n",
	"canary:\n  - {percent: .nan}\n",
	"outlier: {errors: 99999999999999999999}\n",
}

// FuzzParse: Parse never panics; what it accepts validates again, survives
// a JSON round trip unchanged, and has a well-defined chain for every lane.
func FuzzParse(f *testing.F) {
	for _, s := range policySeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		p, err := Parse("fuzz", doc)
		if err != nil {
			var pe *Error
			if !errors.As(err, &pe) {
				t.Fatalf("error %T is not a *policy.Error: %v", err, err)
			}
			return
		}
		if err := p.Validate(); err != nil {
			t.Fatalf("accepted policy fails validation again: %v", err)
		}
		for l := range p.Lanes {
			chain, _ := p.Chain(l)
			if len(chain) == 0 || chain[0] != l || len(chain) > len(p.Lanes)+1 {
				t.Fatalf("chain of %q is %v", l, chain)
			}
		}
		js, err := json.Marshal(p)
		if err != nil {
			t.Fatalf("marshal: %v", err)
		}
		q, err := Parse("json", js)
		if err != nil {
			t.Fatalf("JSON form %s of an accepted policy is refused: %v", js, err)
		}
		js2, _ := json.Marshal(q)
		if string(js) != string(js2) {
			t.Fatalf("JSON round trip changed the policy:\n%s\n%s", js, js2)
		}
	})
}
