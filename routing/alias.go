package routing

// alias is Vose's alias table: a weighted choice in O(1) from one 64-bit
// number. The pick path feeds it the group's counter, scrambled, so that a
// weighted group is walked in a well-spread, deterministic order without a
// random-number generator or a lock.
type alias struct {
	prob  []uint32 // threshold of column i, scaled to 2^32
	other []uint32 // the column's alias
}

// makeAlias makes the table of weights in cols, which holds the 2n columns
// (prob and other, in one allocation; made here when nil) and is the
// table's from then on.
func makeAlias(weights []int, cols []uint32) alias {
	n := len(weights)
	if cols == nil {
		cols = make([]uint32, 2*n)
	}
	a := alias{prob: cols[:n:n], other: cols[n : 2*n : 2*n]}
	var sum float64
	for _, w := range weights {
		sum += float64(w)
	}
	// The scratch of a small table stays on the stack.
	var scaledBuf [16]float64
	var workBuf [16]int
	scaled, work := scaledBuf[:0], workBuf[:0]
	if n > len(scaledBuf) {
		scaled, work = make([]float64, 0, n), make([]int, 0, n)
	}
	scaled, work = scaled[:n], work[:n]
	// The small columns stack up from the start of work, the large ones
	// down from its end: every column is in one of them.
	ns, nl := 0, n
	for i, w := range weights {
		scaled[i] = float64(w) * float64(n) / sum
		if scaled[i] < 1 {
			work[ns] = i
			ns++
		} else {
			nl--
			work[nl] = i
		}
	}
	for ns > 0 && nl < n {
		s, l := work[ns-1], work[nl]
		ns--
		a.prob[s] = uint32(scaled[s] * (1 << 32))
		a.other[s] = uint32(l)
		scaled[l] -= 1 - scaled[s]
		if scaled[l] < 1 {
			nl++
			work[ns] = l
			ns++
		}
	}
	for _, i := range work[:ns] {
		a.prob[i] = 1<<32 - 1
		a.other[i] = uint32(i)
	}
	for _, i := range work[nl:] {
		a.prob[i] = 1<<32 - 1
		a.other[i] = uint32(i)
	}
	return a
}

// pick maps a counter value to a column.
func (a *alias) pick(counter uint64) int {
	u := mix64(counter)
	col := int((u & 0xffffffff) * uint64(len(a.prob)) >> 32)
	if uint32(u>>32) < a.prob[col] {
		return col
	}
	return int(a.other[col])
}

// mix64 is the splitmix64 finaliser.
func mix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// keyBucket hashes a request key (FNV-1a, then mixed) into 0..buckets-1. It
// is stable across processes and versions, so every hop and every gateway
// replica splits a key the same way.
func keyBucket(key string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(key); i++ {
		h ^= uint64(key[i])
		h *= 1099511628211
	}
	return mix64(h) % buckets
}
