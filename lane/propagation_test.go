package lane

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"testing"
)

var aliases = Propagator{Aliases: []string{"clk", "dubbo.tag", "service-lane", "x-asm-prefer-tag", "sd-routing-key"}}

func header(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i < len(kv); i += 2 {
		h.Add(kv[i], kv[i+1])
	}
	return h
}

func TestExtract(t *testing.T) {
	tests := []struct {
		name   string
		h      http.Header
		lane   string
		source string
		rule   Rule // "" for no error
	}{
		{"none", header(), "", "", ""},
		{"x-lane", header("X-Lane", "alice"), "alice", Header, ""},
		{"x-lane normalised", header("X-Lane", " Alice "), "alice", Header, ""},
		{"x-lane blank falls through", header("X-Lane", "  ", "Baggage", "lane=bob"), "bob", BaggageHeader, ""},
		{"x-lane beats baggage", header("X-Lane", "alice", "Baggage", "lane=bob"), "alice", Header, ""},
		{"x-lane beats alias", header("X-Lane", "alice", "Clk", "carol"), "alice", Header, ""},
		{"baggage", header("Baggage", "lane=bob"), "bob", BaggageHeader, ""},
		{"baggage beats alias", header("Baggage", "lane=bob", "Clk", "carol"), "bob", BaggageHeader, ""},
		{"baggage among members", header("Baggage", "a=1, lane = Bob ;p=1;q ,c=3"), "bob", BaggageHeader, ""},
		{"baggage second value", header("Baggage", "a=1", "Baggage", "b=2,lane=bob"), "bob", BaggageHeader, ""},
		{"baggage percent-encoded", header("Baggage", "lane=%62%4Fb"), "bob", BaggageHeader, ""},
		{"baggage encoded spaces", header("Baggage", "lane=%20bob%20"), "bob", BaggageHeader, ""},
		{"baggage last lane member wins", header("Baggage", "lane=bob,lane=eve"), "eve", BaggageHeader, ""},
		{"baggage last lane member wins over values", header("Baggage", "lane=bob", "Baggage", "lane=eve"), "eve", BaggageHeader, ""},
		{"baggage malformed last lane member skipped", header("Baggage", "lane=bob,lane=eve;p q"), "bob", BaggageHeader, ""},
		{"baggage lane member with bad property skipped", header("Baggage", "lane=bob;=x", "Clk", "carol"), "carol", "clk", ""},
		{"baggage lane member with bad characters skipped", header("Baggage", "lane=al ice", "Clk", "carol"), "carol", "clk", ""},
		{"baggage lane member with a quote skipped", header("Baggage", `lane="bob"`), "", "", ""},
		{"baggage other whitespace is not trimmed", header("Baggage", "lane=bob\u00a0", "Clk", "carol"), "carol", "clk", ""},
		{"baggage key is trimmed", header("Baggage", "\tlane\t=bob"), "bob", BaggageHeader, ""},
		{"baggage key is case-sensitive", header("Baggage", "Lane=bob"), "", "", ""},
		{"baggage key with property is not lane", header("Baggage", "lane;p=bob"), "", "", ""},
		{"baggage empty lane falls through", header("Baggage", "lane=", "Clk", "carol"), "carol", "clk", ""},
		{"baggage encoded blank falls through", header("Baggage", "lane=%20", "Clk", "carol"), "carol", "clk", ""},
		{"baggage without lane", header("Baggage", "a=1,b=2", "Clk", "carol"), "carol", "clk", ""},
		{"baggage malformed members skipped", header("Baggage", "=x,,junk,;,lane=bob"), "bob", BaggageHeader, ""},
		{"alias", header("Clk", "carol"), "carol", "clk", ""},
		{"aliases in order", header("Sd-Routing-Key", "dave", "Dubbo.tag", "carol"), "carol", "dubbo.tag", ""},
		{"last alias", header("Sd-Routing-Key", "Dave"), "dave", "sd-routing-key", ""},
		{"alias blank skipped", header("Clk", " ", "Service-Lane", "erin"), "erin", "service-lane", ""},

		{"invalid x-lane", header("X-Lane", "alice;drop", "Baggage", "lane=bob"), "", Header, RuleChars},
		{"invalid x-lane space", header("X-Lane", "al ice"), "", Header, RuleChars},
		{"invalid x-lane edge", header("X-Lane", "-alice"), "", Header, RuleEdge},
		{"invalid x-lane long", header("X-Lane", strings.Repeat("a", MaxLen+1)), "", Header, RuleTooLong},
		{"invalid x-lane joined", header("X-Lane", "alice, bob"), "", Header, RuleChars},
		{"invalid baggage never falls through", header("Baggage", "lane=al%20ice", "Clk", "carol"), "", BaggageHeader, RuleChars},
		{"undecodable baggage skipped", header("Baggage", "lane=%zz", "Clk", "carol"), "carol", "clk", ""},
		{"baggage decodes to an invalid lane", header("Baggage", "lane=%FF"), "", BaggageHeader, RuleChars},
		{"baggage decodes to a comma", header("Baggage", "lane=a%2Cb"), "", BaggageHeader, RuleChars},
		{"truncated escape skipped", header("Baggage", "lane=bob%4"), "", "", ""},
		{"invalid alias", header("Dubbo.tag", "gray_1", "Sd-Routing-Key", "dave"), "", "dubbo.tag", RuleChars},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, src, err := aliases.Extract(HTTPHeader(tt.h))
			if got != tt.lane || src != tt.source {
				t.Errorf("Extract = %q from %q, want %q from %q", got, src, tt.lane, tt.source)
			}
			if tt.rule == "" {
				if err != nil {
					t.Errorf("err = %v, want nil", err)
				}
				return
			}
			var ne *NameError
			if !errors.As(err, &ne) {
				t.Fatalf("err = %v, want a *NameError", err)
			}
			if ne.Rule != tt.rule || ne.Header != tt.source {
				t.Errorf("err = %+v, want rule %q in header %q", ne, tt.rule, tt.source)
			}
		})
	}
}

