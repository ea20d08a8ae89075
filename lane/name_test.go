package lane

import (
	"errors"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	long := strings.Repeat("a", MaxLen)
	tests := []struct {
		raw  string
		want string
		rule Rule // "" when valid
	}{
		{"alice", "alice", ""},
		{" Alice ", "alice", ""},
		{"ALICE", "alice", ""},
		{"\talice\t", "alice", ""},
		{" \t alice \t ", "alice", ""},
		{"feature-42", "feature-42", ""},
		{"42", "42", ""},
		{"0", "0", ""},
		{"a", "a", ""},
		{"a-b-c", "a-b-c", ""},
		{"a--b", "a--b", ""},
		{"Canary-V2", "canary-v2", ""},
		{long, long, ""},
		{" " + long + " ", long, ""},
		{long + "a", "", RuleTooLong},
		{"", "", RuleEmpty},
		{"   ", "", RuleEmpty},
		{"\t \t", "", RuleEmpty},
		// Only ASCII spaces and tabs are trimmed; other whitespace is refused.
		{"\talice\n", "", RuleChars},
		{"\t\n", "", RuleChars},
		{"alice\r", "", RuleChars},
		{"\valice", "", RuleChars},
		{"\u00a0alice", "", RuleChars}, // no-break space
		{"alice\u00a0", "", RuleChars},
		{"\u3000alice\u3000", "", RuleChars}, // ideographic space
		{"alice\u0085", "", RuleChars},       // next line
		{"\u2003alice", "", RuleChars},       // em space
		{"\ufeffalice", "", RuleChars},       // byte order mark
		{"\u00a0", "", RuleChars},
		{"alice;drop", "", RuleChars},
		{"al ice", "", RuleChars},
		{"alice,bob", "", RuleChars},
		{"alice_bob", "", RuleChars},
		{"alice.bob", "", RuleChars},
		{"alice/bob", "", RuleChars},
		{"alice%20", "", RuleChars},
		{"ålice", "", RuleChars},
		{"alice\x00", "", RuleChars},
		{"-alice", "", RuleEdge},
		{"alice-", "", RuleEdge},
		{"-", "", RuleEdge},
		{" -a ", "", RuleEdge},
	}
	for _, tt := range tests {
		got, err := Parse(tt.raw)
		if tt.rule == "" {
			if err != nil || got != tt.want {
				t.Errorf("Parse(%q) = %q, %v; want %q, nil", tt.raw, got, err, tt.want)
			}
			if !Valid(got) {
				t.Errorf("Valid(%q) = false for the result of Parse", got)
			}
			continue
		}
		var ne *NameError
		if !errors.As(err, &ne) {
			t.Errorf("Parse(%q) = %q, %v; want a *NameError", tt.raw, got, err)
			continue
		}
		if got != "" || ne.Rule != tt.rule || ne.Value != tt.raw || ne.Header != "" {
			t.Errorf("Parse(%q) = %q, %+v; want \"\", rule %q, value %q", tt.raw, got, ne, tt.rule, tt.raw)
		}
	}
}

func TestValid(t *testing.T) {
	tests := []struct {
		name string
		want bool
	}{
		{"alice", true},
		{"a-1", true},
		{strings.Repeat("z", MaxLen), true},
		{strings.Repeat("z", MaxLen+1), false},
		{"", false},
		{"Alice", false}, // not normalised
		{" alice", false},
		{"alice ", false},
		{"-a", false},
		{"a-", false},
		{"a_b", false},
	}
	for _, tt := range tests {
		if got := Valid(tt.name); got != tt.want {
			t.Errorf("Valid(%q) = %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestNameErrorMessage(t *testing.T) {
	tests := []struct {
		err  *NameError
		want string
	}{
		{&NameError{Value: "", Rule: RuleEmpty}, `invalid lane "": empty after trimming`},
		{&NameError{Value: "a b", Rule: RuleChars}, `invalid lane "a b": only a-z, 0-9 and '-' are allowed`},
		{&NameError{Value: "-a", Rule: RuleEdge}, `invalid lane "-a": must start and end with a letter or digit`},
		{&NameError{Value: "x", Rule: RuleTooLong}, `invalid lane "x": longer than 63 characters`},
		{&NameError{Value: "a;b", Rule: RuleChars, Header: "x-lane"}, `invalid lane "a;b" in header "x-lane": only a-z, 0-9 and '-' are allowed`},
	}
	for _, tt := range tests {
		if got := tt.err.Error(); got != tt.want {
			t.Errorf("Error() = %q, want %q", got, tt.want)
		}
	}
}

func TestParseAllocs(t *testing.T) {
	for _, s := range []string{"alice", "feature-42", strings.Repeat("a", MaxLen)} {
		if n := testing.AllocsPerRun(100, func() {
			if _, err := Parse(s); err != nil {
				t.Fatal(err)
			}
			if !Valid(s) {
				t.Fatal("not valid")
			}
		}); n != 0 {
			t.Errorf("Parse(%q) and Valid: %v allocations, want 0", s, n)
		}
	}
}

// TestNormalizeAgreesWithParse: Normalize trims and checks exactly as Parse
// does, other whitespace than ASCII spaces and tabs included.
func TestNormalizeAgreesWithParse(t *testing.T) {
	for _, raw := range []string{"alice", " Alice\t", "\u00a0alice", "alice\u3000", "alice\u0085", "\nalice", "\t", "", "a_b"} {
		want, err := Parse(raw)
		got, ok := Normalize(raw)
		if got != want || ok != (err == nil) {
			t.Errorf("Normalize(%q) = %q, %v; Parse = %q, %v", raw, got, ok, want, err)
		}
	}
}
