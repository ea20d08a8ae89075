// Package benchcpu compares the CPU time that two ways of doing the same
// work cost, for benchmarks that must hold on a loaded machine: a call's
// CPU time (user and system, of the whole process, so client and server in
// one test binary both count) does not grow while the process waits for a
// core, as its wall time does.
//
// Compare runs the two in alternating chunks and reports the ratio:
//
//	wall, cpu := benchcpu.Compare(b, 256, func() { lanesCall() }, func() { plainCall() })
//	b.ReportMetric(cpu, "x_plain_cpu")
package benchcpu

import (
	"sync"
	"testing"
	"time"
)

// Compare runs f, b.N times in all, and ref as many times, in alternating
// chunks of chunk calls, and returns the time f took over the time ref took:
// wall time, and CPU time (0 when the process CPU time cannot be read). The
// timer runs only while f runs.
func Compare(b *testing.B, chunk int, f, ref func()) (wall, cpu float64) {
	return compareN(b.N, chunk, f, ref, serial, b.StopTimer, b.StartTimer)
}

// CompareParallel is Compare with par callers at once: each chunk is shared
// out among par goroutines, which all end before the next chunk starts, so
// that f and ref are measured under the same concurrency.
func CompareParallel(b *testing.B, chunk, par int, f, ref func()) (wall, cpu float64) {
	return compareN(b.N, chunk, f, ref, parallel(par), b.StopTimer, b.StartTimer)
}

// serial makes n calls of g, one after the other.
func serial(n int, g func()) {
	for range n {
		g()
	}
}

// parallel returns the function that makes n calls of g shared out among
// par goroutines, and returns when all have ended.
func parallel(par int) func(n int, g func()) {
	return func(n int, g func()) {
		var wg sync.WaitGroup
		for w := range par {
			k := n / par
			if w < n%par {
				k++
			}
			wg.Go(func() {
				for range k {
					g()
				}
			})
		}
		wg.Wait()
	}
}

// compareN is Compare and CompareParallel: n calls of each, run makes a
// chunk's calls, and stop and start are the benchmark timer's.
func compareN(n, chunk int, f, ref func(), run func(n int, g func()), stop, start func()) (wall, cpu float64) {
	var spent, refSpent, cpuSpent, cpuRef time.Duration
	for done := 0; done < n; {
		k := min(chunk, n-done)
		t0, c0 := time.Now(), Process()
		run(k, f)
		spent += time.Since(t0)
		cpuSpent += Process() - c0
		done += k
		stop()
		t0, c0 = time.Now(), Process()
		run(k, ref)
		refSpent += time.Since(t0)
		cpuRef += Process() - c0
		start()
	}
	if refSpent > 0 {
		wall = float64(spent) / float64(refSpent)
	}
	if cpuRef > 0 {
		cpu = float64(cpuSpent) / float64(cpuRef)
	}
	return wall, cpu
}
