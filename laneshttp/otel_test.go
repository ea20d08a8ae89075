package laneshttp_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"testing"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/propagation"

	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/laneshttp"
	"github.com/lanesdev/lanes/registry"
)

// TestOpenTelemetryInterop: a caller that knows nothing of lanes, a plain
// http.Client with only otelhttp's transport and the W3C baggage propagator,
// puts lane=alice and team=x in its baggage. The lanes middleware reads the
// lane; the handler still sees team=x through OpenTelemetry; and a hop made
// with otelhttp over the lanes transport carries both to the alice instance.
func TestOpenTelemetryInterop(t *testing.T) {
	prop := otelhttp.WithPropagators(propagation.Baggage{})
	f := newFleet(t, "")
	guarded := func(in registry.Instance, h http.Handler) http.Handler {
		return laneshttp.Handler(h, laneshttp.WithGuard(guardFor(f.e, in)), laneshttp.WithLogger(quiet))
	}
	// orders reports what it sees: its lane (lanes) and team (OpenTelemetry).
	report := func(in registry.Instance, _ http.Handler) http.Handler {
		return otelhttp.NewHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "%s lane=%s team=%s baggage=%q", in.ID, lane.FromContext(r.Context()),
				baggage.FromContext(r.Context()).Member("team").Value(), r.Header.Get("Baggage"))
		}), "orders", prop)
	}
	f.start("orders-base orders", report)
	alice := f.start("orders-alice orders lane=alice", report, guarded)

	// front calls orders: OpenTelemetry outside, lanes inside, as documented.
	lanesTr := f.client().Transport
	down := &http.Client{Transport: otelhttp.NewTransport(lanesTr, prop)}
	front := f.start("front front", func(in registry.Instance, _ http.Handler) http.Handler {
		return otelhttp.NewHandler(laneshttp.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, body, _, err := call(r.Context(), down, http.MethodGet, "http://orders/", nil)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadGateway)
				return
			}
			fmt.Fprintf(w, "front team=%s > %s", baggage.FromContext(r.Context()).Member("team").Value(), body)
		}), laneshttp.WithLogger(quiet)), "front", prop)
	})
	f.await("orders", 2)

	// The caller: no lanes at all.
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	plain := &http.Client{Transport: otelhttp.NewTransport(base, prop)}
	ctx := withBaggage(t, bg(t), "lane", "alice", "team", "x")

	code, body := get(t, ctx, plain, front.srv.URL+"/")
	want := `front team=x > orders-alice lane=alice team=x baggage="lane=alice,team=x"`
	if code != 200 || body != want {
		t.Fatalf("got %d %q\nwant %q", code, body, want)
	}
	// Without the lane member: baseline, and team=x still travels.
	code, body = get(t, withBaggage(t, bg(t), "team", "x"), plain, front.srv.URL+"/")
	body = withoutKey(body) // front gave the baseline request its request key
	if want := `front team=x > orders-base lane= team=x baggage="team=x"`; code != 200 || body != want {
		t.Fatalf("got %d %q\nwant %q", code, body, want)
	}

	// Straight to the alice instance: its guard reads the lane from baggage.
	// (OpenTelemetry writes the members in no particular order.)
	code, body = get(t, ctx, plain, alice.srv.URL+"/")
	if code != 200 || body != `orders-alice lane=alice team=x baggage="lane=alice,team=x"` && body != `orders-alice lane=alice team=x baggage="team=x,lane=alice"` {
		t.Fatalf("straight: %d %q", code, body)
	}
	res, err := plain.Get(alice.srv.URL + "/") // no baggage: a baseline request
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusMisdirectedRequest {
		t.Fatalf("a baseline request reached the alice instance: %d", res.StatusCode)
	}
}

// withBaggage returns ctx with OpenTelemetry baggage of the given key-value
// pairs.
func withBaggage(t *testing.T, ctx context.Context, kv ...string) context.Context {
	var ms []baggage.Member
	for i := 0; i+1 < len(kv); i += 2 {
		m, err := baggage.NewMember(kv[i], kv[i+1])
		if err != nil {
			t.Fatal(err)
		}
		ms = append(ms, m)
	}
	b, err := baggage.New(ms...)
	if err != nil {
		t.Fatal(err)
	}
	return baggage.ContextWithBaggage(ctx, b)
}

// keyMember matches the request key member that the entry of a baseline
// request adds to its baggage.
var keyMember = regexp.MustCompile(`lanes-key=[0-9a-f]{16},?`)

// withoutKey removes the request key member from s.
func withoutKey(s string) string { return keyMember.ReplaceAllString(s, "") }
