package lane

import (
	"net/http"
	"net/textproto"
	"reflect"
	"strings"
	"testing"
)

var (
	_ Carrier = HTTPHeader(nil)
	_ Carrier = Metadata(nil)
	_ Carrier = MessageHeader(nil)
)

func TestHTTPHeader(t *testing.T) {
	h := http.Header{}
	h.Add("X-Lane", "alice")
	h.Add("Baggage", "a=1")
	h.Add("Baggage", "b=2")
	h.Add("Dubbo.tag", "gray")
	c := HTTPHeader(h)

	for _, k := range []string{"x-lane", "X-Lane", "X-LANE", "x-LaNe"} {
		if got := c.Get(k); got != "alice" {
			t.Errorf("Get(%q) = %q, want alice", k, got)
		}
	}
	if got := c.Values("baggage"); !reflect.DeepEqual(got, []string{"a=1", "b=2"}) {
		t.Errorf("Values(baggage) = %q", got)
	}
	if got := c.Get("dubbo.tag"); got != "gray" {
		t.Errorf("Get(dubbo.tag) = %q, want gray", got)
	}
	if got := c.Get("missing"); got != "" {
		t.Errorf("Get(missing) = %q", got)
	}
	if got := c.Values("missing"); got != nil {
		t.Errorf("Values(missing) = %q", got)
	}
	long := strings.Repeat("x", maxStackKey) + "-lane"
	h.Set(long, "v")
	if got := c.Get(strings.ToUpper(long)); got != "v" {
		t.Errorf("Get(long key) = %q, want v", got)
	}

	c.Set("x-lane", "bob")
	if got := h.Values("X-Lane"); !reflect.DeepEqual(got, []string{"bob"}) {
		t.Errorf("after Set: %q", got)
	}
	c.Set("service-lane", "carol")
	if got := h.Get("Service-Lane"); got != "carol" {
		t.Errorf("after Set(service-lane): %q", got)
	}
	c.Del("X-LANE")
	c.Del("baggage")
	c.Del("dubbo.TAG")
	c.Del("not-there")
	for _, k := range []string{"X-Lane", "Baggage", "Dubbo.tag"} {
		if _, ok := h[k]; ok {
			t.Errorf("%s still there after Del", k)
		}
	}
	// A nil header reads as empty and Del is a no-op.
	var nh HTTPHeader
	if nh.Get("x-lane") != "" || nh.Values("baggage") != nil {
		t.Error("nil header is not empty")
	}
	nh.Del("x-lane")
}

func TestCanonical(t *testing.T) {
	keys := []string{
		"", "x-lane", "X-Lane", "X-LANE", "x-LANE", "baggage", "Baggage",
		"dubbo.tag", "Dubbo.Tag", "x-asm-prefer-tag", "sd-routing-key", "clk",
		"a-", "-a", "--", "x_lane", "with space", "ñ", "x-lañe", "X-Lane\x00",
		"a:b", "1-2-3", "content-md5",
	}
	for _, k := range keys {
		want := textproto.CanonicalMIMEHeaderKey(k)
		if got := canonical(k); got != (want == k) {
			t.Errorf("canonical(%q) = %v, want %v", k, got, want == k)
		}
		if !canonical(k) {
			if got := string(canonicalize(nil, k)); got != want {
				t.Errorf("canonicalize(%q) = %q, want %q", k, got, want)
			}
		}
		if got := canonicalKey(k); got != want {
			t.Errorf("canonicalKey(%q) = %q, want %q", k, got, want)
		}
	}
}

func TestMetadata(t *testing.T) {
	md := Metadata{"x-lane": {"alice"}, "baggage": {"a=1", "lane=bob"}}
	for _, k := range []string{"x-lane", "X-Lane", "X-LANE"} {
		if got := md.Get(k); got != "alice" {
			t.Errorf("Get(%q) = %q", k, got)
		}
	}
	if got := md.Values("Baggage"); !reflect.DeepEqual(got, []string{"a=1", "lane=bob"}) {
		t.Errorf("Values(Baggage) = %q", got)
	}
	if got := md.Get(strings.Repeat("K", maxStackKey+1)); got != "" {
		t.Errorf("Get(long) = %q", got)
	}
	md.Set("Service-Lane", "carol")
	if got := md["service-lane"]; !reflect.DeepEqual(got, []string{"carol"}) {
		t.Errorf("after Set: md[service-lane] = %q", got)
	}
	md.Del("X-Lane")
	md.Del("nothing")
	if _, ok := md["x-lane"]; ok {
		t.Error("x-lane still there after Del")
	}
	if len(md) != 2 {
		t.Errorf("len = %d, want 2: %v", len(md), md)
	}
}

func TestMessageHeader(t *testing.T) {
	m := MessageHeader{"X-Lane": {"alice"}, "baggage": {"a=1"}, "Baggage": {"b=2"}, "BAGGAGE": {"c=3"}}
	for _, k := range []string{"x-lane", "X-Lane", "X-LANE"} {
		if got := m.Get(k); got != "alice" {
			t.Errorf("Get(%q) = %q, want alice", k, got)
		}
	}
	// Several spellings: lower case first, then in key order.
	want := []string{"a=1", "c=3", "b=2"}
	for i := 0; i < 20; i++ { // map order is random: try a few times
		if got := m.Values("Baggage"); !reflect.DeepEqual(got, want) {
			t.Fatalf("Values(Baggage) = %q, want %q", got, want)
		}
	}
	if got := m.Get("missing"); got != "" {
		t.Errorf("Get(missing) = %q", got)
	}
	// Non-ASCII letters are not folded.
	m2 := MessageHeader{"x-lañe": {"v"}}
	if got := m2.Get("X-LAÑE"); got != "" {
		t.Errorf("Get(X-LAÑE) = %q, want no match", got)
	}

	m.Set("BAGGAGE", "lane=x")
	if !reflect.DeepEqual(map[string][]string(m), map[string][]string{"X-Lane": {"alice"}, "baggage": {"lane=x"}}) {
		t.Errorf("after Set: %v", m)
	}
	m.Set("x-lane", "bob")
	if !reflect.DeepEqual(map[string][]string(m), map[string][]string{"x-lane": {"bob"}, "baggage": {"lane=x"}}) {
		t.Errorf("after Set: %v", m)
	}
	m["X-LANE"] = []string{"stale"}
	m.Del("x-Lane")
	if !reflect.DeepEqual(map[string][]string(m), map[string][]string{"baggage": {"lane=x"}}) {
		t.Errorf("after Del: %v", m)
	}
}

func TestCarrierReadAllocs(t *testing.T) {
	h := http.Header{}
	h.Set("X-Lane", "alice")
	h.Set("Dubbo.tag", "gray")
	md := Metadata{"x-lane": {"alice"}, "dubbo.tag": {"gray"}}
	mh := MessageHeader{"X-Lane": {"alice"}, "dubbo.tag": {"gray"}}
	for name, c := range map[string]Carrier{"HTTPHeader": HTTPHeader(h), "Metadata": md, "MessageHeader": mh} {
		n := testing.AllocsPerRun(100, func() {
			if c.Get("x-lane") != "alice" || c.Get("X-LANE") != "alice" || c.Get("dubbo.tag") != "gray" || c.Values("absent") != nil {
				t.Fatal("wrong value")
			}
		})
		if n != 0 {
			t.Errorf("%s reads: %v allocations, want 0", name, n)
		}
	}
}
