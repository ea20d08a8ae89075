package routing

import (
	"fmt"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/registry"
)

// fleet builds an engine whose service "orders" has n instances and whose
// fleet has the given number of lanes. Half of the instances (at least one)
// are in the baseline; the rest are spread over the lanes, lane-0 first. Every
// lane also has policy settings, and the lane "ghost", which has no instance,
// falls back to lane-0.
func fleet(tb testing.TB, n, lanes int) *Engine {
	tb.Helper()
	var pol strings.Builder
	pol.WriteString("locality: {host: true}\nlanes:\n  ghost: {fallback: [lane-0]}\n")
	for l := range lanes {
		fmt.Fprintf(&pol, "  lane-%d: {}\n", l)
	}
	e := New()
	tb.Cleanup(func() { e.Close() })
	e.SetPolicy(mustPolicy(tb, pol.String()))
	e.SetInstances("orders", fleetInstances(tb, n, lanes))
	return e
}

// fleetInstances makes the instances of fleet: instance i is on host h<i>,
// in zone az<i%3>.
func fleetInstances(tb testing.TB, n, lanes int) []registry.Instance {
	tb.Helper()
	insts := make([]registry.Instance, 0, n)
	base := max(1, n/2)
	for i := range n {
		in := registry.Instance{ID: fmt.Sprintf("i%d", i), Service: "orders", Addr: fmt.Sprintf("10.%d.%d.%d:8080", i>>16&255, i>>8&255, i&255), Zone: fmt.Sprintf("az%d", i%3), Host: fmt.Sprintf("h%d", i)}
		if i >= base {
			in.Lane = fmt.Sprintf("lane-%d", (i-base)%lanes)
		}
		norm, err := registry.Normalize(in)
		if err != nil {
			tb.Fatal(err)
		}
		insts = append(insts, norm)
	}
	return insts
}

// pickCases are the requests of BenchmarkPick. The fleet's policy turns on
// locality.host; the host cases come from the host of an instance of the
// serving lane, so that the same-host rule narrows the pick to it (host
// "lane" is lane-0's first instance, "baseline" the first baseline one).
var pickCases = []struct {
	name string
	req  Request
	host string // "", "lane", "baseline" or "none" (a host without instances): which instance's host the request comes from
	want string // the serving lane
}{
	{"request=lane", Request{Lane: "lane-0"}, "", "lane-0"},
	{"request=fallback", Request{Lane: "ghost"}, "", "lane-0"},
	{"request=baseline", Request{}, "", ""},
	{"request=lane-host", Request{Lane: "lane-0"}, "lane", "lane-0"},
	{"request=baseline-host", Request{}, "baseline", ""},
	{"request=lane-otherhost", Request{Lane: "lane-0"}, "none", "lane-0"},
}

// BenchmarkPick measures one pick through a service handle, with the
// same-host rule on. Every case must report 0 allocs/op, ns/op must not
// grow with the instance count, and every case must stay within 2x of
// BenchmarkPickFloor. cpu-ns/op is the process's CPU time per pick: on a
// loaded machine, the wall clock also counts the time the benchmark waited
// for a core.
func BenchmarkPick(b *testing.B) {
	for _, n := range []int{10, 100, 1000, 10000} {
		b.Run(fmt.Sprintf("instances=%d", n), func(b *testing.B) {
			for _, lanes := range []int{1, 100} {
				b.Run(fmt.Sprintf("lanes=%d", lanes), func(b *testing.B) {
					svc := fleet(b, n, lanes).Service("orders")
					for _, c := range pickCases {
						b.Run(c.name, func(b *testing.B) {
							req := c.req
							switch c.host {
							case "lane":
								req.Host = fmt.Sprintf("h%d", max(1, n/2))
							case "baseline":
								req.Host = "h0"
							case "none":
								req.Host = "elsewhere"
							}
							r, err := svc.Pick(req)
							if err != nil || r.Lane != c.want || c.host != "none" && req.Host != "" && r.Instance.Host != req.Host {
								b.Fatalf("picked %s on %s in lane %q, %v; want lane %q, host %q", r.Instance.ID, r.Instance.Host, r.Lane, err, c.want, req.Host)
							}
							b.ReportAllocs()
							cpu := cpuTime()
							for b.Loop() {
								svc.Pick(req)
							}
							b.ReportMetric(float64(cpuTime()-cpu)/float64(b.N), "cpu-ns/op")
						})
					}
				})
			}
		})
	}
}

