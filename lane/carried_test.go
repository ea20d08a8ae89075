package lane

import (
	"context"
	"net/http"
	"testing"
	"unsafe"
)

// What a context carries is one value: the lane and the key read together, each kept when the
// other changes, with the lane's encoded headers.
func TestCarry(t *testing.T) {
	bg := context.Background()
	if v := Carry(bg); v == nil || v.Lane() != "" || v.Key() != "" || v.Encoded() != nil {
		t.Fatalf("Carry(Background) = %+v, want the baseline without a key", v)
	}
	ctx := WithKey(bg, "k1")
	ctx = WithLane(ctx, "alice")
	v := Carry(ctx)
	if v.Lane() != "alice" || v.Key() != "k1" {
		t.Errorf("after WithKey, WithLane: lane %q key %q, want alice k1", v.Lane(), v.Key())
	}
	if v.Encoded() != Encode("alice") {
		t.Error("Carried.Encoded is not the lane's encoding")
	}
	ctx = WithKey(ctx, "k2")
	if v := Carry(ctx); v.Lane() != "alice" || v.Key() != "k2" {
		t.Errorf("after WithKey: lane %q key %q, want alice k2", v.Lane(), v.Key())
	}
	ctx = WithLane(ctx, "")
	if v := Carry(ctx); v.Lane() != "" || v.Key() != "k2" || v.Encoded() != nil {
		t.Errorf("after WithLane baseline: lane %q key %q enc %v, want baseline k2 nil", v.Lane(), v.Key(), v.Encoded())
	}
	if FromContext(ctx) != "" || KeyFromContext(ctx) != "k2" {
		t.Errorf("FromContext, KeyFromContext = %q, %q", FromContext(ctx), KeyFromContext(ctx))
	}
	// Writing the carried value is InjectCall's writing.
	h, want := http.Header{}, http.Header{}
	Propagator{}.InjectCarried(Carry(ctx), "", HTTPHeader(h))
	Propagator{}.InjectCall(ctx, "", HTTPHeader(want))
	if h.Get("Baggage") != "lanes-key=k2" || h.Get("Baggage") != want.Get("Baggage") {
		t.Errorf("InjectCarried wrote baggage %q, InjectCall %q", h.Get("Baggage"), want.Get("Baggage"))
	}
}

// Reading what a context carries costs one lookup and no allocation, and storing a lane of the
// fleet without a key allocates only the contexts.
func TestCarryAllocs(t *testing.T) {
	ctx := WithLane(context.Background(), "alice")
	if n := testing.AllocsPerRun(100, func() {
		v := Carry(ctx)
		_, _, _ = v.Lane(), v.Key(), v.Encoded()
	}); n != 0 {
		t.Errorf("Carry allocates %v times", n)
	}
	bg := context.Background()
	// One for the lane's value, two for the OpenTelemetry baggage that agrees with it.
	if n := testing.AllocsPerRun(100, func() { WithLane(bg, "alice") }); n > 3 {
		t.Errorf("WithLane of a cached lane allocates %v times, want 3", n)
	}
	if n := testing.AllocsPerRun(100, func() { WithLane(bg, "") }); n != 0 {
		t.Errorf("WithLane baseline on a context without a lane allocates %v times", n)
	}
}

// A lane name that arrives in a buffer the caller reuses is copied before the encoding cache
// keeps it.
func TestEncodeCopiesName(t *testing.T) {
	buf := []byte("carried-copy-test")
	name := unsafe.String(&buf[0], len(buf)) // as a server that reads names in place hands them
	ctx := WithLane(context.Background(), name)
	copy(buf, "xxxxxxxxxxxxxxxxx") // the buffer serves the next request
	e := Encode("carried-copy-test")
	if e == nil || e.Header[0] != "carried-copy-test" || e.HTTP.Get("Baggage") != "lane=carried-copy-test" {
		t.Fatalf("Encode after the buffer changed = %+v", e)
	}
	if Carry(ctx).Encoded() != e || Carry(ctx).Lane() != "carried-copy-test" {
		t.Errorf("WithLane does not carry the cached encoding: %q", Carry(ctx).Lane())
	}
}