func TestExtractZeroPropagatorIgnoresAliases(t *testing.T) {
	var p Propagator
	if got, src, err := p.Extract(HTTPHeader(header("Clk", "carol"))); got != "" || src != "" || err != nil {
		t.Errorf("Extract = %q, %q, %v; want baseline", got, src, err)
	}
}

func TestIgnoredAliases(t *testing.T) {
	p := Propagator{Aliases: []string{"", "X-Lane", "BAGGAGE", "clk"}}
	h := header("", "alice", "Baggage", "a=1", "Clk", "carol")
	if got, src, err := p.Extract(HTTPHeader(h)); got != "carol" || src != "clk" || err != nil {
		t.Errorf("Extract = %q, %q, %v; want carol from clk", got, src, err)
	}
	p.InjectLane("", HTTPHeader(h))
	if want := header("", "alice", "Baggage", "a=1"); !reflect.DeepEqual(h, want) {
		t.Errorf("after baseline Inject: %q, want %q", h, want)
	}
}

func TestExtractErrorMessage(t *testing.T) {
	_, _, err := Propagator{}.Extract(HTTPHeader(header("X-Lane", "alice;drop")))
	want := `invalid lane "alice;drop" in header "x-lane": only a-z, 0-9 and '-' are allowed`
	if err == nil || err.Error() != want {
		t.Errorf("err = %v, want %s", err, want)
	}
}

func TestExtractCarriers(t *testing.T) {
	carriers := map[string]Carrier{
		"Metadata":      Metadata{"baggage": {"a=1", "lane=Bob"}, "clk": {"x"}},
		"MessageHeader": MessageHeader{"BAGGAGE": {"a=1", "lane=Bob"}, "Clk": {"x"}},
		"HTTPHeader":    HTTPHeader(header("Baggage", "a=1", "Baggage", "lane=Bob", "Clk", "x")),
	}
	for name, c := range carriers {
		if got, src, err := aliases.Extract(c); got != "bob" || src != BaggageHeader || err != nil {
			t.Errorf("%s: Extract = %q, %q, %v; want bob from baggage", name, got, src, err)
		}
	}
}

