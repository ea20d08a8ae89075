package amqptest_test

import (
	"net"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/lanesdev/lanes/internal/testkit/amqptest"
	"github.com/lanesdev/lanes/internal/testkit/leaktest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, leaktest.Options()...) }

// TestKillStart: Kill ends the broker itself (nothing answers on its port
// any more), and Start brings it back on the same port.
func TestKillStart(t *testing.T) {
	b := amqptest.Start(t)
	if err := b.Kill(); err != nil {
		t.Fatal(err)
	}
	if c, err := net.DialTimeout("tcp", b.Addr(), time.Second); err == nil {
		c.Close()
		t.Fatalf("something still answers on %s after Kill", b.Addr())
	}
	if err := b.Start(); err != nil {
		t.Fatal(err)
	}
	c, err := net.DialTimeout("tcp", b.Addr(), 5*time.Second)
	if err != nil {
		t.Fatalf("the broker is not back on %s: %v", b.Addr(), err)
	}
	c.Close()
}
