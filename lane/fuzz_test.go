package lane

import (
	"errors"
	"net/http"
	"net/textproto"
	"slices"
	"strings"
	"testing"
)

func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"alice", " Alice ", "ALICE", "alice;drop", "al ice", "", " ", "-a", "a-",
		"a--b", "42", strings.Repeat("a", MaxLen), strings.Repeat("a", MaxLen+1),
		"\u00a0alice\u00a0", "K", "\xff", "a\x00",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		name, err := Parse(raw)
		if err != nil {
			var ne *NameError
			if !errors.As(err, &ne) || ne.Value != raw || ne.Rule == "" {
				t.Fatalf("Parse(%q): err = %#v", raw, err)
			}
			if name != "" {
				t.Fatalf("Parse(%q) = %q with an error", raw, name)
			}
			if Valid(raw) {
				t.Fatalf("Valid(%q) but Parse fails", raw)
			}
			return
		}
		if !Valid(name) {
			t.Fatalf("Parse(%q) = %q, which is not Valid", raw, name)
		}
		if again, err := Parse(name); again != name || err != nil {
			t.Fatalf("Parse(Parse(%q)) = %q, %v; want %q", raw, again, err, name)
		}
		if Valid(raw) != (raw == name) {
			t.Fatalf("Valid(%q) = %v, but Parse gives %q", raw, Valid(raw), name)
		}
	})
}

// others splits a baggage header naively into its non-empty, non-lane
// members, trimmed: what Inject must carry on, limits aside.
func others(header string) (keep []string, all int) {
	for _, m := range strings.Split(header, ",") {
		m = strings.Trim(m, " \t")
		if m == "" {
			continue
		}
		all++
		if k, _, ok := strings.Cut(m, "="); ok && strings.Trim(k, " \t") == BaggageKey {
			continue
		}
		keep = append(keep, m)
	}
	return keep, all
}

func FuzzBaggage(f *testing.F) {
	f.Add("a=1, lane=bob;p ,b=2", "", "alice")
	f.Add("lane=%41lice", "c=3", "bob")
	f.Add("", "lane=x", "")
	f.Add(" , ,lane", "=,;", "a")
	f.Add("lane=%", "lane=%z1", "x-1")
	f.Add("k=v;p=1;q", "lane=bob,lane=eve", "Alice")
	f.Add(strings.Repeat("k=v,", 70)+"lane=bob", "", "alice")
	f.Add("a="+strings.Repeat("x", maxBytes), "lane=bob", "")
	f.Fuzz(checkBaggage)
}

// checkBaggage is the body of FuzzBaggage.
func checkBaggage(t *testing.T, b1, b2, name string) {
	vals := []string{b1, b2}
	joined := b1 + "," + b2
	want, all := others(joined)
	p := Propagator{}

	// Reading never panics and never yields an invalid lane.
	h := http.Header{"Baggage": slices.Clone(vals)}
	got, src, err := p.Extract(HTTPHeader(h))
	if got != "" && !Valid(got) {
		t.Fatalf("Extract = %q, not Valid", got)
	}
	if err != nil && (got != "" || src != BaggageHeader) {
		t.Fatalf("Extract = %q, %q, %v", got, src, err)
	}

	// A baseline Inject drops every lane member and keeps the others.
	p.InjectLane("", HTTPHeader(h))
	if got, src, err := p.Extract(HTTPHeader(h)); got != "" || src != "" || err != nil {
		t.Fatalf("after baseline Inject: Extract = %q, %q, %v; baggage %q", got, src, err, h["Baggage"])
	}
	if len(want) < all { // there was a lane member: rewritten
		out, _ := others(h.Get("Baggage"))
		if len(h["Baggage"]) > 1 || !isPrefix(out, want) || (fits(joined, all, "") && len(out) != len(want)) {
			t.Fatalf("baseline Inject of %q: %q, want %q", vals, h["Baggage"], want)
		}
	} else if !slices.Equal(h["Baggage"], vals) {
		t.Fatalf("baseline Inject changed %q to %q", vals, h["Baggage"])
	}

	// Inject then Extract round-trips a lane and keeps the others.
	lane, perr := Parse(name)
	if perr != nil {
		return
	}
	h = http.Header{"Baggage": slices.Clone(vals)}
	p.InjectLane(name, HTTPHeader(h))
	if got, src, err := p.Extract(HTTPHeader(h)); got != lane || src != Header || err != nil {
		t.Fatalf("Extract after Inject(%q) = %q, %q, %v", name, got, src, err)
	}
	h.Del("X-Lane")
	if got, src, err := p.Extract(HTTPHeader(h)); got != lane || src != BaggageHeader || err != nil {
		t.Fatalf("Extract from baggage after Inject(%q) = %q, %q, %v; baggage %q", name, got, src, err, h["Baggage"])
	}
	bag := h["Baggage"]
	if len(bag) != 1 || len(bag[0]) > maxBytes || !strings.HasPrefix(bag[0], BaggageKey+"="+lane) {
		t.Fatalf("Inject(%q): baggage %q", name, bag)
	}
	out, n := others(bag[0])
	if n > maxMembers || !isPrefix(out, want) || (fits(joined, all, lane) && len(out) != len(want)) {
		t.Fatalf("Inject(%q) into %q: others %q, want %q", name, vals, out, want)
	}
}

// isPrefix reports whether p is a prefix of s.
func isPrefix(p, s []string) bool {
	return len(p) <= len(s) && slices.Equal(p, s[:len(p)])
}

