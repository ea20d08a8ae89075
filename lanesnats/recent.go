package lanesnats

import "hash/maphash"

// recentAcks remembers the messages a fetcher acknowledged lately, by
// stream sequence and content, so that a redelivery of one of them is
// acknowledged again instead of handled a second time. JetStream delivers a
// message again when its ack arrives after AckWait, which happens to a
// consumer working through its buffered batches late (a starved process),
// even though it handled the first copy: both copies then reach the same
// fetcher, a few messages apart.
//
// The content is part of the key because a stream whose leader was killed
// can give a sequence to another message than the one first acknowledged
// with it: a different message at a remembered sequence is handled. The
// ring holds four batches, more than a fetcher has in flight or buffered
// (two), and is only searched for messages delivered more than once.
type recentAcks struct {
	seed maphash.Seed
	ring []ackedMsg
	next int
}

type ackedMsg struct{ seq, sum uint64 }

// sum identifies d's content: its subject, message id and data.
func (r *recentAcks) sum(d *Delivery) uint64 {
	var h maphash.Hash
	h.SetSeed(r.seed)
	h.WriteString(d.Subject)
	h.WriteByte(0)
	h.WriteString(d.MsgID)
	h.WriteByte(0)
	h.Write(d.Data)
	return h.Sum64()
}

// add remembers that d was acknowledged; size is the ring's length, set
// when the first ack is remembered.
func (r *recentAcks) add(d *Delivery, size int) {
	if r.ring == nil {
		r.seed = maphash.MakeSeed()
		r.ring = make([]ackedMsg, size)
	}
	r.ring[r.next] = ackedMsg{seq: d.Seq, sum: r.sum(d)}
	r.next = (r.next + 1) % len(r.ring)
}

// has reports whether d, delivered again, is a message acknowledged lately.
func (r *recentAcks) has(d *Delivery) bool {
	if d.NumDelivered < 2 || r.ring == nil {
		return false
	}
	var sum uint64
	for _, a := range r.ring {
		if a.seq == d.Seq && a.seq != 0 {
			if sum == 0 {
				sum = r.sum(d)
			}
			if a.sum == sum {
				return true
			}
		}
	}
	return false
}