func TestExtractLimits(t *testing.T) {
	others := func(n int) string {
		var b strings.Builder
		for i := range n {
			fmt.Fprintf(&b, "k%d=v,", i)
		}
		return b.String()
	}
	tests := []struct {
		name    string
		baggage []string
		want    string
	}{
		{"64th member", []string{others(63) + "lane=bob"}, "bob"},
		{"65th member", []string{others(64) + "lane=bob"}, ""},
		{"duplicate keys over values count once", []string{others(32), others(32), "lane=bob"}, "bob"},
		{"a value after 64 members is read", []string{others(64), "lane=bob"}, "bob"},
		{"a value after 64 members over values is read", []string{others(32), strings.ReplaceAll(others(32), "k", "j"), "lane=bob"}, "bob"},
		{"a value after 65 members over values is not read", []string{others(32), strings.ReplaceAll(others(33), "k", "j"), "lane=bob"}, ""},
		{"malformed members do not count", []string{strings.Repeat("junk,", 100) + "lane=bob"}, "bob"},
		{"empty members do not count", []string{others(63) + ",,, ,lane=bob"}, "bob"},
		{"ends at byte 8192", []string{strings.Repeat(" ", maxBytes-len("lane=bob")) + "lane=bob"}, "bob"},
		{"ends at byte 8193", []string{strings.Repeat(" ", maxBytes-len("lane=bob")+1) + "lane=bob"}, ""},
		{"bytes over values", []string{strings.Repeat(" ", maxBytes-len("lane=bob")-1), "lane=bob"}, "bob"},
		{"bytes over values, one too many", []string{strings.Repeat(" ", maxBytes-len("lane=bob")), "lane=bob"}, ""},
		{"huge member before", []string{"a=" + strings.Repeat("x", 2*maxBytes), "lane=bob"}, ""},
	}
	for _, tt := range tests {
		h := http.Header{"Baggage": tt.baggage}
		got, _, err := Propagator{}.Extract(HTTPHeader(h))
		if got != tt.want || err != nil {
			t.Errorf("%s: Extract = %q, %v; want %q, nil", tt.name, got, err, tt.want)
		}
	}
}

func TestExtractAllocs(t *testing.T) {
	h := header("X-Lane", "alice", "Baggage", "a=1,lane=alice", "Traceparent", "00-abc")
	c := HTTPHeader(h)
	n := testing.AllocsPerRun(1000, func() {
		if l, _, err := aliases.Extract(c); l != "alice" || err != nil {
			t.Fatal(l, err)
		}
	})
	if n != 0 {
		t.Errorf("Extract from x-lane: %v allocations, want 0", n)
	}
	// Baseline requests, with aliases to look at, do not allocate either.
	b := HTTPHeader(header("Baggage", "a=1,b=2;p", "Traceparent", "00-abc"))
	n = testing.AllocsPerRun(1000, func() {
		if l, _, err := aliases.Extract(b); l != "" || err != nil {
			t.Fatal(l, err)
		}
	})
	if n != 0 {
		t.Errorf("Extract of a baseline request: %v allocations, want 0", n)
	}
	// Nor does a lane from baggage without escapes.
	g := HTTPHeader(header("Baggage", "a=1, lane=alice;p"))
	n = testing.AllocsPerRun(1000, func() {
		if l, _, err := aliases.Extract(g); l != "alice" || err != nil {
			t.Fatal(l, err)
		}
	})
	if n != 0 {
		t.Errorf("Extract from baggage: %v allocations, want 0", n)
	}
}

func TestExtractContext(t *testing.T) {
	up := WithLane(context.Background(), "alice")
	tests := []struct {
		h    http.Header
		want string
	}{
		{header("X-Lane", "Bob"), "bob"},
		{header(), ""},                 // baseline hides the upstream lane
		{header("X-Lane", "b;ob"), ""}, // invalid: baseline
		{header("Baggage", "lane=carol"), "carol"},
	}
	for _, tt := range tests {
		ctx := Propagator{}.ExtractContext(up, HTTPHeader(tt.h))
		if got := FromContext(ctx); got != tt.want {
			t.Errorf("ExtractContext(%v): lane %q, want %q", tt.h, got, tt.want)
		}
	}
}

