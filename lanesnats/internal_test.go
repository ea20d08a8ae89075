package lanesnats

import (
	"testing"

	"github.com/nats-io/nats.go"
)

// TestAckInfo: the ack subject parser agrees with nats.go's on both forms,
// without allocating.
func TestAckInfo(t *testing.T) {
	for _, reply := range []string{
		"$JS.ACK.orders.invoices_alice.3.1042.77.1700000000000000000.5",
		"$JS.ACK._.ACCHASH.orders.invoices_alice.3.1042.77.1700000000000000000.5.abc",
		"$JS.ACK.hub.ACCHASH.orders.invoices__.1.9.9.1700000000000000000.0",
	} {
		m := &nats.Msg{Reply: reply, Sub: &nats.Subscription{}}
		meta, err := m.Metadata()
		if err != nil {
			t.Fatal(err)
		}
		seq, n, ok := ackInfo(reply)
		if !ok || seq != meta.Sequence.Stream || n != meta.NumDelivered {
			t.Errorf("%s: %d %d %v, nats.go says %d %d", reply, seq, n, ok, meta.Sequence.Stream, meta.NumDelivered)
		}
	}
	for _, bad := range []string{"", "_INBOX.x", "$JS.ACK.a.b.c", "$JS.ACK.s.c.x.1.1.1.1"} {
		if _, _, ok := ackInfo(bad); ok {
			t.Errorf("%q accepted", bad)
		}
	}
	if n := testing.AllocsPerRun(100, func() { ackInfo("$JS.ACK.orders.invoices_alice.3.1042.77.1700000000000000000.5") }); n != 0 {
		t.Errorf("%v allocations", n)
	}
}
