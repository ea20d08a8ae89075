package polyglot

import (
	"encoding/json"
	"net/http"
	"os/exec"
	"testing"
	"time"

	"github.com/lanesdev/lanes/adminapi"
)

// lanes are the lanes the test sends requests in: the baseline, and two lanes.
var lanes = []string{"", "alice", "bob"}

// TestChain sends requests in the baseline and in two lanes through the gateway to web (Node,
// behind the sidecar), orders (Python, behind the sidecar), payments (Node gRPC over proxyless
// xDS, sidecar --direct) and ledger (Go SDK), and checks that every hop is served as routing.md
// says, that no baseline request reaches a lane instance, and that `lanes trace` shows every
// service's hop with its lane.
func TestChain(t *testing.T) {
	modules := prerequisites(t)
	s := startStack(t, modules)
	s.fleet()
	client := &http.Client{Timeout: 10 * time.Second}
	for _, l := range lanes {
		s.ready(client, l)
	}

	const rounds = 20
	leaked := 0
	traces := map[string]string{}
	for range rounds {
		for _, l := range lanes {
			a := call(client, s.gateway, l)
			if a.err != nil {
				t.Errorf("lane %s: %v", name(l), a.err)
				continue
			}
			if want := expected(l); !sameChain(a.hops, want) {
				t.Errorf("lane %s: served by %s, want %s", name(l), chain(a.hops), chain(want))
			}
			for _, h := range a.hops {
				if l == "" && h.Lane != "" {
					leaked++
				}
			}
			traces[l] = a.traceID
		}
	}
	t.Logf("chain: %d requests in each of baseline, alice, bob, each served as routing.md says; baseline hops served by a lane instance: %d", rounds, leaked)
	for _, l := range lanes {
		t.Logf("chain: lane %s: %s", name(l), chain(expected(l)))
	}
	if leaked != 0 {
		t.Errorf("%d baseline hops were served by a lane instance", leaked)
	}

	for _, l := range lanes {
		s.checkTrace(l, traces[l])
	}
}

// ready waits until a request in lane l is served by its whole expected chain: until every
// sidecar's registration and every xDS client's resources have arrived.
func (s *stack) ready(client *http.Client, l string) {
	s.t.Helper()
	deadline := time.Now().Add(wait)
	var last answer
	for time.Now().Before(deadline) {
		if last = call(client, s.gateway, l); last.err == nil && sameChain(last.hops, expected(l)) {
			return
		}
		time.Sleep(100 * time.Millisecond) // the next probe: the chain answers an event at a time
	}
	s.t.Fatalf("lane %s: not served by %s within %s; last answer %s, %v", name(l), chain(expected(l)), wait, chain(last.hops), last.err)
}

// checkTrace waits until `lanes trace` shows a server hop of each of the four services in the
// trace of a request in lane l, each with the lane requested and the lane that served it, and
// checks that the trace has no integrity finding.
func (s *stack) checkTrace(l, id string) {
	s.t.Helper()
	if id == "" {
		s.t.Errorf("lane %s: the gateway answered without x-trace-id", name(l))
		return
	}
	want := map[string]string{}
	for _, h := range expected(l) {
		want[h.Service] = h.Lane
	}
	deadline := time.Now().Add(wait)
	var tr adminapi.Trace
	var missing []string
	for {
		out, err := exec.Command(bins.lanes, "trace", id, "-o", "json", "--admin", s.admin, "--token", s.token).Output()
		tr = adminapi.Trace{}
		if err == nil && json.Unmarshal(out, &tr) == nil {
			seen := map[string]bool{}
			for _, h := range tr.Hops {
				if h.Kind == "server" && h.Lanes && want[h.Service] == h.Served && h.Requested == l {
					seen[h.Service] = true
				}
			}
			missing = missing[:0]
			for _, svc := range []string{"web", "orders", "payments", "ledger"} {
				if !seen[svc] {
					missing = append(missing, svc)
				}
			}
			if len(missing) == 0 {
				break
			}
		}
		if time.Now().After(deadline) {
			s.t.Errorf("lane %s: trace %s lacks a server hop in lane %s of %v within %s:\n%s", name(l), id, name(l), missing, wait, out)
			return
		}
		time.Sleep(100 * time.Millisecond) // spans arrive in the exporters' batches
	}
	if len(tr.Findings) != 0 {
		s.t.Errorf("lane %s: trace %s has integrity findings: %+v", name(l), id, tr.Findings)
	}
	text, err := exec.Command(bins.lanes, "trace", id, "--admin", s.admin, "--token", s.token).Output()
	if err != nil {
		s.t.Errorf("lanes trace %s: %v", id, err)
	}
	s.t.Logf("trace: lane %s: %d hops, a server hop of web, orders, payments and ledger each carrying lane %s:\n%s", name(l), len(tr.Hops), name(l), text)
}
