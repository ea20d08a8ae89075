package lane

import (
	"slices"
	"strings"
)

// W3C baggage limits, as OpenTelemetry Go applies them: at most maxMembers
// list-members and maxBytes bytes in the whole header.
const (
	maxMembers = 64
	maxBytes   = 8192
)

// members walks the list-members of a baggage header that came as one or
// more values. The values form one comma-separated list, as if joined with
// ",". Empty members are skipped; members are returned with optional
// whitespace trimmed and otherwise untouched.
//
// When bounded, members beyond the W3C limits are not returned: walking stops
// at the 65th member, or at the first member that ends past byte 8192 of the
// joined header.
type members struct {
	vals    []string
	bounded bool
	i       int // index of the current value
	pos     int // offset of the unread part in vals[i]
	base    int // offset of vals[i] in the joined header
	n       int // members returned so far
}

// next returns the next member, or false at the end of the list.
func (it *members) next() (string, bool) {
	for it.i < len(it.vals) {
		v := it.vals[it.i]
		if it.pos > len(v) {
			it.base += len(v) + 1 // the value and the joining comma
			it.i++
			it.pos = 0
			continue
		}
		seg := v[it.pos:]
		end := strings.IndexByte(seg, ',')
		if end < 0 {
			end = len(seg)
		}
		stop := it.base + it.pos + end // where the member ends in the header
		it.pos += end + 1
		m := trimOWS(seg[:end])
		if m == "" {
			continue
		}
		if it.bounded && (it.n >= maxMembers || stop > maxBytes) {
			it.i = len(it.vals)
			return "", false
		}
		it.n++
		return m, true
	}
	return "", false
}

// laneMember returns the still percent-encoded value of the lane member of
// the baggage header that came as the values vals, read as OpenTelemetry Go
// reads it (go.opentelemetry.io/otel/propagation.Baggage with an HTTP
// carrier), so that lanes and OpenTelemetry agree on the lane of a request:
//
//   - the values together, joined with commas, must be at most 8192 bytes,
//     or there is no baggage at all;
//   - each value is a list on its own: its list-members are read from left
//     to right until 64 distinct keys have been read, and a value is not
//     read at all once the values before it gave more than 64 members;
//   - a member that is not well-formed is skipped: a key that is not a
//     token, a value with a character outside the W3C baggage-octets, a
//     broken percent-escape, or a property that is not well-formed;
//   - of several lane members, the last one counts.
//
// found is false when there is none. The differences from OpenTelemetry Go
// that remain are documented in docs/routing.md and checked by the
// differential test: whitespace other than spaces and tabs is not trimmed,
// and more than 64 distinct keys across several values keep the lane.
func laneMember(vals []string) (value string, found bool) {
	return member(vals, BaggageKey)
}

// member is laneMember for the member with the given key.
func member(vals []string, key string) (value string, found bool) {
	total := -1
	for _, v := range vals {
		total += len(v) + 1
	}
	if total > maxBytes {
		return "", false
	}
	read := 0 // members read from the values so far
	for _, v := range vals {
		if read > maxMembers {
			break
		}
		n, lv, ok := listMember(v, key)
		read += n
		if ok {
			value, found = lv, true
		}
	}
	return value, found
}

// listMember reads one baggage list as OpenTelemetry Go's baggage.Parse does:
// it returns the number of distinct keys of its well-formed members within
// the 64-member limit, and the raw value of the last well-formed member with
// the key among them. It does not allocate for up to 8 distinct keys.
func listMember(v, key string) (n int, value string, found bool) {
	var buf [8]string // the distinct keys; on the stack for most baggage
	keys := buf[:0]
	for rest, more := v, true; more && n < maxMembers; {
		var m string
		m, rest, more = strings.Cut(rest, ",")
		k, val, ok := wellFormed(m)
		if !ok {
			continue
		}
		if !slices.Contains(keys, k) {
			keys = append(keys, k)
			n++
		}
		if k == key {
			value, found = val, true
		}
	}
	return n, value, found
}

// wellFormed splits a W3C baggage list-member "key=value;properties" into
// its key and its still percent-encoded value, trimmed of optional
// whitespace (spaces and tabs). ok is false when the member is not
// well-formed: no '=', a key that is not a token, a value with a character
// outside the baggage-octets, a '%' not followed by two hex digits, or a
// property that is not well-formed.
func wellFormed(m string) (key, value string, ok bool) {
	kv, props, more := strings.Cut(m, ";")
	for more {
		var p string
		p, props, more = strings.Cut(props, ";")
		if p != "" && !wellFormedProperty(p) {
			return "", "", false
		}
	}
	k, val, found := strings.Cut(kv, "=")
	if !found {
		return "", "", false
	}
	key, value = trimOWS(k), trimOWS(val)
	if !isToken(key) || !isValue(value) || !validEscapes(value) {
		return "", "", false
	}
	return key, value, true
}

// wellFormedProperty reports whether p is a baggage property: a token key,
// optionally followed by '=' and a value, with optional whitespace around
// each part.
func wellFormedProperty(p string) bool {
	p = trimOWS(p)
	i := 0
	for i < len(p) && tokenByte(p[i]) {
		i++
	}
	if i == 0 {
		return false
	}
	rest := trimOWS(p[i:])
	if rest == "" {
		return true
	}
	if rest[0] != '=' {
		return false
	}
	v := trimOWS(rest[1:])
	return isValue(v) && validEscapes(v)
}

