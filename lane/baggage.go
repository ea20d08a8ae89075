package lane

import "strings"

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

// splitMember splits a list-member "key=value;properties" into its key and
// value, trimmed of optional whitespace. ok is false when there is no '='.
func splitMember(m string) (key, value string, ok bool) {
	eq := strings.IndexByte(m, '=')
	if eq < 0 {
		return "", "", false
	}
	value = m[eq+1:]
	if semi := strings.IndexByte(value, ';'); semi >= 0 {
		value = value[:semi]
	}
	return trimOWS(m[:eq]), trimOWS(value), true
}

// laneMember returns the still percent-encoded value of the first lane
// member within the W3C limits. found is false when there is none.
func laneMember(vals []string) (value string, found bool) {
	it := members{vals: vals, bounded: true}
	for m, ok := it.next(); ok; m, ok = it.next() {
		if k, v, ok := splitMember(m); ok && k == BaggageKey {
			return v, true
		}
	}
	return "", false
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

// isLaneMember reports whether list-member m has the key "lane".
func isLaneMember(m string) bool {
	k, _, ok := splitMember(m)
	return ok && k == BaggageKey
}

// rewriteBaggage returns a baggage header made of the member lane=name
// (none if name is "") followed by the other members of vals, in order and
// byte-for-byte, with every lane member dropped. Members beyond the W3C
// limits of the input are ignored; the other members that would take the
// result past the limits are dropped from the first that does not fit.
func rewriteBaggage(vals []string, name string) string {
	var b strings.Builder
	n := 0
	if name != "" {
		b.Grow(len(BaggageKey) + 1 + len(name))
		b.WriteString(BaggageKey)
		b.WriteByte('=')
		b.WriteString(name) // a lane name never needs percent-encoding
		n = 1
	}
	it := members{vals: vals, bounded: true}
	for m, ok := it.next(); ok; m, ok = it.next() {
		if isLaneMember(m) {
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
