package tunnel

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lanesdev/lanes/internal/lib/instdial"
	"github.com/lanesdev/lanes/internal/lib/scenario"
	"github.com/lanesdev/lanes/internal/testkit/oracle"
	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

// The tunnel's routed outbound calls against the reference model of the
// contract (internal/testkit/oracle): random fleets, policies, outcome
// reports and requests. After each request step that the engine answered,
// the machine's process picks as the transports do (Service.Pick) and calls
// the instance it chose through the whole outbound path: the transports'
// dialer (LANES_DIAL), the machine's CONNECT proxy, a yamux stream of the
// tunnel, the control plane's rule of what a tunnel may reach (Dialable,
// given the scenario's fleet) and its dial. The call must reach exactly the
// instance picked, from the model's eligible set, carrying the lane the
// model says: the tunnel chooses nothing and refuses nothing that routing
// may choose.

var differentialScenarios = flag.Int("oracle.scenarios", 500, "random scenarios TestDifferential runs")

func TestDifferential(t *testing.T) {
	var fleet atomic.Pointer[[]registry.Instance]
	// The control plane's side: a dial reaches an in-process instance
	// that answers with the address it was dialled at and the lane the
	// request carries.
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ts, err := Upgrade(w, r)
		if err != nil {
			t.Error(err)
			return
		}
		defer ts.Close()
		ts.Serve(func(ctx context.Context, req string) (net.Conn, error) {
			addr, _ := strings.CutPrefix(req, "dial ")
			if !Dialable(addr, *fleet.Load()) {
				return nil, fmt.Errorf("%q is no registered instance's address", addr)
			}
			a, b := net.Pipe()
			go instance(b, addr)
			return a, nil
		})
		ended := ts.Ended()
		ts.SendHello(Hello{})
		select {
		case <-ended:
		case <-ts.Done():
		}
		ts.Goodbye()
	}))
	defer hs.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Dial(ctx, hs.URL, "secret", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(5 * time.Second)
	// The machine's side: the dial proxy of lanes dev.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	proxyDone := make(chan struct{})
	go func() {
		defer close(proxyDone)
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go ServeConnect(conn, 10*time.Second, func(addr string) (net.Conn, error) {
				return c.Open(context.Background(), "dial "+addr)
			})
		}
	}()
	defer func() { ln.Close(); <-proxyDone }()
	t.Setenv(instdial.Env, "http://"+ln.Addr().String())
	tr := &http.Transport{DialContext: instdial.Dialer(&net.Dialer{}), DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}

	calls := 0
	check := func(svc *routing.Service, req routing.Request, res scenario.StepResult) string {
		if res.Error != "" || res.Reason == routing.ReasonProbe.String() {
			return ""
		}
		r, err := svc.Pick(req)
		if err != nil {
			return fmt.Sprintf("Pick failed with %v", err)
		}
		if !slices.Contains(res.Eligible, r.Instance.ID) {
			return fmt.Sprintf("Pick chose %s, not of the eligible set", r.Instance.ID)
		}
		calls++
		hr, _ := http.NewRequest(http.MethodGet, "http://"+r.Instance.Addr+"/", nil)
		hr.Header.Set("X-Lane", r.RequestLane)
		resp, err := client.Do(hr)
		if err != nil {
			return fmt.Sprintf("the call to %s (%s) through the tunnel failed: %v", r.Instance.ID, r.Instance.Addr, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if want := r.Instance.Addr + " " + res.RequestLane; string(body) != want {
			return fmt.Sprintf("the call through the tunnel reached %q, want %q", body, want)
		}
		return ""
	}
	path := func(s *scenario.Scenario) []oracle.Answer {
		fleet.Store(&s.Instances)
		return oracle.EngineAnd(check)(s)
	}

	n := *differentialScenarios
	if testing.Short() {
		n /= 5
	}
	var total oracle.Counts
	for seed := range uint64(n) {
		cs := oracle.Generate(oracle.Seeded(seed), fmt.Sprintf("tunnel seed %d", seed), 2+int(seed%7))
		d, counts, err := oracle.Check(path, oracle.KeepsAll, cs)
		if err != nil {
			t.Fatalf("seed %d: the generated case is not a valid scenario: %v\n%s", seed, err, cs.YAML())
		}
		total.Add(counts)
		if d != nil {
			small := oracle.Shrink(path, oracle.KeepsAll, cs)
			sd, _, _ := oracle.Check(path, oracle.KeepsAll, small)
			out, _ := oracle.Print(small)
			t.Fatalf("seed %d: %v\nshrunk: %v\n%s", seed, d, sd, out)
		}
	}
	t.Logf("%d scenarios, %d requests compared, %d calls through the tunnel, 0 disagreements; answers: %v", n, total.Requests, calls, total.Answers)
	if calls == 0 {
		t.Error("no call went through the tunnel")
	}
}

// instance serves one connection as an instance at addr: each request is
// answered with addr and the lane it carries.
func instance(c net.Conn, addr string) {
	defer c.Close()
	br := bufio.NewReader(c)
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return // the call is over
		}
		body := addr + " " + req.Header.Get("X-Lane")
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	}
}
