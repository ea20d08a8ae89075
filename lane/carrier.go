package lane

import (
	"net/http"
	"net/textproto"
	"slices"
	"strings"
)

// A Carrier holds the headers of one request or message, for a [Propagator]
// to read from and write to. Keys are header names; a carrier decides how
// they compare (an HTTP header is case-insensitive, for example). The
// propagator passes lower-case keys.
//
// It has the shape of OpenTelemetry's TextMapCarrier, plus Values and Del.
type Carrier interface {
	// Get returns the first value of key, or "" if there is none.
	Get(key string) string
	// Values returns all values of key, in order, or nil. The caller must
	// not modify the returned slice.
	Values(key string) []string
	// Set replaces all values of key with value.
	Set(key, value string)
	// Del removes key and its values.
	Del(key string)
}

// maxStackKey is the longest key that the adapters normalise on the stack,
// without allocating. Longer keys still work.
const maxStackKey = 128

// HTTPHeader adapts an [http.Header] to a [Carrier]:
//
//	p.Inject(ctx, lane.HTTPHeader(req.Header))
//
// Keys are canonicalised as [http.Header] does. Reads do not allocate (for
// keys up to 128 bytes). Set panics on a nil header, as [http.Header.Set]
// does.
type HTTPHeader http.Header

// Get returns the first value of key, like [http.Header.Get].
func (h HTTPHeader) Get(key string) string {
	if v := h.Values(key); len(v) > 0 {
		return v[0]
	}
	return ""
}

// Values returns the values of key, like [http.Header.Values].
func (h HTTPHeader) Values(key string) []string {
	if canonical(key) {
		return h[key]
	}
	if len(key) > maxStackKey {
		return h[textproto.CanonicalMIMEHeaderKey(key)]
	}
	var buf [maxStackKey]byte
	return h[string(canonicalize(buf[:0], key))] // the conversion does not allocate
}

// Set sets key to value, like [http.Header.Set].
func (h HTTPHeader) Set(key, value string) {
	h[canonicalKey(key)] = []string{value}
}

// Del removes key, like [http.Header.Del].
func (h HTTPHeader) Del(key string) {
	if h.Values(key) != nil {
		delete(h, canonicalKey(key))
	}
}

// canonicalKey returns textproto.CanonicalMIMEHeaderKey(key) without
// allocating for the keys of this package.
func canonicalKey(key string) string {
	switch key {
	case Header:
		return "X-Lane"
	case BaggageHeader:
		return "Baggage"
	}
	return textproto.CanonicalMIMEHeaderKey(key)
}

// canonical reports whether key is its own canonical form, that is, whether
// textproto.CanonicalMIMEHeaderKey(key) == key.
func canonical(key string) bool {
	upper := true
	changes := false
	for i := 0; i < len(key); i++ {
		c := key[i]
		if !headerByte(c) {
			return true // not a header key: left alone
		}
		if upper && 'a' <= c && c <= 'z' || !upper && 'A' <= c && c <= 'Z' {
			changes = true
		}
		upper = c == '-'
	}
	return !changes
}

// canonicalize appends the canonical form of key, which must be all header
// bytes, to b: upper case at the start and after each '-', lower case
// elsewhere.
func canonicalize(b []byte, key string) []byte {
	upper := true
	for i := 0; i < len(key); i++ {
		c := key[i]
		if upper && 'a' <= c && c <= 'z' {
			c -= 'a' - 'A'
		} else if !upper && 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		b = append(b, c)
		upper = c == '-'
	}
	return b
}

// headerByte reports whether c may appear in an HTTP field name (a token,
// RFC 9110).
func headerByte(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// Metadata adapts gRPC metadata to a [Carrier]. gRPC's metadata.MD has this
// underlying type, so convert it:
//
//	md, _ := metadata.FromIncomingContext(ctx)
//	ctx = p.ExtractContext(ctx, lane.Metadata(md))
//
// Keys are lower-case (ASCII), as in metadata.MD. Reads do not allocate (for
// keys up to 128 bytes). Set panics on nil metadata.
type Metadata map[string][]string

// Get returns the first value of key.
func (md Metadata) Get(key string) string {
	if v := md.Values(key); len(v) > 0 {
		return v[0]
	}
	return ""
}

// Values returns the values of key.
func (md Metadata) Values(key string) []string {
	if !hasUpper(key) {
		return md[key]
	}
	if len(key) > maxStackKey {
		return md[lowerASCII(key)]
	}
	var buf [maxStackKey]byte
	return md[string(appendLower(buf[:0], key))]
}

// Set sets key to value.
func (md Metadata) Set(key, value string) {
	md[lowerASCII(key)] = []string{value}
}

// Del removes key.
func (md Metadata) Del(key string) {
	if md.Values(key) != nil {
		delete(md, lowerASCII(key))
	}
}

// MessageHeader adapts message-queue headers with case-sensitive keys, such
// as nats.Header, to a [Carrier]:
//
//	p.Inject(ctx, lane.MessageHeader(msg.Header))
//
// Reads match keys case-insensitively (ASCII). When a key is present in
// several spellings, Values returns the values of the lower-case spelling
// first, then those of the others in key order. Writes use the lower-case
// key and remove the other spellings. Set panics on a nil map.
type MessageHeader map[string][]string

// Get returns the first value of key, in any spelling.
func (m MessageHeader) Get(key string) string {
	if v := m.Values(key); len(v) > 0 {
		return v[0]
	}
	return ""
}

// Values returns the values of key, in any spelling. It allocates only when
// key is present in more than one spelling.
func (m MessageHeader) Values(key string) []string {
	var keys []string // spellings other than lower case, once there are two
	var first string  // the first spelling found
	found := 0
	for k := range m {
		if !equalFold(k, key) {
			continue
		}
		found++
		switch found {
		case 1:
			first = k
		case 2:
			keys = append(keys, first, k)
		default:
			keys = append(keys, k)
		}
	}
	switch found {
	case 0:
		return nil
	case 1:
		return m[first]
	}
	// Several spellings: lower case first, then the others in key order.
	slices.SortFunc(keys, func(a, b string) int {
		switch la, lb := !hasUpper(a), !hasUpper(b); {
		case la && !lb:
			return -1
		case lb && !la:
			return 1
		}
		return strings.Compare(a, b)
	})
	var vs []string
	for _, k := range keys {
		vs = append(vs, m[k]...)
	}
	return vs
}

// Set sets the lower-case key to value and removes other spellings.
func (m MessageHeader) Set(key, value string) {
	m.Del(key)
	m[lowerASCII(key)] = []string{value}
}

// Del removes key in every spelling.
func (m MessageHeader) Del(key string) {
	for k := range m {
		if equalFold(k, key) {
			delete(m, k)
		}
	}
}

// appendLower appends key with ASCII upper case turned to lower case.
func appendLower(b []byte, key string) []byte {
	for i := 0; i < len(key); i++ {
		c := key[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		b = append(b, c)
	}
	return b
}

// lowerASCII returns key with ASCII upper case turned to lower case. It
// allocates only if key has upper case.
func lowerASCII(key string) string {
	if !hasUpper(key) {
		return key
	}
	return string(appendLower(make([]byte, 0, len(key)), key))
}

// equalFold reports whether a and b are equal under ASCII case folding.
func equalFold(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		x, y := a[i], b[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}
