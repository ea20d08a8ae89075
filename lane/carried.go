package lane

import "context"

// Carried is what travels with a request from one hop to the next: its lane,
// the request key of a baseline request (see [WithKey]), and what lanes
// writes for them, encoded once: the lane's header values ([Encoded]) and
// the key's baggage member. A context holds one Carried, stored by
// [WithLane], [WithKey], [Propagator.ExtractContext] and
// [Propagator.ExtractKeyContext]; [Carry] reads it with one lookup, so
// that a transport reads the lane, the key and their headers for an
// outgoing call without parsing or encoding them again.
//
// A Carried is immutable: the functions that change the lane or the key
// store a new one.
type Carried struct {
	name   string
	member string   // KeyMember + "=" + key, or "" for no key
	enc    *Encoded // name's headers; nil for the baseline
}

// carriedKey is the context key of the Carried of a context. Being an
// unexported type, no other package can read or overwrite the value behind
// it.
type carriedKey struct{}

// none is what a context without a Carried carries: the baseline, no key.
var none = &Carried{}

// Carry returns what ctx carries: its lane and request key, with their
// headers. It never returns nil (a context without a lane carries the
// baseline and no key), and it does not allocate.
func Carry(ctx context.Context) *Carried {
	if c, _ := ctx.Value(carriedKey{}).(*Carried); c != nil {
		return c
	}
	return none
}

// Lane returns the lane ("" for the baseline), as [FromContext] does.
func (c *Carried) Lane() string { return c.name }

// Key returns the request key, as [KeyFromContext] does: "" when there is
// none.
func (c *Carried) Key() string {
	if c.member == "" {
		return ""
	}
	return c.member[len(KeyMember)+1:]
}

// Encoded returns the headers of the lane, as [Encode] returns them; nil
// for the baseline.
func (c *Carried) Encoded() *Encoded { return c.enc }

// with returns what c carries with the lane name (normalised, or the
// baseline) and the key member km ("" for none): c itself when nothing
// changes, a value cached with the lane's encoding when there is no key,
// and a new value otherwise.
func (c *Carried) with(name, km string) *Carried {
	if c.name == name && c.member == km {
		return c
	}
	var enc *Encoded
	if name != "" {
		if enc = Encode(name); enc == nil { // not normalised: stored as given, written as Inject writes it
			return &Carried{name: name, member: km}
		}
	}
	switch {
	case km != "":
		return &Carried{name: name, member: km, enc: enc}
	case enc != nil:
		return enc.carried
	}
	return none
}

// store returns ctx carrying v, unless it carries it already.
func store(ctx context.Context, cur, v *Carried) context.Context {
	if v == cur {
		return ctx
	}
	return context.WithValue(ctx, carriedKey{}, v)
}
