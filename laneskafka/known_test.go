package laneskafka_test

import (
	"context"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/laneskafka"
)

// TestKnownTopicsBounded: past the bound of its memory of the lane topics
// it created, a publisher forgets the one remembered longest, counts it,
// and publishes to it again as to a new one.
func TestKnownTopicsBounded(t *testing.T) {
	laneskafka.SetMaxKnownTopics(t, 2)
	cl, err := kgo.NewClient(kgo.SeedBrokers(fakeBrokers(t)...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	pub, err := laneskafka.NewPublisher(cl, "orders")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i, l := range []string{"alice", "bob", "alice", "carol", "alice"} {
		if err := pub.Publish(lane.WithLane(ctx, l), nil, []byte(l)); err != nil {
			t.Fatalf("message %d in %s: %v", i, l, err)
		}
	}
	// alice, bob; alice known; carol forgets alice; alice forgets bob.
	if n := pub.Forgotten(); n != 2 {
		t.Errorf("%d topics forgotten, want 2", n)
	}
}
