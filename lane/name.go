package lane

import (
	"fmt"
	"strings"
)

// MaxLen is the longest lane name, in bytes.
const MaxLen = 63

// Rule names the rule of the lane-name grammar that a value breaks. The
// gateway quotes it in its 400 answers, so it is part of the API.
type Rule string

// The rules of the lane-name grammar.
const (
	RuleEmpty   Rule = "empty"          // nothing left after trimming
	RuleTooLong Rule = "too-long"       // more than MaxLen characters
	RuleChars   Rule = "characters"     // a character outside a-z, 0-9 and '-'
	RuleEdge    Rule = "starts-or-ends" // a '-' at the start or the end
)

// NameError reports a lane name that breaks the grammar.
type NameError struct {
	Value string // the value as received, before trimming (percent-decoded, from baggage)
	Rule  Rule
	// Header is the header the value was read from, set by
	// Propagator.Extract; "" for an error from Parse.
	Header string
}

// Error names the value, the header it came from if known, and the rule.
func (e *NameError) Error() string {
	what := fmt.Sprintf("invalid lane %q", e.Value)
	if e.Header != "" {
		what += fmt.Sprintf(" in header %q", e.Header)
	}
	switch e.Rule {
	case RuleEmpty:
		return what + ": empty after trimming"
	case RuleTooLong:
		return fmt.Sprintf("%s: longer than %d characters", what, MaxLen)
	case RuleChars:
		return what + ": only a-z, 0-9 and '-' are allowed"
	default:
		return what + ": must start and end with a letter or digit"
	}
}

// Parse trims and lower-cases raw and checks it against the lane-name
// grammar: 1 to 63 characters of a-z, 0-9 and '-', starting and ending with a
// letter or digit. It returns the normalised name or a *NameError.
//
// Only ASCII spaces and tabs are trimmed, as the routing contract says. Any
// other whitespace (a line feed, a no-break space U+00A0, U+0085, an
// ideographic space U+3000) is not trimmed and breaks [RuleChars]: a value
// that a proxy or a copy-paste padded with it is refused, not silently
// turned into another lane.
//
// Parse does not allocate when raw is already normalised.
func Parse(raw string) (string, error) {
	s, r := parse(raw)
	if r != "" {
		return "", &NameError{Value: raw, Rule: r}
	}
	return s, nil
}

// parse is Parse that returns the rule raw breaks ("" for none) instead of
// an error, for callers that build the error themselves.
func parse(raw string) (string, Rule) {
	s := trimOWS(raw)
	if r := check(s); r != "" {
		return "", r
	}
	if hasUpper(s) {
		s = strings.ToLower(s)
	}
	return s, ""
}

// Valid reports whether name is a normalised lane name, that is, whether
// Parse(name) would return name unchanged. It never allocates.
func Valid(name string) bool {
	if check(name) != "" {
		return false
	}
	return !hasUpper(name)
}

// check tests the grammar case-insensitively on an already trimmed value.
func check(s string) Rule {
	switch {
	case s == "":
		return RuleEmpty
	case len(s) > MaxLen:
		return RuleTooLong
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case c == '-':
			if i == 0 || i == len(s)-1 {
				return RuleEdge
			}
		default:
			return RuleChars
		}
	}
	return ""
}

func hasUpper(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c >= 'A' && c <= 'Z' {
			return true
		}
	}
	return false
}
