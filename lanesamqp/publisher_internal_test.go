package lanesamqp

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/lanesdev/lanes/internal/lib/mqlane"
	"github.com/lanesdev/lanes/lane"
)

// The headers of an untraced message without headers of its own, taken
// from the publisher's table of the lane, are those that the general path
// writes: for the baseline, a lane, a lane not normalised in the context,
// and lanes past the tables' bound.
func TestMessageHeadersOfLaneTables(t *testing.T) {
	p, err := NewPublisher(func(context.Context) (*amqp.Connection, error) { return nil, errors.New("no broker") }, "orders")
	if err != nil {
		t.Fatal(err)
	}
	check := func(given string) {
		t.Helper()
		ctx := lane.WithLane(context.Background(), given)
		carried := lane.Carry(ctx)
		l := mqlane.Norm(carried.Lane())
		got := p.messageHeaders(ctx, carried, l, nil, false)
		want := p.headers(ctx, l, nil, false)
		if !maps.Equal(got, want) {
			t.Errorf("lane %q: headers %v, want %v", given, got, want)
		}
		if again := p.messageHeaders(ctx, carried, l, nil, false); l != "" && p.tables.n.Load() < maxLaneTables &&
			fmt.Sprintf("%p", again) != fmt.Sprintf("%p", got) {
			t.Errorf("lane %q: a second table for the lane", given)
		}
	}
	for _, l := range []string{"", "alice", "ALICE", "bob"} {
		check(l)
	}
	for i := range maxLaneTables + 10 {
		check(fmt.Sprintf("lane-%d", i))
	}
	if n := p.tables.n.Load(); n != maxLaneTables {
		t.Errorf("%d lanes' tables kept, want the bound %d", n, maxLaneTables)
	}
}