func TestInject(t *testing.T) {
	tests := []struct {
		name string
		lane string
		in   http.Header
		want http.Header
	}{
		{"lane into empty", "alice", header(),
			header("X-Lane", "alice", "Baggage", "lane=alice")},
		{"lane replaces stale", "alice", header("X-Lane", "bob", "Baggage", "lane=bob"),
			header("X-Lane", "alice", "Baggage", "lane=alice")},
		{"lane first, others untouched", "alice",
			header("Baggage", "a=1;p=%20x , lane=bob; q, b= two%2C ;x", "Baggage", "c=3,lane=eve", "Traceparent", "00-1"),
			header("X-Lane", "alice", "Baggage", "lane=alice,a=1;p=%20x,b= two%2C ;x,c=3", "Traceparent", "00-1")},
		{"malformed members pass through", "alice", header("Baggage", "junk, =x,a=1"),
			header("X-Lane", "alice", "Baggage", "lane=alice,junk,=x,a=1")},
		{"lane leaves aliases alone", "alice", header("Clk", "bob"),
			header("X-Lane", "alice", "Baggage", "lane=alice", "Clk", "bob")},
		{"lane normalised", " Alice ", header(),
			header("X-Lane", "alice", "Baggage", "lane=alice")},

		{"baseline into empty", "", header(), header()},
		{"baseline removes stale", "",
			header("X-Lane", "bob", "Clk", "bob", "Dubbo.tag", "bob", "Service-Lane", "bob",
				"X-Asm-Prefer-Tag", "bob", "Sd-Routing-Key", "bob", "Baggage", "a=1, lane=bob ,b=2;p", "Traceparent", "00-1"),
			header("Baggage", "a=1,b=2;p", "Traceparent", "00-1")},
		{"baseline deletes emptied baggage", "", header("Baggage", "lane=bob", "Baggage", " , lane=eve"), header()},
		{"baseline leaves baggage without lane untouched", "",
			header("Baggage", " a=1 ,, b=2 ", "Baggage", "c=3", "X-Lane", "bob"),
			header("Baggage", " a=1 ,, b=2 ", "Baggage", "c=3")},
		{"invalid is baseline", "al ice", header("X-Lane", "bob", "Baggage", "lane=bob,a=1"),
			header("Baggage", "a=1")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := tt.in.Clone()
			aliases.Inject(WithLane(context.Background(), tt.lane), HTTPHeader(h))
			if !reflect.DeepEqual(h, tt.want) {
				t.Errorf("after Inject(%q):\n got %q\nwant %q", tt.lane, h, tt.want)
			}
		})
	}
}

func TestInjectCarriers(t *testing.T) {
	md := Metadata{"x-lane": {"bob"}, "baggage": {"a=1,lane=bob"}, "clk": {"bob"}}
	aliases.InjectLane("", md)
	if want := (Metadata{"baggage": {"a=1"}}); !reflect.DeepEqual(md, want) {
		t.Errorf("Metadata after baseline Inject: %v, want %v", md, want)
	}
	aliases.InjectLane("alice", md)
	if want := (Metadata{"x-lane": {"alice"}, "baggage": {"lane=alice,a=1"}}); !reflect.DeepEqual(md, want) {
		t.Errorf("Metadata after Inject: %v, want %v", md, want)
	}

	mh := MessageHeader{"X-Lane": {"bob"}, "Baggage": {"lane=bob,a=1"}, "CLK": {"bob"}}
	aliases.InjectLane("alice", mh)
	if want := (MessageHeader{"x-lane": {"alice"}, "baggage": {"lane=alice,a=1"}, "CLK": {"bob"}}); !reflect.DeepEqual(mh, want) {
		t.Errorf("MessageHeader after Inject: %v, want %v", mh, want)
	}
	aliases.InjectLane("", mh)
	if want := (MessageHeader{"baggage": {"a=1"}}); !reflect.DeepEqual(mh, want) {
		t.Errorf("MessageHeader after baseline Inject: %v, want %v", mh, want)
	}
}

