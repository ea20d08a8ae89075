package cowmap_test

import (
	"maps"
	"strconv"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/lanesdev/lanes/internal/lib/cowmap"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestZeroValue(t *testing.T) {
	var m cowmap.Map[string, int]
	if v, ok := m.Load("a"); ok || v != 0 {
		t.Errorf("Load on the zero Map = %d, %v", v, ok)
	}
	if m.Len() != 0 {
		t.Errorf("Len = %d", m.Len())
	}
	for k := range m.All() {
		t.Errorf("All yields %q on the zero Map", k)
	}
}

func TestLoadOrStore(t *testing.T) {
	var m cowmap.Map[string, int]
	calls := 0
	make1 := func() int { calls++; return 1 }
	if v, stored := m.LoadOrStore("a", make1, 0); v != 1 || !stored {
		t.Errorf("first LoadOrStore = %d, %v; want 1, true", v, stored)
	}
	if v, stored := m.LoadOrStore("a", func() int { return 2 }, 0); v != 1 || stored {
		t.Errorf("second LoadOrStore = %d, %v; want the stored 1, false", v, stored)
	}
	if calls != 1 {
		t.Errorf("create called %d times, want 1", calls)
	}
	// Past the bound, the value is made and returned, not stored.
	var b cowmap.Map[string, int]
	for i := range 3 {
		b.LoadOrStore(strconv.Itoa(i), func() int { return i }, 2)
	}
	if b.Len() != 2 {
		t.Errorf("Len past the bound = %d, want 2", b.Len())
	}
	if v, stored := b.LoadOrStore("x", func() int { return 7 }, 2); v != 7 || stored {
		t.Errorf("LoadOrStore past the bound = %d, %v; want 7, false", v, stored)
	}
	if _, ok := b.Load("x"); ok {
		t.Error("a value past the bound was stored")
	}
}

func TestUpdateReplaceAll(t *testing.T) {
	var m cowmap.Map[string, int]
	m.Replace(map[string]int{"a": 1, "b": 2})
	before := maps.Collect(m.All())
	seen := m.All()
	m.Update(func(next map[string]int) {
		delete(next, "a")
		next["c"] = 3
	})
	if got := maps.Collect(m.All()); !maps.Equal(got, map[string]int{"b": 2, "c": 3}) {
		t.Errorf("after Update: %v", got)
	}
	if got := maps.Collect(seen); !maps.Equal(got, before) {
		t.Errorf("an iteration begun before Update sees %v, want %v", got, before)
	}
	m.Replace(nil)
	if m.Len() != 0 {
		t.Errorf("Len after Replace(nil) = %d", m.Len())
	}
}

// TestConcurrent reads while writers add, update and replace; run it with -race.
func TestConcurrent(t *testing.T) {
	var m cowmap.Map[int, *int]
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := range 200 {
				k := w*1000 + i
				v, _ := m.LoadOrStore(k, func() *int { return &k }, 0)
				if *v != k {
					t.Errorf("key %d holds %d", k, *v)
					return
				}
				if i%50 == 0 {
					m.Update(func(next map[int]*int) { delete(next, k) })
				}
			}
		})
	}
	for range 2 {
		wg.Go(func() {
			for range 400 {
				for k, v := range m.All() {
					if *v != k {
						t.Errorf("key %d holds %d", k, *v)
						return
					}
				}
				_, _ = m.Load(1)
			}
		})
	}
	wg.Wait()
	if n := m.Len(); n != 4*200-4*4 {
		t.Errorf("Len = %d, want %d", n, 4*200-4*4)
	}
}

func TestLoadDoesNotAllocate(t *testing.T) {
	var m cowmap.Map[string, *int]
	one := 1
	m.LoadOrStore("alice", func() *int { return &one }, 0)
	key := "alice"
	if n := testing.AllocsPerRun(100, func() {
		if _, ok := m.Load(key); !ok {
			t.Fatal("alice missing")
		}
		if _, stored := m.LoadOrStore(key, func() *int { return &one }, 0); stored {
			t.Fatal("alice stored again")
		}
	}); n != 0 {
		t.Errorf("Load and LoadOrStore of a present key allocate %v times, want 0", n)
	}
}

func BenchmarkLoad(b *testing.B) {
	var m cowmap.Map[string, *int]
	for i := range 16 {
		m.LoadOrStore("lane-"+strconv.Itoa(i), func() *int { return &i }, 0)
	}
	key := "lane-7"
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := m.Load(key); !ok {
			b.Fatal("missing")
		}
	}
}
