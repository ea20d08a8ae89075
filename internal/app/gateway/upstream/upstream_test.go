package upstream

import (
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/lanesdev/lanes/internal/testkit/leaktest"
	"github.com/lanesdev/lanes/internal/testkit/timing"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, leaktest.Options()...) }

// eventually polls cond until it holds, for 20s at most.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	timing.Until(t, what, 20*time.Second, cond)
}

// TestPoolSweep: the sweeper keeps a pool whose connection is in use, closes
// an idle connection past the timeout, and then drops the pool.
func TestPoolSweep(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	u := newUpstreams(4, 90*time.Second, 0, 0, nil)
	addr := l.Addr().String()
	p := u.pool(addr)
	now := time.Now()
	c, _, err := p.get(now)
	if err != nil {
		t.Fatal(err)
	}
	later := now.Add(2 * u.idleTimeout)
	u.sweep(later)
	if loaded(u, addr) != p {
		t.Fatal("the sweeper dropped a pool with a connection in use")
	}
	p.put(c, now)
	u.sweep(now.Add(u.idleTimeout / 2))
	if loaded(u, addr) != p || len(p.idle) != 1 {
		t.Fatalf("the sweeper dropped a connection idle for half the timeout (idle %d)", len(p.idle))
	}
	u.sweep(later)
	if _, err := c.c.Read(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
		t.Errorf("after the idle timeout, reading the idle connection: %v, want net.ErrClosed", err)
	}
	if loaded(u, addr) != nil {
		t.Error("the sweeper kept the pool of an unused instance")
	}
	if u.pool(addr) == p {
		t.Error("the dropped pool came back")
	}
}

// idlePair is an upstream connection's check (idleCheck) on one end of a
// loopback connection, and the other end.
func idlePair(tb testing.TB) (*idleCheck, net.Conn) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer l.Close()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	peer, err := l.Accept()
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { peer.Close() })
	k := new(idleCheck)
	k.init(c)
	return k, peer
}

// TestIdleCheck: the look at an idle connection finds nothing on a quiet
// one, without allocating, and finds a byte, or the end, once the peer has
// sent one, or closed.
func TestIdleCheck(t *testing.T) {
	k, peer := idlePair(t)
	if k.spoiled() {
		t.Fatal("a quiet connection looks spoiled")
	}
	if n := testing.AllocsPerRun(100, func() { k.spoiled() }); n != 0 {
		t.Errorf("a look allocates %v times", n)
	}
	if k.raw == nil {
		t.Skip("no look at idle connections on this system")
	}
	io.WriteString(peer, "x")
	eventually(t, "the byte to be seen", k.spoiled)
	k2, peer2 := idlePair(t)
	peer2.Close()
	eventually(t, "the end to be seen", k2.spoiled)
}

// BenchmarkIdleCheck is the cost of the look at an idle connection that
// the fast path takes before it reuses one: a system call.
func BenchmarkIdleCheck(b *testing.B) {
	k, _ := idlePair(b)
	b.ReportAllocs()
	for b.Loop() {
		if k.spoiled() {
			b.Fatal("spoiled")
		}
	}
}

// loaded is the pool of addr that u holds, nil for none.
func loaded(u *Client, addr string) *upPool {
	p, _ := u.m.Load(addr)
	return p
}
