package lane

import (
	"context"
	"net/http"
	"slices"
	"strings"
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

func TestRequestKey(t *testing.T) {
	if NormalizeKey("user-1") != "user-1" || NormalizeKey("") != "" {
		t.Error("a key that travels as it is was changed")
	}
	for _, k := range []string{"user 1", "a,b", "100%", "é", strings.Repeat("k", MaxKeyLen+1)} {
		n := NormalizeKey(k)
		if len(n) != 16 || NormalizeKey(n) != n || NormalizeKey(k) != n {
			t.Errorf("NormalizeKey(%q) = %q", k, n)
		}
	}
	if k := NewKey(); len(k) != 16 || NormalizeKey(k) != k || k == NewKey() {
		t.Errorf("NewKey() = %q", k)
	}

	p := Propagator{}
	h := http.Header{"Baggage": {"team=x,lanes-key=k1"}}
	if got := p.ExtractKey(HTTPHeader(h)); got != "k1" {
		t.Errorf("ExtractKey = %q", got)
	}
	if got := p.ExtractKey(HTTPHeader(http.Header{"Baggage": {"lanes-key=a%20b"}})); got != "" {
		t.Errorf("ExtractKey of an encoded key = %q, want none", got)
	}
	ctx := p.ExtractKeyContext(context.Background(), HTTPHeader(h))
	if KeyFromContext(ctx) != "k1" {
		t.Errorf("ExtractKeyContext kept %q", KeyFromContext(ctx))
	}
	if k := KeyFromContext(p.ExtractKeyContext(context.Background(), HTTPHeader(http.Header{}))); len(k) != 16 {
		t.Errorf("ExtractKeyContext without a key: %q, want a new one", k)
	}

	out := http.Header{"Baggage": {"lanes-key=old,team=x,lane=bob"}, "X-Lane": {"bob"}}
	p.InjectCall(ctx, "", HTTPHeader(out))
	if got := out.Get("Baggage"); got != "lanes-key=k1,team=x" || out.Get("X-Lane") != "" {
		t.Errorf("InjectCall baseline: baggage %q x-lane %q", got, out.Get("X-Lane"))
	}
	out = http.Header{}
	p.InjectCall(ctx, "alice", HTTPHeader(out))
	if got := out.Get("Baggage"); got != "lane=alice" {
		t.Errorf("InjectCall lane: baggage %q, want the lane alone", got)
	}

	// The OpenTelemetry baggage carries the key when it has members.
	octx := WithKey(otelBag(t, "team=x"), "k2")
	if got := baggage.FromContext(octx).Member(KeyMember).Value(); got != "k2" {
		t.Errorf("OpenTelemetry baggage key %q", got)
	}
	if got := baggage.FromContext(SyncBaggage(WithKey(context.Background(), "k3"), "")); got.Len() != 0 {
		t.Errorf("SyncBaggage added baggage %q to a context without any", got)
	}
	if got := baggage.FromContext(SyncBaggage(WithKey(otelBag(t, "lane=a,team=x"), "k3"), "")); got.Member(KeyMember).Value() != "k3" || got.Member("lane").Key() != "" {
		t.Errorf("SyncBaggage baseline: %q", got)
	}
}

// EntryContext is WithLane, then for a baseline request ExtractKeyContext: the same lane, key and
// OpenTelemetry baggage, whatever the context carried before (a lane, a key, baggage members)
// and whatever the request's headers carry. A new key is random, so it is compared by its form.
func TestEntryContext(t *testing.T) {
	p := Propagator{}
	contexts := map[string]context.Context{
		"empty":       context.Background(),
		"lane":        WithLane(context.Background(), "bob"),
		"key":         WithKey(context.Background(), "old"),
		"baggage":     otelBag(t, "team=x"),
		"baggage-key": otelBag(t, "team=x,lanes-key=old,lane=bob"),
	}
	headers := map[string]http.Header{
		"none":    {},
		"key":     {"Baggage": {"team=y,lanes-key=k1"}},
		"bad-key": {"Baggage": {"lanes-key=a%20b"}},
	}
	for cn, ctx := range contexts {
		for hn, h := range headers {
			for _, name := range []string{"", "alice"} {
				want := WithLane(ctx, name)
				if name == "" {
					want = p.ExtractKeyContext(want, HTTPHeader(h))
				}
				got := p.EntryContext(ctx, name, HTTPHeader(h))
				wk, gk := KeyFromContext(want), KeyFromContext(got)
				sameKey := wk == gk || len(wk) == 16 && len(gk) == 16 && wk != "old" && gk != "old"
				wb, gb := baggage.FromContext(want), baggage.FromContext(got)
				wm, gm := wb.Member(KeyMember), gb.Member(KeyMember)
				if wl := FromContext(want); FromContext(got) != wl || !sameKey ||
					!slices.Equal(otherMembers(wb), otherMembers(gb)) ||
					(wm.Key() == "") != (gm.Key() == "") || name == "" && gm.Key() != "" && gm.Value() != gk {
					t.Errorf("context %s, headers %s, lane %q: EntryContext has lane %q key %q baggage %q; WithLane and ExtractKeyContext: %q %q %q",
						cn, hn, name, FromContext(got), gk, gb, wl, wk, wb)
				}
			}
		}
	}
	h := HTTPHeader(http.Header{})
	if n := testing.AllocsPerRun(100, func() { p.EntryContext(context.Background(), "", h) }); n > 2 {
		t.Errorf("EntryContext of a baseline request without baggage: %v allocations, want 2 (its key)", n)
	}
}

// otherMembers returns the members of b but the request key, sorted.
func otherMembers(b baggage.Baggage) []string {
	var out []string
	for _, m := range b.Members() {
		if m.Key() != KeyMember {
			out = append(out, m.String())
		}
	}
	slices.Sort(out)
	return out
}
