package cli

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/lanesdev/lanes/internal/testkit/childproc"
	"github.com/lanesdev/lanes/registry"
)

// TestUpHalfOpenFlood runs `lanes up` with an open-file limit of 1024 (set
// with prlimit, soft and hard) and floods its gateway with connections that
// send part of a request head and stop, as many as the test process may
// open up to 20,000:
//
//   - cap: at the defaults, the gateway holds a quarter of the limit (256)
//     and answers every other connection 503 overloaded at once; the held
//     ones close at the client header timeout, and requests are served
//     again while the flood still holds its connections;
//   - emfile: with max_conns over the limit, accept runs out of file
//     descriptors (EMFILE); the gateway waits it out, the control plane
//     goes on (a fatal accept error stopped all of it), and requests are
//     served again as the held connections time out.
//
// Both recover when the flood closes its connections. The figures are
// logged (go test -v -run TestUpHalfOpenFlood).
func TestUpHalfOpenFlood(t *testing.T) {
	prlimit, err := exec.LookPath("prlimit")
	if err != nil {
		t.Skip("no prlimit command")
	}
	const fdLimit = 1024
	n := floodSize(20000)
	t.Run("cap", func(t *testing.T) { flood(t, prlimit, fdLimit, n, nil) })
	t.Run("emfile", func(t *testing.T) {
		// Beyond the descriptors lanes up has, but within the kernel's
		// backlog (somaxconn, 4096 here) so that every dial completes.
		flood(t, prlimit, fdLimit, min(n, 3000), []string{"--gateway-max-conns", "10000"})
	})
}

// floodSize is how many connections the test process may open, up to
// want: it raises its own open-file limit when it may (as root), and keeps
// 512 descriptors for the rest.
func floodSize(want int) int {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		return 1000
	}
	if need := uint64(want + 512); r.Cur < need {
		up := syscall.Rlimit{Cur: need, Max: max(r.Max, need)}
		if syscall.Setrlimit(syscall.RLIMIT_NOFILE, &up) == nil {
			r = up
		} else {
			r.Cur = r.Max
			syscall.Setrlimit(syscall.RLIMIT_NOFILE, &r)
		}
	}
	return min(want, int(r.Cur)-512)
}

func flood(t *testing.T, prlimit string, fdLimit, n int, extra []string) {
	argv := []string{prlimit, fmt.Sprintf("--nofile=%d:%d", fdLimit, fdLimit), binary}
	u := startUpArgv(t, t.TempDir(), nil, argv, "up",
		append([]string{"--route", "/=web", "--gateway-client-header-timeout", "2s"}, extra...)...)
	b := newBackend(t, "web-base")
	u.register(t, u.token, registry.Instance{Service: "web", ID: "web-base", Addr: b.addr})
	tr := &http.Transport{DisableKeepAlives: true}
	probe := &http.Client{Transport: tr, Timeout: wait}
	expectBackend(t, probe, u.gateway+"/", "web-base", nil)
	addr := strings.TrimPrefix(u.gateway, "http://")

	// The flood: n connections, each with a partial head, held open.
	start := time.Now()
	var (
		mu     sync.Mutex
		conns  []net.Conn
		failed atomic.Int64
		next   atomic.Int64
		wg     sync.WaitGroup
	)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for w := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Spread the flood over source addresses, for their ports.
			d := net.Dialer{Timeout: 10 * time.Second, LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 2, byte(1+w%8))}}
			for next.Add(1) <= int64(n) {
				c, err := d.Dial("tcp", addr)
				if err != nil {
					failed.Add(1)
					continue
				}
				io.WriteString(c, "GET / HTTP/1.1\r\nHost: web\r\nX-Slow: ")
				mu.Lock()
				conns = append(conns, c)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	t.Logf("flood: %d of %d connections opened (%d failed) in %v, against an open-file limit of %d",
		len(conns), n, failed.Load(), time.Since(start).Round(time.Millisecond), fdLimit)
	if int(failed.Load()) > n/100 {
		t.Errorf("%d of %d connections failed to open", failed.Load(), n)
	}

	alive := func(when string) {
		t.Helper()
		select {
		case <-u.Exited():
			t.Fatalf("lanes up exited %s: %v\nstderr:\n%s", when, u.Err(), childproc.Tail(u.Stderr.String(), 4000))
		default:
		}
	}
	alive("under the flood")

	// While the flood holds its connections: a request at a time.
	var ok, shed, other int
	var firstOK time.Duration
	var otherMsg string
	served := time.Now()
	for time.Since(served) < wait {
		a := get(t, probe, u.gateway+"/", nil)
		switch {
		case a.Status == http.StatusOK && a.Backend == "web-base":
			ok++
			if firstOK == 0 {
				firstOK = time.Since(served)
			}
		case a.Status == http.StatusServiceUnavailable && strings.Contains(a.Body, "max_conns"):
			shed++
		default:
			other++
			otherMsg = fmt.Sprintf("%d %q", a.Status, a.Body)
		}
		if ok >= 20 {
			break
		}
	}
	t.Logf("under the flood: %d requests served, %d answered 503 overloaded, %d failed otherwise (the last: %s); the first served %v after the flood was in",
		ok, shed, other, otherMsg, firstOK.Round(time.Millisecond))
	alive("under the flood")
	if ok == 0 {
		t.Errorf("no request served while the flood held its connections (the held ones time out after 2s)")
	}
	// The admin API (its own listener, its own cap) answers.
	eventually(t, "the admin API's health", func() string {
		resp, err := probe.Get(u.admin + "/healthz")
		if err != nil {
			return err.Error()
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return resp.Status
		}
		return ""
	})
	if extra == nil {
		eventually(t, "the shed connections counted", func() string {
			resp, err := probe.Get(u.admin + "/metrics")
			if err != nil {
				return err.Error()
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if !strings.Contains(string(body), `lanes_gateway_errors_total{code="overloaded"}`) {
				return "no lanes_gateway_errors_total{code=\"overloaded\"} in /metrics"
			}
			return ""
		})
	}

	// The flood ends: every request is served.
	for _, c := range conns {
		c.Close()
	}
	conns = nil
	expectBackend(t, probe, u.gateway+"/", "web-base", nil)
	ok, other = 0, 0
	for range 50 {
		if a := get(t, probe, u.gateway+"/", nil); a.Status == http.StatusOK {
			ok++
		} else {
			other++
		}
	}
	t.Logf("after the flood: %d of 50 requests served", ok)
	if other > 0 {
		t.Errorf("after the flood: %d of 50 requests failed", other)
	}
	alive("after the flood")
}
