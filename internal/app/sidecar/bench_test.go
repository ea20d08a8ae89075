package sidecar

import (
	"io"
	"net/http"
	"testing"

	"github.com/lanesdev/lanes/internal/testkit/benchcpu"
)

// BenchmarkSidecar measures what a sidecar adds to a call, side by side in
// one run: direct calls the app itself; inbound calls it through the
// sidecar's inbound listener (the lane middleware and the guard, the reverse
// proxy); outbound calls it as a lanes service through the sidecar's
// outbound proxy (the routed call: pick, attempt, report). Client, sidecar
// and app run in the benchmark's process, so allocs/op and cpu-us/op count
// all three; x_direct_cpu is the CPU time of a call over a direct call's,
// measured in alternating chunks (benchcpu.Compare), which holds on a
// loaded machine.
func BenchmarkSidecar(b *testing.B) {
	m := newMesh(b)
	a := newApp(b, "ok", nil)
	m.register("app", "app-1", "", a.addr())
	s := m.sidecar(Config{Service: "bench", App: a.addr()})
	in := "http://" + s.waitRegistered(b) + "/"

	tr := &http.Transport{MaxIdleConnsPerHost: 16}
	b.Cleanup(tr.CloseIdleConnections)
	plain := &http.Client{Transport: tr}
	viaProxy := s.proxyClient(b)
	waitBody(b, viaProxy, "http://app/", "ok")

	call := func(c *http.Client, url string) func() {
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		return func() {
			res, err := c.Do(req)
			if err != nil {
				b.Fatal(err)
			}
			io.Copy(io.Discard, res.Body)
			res.Body.Close()
			if res.StatusCode != 200 {
				b.Fatalf("%s: %d", url, res.StatusCode)
			}
		}
	}
	direct := call(plain, "http://"+a.addr()+"/")
	for _, bc := range []struct {
		name string
		f    func()
	}{
		{"direct", direct},
		{"inbound", call(plain, in)},
		{"outbound", call(viaProxy, "http://app/")},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for range 100 {
				bc.f()
			}
			b.ResetTimer()
			_, cpu := benchcpu.Compare(b, 64, bc.f, direct)
			b.ReportMetric(cpu, "x_direct_cpu")
		})
	}
}
