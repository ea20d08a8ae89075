package lane

import (
	"context"
	"net/http"
	"strings"

	"go.opentelemetry.io/otel/baggage"

	"github.com/lanesdev/lanes/internal/lib/cowmap"
)

// OpenTelemetry's baggage propagators write the baggage of the context whole,
// replacing the baggage header that lanes wrote, and its interceptors may run
// before or after lanes'. So the lane is kept in the OpenTelemetry baggage of
// the context too: whatever runs last writes the same lane.

// SyncBaggage returns ctx, or a copy of it whose OpenTelemetry baggage
// (go.opentelemetry.io/otel/baggage) has the member lane=name, or no lane
// member for the baseline (name ""), keeping its other members; for the
// baseline it also has the request key of ctx ([KeyFromContext]), as
// [Propagator.InjectCall] writes it. An invalid name counts as the
// baseline, as in [Propagator.InjectLane].
//
// A context without OpenTelemetry baggage is returned as it is for a lane
// too: OpenTelemetry's propagators write no baggage header for it, so the
// header that lanes writes goes out. The transports call SyncBaggage for
// every outgoing call, with the lane that the call carries; [WithLane] keeps
// the baggage in step on its own.
//
// It does not allocate when the baggage already agrees.
func SyncBaggage(ctx context.Context, name string) context.Context {
	bag := baggage.FromContext(ctx)
	if bag.Len() == 0 {
		return ctx
	}
	ctx = syncBaggage(ctx, bag, name)
	if name == "" {
		if k := Carry(ctx).Key(); k != "" {
			ctx = syncKey(ctx, baggage.FromContext(ctx), k)
		}
	}
	return ctx
}

// syncBaggage returns ctx with the OpenTelemetry baggage bag (ctx's) made to
// agree with lane name.
func syncBaggage(ctx context.Context, bag baggage.Baggage, name string) context.Context {
	if name != "" && !Valid(name) {
		if n, err := Parse(name); err == nil {
			name = n
		} else {
			name = ""
		}
	}
	m := bag.Member(BaggageKey)
	switch {
	case name == "" && m.Key() == "":
		return ctx
	case name == "":
		if bag.Len() == 1 {
			return baggage.ContextWithoutBaggage(ctx)
		}
		return baggage.ContextWithBaggage(ctx, bag.DeleteMember(BaggageKey))
	case m.Key() != "" && m.Value() == name && len(m.Properties()) == 0:
		return ctx
	case bag.Len() == 0 || bag.Len() == 1 && m.Key() != "":
		return baggage.ContextWithBaggage(ctx, encode(name).bag)
	}
	b, err := bag.SetMember(encode(name).member)
	if err != nil { // cannot happen: the member is valid
		return ctx
	}
	return baggage.ContextWithBaggage(ctx, b)
}

// Encoded is what lanes writes for one lane, computed once per lane: the
// values of the x-lane and baggage headers of a request that carries only
// the lane. The slices are shared: do not modify them.
type Encoded struct {
	// Header is the value of [Header]: []string{name}.
	Header []string
	// Baggage is the value of [BaggageHeader]: []string{"lane=" + name}.
	Baggage []string
	// HTTP is the headers of an HTTP request that carries only the lane:
	// X-Lane and Baggage, canonical. A transport may send it as the
	// headers of a request that had none, as RoundTrippers do not modify
	// the headers they are given.
	HTTP http.Header
	// Metadata is the same for gRPC metadata, with lower-case keys
	// (convert it to metadata.MD).
	Metadata map[string][]string

	member  baggage.Member
	bag     baggage.Baggage
	carried *Carried // the lane without a request key, as a context carries it
}

// Encode returns the headers of lane name, which must be valid (see
// [Valid]); nil for the baseline or an invalid name. The result is cached
// for up to 256 lanes, so that it does not allocate for the lanes of a
// fleet; the cache does not grow past that.
func Encode(name string) *Encoded {
	if e := cached(name); e != nil {
		return e
	}
	if !Valid(name) {
		return nil
	}
	return encodeSlow(name)
}

// encode is Encode for a name known to be valid.
func encode(name string) *Encoded {
	if e := cached(name); e != nil {
		return e
	}
	return encodeSlow(name)
}

// cached returns the cached encoding of name, or nil.
func cached(name string) *Encoded {
	e, _ := encoded.Load(name)
	return e
}

// maxEncoded bounds the cache of Encode: lanes are few, but the names read
// from requests are not.
const maxEncoded = 256

var encoded cowmap.Map[string, *Encoded]

func encodeSlow(name string) *Encoded {
	name = strings.Clone(name) // kept: it may be in a request's buffer
	mem, err := baggage.NewMemberRaw(BaggageKey, name)
	if err != nil {
		panic("lane: " + err.Error()) // a valid lane name is a valid member
	}
	bag, err := baggage.New(mem)
	if err != nil {
		panic("lane: " + err.Error())
	}
	e := &Encoded{
		Header:  []string{name},
		Baggage: []string{BaggageKey + "=" + name},
		member:  mem,
		bag:     bag,
	}
	e.carried = &Carried{name: name, enc: e}
	e.HTTP = http.Header{"X-Lane": e.Header, "Baggage": e.Baggage}
	e.Metadata = map[string][]string{Header: e.Header, BaggageHeader: e.Baggage}
	// Another goroutine may have stored name meanwhile: its encoding wins.
	v, _ := encoded.LoadOrStore(name, func() *Encoded { return e }, maxEncoded)
	return v
}
