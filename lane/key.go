package lane

import (
	"context"
	"hash/fnv"
	"math/rand/v2"
	"unsafe"

	"go.opentelemetry.io/otel/baggage"
)

// The request key makes a canary split sticky: the same key always gets the
// same answer, in every process. So that every hop of one request makes the
// same choice, the key travels with the request: the entry (the gateway, or
// the first lanes-aware service) gives a baseline request without one a key,
// and each hop carries it on as the baggage member KeyMember.

// KeyMember is the key of the baggage list-member that carries the request
// key of a baseline request.
const KeyMember = "lanes-key"

// MaxKeyLen is the longest request key that travels as it is; [NormalizeKey]
// hashes longer ones.
const MaxKeyLen = 64

// WithKey returns a copy of ctx that carries the request key of canary
// splits, normalised with [NormalizeKey]; "" removes it. The lanes clients
// carry it on, for baseline calls, as the baggage member [KeyMember], so
// that the next hops split the request as this one did; the OpenTelemetry
// baggage of the context gets the member too when it has members, so that
// OpenTelemetry's propagators write it as well. The lane of ctx is kept.
func WithKey(ctx context.Context, key string) context.Context {
	key = NormalizeKey(key)
	cur := Carry(ctx)
	if cur.Key() == key {
		return ctx
	}
	km := ""
	if key != "" {
		km = KeyMember + "=" + key
	}
	ctx = store(ctx, cur, cur.with(cur.name, km))
	if bag := baggage.FromContext(ctx); bag.Len() > 0 {
		ctx = syncKey(ctx, bag, key)
	}
	return ctx
}

// KeyFromContext returns the request key in ctx, or "". It does not
// allocate.
func KeyFromContext(ctx context.Context) string {
	return Carry(ctx).Key()
}

// NewKey returns a new random request key: 16 hex digits.
func NewKey() string {
	return newKeyMember()[len(KeyMember)+1:]
}

// newKeyMember returns the baggage member of a new random key, in one
// allocation.
func newKeyMember() string {
	var b keyMemberBytes
	b.fill()
	return string(b[:])
}

// keyMemberBytes is the baggage member of a random key: KeyMember, '=' and
// 16 hex digits.
type keyMemberBytes [len(KeyMember) + 1 + 16]byte

// fill writes a new random member into b.
func (b *keyMemberBytes) fill() {
	copy(b[:], KeyMember+"=")
	const hex = "0123456789abcdef"
	n := rand.Uint64()
	for i := len(KeyMember) + 1; i < len(b); i++ {
		b[i] = hex[n&15]
		n >>= 4
	}
}

// newKeyed returns what a context that carries lane name carries once it
// is given a new random key: the value and its member in one allocation.
// The member's bytes are never written again once filled.
func newKeyed(name string, enc *Encoded) *Carried {
	k := &struct {
		Carried
		b keyMemberBytes
	}{Carried: Carried{name: name, enc: enc}}
	k.b.fill()
	k.member = unsafe.String(&k.b[0], len(k.b))
	return &k.Carried
}

// NormalizeKey returns key as it travels in baggage: unchanged when it is 1
// to [MaxKeyLen] bytes of W3C baggage-octets other than '%' (so that it
// needs no encoding), and otherwise, unless it is "", the 16 hex digits of
// its 64-bit FNV-1a hash. The splits of one request are made on the
// normalised key at every hop, the entry included.
func NormalizeKey(key string) string {
	if key == "" || len(key) <= MaxKeyLen && isValue(key) && !hasPercent(key) {
		return key
	}
	h := fnv.New64a()
	h.Write([]byte(key))
	var b [16]byte
	const hex = "0123456789abcdef"
	n := h.Sum64()
	for i := range b {
		b[15-i] = hex[n&15]
		n >>= 4
	}
	return string(b[:])
}

func hasPercent(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] == '%' {
			return true
		}
	}
	return false
}

// EntryContext returns the context of a request that enters this service
// in lane name, as [Propagator.Extract] read it from c: [WithLane] with
// name, and for a baseline request ("") [Propagator.ExtractKeyContext] too,
// since the entry of a baseline request gives it a request key, which its
// next hops carry on, so that every hop splits it alike. It is what the
// lanes servers do with each request.
func (p Propagator) EntryContext(ctx context.Context, name string, c Carrier) context.Context {
	ctx = WithLane(ctx, name)
	if name == "" {
		ctx = p.ExtractKeyContext(ctx, c)
	}
	return ctx
}

// ExtractKeyContext returns a copy of ctx that carries the request key read
// from c by [Propagator.ExtractKey], or a new random one ([NewKey]) when c
// carries none: the entry of a request gives it its key. Servers call it for
// the baseline requests they serve (a lane request is never split).
func (p Propagator) ExtractKeyContext(ctx context.Context, c Carrier) context.Context {
	if k := p.ExtractKey(c); k != "" {
		return WithKey(ctx, k)
	}
	cur := Carry(ctx)
	v := newKeyed(cur.name, cur.enc)
	ctx = context.WithValue(ctx, carriedKey{}, v)
	if bag := baggage.FromContext(ctx); bag.Len() > 0 {
		ctx = syncKey(ctx, bag, v.Key())
	}
	return ctx
}

// InjectLaneKey is [Propagator.InjectCall] with the request key given: the
// key (normalised with [NormalizeKey]) is written for a baseline call.
func (p Propagator) InjectLaneKey(name, key string, c Carrier) {
	km := ""
	if key = NormalizeKey(key); key != "" {
		km = KeyMember + "=" + key
	}
	p.inject(name, km, c)
}

// ExtractKey returns the request key carried in the baggage of c (the
// member [KeyMember], read as the lane member is), or "" when there is none
// or it is not a normalised key.
func (p Propagator) ExtractKey(c Carrier) string {
	v, ok := member(c.Values(BaggageHeader), KeyMember)
	if !ok || v == "" || NormalizeKey(v) != v {
		return ""
	}
	return v
}

// syncKey returns ctx with the OpenTelemetry baggage bag (ctx's, not empty)
// made to carry the request key (none for "").
func syncKey(ctx context.Context, bag baggage.Baggage, key string) context.Context {
	m := bag.Member(KeyMember)
	switch {
	case key == "" && m.Key() == "":
		return ctx
	case key == "":
		return baggage.ContextWithBaggage(ctx, bag.DeleteMember(KeyMember))
	case m.Value() == key:
		return ctx
	}
	km, err := baggage.NewMemberRaw(KeyMember, key)
	if err != nil {
		return ctx
	}
	b, err := bag.SetMember(km)
	if err != nil {
		return ctx
	}
	return baggage.ContextWithBaggage(ctx, b)
}