// BenchmarkPickLaneExpiry is BenchmarkPick's lane and baseline cases on a
// fleet (1,000 instances, 100 lanes) one of whose lanes expires in a year:
// with a time-driven transition ahead, picks still take the fast path (a
// timer rebuilds the snapshot when it is due), so every case must stay
// within 2x of BenchmarkPickFloor too.
func BenchmarkPickLaneExpiry(b *testing.B) {
	var pol strings.Builder
	pol.WriteString("locality: {host: true}\nlanes:\n  ghost: {fallback: [lane-0]}\n")
	for l := range 100 {
		fmt.Fprintf(&pol, "  lane-%d: {}\n", l)
	}
	fmt.Fprintf(&pol, "  lane-99: {expires: %s}\n", time.Now().AddDate(1, 0, 0).UTC().Format(time.RFC3339))
	e := New()
	b.Cleanup(func() { e.Close() })
	e.SetPolicy(mustPolicy(b, strings.Replace(pol.String(), "  lane-99: {}\n", "", 1)))
	e.SetInstances("orders", fleetInstances(b, 1000, 100))
	svc := e.Service("orders")
	for _, c := range pickCases[:3] {
		b.Run(c.name, func(b *testing.B) {
			if r, err := svc.Pick(c.req); err != nil || r.Lane != c.want {
				b.Fatalf("picked lane %q, %v; want %q", r.Lane, err, c.want)
			}
			b.ReportAllocs()
			cpu := cpuTime()
			for b.Loop() {
				svc.Pick(c.req)
			}
			b.ReportMetric(float64(cpuTime()-cpu)/float64(b.N), "cpu-ns/op")
		})
	}
}

// BenchmarkPickZone adds the caller's zone, and BenchmarkPickWeighted mixed
// weights (the alias-table path).
func BenchmarkPickZone(b *testing.B) {
	svc := fleet(b, 10000, 100).Service("orders")
	req := Request{Lane: "lane-0", Zone: "az1"}
	b.ReportAllocs()
	cpu := cpuTime()
	for b.Loop() {
		svc.Pick(req)
	}
	b.ReportMetric(float64(cpuTime()-cpu)/float64(b.N), "cpu-ns/op")
}

func BenchmarkPickWeighted(b *testing.B) {
	e := New()
	b.Cleanup(func() { e.Close() })
	insts := fleetInstances(b, 10000, 1)
	for i := range insts {
		insts[i].Weight = 1 + i%200
	}
	e.SetInstances("orders", insts)
	svc := e.Service("orders")
	b.ReportAllocs()
	cpu := cpuTime()
	for b.Loop() {
		svc.Pick(Request{})
	}
	b.ReportMetric(float64(cpuTime()-cpu)/float64(b.N), "cpu-ns/op")
}

func BenchmarkPickCanaryKey(b *testing.B) {
	e := fleet(b, 1000, 1)
	e.SetPolicy(mustPolicy(b, "canary:\n  - {service: orders, lane: lane-0, percent: 10}\n"))
	svc := e.Service("orders")
	req := Request{Key: "user-42"}
	b.ReportAllocs()
	cpu := cpuTime()
	for b.Loop() {
		svc.Pick(req)
	}
	b.ReportMetric(float64(cpuTime()-cpu)/float64(b.N), "cpu-ns/op")
}

// BenchmarkPickParallel shows the pick under contention on all cores.
func BenchmarkPickParallel(b *testing.B) {
	svc := fleet(b, 1000, 100).Service("orders")
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			svc.Pick(Request{Lane: "lane-0"})
		}
	})
}

// cpuTime is the CPU time the process has used, user and system: on a
// loaded machine, a steadier measure of work than the wall clock.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkSnapshotRebuild measures the rebuild that follows a change of the
// instances or the policy, with locality.host off and on (a host sub-group
// for each instance). cpu-ns/op is the process's CPU time per rebuild, GC
// included.
func BenchmarkSnapshotRebuild(b *testing.B) {
	for _, n := range []int{10000} {
		for _, host := range []bool{false, true} {
			b.Run(fmt.Sprintf("instances=%d/locality.host=%v", n, host), func(b *testing.B) {
				e := fleet(b, n, 100)
				if !host {
					e.SetPolicy(mustPolicy(b, "lanes:\n  ghost: {fallback: [lane-0]}\n"))
				}
				insts := fleetInstances(b, n, 100)
				svc := e.Service("orders")
				b.ReportAllocs()
				cpu := cpuTime()
				for b.Loop() {
					svc.setInstances(insts)
				}
				b.ReportMetric(float64(cpuTime()-cpu)/float64(b.N), "cpu-ns/op")
			})
		}
	}
}

