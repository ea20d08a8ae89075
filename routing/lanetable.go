package routing

import (
	"math/bits"
	"math/rand/v2"
)

// laneTable finds the route of a request lane: the lookup of every lane
// pick. It is built once per snapshot and only read after, so it can be
// cheaper than a Go map: the hash is one multiplication of the name's first
// and last bytes, the table is at most half full (linear probing), and a
// name of up to 16 bytes is compared as the two words the hash was made of
// and its length, without a call (Service.Pick has the lookup inline). A
// lookup never inserts, so whatever lanes requests carry, the longest probe
// is one the build saw; the seed is random per snapshot.
type laneTable struct {
	slots []laneSlot // a power of two of them, at least 4 and twice the lanes
	mask  uint64
	seed  uint64
}

// laneSlot is one slot of a laneTable; an empty one has a nil route.
type laneSlot struct {
	a, b  uint64 // laneWords of key
	key   string
	route *route
}

// maxProbe is the longest probe the build accepts before it tries another
// seed (it keeps the last table if none does better).
const maxProbe = 8

// noLanes is the table of a snapshot without lane routes, shared, as
// tables are only read.
var noLanes [4]laneSlot

// newLaneTable makes the table of routes.
func newLaneTable(routes map[string]*route) laneTable {
	if len(routes) == 0 {
		return laneTable{slots: noLanes[:], mask: uint64(len(noLanes) - 1)}
	}
	size := 4
	for size < 2*len(routes) {
		size *= 2
	}
	var t laneTable
	for range 4 {
		t = laneTable{slots: make([]laneSlot, size), mask: uint64(size - 1), seed: rand.Uint64()}
		longest := 0
		for k, r := range routes {
			a, b := laneWords(k)
			i, n := t.slot(a, b, len(k)), 1
			for t.slots[i].route != nil {
				i, n = (i+1)&t.mask, n+1
			}
			t.slots[i] = laneSlot{a: a, b: b, key: k, route: r}
			longest = max(longest, n)
		}
		if longest <= maxProbe {
			break
		}
	}
	return t
}

// get returns the route of lane l, or nil.
func (t *laneTable) get(l string) *route {
	a, b := laneWords(l)
	for i := t.slot(a, b, len(l)); ; i = (i + 1) & t.mask {
		if s := &t.slots[i]; s.route == nil || s.is(a, b, l) {
			return s.route
		}
	}
}

// is reports whether the slot holds lane l, whose laneWords are a and b.
// Up to 16 bytes, the words and the length are the whole name.
func (s *laneSlot) is(a, b uint64, l string) bool {
	return s.a == a && s.b == b && len(s.key) == len(l) && (len(l) <= 16 || s.key == l)
}

// slot is where the probe for the name of words a, b and length n starts.
func (t *laneTable) slot(a, b uint64, n int) uint64 {
	hi, lo := bits.Mul64(a^t.seed, b^uint64(n)^0x9e3779b97f4a7c15)
	return (hi ^ lo) & t.mask
}

// laneWords returns two words of s that, with its length, make it whole
// when it has at most 16 bytes: its first and last 8 bytes (which overlap
// below 16), its first and last 4 below 8, and its first, middle and last
// byte below 4.
func laneWords(s string) (a, b uint64) {
	switch n := len(s); {
	case n >= 8:
		a, b = le64(s), le64(s[n-8:])
	case n >= 4:
		a, b = le32(s), le32(s[n-4:])
	case n > 0:
		a = uint64(s[0])<<16 | uint64(s[n>>1])<<8 | uint64(s[n-1])
	}
	return a, b
}

// le64 and le32 read the first bytes of s as a little-endian number (one
// load each, as the compiler combines the byte loads).
func le64(s string) uint64 {
	_ = s[7]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
}

func le32(s string) uint64 {
	_ = s[3]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24
}
