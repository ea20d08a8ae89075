package lanesnats

import "testing"

// TestRecentAcks: a copy delivered again of a message acknowledged lately
// is known; a first delivery, another message at the same sequence (a
// stream leader's loss) and a message pushed out of the ring are not.
func TestRecentAcks(t *testing.T) {
	var r recentAcks
	d := func(seq, n uint64, data string) *Delivery {
		return &Delivery{Seq: seq, NumDelivered: n, Subject: "created", MsgID: data, Data: []byte(data)}
	}
	if r.has(d(1, 2, "a")) {
		t.Fatal("an empty ring knows a message")
	}
	r.add(d(1, 1, "a"), 3)
	r.add(d(2, 1, "b"), 3)
	for _, tc := range []struct {
		what string
		d    *Delivery
		want bool
	}{
		{"a copy delivered again", d(1, 2, "a"), true},
		{"the first delivery", d(1, 1, "a"), false},
		{"another message at its sequence", d(1, 2, "x"), false},
		{"a sequence never acknowledged", d(3, 2, "c"), false},
	} {
		if got := r.has(tc.d); got != tc.want {
			t.Errorf("%s: has = %v, want %v", tc.what, got, tc.want)
		}
	}
	r.add(d(3, 1, "c"), 3)
	r.add(d(4, 1, "d"), 3) // pushes out sequence 1
	if r.has(d(1, 2, "a")) {
		t.Error("a message pushed out of the ring is still known")
	}
	if !r.has(d(4, 5, "d")) {
		t.Error("the latest ack is not known")
	}
}

// TestRecentAcksFollow: a lane's next fetcher in the same consumer knows
// what the one before it acknowledged, once that one has exited.
func TestRecentAcksFollow(t *testing.T) {
	d := &Delivery{Seq: 7, NumDelivered: 1, Subject: "created", MsgID: "a", Data: []byte("a")}
	prev := &fetcher{done: make(chan struct{})}
	prev.acked.add(d, 4)
	next := &fetcher{prev: prev, done: make(chan struct{})}
	followed := make(chan struct{})
	go func() {
		defer close(followed)
		next.follow()
	}()
	close(prev.done)
	<-followed
	again := *d
	again.NumDelivered = 2
	if !next.acked.has(&again) {
		t.Fatal("the next fetcher does not know a message its predecessor acknowledged")
	}
	if next.prev != nil {
		t.Fatal("the next fetcher still holds its predecessor")
	}
}
