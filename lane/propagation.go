package lane

import "context"

// Header names and the baggage key that carry the lane.
const (
	// Header is the header that carries the lane, in lower case.
	Header = "x-lane"
	// BaggageHeader is the W3C baggage header.
	BaggageHeader = "baggage"
	// BaggageKey is the key of the baggage list-member that carries the lane.
	BaggageKey = "lane"
)

// A Propagator reads the lane from incoming headers and writes it to
// outgoing ones. The zero value reads and writes [Header] and the [BaggageKey]
// member of the W3C [BaggageHeader].
//
// A Propagator is safe for concurrent use as long as Aliases is not modified.
type Propagator struct {
	// Aliases are more header names to read the lane from, after Header and
	// baggage, in order: the headers of a system that a fleet moves over
	// from, such as "clk", "dubbo.tag", "service-lane", "x-asm-prefer-tag"
	// or "sd-routing-key". Their values must be lane names too.
	//
	// Aliases are only read, never written; [Propagator.Inject] deletes them
	// for a baseline request. An empty alias, or one that names Header or
	// BaggageHeader, is ignored.
	Aliases []string
}

// Extract reads the lane of an incoming request from c. It returns the
// normalised lane, or "" for the baseline, and the source that decided:
// [Header], [BaggageHeader] or an alias as spelled in p.Aliases, or "" when
// no header carries a lane. Counting sources shows when a fleet has moved off
// an alias.
//
// The sources are read in order: [Header], then the [BaggageKey] member of
// [BaggageHeader], then each of p.Aliases. The first source that is present,
// that is not empty after trimming, decides; the others are not looked at.
// Its value is normalised with [Parse]; a baggage value is percent-decoded
// first.
//
// A value that is not a valid lane name never selects a lane: Extract then
// returns the baseline and a [*NameError] with its Header set, so that the
// caller can log or count it, or, at the edge, refuse the request with the
// error's Rule.
//
// So an invalid x-lane next to a valid baggage lane is an invalid lane: the
// header that wins when valid does not lose when broken. The gateway, which
// calls Extract too, refuses such a request; a service serves it as a
// baseline request.
//
// Baggage is read as OpenTelemetry Go reads it, so that both agree on the
// lane of a request (docs/routing.md lists the few differences): baggage
// headers over 8192 bytes together carry nothing; each header is read up to
// 64 distinct keys; malformed members (a key that is not a token, a value
// with a character outside the W3C baggage-octets, a broken percent-escape,
// a malformed property) are skipped; of several lane members the last one
// counts. A lane member with an empty value counts as absent.
//
// Extract does not allocate when the lane comes normalised in [Header].
func (p Propagator) Extract(c Carrier) (name, source string, err error) {
	if v := c.Get(Header); !blank(v) {
		return parseFrom(v, Header)
	}
	if v, ok := laneMember(c.Values(BaggageHeader)); ok {
		d, ok := unescape(v)
		if !ok {
			return "", BaggageHeader, &NameError{Value: v, Rule: RuleChars, Header: BaggageHeader}
		}
		if !blank(d) {
			return parseFrom(d, BaggageHeader)
		}
	}
	for _, a := range p.Aliases {
		if ignored(a) {
			continue
		}
		if v := c.Get(a); !blank(v) {
			return parseFrom(v, a)
		}
	}
	return "", "", nil
}

// ExtractContext returns a copy of ctx that carries the lane read from c by
// [Propagator.Extract]. When there is no lane, or an invalid one, the copy
// carries the baseline explicitly, hiding any lane already in ctx. Use
// Extract to see the error of an invalid lane.
func (p Propagator) ExtractContext(ctx context.Context, c Carrier) context.Context {
	name, _, _ := p.Extract(c)
	return WithLane(ctx, name)
}

// Inject writes the lane of ctx (see [FromContext]) to the outgoing headers
// in c, as [Propagator.InjectCall] does.
func (p Propagator) Inject(ctx context.Context, c Carrier) {
	v := Carry(ctx)
	p.inject(v.name, v.member, c)
}

// InjectCall writes the lane name of one outgoing call (the lane of its
// context, or the lane that a canary split at this hop chose) to the
// headers in c, as [Propagator.InjectLane] does; for a baseline call it also
// writes the request key of ctx ([KeyFromContext]), if any, as the baggage
// member [KeyMember], replacing any other, so that the next hops split the
// request as this one did.
func (p Propagator) InjectCall(ctx context.Context, name string, c Carrier) {
	p.inject(name, Carry(ctx).member, c)
}

// InjectCarried is [Propagator.InjectCall] for a transport that has read
// what the call's context carries already ([Carry]): it writes the lane
// name of the call, and for a baseline call the request key of v, without
// looking them up again.
func (p Propagator) InjectCarried(v *Carried, name string, c Carrier) {
	p.inject(name, v.member, c)
}

// InjectLane writes the lane name to the outgoing headers in c.
//
// For a lane, it sets [Header] to name, and rewrites [BaggageHeader] as a
// single value with the member lane=name first, followed by the other
// members, untouched and in order. Other members beyond the W3C limits of
// the incoming header are dropped, and so are the trailing ones that would
// take the header past 64 members or 8192 bytes. Alias headers are left
// alone: Header, read first, overrides them.
//
// For the baseline (name ""), it removes stale lane headers: it deletes
// Header and every alias header, and removes the lane member from baggage,
// keeping the other members (the header is deleted if none is left, and left
// as it is if it has no lane member).
//
// A name that is not normalised is normalised with [Parse]; an invalid name
// is written as the baseline.
//
// OpenTelemetry's baggage propagator sets the baggage header whole: call
// Inject after it, so that the lane member is kept, or keep the
// OpenTelemetry baggage of the context in step ([SyncBaggage]).
func (p Propagator) InjectLane(name string, c Carrier) {
	p.inject(name, "", c)
}

// inject is InjectLane, with km the baggage member of the request key to
// write for a baseline call ("" for none).
func (p Propagator) inject(name, km string, c Carrier) {
	if name != "" && !Valid(name) {
		if n, err := Parse(name); err == nil {
			name = n
		} else {
			name = ""
		}
	}
	bag := c.Values(BaggageHeader)
	if name != "" {
		c.Set(Header, name)
		if len(bag) == 0 {
			c.Set(BaggageHeader, encode(name).Baggage[0])
		} else {
			c.Set(BaggageHeader, rewriteBaggage(bag, name, ""))
		}
		return
	}
	c.Del(Header)
	for _, a := range p.Aliases {
		if !ignored(a) {
			c.Del(a)
		}
	}
	switch {
	case km != "" && len(bag) == 0:
		c.Set(BaggageHeader, km)
	case km != "":
		c.Set(BaggageHeader, rewriteBaggage(bag, "", km))
	case hasLaneMember(bag):
		if v := rewriteBaggage(bag, "", ""); v != "" {
			c.Set(BaggageHeader, v)
		} else {
			c.Del(BaggageHeader)
		}
	}
}

// parseFrom parses the value v of header h.
func parseFrom(v, h string) (name, source string, err error) {
	name, r := parse(v)
	if r != "" {
		return "", h, &NameError{Value: v, Rule: r, Header: h}
	}
	return name, h, nil
}

// blank reports whether v is empty after trimming ASCII spaces and tabs, as
// Parse trims.
func blank(v string) bool {
	return trimOWS(v) == ""
}

// ignored reports whether alias is empty or names Header or BaggageHeader.
func ignored(alias string) bool {
	return alias == "" || equalFold(alias, Header) || equalFold(alias, BaggageHeader)
}
