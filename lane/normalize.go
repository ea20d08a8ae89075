package lane

import "strings"

// Normalize is Parse without the error: it returns the normalised lane and
// true, or "" and false for an invalid value. It allocates only to lower-case
// a value that has upper-case letters, so the routing engine can call it on
// every request. It trims as Parse does: ASCII spaces and tabs only.
func Normalize(raw string) (string, bool) {
	if Valid(raw) {
		return raw, true
	}
	s := trimOWS(raw)
	if check(s) != "" {
		return "", false
	}
	if hasUpper(s) {
		s = strings.ToLower(s)
	}
	return s, true
}