// isToken reports whether s is a non-empty RFC 9110 token, the grammar of a
// baggage key.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !tokenByte(s[i]) {
			return false
		}
	}
	return true
}

// tokenByte reports whether c is a tchar of RFC 9110.
func tokenByte(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return c < 0x80 && strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// isValue reports whether s is made of W3C baggage-octets: the printable
// US-ASCII characters except space, double quote, comma, semicolon and
// backslash. '%' is one, for percent-escapes.
func isValue(s string) bool {
	for i := 0; i < len(s); i++ {
		if !valueByte(s[i]) {
			return false
		}
	}
	return true
}

func valueByte(c byte) bool {
	return c >= 0x21 && c <= 0x7e && c != '"' && c != ',' && c != ';' && c != '\\'
}

// validEscapes reports whether every '%' of s starts a percent-escape of two
// hex digits.
func validEscapes(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] != '%' {
			continue
		}
		if i+2 >= len(s) {
			return false
		}
		if _, ok := unhex(s[i+1]); !ok {
			return false
		}
		if _, ok := unhex(s[i+2]); !ok {
			return false
		}
		i += 2
	}
	return true
}

// hasLaneMember reports whether there is a lane member anywhere, limits or
// not.
func hasLaneMember(vals []string) bool {
	it := members{vals: vals}
	for m, ok := it.next(); ok; m, ok = it.next() {
		if isLaneMember(m) {
			return true
		}
	}
	return false
}

// isLaneMember reports whether list-member m has the key "lane", even
// malformed: it errs towards yes, so that a member that any baggage parser
// would read as the lane is removed. Its key is trimmed of all Unicode white
// space, as OpenTelemetry Go trims it.
func isLaneMember(m string) bool { return hasKey(m, BaggageKey) }

// hasKey reports whether list-member m has the key, trimmed as
// isLaneMember trims it.
func hasKey(m, key string) bool {
	kv, _, _ := strings.Cut(m, ";")
	k, _, ok := strings.Cut(kv, "=")
	return ok && strings.TrimSpace(k) == key
}

// rewriteBaggage returns a baggage header made of the member lane=name
// (none if name is "") and the member km (a request key's "lanes-key=...",
// none if ""), followed by the other members of vals, in order and
// byte-for-byte, with every lane member dropped, and every key member too
// when km is given. Members beyond the W3C limits of the input are ignored;
// the other members that would take the result past the limits are dropped
// from the first that does not fit.
func rewriteBaggage(vals []string, name, km string) string {
	var b strings.Builder
	n := 0
	if name != "" {
		b.Grow(len(BaggageKey) + 1 + len(name))
		b.WriteString(BaggageKey)
		b.WriteByte('=')
		b.WriteString(name) // a lane name never needs percent-encoding
		n = 1
	}
	if km != "" {
		if n > 0 {
			b.WriteByte(',')
		}
		b.WriteString(km)
		n++
	}
	it := members{vals: vals, bounded: true}
	for m, ok := it.next(); ok; m, ok = it.next() {
		if isLaneMember(m) || km != "" && hasKey(m, KeyMember) {
			continue
		}
		sep := 0
		if n > 0 {
			sep = 1
		}
		if n >= maxMembers || b.Len()+sep+len(m) > maxBytes {
			break
		}
		if sep > 0 {
			b.WriteByte(',')
		}
		b.WriteString(m)
		n++
	}
	return b.String()
}

// unescape percent-decodes s. ok is false for a '%' that is not followed by
// two hex digits. It allocates only if s has a '%'.
func unescape(s string) (_ string, ok bool) {
	i := strings.IndexByte(s, '%')
	if i < 0 {
		return s, true
	}
	b := make([]byte, 0, len(s))
	b = append(b, s[:i]...)
	for ; i < len(s); i++ {
		c := s[i]
		if c == '%' {
			if i+2 >= len(s) {
				return "", false
			}
			hi, ok1 := unhex(s[i+1])
			lo, ok2 := unhex(s[i+2])
			if !ok1 || !ok2 {
				return "", false
			}
			c = hi<<4 | lo
			i += 2
		}
		b = append(b, c)
	}
	return string(b), true
}

func unhex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// trimOWS trims optional whitespace (spaces and tabs) from both ends of s.
func trimOWS(s string) string {
	for len(s) > 0 && (s[0] == ' ' || s[0] == '\t') {
		s = s[1:]
	}
	for len(s) > 0 && (s[len(s)-1] == ' ' || s[len(s)-1] == '\t') {
		s = s[:len(s)-1]
	}
	return s
}

// BaggageCarries reports whether the baggage headers in c carry exactly the
// lane name, as lanes and OpenTelemetry both read them: one lane member,
// well-formed, that decodes to name; for the baseline (name ""), no lane
// member at all, not even a malformed one. A server that decided a lane
// rewrites the incoming headers that do not carry it (see
// [Propagator.InjectLane]), so that an OpenTelemetry handler running after
// it reads the same lane from them.
//
// It does not allocate unless the lane member is percent-encoded.
func BaggageCarries(c Carrier, name string) bool {
	vals := c.Values(BaggageHeader)
	if name == "" {
		return !hasLaneMember(vals)
	}
	n := 0
	it := members{vals: vals}
	for m, ok := it.next(); ok; m, ok = it.next() {
		if isLaneMember(m) {
			n++
		}
	}
	if n != 1 {
		return false
	}
	raw, found := laneMember(vals)
	if !found {
		return false
	}
	d, ok := unescape(raw)
	return ok && d == name
}
