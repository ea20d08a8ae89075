package registry

import (
	"errors"
	"testing"
)

// TestScope: an instance's scope is a lane name or ScopeBaseline; anything
// else is refused naming the field, and MayJoin follows it.
func TestScope(t *testing.T) {
	in := Instance{ID: "a1", Service: "orders", Addr: "10.0.0.1:8080"}
	for _, ok := range []string{"", "alice", ScopeBaseline} {
		in.Scope = ok
		if _, err := Normalize(in); err != nil {
			t.Errorf("scope %q: %v", ok, err)
		}
	}
	for _, bad := range []string{"Alice", "@lane", "a b", "-x"} {
		in.Scope = bad
		var fe *FieldError
		if _, err := Normalize(in); !errors.As(err, &fe) || fe.Field != "scope" || fe.Value != bad {
			t.Errorf("scope %q: %v, want a FieldError naming scope", bad, err)
		}
	}
	for scope, want := range map[string][3]bool{"": {true, true, true}, "alice": {true, false, false}, ScopeBaseline: {false, false, false}} {
		in.Scope = scope
		for i, l := range []string{"alice", "bob", "baseline"} {
			if got := in.MayJoin(l); got != want[i] {
				t.Errorf("scope %q: MayJoin(%q) = %v, want %v", scope, l, got, want[i])
			}
		}
	}
}

// TestLaneRefused: a lane that breaks the grammar is refused naming the field, the value as
// written and the rule it breaks.
func TestLaneRefused(t *testing.T) {
	in := Instance{ID: "a1", Service: "orders", Addr: "10.0.0.1:8080"}
	for bad, rule := range map[string]string{"a_b": "characters", "-x": "starts-or-ends", " \t ": "empty"} {
		in.Lane = bad
		var fe *FieldError
		_, err := Normalize(in)
		if !errors.As(err, &fe) || fe.Field != "lane" || fe.Value != bad || fe.Msg != "breaks the lane-name rule "+rule {
			t.Errorf("lane %q: %v, want a FieldError naming lane and the rule %s", bad, err, rule)
		}
	}
}
