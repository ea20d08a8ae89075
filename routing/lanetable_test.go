package routing

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/registry"
)

// tableNames are lane names of every length from 1 to lane.MaxLen, with
// pairs that share their first and last 8 bytes (the words of the hash) and
// differ in between, so that only the whole name tells them apart.
func tableNames() []string {
	var names []string
	seen := map[string]bool{}
	for n := 1; n <= lane.MaxLen; n++ {
		mid := n / 2
		for _, l := range []string{
			strings.Repeat("a", n), strings.Repeat("a", n-1) + "b", "b" + strings.Repeat("a", n-1),
			strings.Repeat("a", mid) + "z" + strings.Repeat("a", n-mid-1),
		} {
			if !seen[l] {
				seen[l] = true
				names = append(names, l)
			}
		}
	}
	return names
}

func TestLaneTable(t *testing.T) {
	names := tableNames()
	for _, size := range []int{0, 1, 2, 3, 100, len(names)} {
		routes := map[string]*route{}
		for _, l := range names[:size] {
			routes[l] = &route{lane: l}
		}
		tab := newLaneTable(routes)
		if len(tab.slots) < 4 || len(tab.slots) < 2*size {
			t.Fatalf("%d routes in %d slots", size, len(tab.slots))
		}
		for i, l := range names {
			r := tab.get(l)
			switch {
			case i < size && (r == nil || r.lane != l):
				t.Errorf("%d routes: get(%q) = %v", size, l, r)
			case i >= size && r != nil:
				t.Errorf("%d routes: get(%q) = route of %q, want none", size, l, r.lane)
			}
		}
		for _, l := range []string{"", "nobody", strings.Repeat("a", lane.MaxLen+1), "a\x00", "\x00a"} {
			if r := tab.get(l); r != nil {
				t.Errorf("%d routes: get(%q) = route of %q, want none", size, l, r.lane)
			}
		}
	}
}

// TestLaneWordsAreTheName checks that up to 16 bytes, two names of the same
// length have the same words only when they are the same name: what lets a
// lookup compare words instead of names.
func TestLaneWordsAreTheName(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for n := 0; n <= 16; n++ {
		seen := map[[2]uint64]string{}
		for range 2000 {
			b := make([]byte, n)
			for i := range b {
				b[i] = "ab"[rng.IntN(2)]
			}
			s := string(b)
			a, w := laneWords(s)
			if prev, ok := seen[[2]uint64{a, w}]; ok && prev != s {
				t.Fatalf("%q and %q have the same words", prev, s)
			}
			seen[[2]uint64{a, w}] = s
		}
	}
}

// TestPickFindsEveryLane picks lanes of every length, through the lookup
// Pick makes inline, among lanes that differ only in their middle bytes.
func TestPickFindsEveryLane(t *testing.T) {
	var names []string
	for _, l := range tableNames() {
		if lane.Valid(l) {
			names = append(names, l)
		}
	}
	e := New()
	defer e.Close()
	var insts []registry.Instance
	for i, l := range names {
		insts = append(insts, inst(t, fmt.Sprintf("i%d orders 10.0.0.%d:80 lane=%s", i, i%250, l)))
	}
	insts = append(insts, inst(t, "base orders 10.0.1.1:80"))
	e.SetInstances("orders", insts)
	svc := e.Service("orders")
	for _, l := range names {
		r, err := svc.Pick(Request{Lane: l})
		if err != nil || r.Lane != l || r.RequestLane != l || r.Reason != ReasonLane || r.Instance.Lane != l {
			t.Errorf("Pick(%q) = lane %q, request lane %q, %v, instance %+v, %v", l, r.Lane, r.RequestLane, r.Reason, r.Instance, err)
		}
	}
	for _, l := range []string{"nobody", strings.Repeat("q", 40)} {
		r, err := svc.Pick(Request{Lane: l})
		if err != nil || r.Lane != "" || r.RequestLane != l || r.Reason != ReasonLaneEmpty {
			t.Errorf("Pick(%q) = lane %q, request lane %q, %v, %v; want the baseline", l, r.Lane, r.RequestLane, r.Reason, err)
		}
	}
}
