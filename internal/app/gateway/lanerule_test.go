package gateway

import (
	"log/slog"
	"net/http"
	"regexp"
	"testing"

	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/laneshttp"
)

// TestLaneHeadersMeanWhatTheyMeanInAService: the gateway reads the lane
// headers with the lane package's rule, so a request means the same at the
// edge as in a service: where lane.Propagator.Extract finds an invalid lane
// (an invalid x-lane next to a valid baggage lane among them), the gateway
// answers 400 and a service (laneshttp's middleware) serves the baseline;
// otherwise both take the same lane.
func TestLaneHeadersMeanWhatTheyMeanInAService(t *testing.T) {
	onStacks(t, testLaneHeadersMeanWhatTheyMeanInAService)
}

func testLaneHeadersMeanWhatTheyMeanInAService(t *testing.T) {
	w := newWorld(t, "", Config{})
	twoLanes(t, w)
	var inService string
	svc := laneshttp.Handler(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		inService = lane.FromContext(r.Context())
	}), laneshttp.WithLogger(slog.New(slog.DiscardHandler)))
	for _, h := range []map[string]string{
		{"x-lane": "al ice", "baggage": "lane=alice"},
		{"x-lane": "-alice", "baggage": "team=x,lane=alice"},
		{"x-lane": "alice\u00a0", "baggage": "lane=alice"},
		{"x-lane": " ", "baggage": "lane=alice"},
		{"x-lane": "alice", "baggage": "lane=bob"},
		{"baggage": "lane=bob,lane=alice"},
		{"baggage": "lane=alice,lane=bo b"},
		{"baggage": "lane=al%20ice"},
		{"baggage": "lane=alice;=x"},
	} {
		hdr := http.Header{}
		for k, v := range h {
			hdr.Set(k, v)
		}
		name, _, err := lane.Propagator{}.Extract(lane.HTTPHeader(hdr))
		r := w.get(t, "/", h)
		switch {
		case err != nil && r.status != http.StatusBadRequest:
			t.Errorf("%v: the lane package finds %v; the gateway answers %d, want 400", h, err, r.status)
		case err == nil && (r.status != http.StatusOK || r.header.Get("X-Lane") != name):
			t.Errorf("%v: the lane package reads lane %q; the gateway answers %d in lane %q", h, name, r.status, r.header.Get("X-Lane"))
		}
		req, _ := http.NewRequest(http.MethodGet, "/", nil)
		req.Header = hdr
		svc.ServeHTTP(nil, req)
		if inService != name {
			t.Errorf("%v: the lane package reads lane %q; a service serves lane %q", h, name, inService)
		}
	}
}

// keyMember matches the request key member that the gateway gives a
// baseline request's baggage.
var keyMember = regexp.MustCompile(`lanes-key=[0-9a-f]{16},?`)

// withoutKey removes the request key member from a baggage header.
func withoutKey(s string) string { return keyMember.ReplaceAllString(s, "") }

// TestGatewayGivesTheRequestKey: the gateway, the entry, sends a baseline
// request on with its request key in baggage (the key header's, or a new
// one), so that every hop splits it as the gateway did; a lane request needs
// none.
func TestGatewayGivesTheRequestKey(t *testing.T) { onStacks(t, testGatewayGivesTheRequestKey) }

func testGatewayGivesTheRequestKey(t *testing.T) {
	w := newWorld(t, "", Config{})
	twoLanes(t, w)
	r := w.get(t, "/", map[string]string{"x-lanes-key": "user-1", "baggage": "team=x"})
	if got := r.echo.hdr(t, "baggage"); got != "lanes-key=user-1,team=x" {
		t.Errorf("with a key header: upstream baggage %q", got)
	}
	r = w.get(t, "/", map[string]string{"x-lanes-key": "user 1"})
	if got := r.echo.hdr(t, "baggage"); got != "lanes-key="+lane.NormalizeKey("user 1") {
		t.Errorf("with a key that needs encoding: upstream baggage %q", got)
	}
	r = w.get(t, "/", nil)
	if got := r.echo.hdr(t, "baggage"); !keyMember.MatchString(got) || withoutKey(got) != "" {
		t.Errorf("without a key: upstream baggage %q, want a new key", got)
	}
	r = w.get(t, "/", map[string]string{"x-lane": "alice", "x-lanes-key": "user-1"})
	if got := r.echo.hdr(t, "baggage"); got != "lane=alice" {
		t.Errorf("a lane request: upstream baggage %q", got)
	}
}
