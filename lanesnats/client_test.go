package lanesnats_test

import (
	"context"
	"errors"
	"testing"

	"github.com/lanesdev/lanes/lanesnats"
	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

// TestNoConnection: a service without a NATS connection gets an error that
// says what to set, never a nil-pointer panic.
func TestNoConnection(t *testing.T) {
	var c *lanesnats.Client // what lanesenv leaves without LANES_NATS
	if _, err := c.Publisher("orders"); !errors.Is(err, lanesnats.ErrNoConnection) {
		t.Errorf("Publisher on a nil Client: %v, want ErrNoConnection", err)
	}
	if _, err := c.Consumer(context.Background(), lanesnats.ConsumerConfig{}, nil); !errors.Is(err, lanesnats.ErrNoConnection) {
		t.Errorf("Consumer on a nil Client: %v, want ErrNoConnection", err)
	}
	if err := c.CreateStreams(context.Background(), "orders"); !errors.Is(err, lanesnats.ErrNoConnection) {
		t.Errorf("CreateStreams on a nil Client: %v, want ErrNoConnection", err)
	}
	e := routing.New()
	defer e.Close()
	if _, err := lanesnats.NewClient(nil, registry.NewMemory(), e); !errors.Is(err, lanesnats.ErrInvalidOption) {
		t.Errorf("NewClient(nil connection): %v, want ErrInvalidOption", err)
	}
}