func TestInjectLimits(t *testing.T) {
	members := func(n int) []string {
		var m []string
		for i := range n {
			m = append(m, fmt.Sprintf("k%d=v", i))
		}
		return m
	}
	count := func(s string) int { return len(strings.Split(s, ",")) }

	// 64 others: the lane takes the first place and the last is dropped.
	h := http.Header{"Baggage": {strings.Join(members(64), ",")}}
	Propagator{}.InjectLane("alice", HTTPHeader(h))
	got := h.Get("Baggage")
	if want := "lane=alice," + strings.Join(members(63), ","); got != want {
		t.Errorf("64 others: got %d members, want lane + 63: %q", count(got), got)
	}

	// Too many bytes: the trailing member that does not fit and all after
	// it are dropped, even if a later one would fit.
	big := "big=" + strings.Repeat("x", maxBytes-len("lane=alice,a=1,")-len("big=")+1)
	h = http.Header{"Baggage": {"a=1", big, "b=2"}}
	Propagator{}.InjectLane("alice", HTTPHeader(h))
	if got, want := h.Get("Baggage"), "lane=alice,a=1"; got != want {
		t.Errorf("bytes: got %q, want %q", got, want)
	}

	// Exactly 8192 bytes fit.
	fit := "big=" + strings.Repeat("x", maxBytes-len("lane=alice,a=1,")-len("big="))
	h = http.Header{"Baggage": {"a=1", fit}}
	Propagator{}.InjectLane("alice", HTTPHeader(h))
	if got := h.Get("Baggage"); len(got) != maxBytes || !strings.HasSuffix(got, fit) {
		t.Errorf("8192 bytes: got %d bytes", len(got))
	}

	// Members beyond the limits of the incoming header are not carried on.
	h = http.Header{"Baggage": {strings.Join(append(members(64), "late=1"), ",")}}
	Propagator{}.InjectLane("", HTTPHeader(h)) // no lane member: untouched
	if got := count(h.Get("Baggage")); got != 65 {
		t.Errorf("baseline without lane member: %d members, want 65 untouched", got)
	}
	h = http.Header{"Baggage": {strings.Join(append(append(members(64), "late=1"), "lane=bob"), ",")}}
	Propagator{}.InjectLane("", HTTPHeader(h))
	if got, want := h.Get("Baggage"), strings.Join(members(64), ","); got != want {
		t.Errorf("baseline with a late lane member: got %d members, want the first 64", count(got))
	}
}

func TestRoundTrip(t *testing.T) {
	for _, c := range []Carrier{HTTPHeader(http.Header{}), Metadata{}, MessageHeader{}} {
		for _, l := range []string{"alice", "x", strings.Repeat("a1-", 20) + "z", ""} {
			aliases.Inject(WithLane(context.Background(), l), c)
			ctx := aliases.ExtractContext(WithLane(context.Background(), "stale"), c)
			if got := FromContext(ctx); got != l {
				t.Errorf("%T: round trip of %q gave %q", c, l, got)
			}
		}
	}
}

func BenchmarkExtract(b *testing.B) {
	cases := map[string]http.Header{
		"x-lane":   header("X-Lane", "alice", "Baggage", "a=1,lane=alice", "Traceparent", "00-1"),
		"baggage":  header("Baggage", "a=1, b=2;p, lane=alice", "Traceparent", "00-1"),
		"baseline": header("Baggage", "a=1, b=2;p", "Traceparent", "00-1"),
	}
	for name, h := range cases {
		b.Run(name, func(b *testing.B) {
			c := HTTPHeader(h)
			b.ReportAllocs()
			for b.Loop() {
				aliases.Extract(c)
			}
		})
	}
}

func BenchmarkInject(b *testing.B) {
	for _, l := range []string{"alice", ""} {
		b.Run("lane="+l, func(b *testing.B) {
			ctx := WithLane(context.Background(), l)
			in := header("Baggage", "a=1, b=2;p, lane=bob", "X-Lane", "bob", "Traceparent", "00-1")
			b.ReportAllocs()
			for b.Loop() {
				h := http.Header{"Baggage": in["Baggage"], "X-Lane": in["X-Lane"]}
				aliases.Inject(ctx, HTTPHeader(h))
			}
		})
	}
}
