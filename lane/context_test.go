package lane

import (
	"context"
	"errors"
	"testing"
	"time"
)

type otherKey struct{}

func TestContextRoundTrip(t *testing.T) {
	bg := context.Background()
	if got := FromContext(bg); got != "" {
		t.Errorf("FromContext(Background) = %q, want baseline", got)
	}
	ctx := WithLane(bg, "alice")
	if got := FromContext(ctx); got != "alice" {
		t.Errorf("FromContext = %q, want alice", got)
	}
	if got := FromContext(bg); got != "" {
		t.Errorf("parent changed: FromContext(Background) = %q", got)
	}
	// A downstream baseline decision clears the upstream lane.
	base := WithLane(ctx, "")
	if got := FromContext(base); got != "" {
		t.Errorf("after WithLane(ctx, \"\"): FromContext = %q, want baseline", got)
	}
	if got := FromContext(WithLane(base, "bob")); got != "bob" {
		t.Errorf("FromContext = %q, want bob", got)
	}
	// Storing the lane it already has returns ctx itself.
	if WithLane(ctx, "alice") != ctx {
		t.Error("WithLane with the same lane made a new context")
	}
	// Other string values do not read as a lane.
	other := context.WithValue(bg, otherKey{}, "carol")
	if got := FromContext(other); got != "" {
		t.Errorf("FromContext read another key: %q", got)
	}
}

func TestFromContextAllocs(t *testing.T) {
	ctx := context.WithValue(WithLane(context.Background(), "alice"), otherKey{}, 1)
	if n := testing.AllocsPerRun(100, func() {
		if FromContext(ctx) != "alice" {
			t.Fatal("lost the lane")
		}
	}); n != 0 {
		t.Errorf("FromContext: %v allocations, want 0", n)
	}
}

func TestDetach(t *testing.T) {
	parent, cancel := context.WithTimeout(context.Background(), time.Hour)
	parent = context.WithValue(WithLane(parent, "alice"), otherKey{}, "trace")
	d := Detach(parent)
	cancel()
	if !errors.Is(parent.Err(), context.Canceled) {
		t.Fatalf("parent.Err() = %v", parent.Err())
	}
	if err := d.Err(); err != nil {
		t.Errorf("detached Err() = %v, want nil", err)
	}
	if d.Done() != nil {
		t.Error("detached Done() is not nil")
	}
	if _, ok := d.Deadline(); ok {
		t.Error("detached context has a deadline")
	}
	if got := FromContext(d); got != "alice" {
		t.Errorf("detached lane = %q, want alice", got)
	}
	if got := d.Value(otherKey{}); got != "trace" {
		t.Errorf("detached other value = %v, want trace", got)
	}
}
