package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/lanesdev/lanes/adminapi"
	"github.com/lanesdev/lanes/internal/testkit/childproc"
)

// laneApp is a plain net/http app that knows nothing of lanes: it answers
// with its name, and counts the requests it serves by the x-lane they carry.
type laneApp struct {
	name string
	addr string
	srv  *http.Server

	mu    sync.Mutex
	lanes map[string]int
}

func newLaneApp(t *testing.T, name string, h http.HandlerFunc) *laneApp {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := &laneApp{name: name, addr: ln.Addr().String(), lanes: map[string]int{}}
	a.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.mu.Lock()
		a.lanes[r.Header.Get("X-Lane")]++
		a.mu.Unlock()
		if h != nil {
			h(w, r)
			return
		}
		io.WriteString(w, name)
	})}
	done := make(chan struct{})
	go func() { // ends when the server is closed
		defer close(done)
		a.srv.Serve(ln)
	}()
	t.Cleanup(func() {
		a.srv.Close()
		<-done
	})
	return a
}

// served returns how many requests of lane l (x-lane, "" for none) the app served.
func (a *laneApp) served(l string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.lanes[l]
}

// forwarder is the handler of an app that calls next through its sidecar's
// outbound proxy (HTTP_PROXY), forwarding the lane headers and the
// traceparent by hand, and answers with next's answer.
func forwarder(t *testing.T, proxy *atomic.Pointer[url.URL], next string) http.HandlerFunc {
	tr := &http.Transport{Proxy: func(*http.Request) (*url.URL, error) { return proxy.Load(), nil }}
	t.Cleanup(tr.CloseIdleConnections)
	c := &http.Client{Transport: tr, Timeout: wait}
	return func(w http.ResponseWriter, r *http.Request) {
		req, _ := http.NewRequestWithContext(r.Context(), http.MethodGet, "http://"+next+r.URL.Path, nil)
		for _, h := range []string{"X-Lane", "Baggage", "Traceparent"} {
			if v := r.Header.Get(h); v != "" {
				req.Header.Set(h, v)
			}
		}
		res, err := c.Do(req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer res.Body.Close()
		w.WriteHeader(res.StatusCode)
		io.Copy(w, res.Body)
	}
}

var sidecarLines = regexp.MustCompile(`sidecar: (?:inbound (\S+) -> app \S+|outbound proxy (\S+) \(HTTP_PROXY=http://\S+\))`)

// sidecar starts `lanes sidecar` for app as an instance of service in lane l
// ("" for the baseline), registered through the admin API with a token of
// its lane, tracing into the collector; it waits for the registration and
// returns the process and its proxy's URL.
func (u *up) sidecar(t *testing.T, service, l string, app string, extra ...string) (*childproc.Child, *url.URL) {
	t.Helper()
	req := adminapi.TokenRequest{Name: service + "-" + l, Lane: l, Baseline: l == ""}
	env := []string{"LANES_REGISTRY=" + u.admin, "LANES_TOKEN=" + u.newToken(t, req), "LANES_TRACES=" + u.traces, "LANES_LOG_LEVEL=warn"}
	args := []string{"sidecar", "--service", service, "--lane", l, "--app", app, "--proxy", "127.0.0.1:0", "--ready-interval", "100ms"}
	if !slices.Contains(extra, "--direct") {
		args = append(args, "--listen", "127.0.0.1:0")
	}
	args = append(args, extra...)
	p := startEnv(t, env, args...)
	where := "lane " + l
	if l == "" {
		where = "baseline"
	}
	out := p.WaitOutput("sidecar: registered " + service + " " + where + " at ")
	var proxy *url.URL
	for _, m := range sidecarLines.FindAllStringSubmatch(out, -1) {
		if m[2] != "" {
			proxy = &url.URL{Scheme: "http", Host: m[2]}
		}
	}
	if proxy == nil {
		t.Fatalf("no proxy line:\n%s", out)
	}
	t.Cleanup(func() {
		select {
		case <-p.Exited():
		default:
			if code := p.Stop(syscall.SIGTERM); code != 0 {
				t.Errorf("lanes sidecar %s/%s exited %d after SIGTERM\n%s", service, l, code, childproc.Tail(p.Stderr.String(), 3000))
			}
		}
	})
	return p, proxy
}

// TestSidecarChain: the gateway of lanes up -> front, a Go app that does
// not use lanes (it forwards x-lane, baggage and traceparent by hand) behind
// lanes sidecar -> back, in the baseline and in lane alice, each behind a
// sidecar. Baseline and alice requests are served as the routing contract
// says, no baseline request reaches alice's instance, and lanes trace shows
// each hop with its lane. Then a kill -9 of an alice instance's sidecar, and
// the death of the app behind the other, under a request every 100 ms: the
// idempotent GETs move on to an instance that serves.
func TestSidecarChain(t *testing.T) {
	u := startUp(t, "up", "--route", "/=front")
	backBase := newLaneApp(t, "back-base", nil)
	backAlice1 := newLaneApp(t, "back-alice-1", nil)
	backAlice2 := newLaneApp(t, "back-alice-2", nil)
	u.sidecar(t, "back", "", backBase.addr)
	alice1, _ := u.sidecar(t, "back", "alice", backAlice1.addr, "--ttl", "3s")
	u.sidecar(t, "back", "alice", backAlice2.addr, "--ttl", "3s")
	var proxy atomic.Pointer[url.URL]
	front := newLaneApp(t, "front", forwarder(t, &proxy, "back"))
	_, p := u.sidecar(t, "front", "", front.addr)
	proxy.Store(p)

	c := clientFrom(t, "127.0.0.1")
	send := func(l string) (int, string, string) {
		req, _ := http.NewRequest(http.MethodGet, u.gateway+"/", nil)
		if l != "" {
			req.Header.Set("x-lane", l)
		}
		res, err := c.Do(req)
		if err != nil {
			return 0, err.Error(), ""
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b), res.Header.Get("X-Trace-Id")
	}
	eventually(t, "both alice instances serve lane alice", func() string {
		for range 4 {
			send("alice")
		}
		if backAlice1.served("alice") == 0 || backAlice2.served("alice") == 0 {
			return fmt.Sprintf("alice-1 %d, alice-2 %d", backAlice1.served("alice"), backAlice2.served("alice"))
		}
		return ""
	})
	for range 20 {
		if code, body, _ := send(""); code != 200 || body != "back-base" {
			t.Fatalf("baseline request: %d %q", code, body)
		}
		if code, body, _ := send("alice"); code != 200 || !strings.HasPrefix(body, "back-alice-") {
			t.Fatalf("alice request: %d %q", code, body)
		}
		if code, body, _ := send("bob"); code != 200 || body != "back-base" {
			t.Fatalf("bob request (no such lane: the baseline): %d %q", code, body)
		}
	}
	if n := backAlice1.served("") + backAlice2.served("") + backAlice1.served("bob") + backAlice2.served("bob"); n != 0 {
		t.Fatalf("%d requests of other lanes reached alice's instances", n)
	}
	if n := backBase.served("alice"); n != 0 {
		t.Fatalf("%d alice requests reached the baseline while alice had instances", n)
	}

	// The trace: each hop with its lane.
	_, _, id := send("alice")
	admin := []string{"--admin", u.admin, "--token", u.token}
	var calls []string
	eventually(t, "the trace of an alice request", func() string {
		code, out, _ := run(t, "", append([]string{"trace", id, "-o", "json"}, admin...)...)
		var tr adminapi.Trace
		if code != 0 || json.Unmarshal([]byte(out), &tr) != nil {
			return fmt.Sprintf("exit %d: %s", code, out)
		}
		calls = calls[:0]
		for _, h := range tr.Hops {
			switch h.Kind {
			case "client":
				calls = append(calls, fmt.Sprintf("%s->%s %s/%s", h.Service, h.Callee, h.Requested, h.Served))
			case "server":
				calls = append(calls, fmt.Sprintf("%s %s/%s", h.Service, h.Requested, h.Served))
			}
		}
		want := "lanes-gateway alice/ lanes-gateway->front alice/ front alice/ front->back alice/alice back alice/alice"
		if got := strings.Join(calls, " "); got != want {
			return fmt.Sprintf("hops %q, want %q", got, want)
		}
		if len(tr.Findings) != 0 {
			return fmt.Sprintf("findings %+v", tr.Findings)
		}
		return ""
	})
	code, out, _ := run(t, "", append([]string{"trace", id}, admin...)...)
	if code != 0 || !strings.Contains(out, "front → back  GET  lane alice → alice") {
		t.Errorf("lanes trace %s:\n%s", id, out)
	}
	t.Logf("lanes trace of an alice request through sidecars:\n%s", out)

	// A request every 100 ms in lane alice, while alice's instances die.
	type result struct {
		at   time.Time
		code int
		body string
	}
	var (
		mu      sync.Mutex
		results []result
		stop    = make(chan struct{})
		done    = make(chan struct{})
	)
	go func() { // ends when stop is closed
		defer close(done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			code, body, _ := send("alice")
			mu.Lock()
			results = append(results, result{time.Now(), code, body})
			mu.Unlock()
		}
	}()
	count := func(t0, t1 time.Time, want func(string) bool) (n, failed int, first time.Duration, failures []string) {
		mu.Lock()
		defer mu.Unlock()
		first = -1
		for _, r := range results {
			if r.at.Before(t0) || !r.at.Before(t1) {
				continue
			}
			n++
			if r.code != 200 {
				failed++
				failures = append(failures, fmt.Sprintf("%d %q", r.code, r.body))
				continue
			}
			if first < 0 && want(r.body) {
				first = r.at.Sub(t0)
			}
		}
		return n, failed, first, failures
	}
	waitResults := func(t0 time.Time, n int) {
		eventually(t, "requests sent", func() string {
			got, _, _, _ := count(t0, time.Now().Add(time.Hour), func(string) bool { return false })
			if got < n {
				return fmt.Sprintf("%d of %d", got, n)
			}
			return ""
		})
	}

	// kill -9 of alice-1's sidecar: its lease runs on (--ttl 3s), and its
	// address refuses connections; calls move on to alice-2.
	t0 := time.Now()
	alice1.Kill()
	waitResults(t0, 50) // past the lease's end
	t1 := time.Now()
	n, failed, first, failures := count(t0, t1, func(b string) bool { return b == "back-alice-2" })
	t.Logf("kill -9 of an alice sidecar: %d requests, %d failed, first served by the other alice instance %.2fs after the kill", n, failed, first.Seconds())
	if failed != 0 {
		t.Errorf("%d of %d GETs failed after the kill -9, where another alice instance serves: %v", failed, n, failures)
	}

	// The app behind alice-2's sidecar dies: the sidecar answers 502, the
	// GET is retried along the lane's chain to the baseline, and the sidecar
	// deregisters the instance once its checks fail.
	t2 := time.Now()
	backAlice2.srv.Close()
	waitResults(t2, 50)
	t3 := time.Now()
	n, failed, first, failures = count(t2, t3, func(b string) bool { return b == "back-base" })
	close(stop)
	<-done
	t.Logf("the app behind the last alice sidecar dies: %d requests, %d failed, first fallback to the baseline %.2fs after", n, failed, first.Seconds())
	if failed != 0 {
		t.Errorf("%d of %d GETs failed after the app died, where the baseline serves: %v", failed, n, failures)
	}
	if first < 0 {
		t.Errorf("no request fell back to the baseline")
	}
}

// TestSidecarCommand: the command line of lanes sidecar. Bad flags and a
// missing LANES_REGISTRY exit 2 before anything starts, naming the flag or
// the variable and the value as written; --direct registers the app's own
// address, prints the documented lines, and SIGTERM deregisters it at once
// and exits 0.
func TestSidecarCommand(t *testing.T) {
	base := []string{"sidecar", "--service", "orders", "--lane", "alice", "--listen", "127.0.0.1:0", "--app", "127.0.0.1:8081"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"sidecar", "--lane", "alice", "--listen", "127.0.0.1:0", "--app", "127.0.0.1:8081"}, `--service "": required`},
		{append(base[:len(base):len(base)], "--proxy", "0.0.0.0:3128"), `--proxy "0.0.0.0:3128": the outbound proxy listens on loopback only`},
		{append(base[:len(base):len(base)], "--ready-path", "healthz"), `--ready-path "healthz": want an absolute path`},
		{append(base[:len(base):len(base)], "--direct"), `--listen "127.0.0.1:0": --direct takes no inbound traffic`},
		{[]string{"sidecar", "--service", "orders", "--listen", "127.0.0.1:0", "--app", "8081"}, `--app "8081": not host:port`},
		{[]string{"sidecar", "--service", "orders", "--lane", "Not A Lane!", "--listen", "127.0.0.1:0", "--app", "127.0.0.1:8081"}, `--lane "Not A Lane!"`},
		{base, "LANES_REGISTRY is not set"},
	} {
		code, out, errOut := run(t, "", tc.args...)
		expect(t, strings.Join(tc.args, " "), code, out, errOut, 2, tc.want)
	}

	u := startUp(t, "up")
	a := newLaneApp(t, "grpc-ish", nil)
	p, _ := u.sidecar(t, "pricing", "alice", a.addr, "--direct")
	want := regexp.MustCompile(`^sidecar: direct, app ` + regexp.QuoteMeta(a.addr) + `
sidecar: outbound proxy 127\.0\.0\.1:\d+ \(HTTP_PROXY=http://127\.0\.0\.1:\d+\)
sidecar: registered pricing lane alice at ` + regexp.QuoteMeta(a.addr) + `
$`)
	if out := p.Stdout.String(); !want.MatchString(out) {
		t.Fatalf("printed:\n%s", out)
	}
	c := u.client(t, u.token)
	listed := func() int {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		ins, err := c.Instances(ctx, "pricing")
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, in := range ins {
			if in.Addr == a.addr && in.Lane == "alice" {
				n++
			}
		}
		return n
	}
	if n := listed(); n != 1 {
		t.Fatalf("%d instances of pricing at %s", n, a.addr)
	}
	if code := p.Stop(syscall.SIGTERM); code != 0 {
		t.Fatalf("exit %d after SIGTERM:\n%s", code, p.Stderr.String())
	}
	if n := listed(); n != 0 {
		t.Fatalf("%d instances of pricing left after the sidecar stopped", n)
	}
}
