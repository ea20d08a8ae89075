package routing

import (
	"math"
	"math/rand/v2"
	"testing"
)

// The alias table gives each column exactly its share of the weight.
func TestAliasShares(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, ws := range [][]int{{1}, {1, 1}, {1, 2, 3, 4}, {100, 1, 1, 1, 1000}, {5, 0, 5}} {
		checkAlias(t, ws)
	}
	for range 50 {
		ws := make([]int, 1+rng.IntN(40))
		for i := range ws {
			ws[i] = rng.IntN(1000) + 1
		}
		checkAlias(t, ws)
	}
}

func checkAlias(t *testing.T, ws []int) {
	t.Helper()
	a := makeAlias(ws, nil)
	n := float64(len(ws))
	sum := 0.0
	for _, w := range ws {
		sum += float64(w)
	}
	mass := make([]float64, len(ws))
	for i := range ws {
		p := float64(a.prob[i]) / (1 << 32)
		mass[i] += p / n
		mass[a.other[i]] += (1 - p) / n
	}
	for i, w := range ws {
		if want := float64(w) / sum; math.Abs(mass[i]-want) > 1e-6 {
			t.Errorf("weights %v: column %d has share %.6f, want %.6f", ws, i, mass[i], want)
		}
	}
}