// fits reports whether a header of n members joined, with the lane member
// added, stays within the limits, so that nothing may be dropped.
func fits(joined string, n int, lane string) bool {
	return len(joined)+len(BaggageKey)+2+len(lane) <= maxBytes && n < maxMembers
}

func FuzzExtract(f *testing.F) {
	f.Add("alice", "lane=bob", "carol", "clk")
	f.Add("", "lane=Bob", "carol", "dubbo.tag")
	f.Add(" ", "a=1", "Carol", "Service-Lane")
	f.Add("al ice", "", "", "x-asm-prefer-tag")
	f.Add("", "lane=%zz", "carol", "sd-routing-key")
	f.Add("", "", "-bad", "CLK")
	f.Add("", "", "", "")
	f.Fuzz(func(t *testing.T, xlane, baggage, alias, aliasKey string) {
		p := Propagator{Aliases: []string{aliasKey}}
		set := func(c Carrier) Carrier {
			c.Set(Header, xlane)
			c.Set(BaggageHeader, baggage)
			c.Set(aliasKey, alias) // may overwrite one of the others
			return c
		}
		var first struct{ lane, src, err string }
		for i, c := range []Carrier{set(HTTPHeader{}), set(Metadata{}), set(MessageHeader{})} {
			lane, src, err := p.Extract(c)
			if lane != "" && !Valid(lane) {
				t.Fatalf("%T: Extract = %q, not Valid", c, lane)
			}
			if err != nil {
				var ne *NameError
				if lane != "" || !errors.As(err, &ne) || ne.Header != src || src == "" {
					t.Fatalf("%T: Extract = %q, %q, %#v", c, lane, src, err)
				}
			}
			if lane != "" && src == "" {
				t.Fatalf("%T: lane %q without a source", c, lane)
			}
			if !blank(c.Get(Header)) && src != Header {
				t.Fatalf("%T: x-lane %q present but source %q", c, c.Get(Header), src)
			}
			es := ""
			if err != nil {
				es = err.Error()
			}
			if i == 0 {
				first.lane, first.src, first.err = lane, src, es
			} else if lane != first.lane || src != first.src || es != first.err {
				t.Fatalf("%T: Extract = %q, %q, %q; HTTPHeader gave %+v", c, lane, src, es, first)
			}

			// Baseline Inject clears everything Extract could read.
			p.InjectLane("", c)
			if lane, src, err := p.Extract(c); lane != "" || src != "" || err != nil {
				t.Fatalf("%T: after baseline Inject: %q, %q, %v", c, lane, src, err)
			}
		}
	})
}

// headerKeyOK reports whether key is made of header bytes only, so that all
// carriers fold its case.
func headerKeyOK(key string) bool {
	for i := 0; i < len(key); i++ {
		if !headerByte(key[i]) {
			return false
		}
	}
	return true
}

func FuzzHeaderKey(f *testing.F) {
	for _, k := range []string{"x-lane", "X-LANE", "dubbo.tag", "a b", "", "ñ", "-x-"} {
		f.Add(k)
	}
	f.Fuzz(func(t *testing.T, key string) {
		want := textproto.CanonicalMIMEHeaderKey(key)
		if canonicalKey(key) != want {
			t.Fatalf("canonicalKey(%q) = %q, want %q", key, canonicalKey(key), want)
		}
		if canonical(key) != (want == key) {
			t.Fatalf("canonical(%q) = %v, want %v", key, canonical(key), want == key)
		}
		h := http.Header{want: {"v"}}
		if got := HTTPHeader(h).Get(key); got != "v" {
			t.Fatalf("Get(%q) = %q, want v (key %q)", key, got, want)
		}
		if got := (Metadata{strings.ToLower(key): {"v"}}).Get(key); headerKeyOK(key) && got != "v" {
			t.Fatalf("Metadata.Get(%q) = %q", key, got)
		}
		if got := (MessageHeader{want: {"v"}}).Get(key); got != "v" {
			t.Fatalf("MessageHeader.Get(%q) = %q", key, got)
		}
	})
}

// FuzzRequestKey: any request key is normalised once and for all, travels in
// baggage next to any other members, and is read back as it was sent.
func FuzzRequestKey(f *testing.F) {
	for _, s := range [][2]string{
		{"user-1", ""}, {"user 1", "team=x"}, {"", "lanes-key=old,lane=bob"}, {"100%", "a=1,,b=2"},
		{strings.Repeat("k", MaxKeyLen+1), "lanes-key=a%20b"}, {"é", " lanes-key = x ;p"},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, key, bag string) {
		n := NormalizeKey(key)
		if NormalizeKey(n) != n || (key == "") != (n == "") || len(n) > MaxKeyLen {
			t.Fatalf("NormalizeKey(%q) = %q", key, n)
		}
		h := http.Header{}
		if bag != "" {
			h.Set(BaggageHeader, bag)
		}
		Propagator{}.InjectLaneKey("", key, HTTPHeader(h))
		got := Propagator{}.ExtractKey(HTTPHeader(h))
		if n != "" && got != n {
			t.Fatalf("key %q over baggage %q: sent %q, read %q (baggage %q)", key, bag, n, got, h.Get(BaggageHeader))
		}
		if name, _, _ := (Propagator{}).Extract(HTTPHeader(h)); name != "" {
			t.Fatalf("a baseline call with key %q carries lane %q (baggage %q)", key, name, h.Get(BaggageHeader))
		}
	})
}
