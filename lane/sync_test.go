package lane

import (
	"context"
	"net/http"
	"testing"

	"go.opentelemetry.io/otel/baggage"
)

// otelBag returns ctx with OpenTelemetry baggage parsed from s.
func otelBag(t *testing.T, s string) context.Context {
	t.Helper()
	b, err := baggage.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return baggage.ContextWithBaggage(context.Background(), b)
}

func TestWithLaneKeepsOpenTelemetryBaggage(t *testing.T) {
	for _, tc := range []struct {
		bag, name string
		want      string // the baggage afterwards, members sorted by the check
	}{
		{"", "alice", "lane=alice"},
		{"", "", ""},
		{"lane=alice", "", ""},
		{"lane=alice,team=x", "", "team=x"},
		{"lane=bob,team=x", "alice", "lane=alice,team=x"},
		{"team=x", "alice", "lane=alice,team=x"},
		{"lane=alice;p=1", "alice", "lane=alice"},
		{"lane=alice,team=x", "alice", "lane=alice,team=x"},
		{"lane=alice,team=x", "Bad Lane", "team=x"}, // invalid: the baseline
	} {
		ctx := context.Background()
		if tc.bag != "" {
			ctx = otelBag(t, tc.bag)
		}
		got := baggage.FromContext(WithLane(ctx, tc.name))
		want, _ := baggage.Parse(tc.want)
		if got.Len() != want.Len() || got.Member("lane").String() != want.Member("lane").String() ||
			got.Member("team").Value() != want.Member("team").Value() {
			t.Errorf("WithLane(baggage %q, %q): baggage %q, want %q", tc.bag, tc.name, got, tc.want)
		}
		if got := FromContext(WithLane(ctx, tc.name)); got != tc.name {
			t.Errorf("WithLane(baggage %q, %q): lane %q", tc.bag, tc.name, got)
		}
	}
}

func TestSyncBaggage(t *testing.T) {
	bg := context.Background()
	if SyncBaggage(bg, "alice") != bg {
		t.Error("SyncBaggage added baggage to a context without any: OpenTelemetry writes none for it")
	}
	ctx := otelBag(t, "lane=bob,team=x")
	if got := baggage.FromContext(SyncBaggage(ctx, "alice")).Member("lane").Value(); got != "alice" {
		t.Errorf("lane member %q, want alice", got)
	}
	if got := baggage.FromContext(SyncBaggage(ctx, "")); got.Member("lane").Key() != "" || got.Member("team").Value() != "x" {
		t.Errorf("baseline: baggage %q, want team=x", got)
	}
	same := otelBag(t, "lane=alice,team=x")
	if SyncBaggage(same, "alice") != same {
		t.Error("SyncBaggage made a new context for baggage that agrees")
	}
	Encode("alice")
	if n := testing.AllocsPerRun(100, func() { SyncBaggage(same, "alice"); SyncBaggage(bg, "alice") }); n != 0 {
		t.Errorf("SyncBaggage that changes nothing: %v allocations", n)
	}
	lctx := WithLane(bg, "alice")
	if n := testing.AllocsPerRun(100, func() { WithLane(lctx, "alice") }); n != 0 {
		t.Errorf("WithLane that changes nothing: %v allocations", n)
	}
}

func TestBaggageCarries(t *testing.T) {
	for _, tc := range []struct {
		vals []string
		name string
		want bool
	}{
		{nil, "", true},
		{nil, "alice", false},
		{[]string{"team=x"}, "", true},
		{[]string{"lane=alice"}, "alice", true},
		{[]string{"team=x, lane = alice ;p"}, "alice", true},
		{[]string{"lane=%61lice"}, "alice", true},
		{[]string{"lane=alice"}, "", false},
		{[]string{"lane=al ice"}, "", false}, // malformed, but some reader may take it
		{[]string{"\u00a0lane=bob"}, "", false},
		{[]string{"lane=bob"}, "alice", false},
		{[]string{"lane=alice,lane=alice"}, "alice", false},
		{[]string{"lane=alice", "lane=bob"}, "alice", false},
		{[]string{"lane=alice,\u00a0lane=bob"}, "alice", false},
	} {
		if got := BaggageCarries(HTTPHeader(http.Header{"Baggage": tc.vals}), tc.name); got != tc.want {
			t.Errorf("BaggageCarries(%q, %q) = %v, want %v", tc.vals, tc.name, got, tc.want)
		}
	}
}

func TestEncode(t *testing.T) {
	e := Encode("alice")
	if e == nil || e.Header[0] != "alice" || e.Baggage[0] != "lane=alice" || Encode("alice") != e {
		t.Fatalf("Encode(alice) = %+v", e)
	}
	for _, bad := range []string{"", "Alice", "al ice"} {
		if Encode(bad) != nil {
			t.Errorf("Encode(%q) is not nil", bad)
		}
	}
	if n := testing.AllocsPerRun(100, func() { Encode("alice") }); n != 0 {
		t.Errorf("Encode of a cached lane: %v allocations", n)
	}
}
