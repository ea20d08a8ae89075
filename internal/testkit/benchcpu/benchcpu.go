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
	"testing"
	"time"
)

// Compare runs f, b.N times in all, and ref as many times, in alternating
// chunks of chunk calls, and returns the time f took over the time ref took:
// wall time, and CPU time (0 when the process CPU time cannot be read). The
// timer runs only while f runs.
func Compare(b *testing.B, chunk int, f, ref func()) (wall, cpu float64) {
	var spent, refSpent, cpuSpent, cpuRef time.Duration
	for done := 0; done < b.N; {
		n := min(chunk, b.N-done)
		t0, c0 := time.Now(), Process()
		for range n {
			f()
		}
		spent += time.Since(t0)
		cpuSpent += Process() - c0
		done += n
		b.StopTimer()
		t0, c0 = time.Now(), Process()
		for range n {
			ref()
		}
		refSpent += time.Since(t0)
		cpuRef += Process() - c0
		b.StartTimer()
	}
	if refSpent > 0 {
		wall = float64(spent) / float64(refSpent)
	}
	if cpuRef > 0 {
		cpu = float64(cpuSpent) / float64(cpuRef)
	}
	return wall, cpu
}