// BenchmarkSnapshotRebuildSmall is the rebuild of a small service (10
// baseline instances in 3 zones, weights all different), the one that each
// of a thousand watching engines makes when an instance changes.
func BenchmarkSnapshotRebuildSmall(b *testing.B) {
	e := New()
	b.Cleanup(func() { e.Close() })
	insts := make([]registry.Instance, 10)
	for i := range insts {
		insts[i] = registry.Instance{ID: fmt.Sprintf("i%02d", i), Service: "orders", Addr: fmt.Sprintf("10.0.0.%d:8080", i), Zone: fmt.Sprintf("az%d", i%3), Host: fmt.Sprintf("h%d", i), Weight: 1 + i}
	}
	svc := e.Service("orders")
	b.ReportAllocs()
	for b.Loop() {
		svc.setInstances(insts)
	}
}

func TestPickDoesNotAllocate(t *testing.T) {
	e := fleet(t, 1000, 100)
	e.SetPolicy(mustPolicy(t, "lanes:\n  ghost: {fallback: [lane-0]}\n  strict: {strict: true}\ncanary:\n  - {service: orders, lane: lane-1, percent: 10}\n"))
	svc := e.Service("orders")
	empty := e.Service("empty")
	for _, req := range []Request{
		{}, {Lane: "lane-0"}, {Lane: "ghost"}, {Lane: "nobody"}, {Zone: "az1"}, {Lane: "lane-3", Zone: "az2"},
		{Key: "user-7"}, {Lane: "not valid"}, {Lane: "strict"},
		{Lane: "lane-0", Host: "h600"}, {Lane: "lane-0", Host: "elsewhere"}, {Host: "elsewhere", Zone: "az1"},
	} {
		if n := testing.AllocsPerRun(1000, func() { svc.Pick(req) }); n != 0 {
			t.Errorf("Pick(%+v) allocates %.1f times", req, n)
		}
		// A failing pick returns its route's prebuilt error, except for a
		// lane known nowhere, whose error is built to name that lane.
		limit := 0.0
		if l, _ := lane.Normalize(req.Lane); l != "" && l != "ghost" && l != "strict" {
			limit = 1
		}
		if n := testing.AllocsPerRun(1000, func() { empty.Pick(req) }); n > limit {
			t.Errorf("failing Pick(%+v) allocates %.1f times", req, n)
		}
	}
	r, _ := svc.Pick(Request{})
	if n := testing.AllocsPerRun(1000, func() { r.Report(true) }); n != 0 {
		t.Errorf("Report(true) allocates %.1f times", n)
	}
}

// BenchmarkReport is the outcome report every transport makes after a call.
func BenchmarkReport(b *testing.B) {
	svc := fleet(b, 100, 1).Service("orders")
	r, _ := svc.Pick(Request{})
	b.ReportAllocs()
	for b.Loop() {
		r.Report(true)
	}
}

// floorGroup and floorSnapshot are the least a pick can be: an atomic
// snapshot load, one map lookup, one atomic step and one slice index.
type floorGroup struct {
	next  atomic.Uint64
	ready []*registry.Instance
}

type floorSnapshot struct{ groups map[string]*floorGroup }

// BenchmarkPickFloor is the floor that BenchmarkPick is measured against,
// on the same fleets: every BenchmarkPick case must stay within 2x of it.
func BenchmarkPickFloor(b *testing.B) {
	for _, n := range []int{10, 100, 1000, 10000} {
		b.Run(fmt.Sprintf("instances=%d", n), func(b *testing.B) {
			insts := fleetInstances(b, n, 100)
			fs := &floorSnapshot{groups: map[string]*floorGroup{}}
			for i := range insts {
				g := fs.groups[insts[i].Lane]
				if g == nil {
					g = &floorGroup{}
					fs.groups[insts[i].Lane] = g
				}
				g.ready = append(g.ready, &insts[i])
			}
			var p atomic.Pointer[floorSnapshot]
			p.Store(fs)
			var sink *registry.Instance
			b.ReportAllocs()
			cpu := cpuTime()
			for b.Loop() {
				g := p.Load().groups["lane-0"]
				sink = g.ready[g.next.Add(1)%uint64(len(g.ready))]
			}
			b.ReportMetric(float64(cpuTime()-cpu)/float64(b.N), "cpu-ns/op")
			_ = sink
		})
	}
}
