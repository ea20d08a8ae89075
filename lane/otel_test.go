package lane_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"unicode"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/propagation"

	"github.com/lanesdev/lanes/lane"
)

// The differential test of lanes' baggage reading against OpenTelemetry Go
// (go.opentelemetry.io/otel/propagation.Baggage over an HTTP header): both
// must find the same lane member, or the case must fall under one of the
// differences documented in docs/routing.md.

func init() {
	// OpenTelemetry reports malformed baggage to its global error handler,
	// which logs; the cases here are malformed on purpose.
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(error) {}))
}

// answer is what a reader makes of the baggage: the lane, or an invalid
// value, or none.
type answer struct {
	lane    string
	invalid bool
}

func (a answer) String() string {
	if a.invalid {
		return "invalid"
	}
	if a.lane == "" {
		return "baseline"
	}
	return "lane " + a.lane
}

// lanesAnswer is lanes' reading of the baggage headers vals.
func lanesAnswer(vals []string) answer {
	name, _, err := lane.Propagator{}.Extract(lane.HTTPHeader(http.Header{"Baggage": vals}))
	var ne *lane.NameError
	if err != nil && !errors.As(err, &ne) {
		panic(err)
	}
	return answer{lane: name, invalid: err != nil}
}

// otelAnswer is OpenTelemetry Go's lane member of the baggage headers vals,
// judged by the lane-name grammar.
func otelAnswer(vals []string) answer {
	ctx := propagation.Baggage{}.Extract(context.Background(), propagation.HeaderCarrier(http.Header{"Baggage": vals}))
	m := baggage.FromContext(ctx).Member(lane.BaggageKey)
	if m.Key() == "" || strings.Trim(m.Value(), " \t") == "" {
		return answer{}
	}
	name, err := lane.Parse(m.Value())
	return answer{lane: name, invalid: err != nil}
}

// The documented differences.
const (
	// OpenTelemetry Go trims keys and values with strings.TrimSpace; the
	// W3C's optional whitespace, and lane names, are spaces and tabs only.
	diffSpace = "whitespace other than spaces and tabs"
	// Over several headers with more than 64 distinct keys together,
	// OpenTelemetry Go drops arbitrary members (map order); lanes keeps the
	// lane member.
	diffMembers = "more than 64 distinct keys over several headers"
	// OpenTelemetry Go counts the 8192 bytes on its own re-encoding, which
	// grows where percent-escapes decode to invalid UTF-8 (%FF becomes
	// U+FFFD, 9 bytes once encoded); lanes counts the header as received.
	diffReencoded = "8192 bytes counted after re-encoding"
)

// documented returns the documented difference that vals fall under, or "".
func documented(vals []string) string {
	joined := strings.Join(vals, ",")
	if strings.ContainsFunc(joined, func(r rune) bool { return unicode.IsSpace(r) && r != ' ' && r != '\t' }) {
		return diffSpace
	}
	if len(vals) > 1 && len(joined) <= 8192 {
		keys := map[string]bool{}
		read := 0
		for _, v := range vals {
			if read > 64 {
				break
			}
			b, _ := baggage.Parse(v)
			read += b.Len()
			for _, m := range b.Members() {
				keys[m.Key()] = true
			}
		}
		if len(keys) > 64 {
			return diffMembers
		}
	}
	for _, v := range vals {
		if _, err := baggage.Parse(v); err != nil && len(v) <= 8192 && strings.Contains(err.Error(), "baggage-string too large") {
			return diffReencoded
		}
	}
	return ""
}

// compare checks one case: lanes and OpenTelemetry agree, or the case is a
// documented difference (then OpenTelemetry's answer must be lanes' or
// none). It returns the difference, "" when they agree.
func compare(t *testing.T, name string, vals []string) (diff string, agree bool) {
	t.Helper()
	got, want := lanesAnswer(vals), otelAnswer(vals)
	if got == want {
		return documented(vals), true
	}
	d := documented(vals)
	switch d {
	case "":
		t.Errorf("%s: baggage %q: lanes reads %v, OpenTelemetry %v", name, short(vals), got, want)
	case diffMembers:
		if want != (answer{}) {
			t.Errorf("%s: baggage %q: lanes reads %v, OpenTelemetry %v (%s)", name, short(vals), got, want, d)
		}
	}
	return d, false
}

func short(vals []string) []string {
	out := make([]string, len(vals))
	for i, v := range vals {
		if len(v) > 120 {
			v = fmt.Sprintf("%s...(%d bytes)", v[:100], len(v))
		}
		out[i] = v
	}
	return out
}

// members returns n members "<prefix>NN=vNN", as OpenTelemetry Go's tests
// build them.
func members(n int, prefix string) string {
	ms := make([]string, n)
	for i := range ms {
		ms[i] = fmt.Sprintf("%s%02d=v%02d", prefix, i, i)
	}
	return strings.Join(ms, ",")
}

// otelCases are the inputs of OpenTelemetry Go's own tests of baggage.Parse
// and of the baggage propagator (go.opentelemetry.io/otel v1.45.0,
// baggage/baggage_test.go and propagation/baggage_test.go), with "lane" for
// their key where they have one.
var otelCases = [][]string{
	{""}, {"lane"}, {"lane="}, {"lane=value"}, {" lane=value "}, {"lane = value"}, {" lane = value "},
	{"\tlane=value"}, {"lane=1"}, {"lane=1+1"}, {"lane=1%2B1"}, {"lane=1/1"}, {"lane=1%2F1"}, {"lane=1=1"},
	{"lane=1%3D1"}, {" lane \t= 1\t\t "}, {"lane=;state=on;red"}, {"lane=1;state=on;red"}, {"lane=0=0=0"},
	{"lane=1;state=on;red,bar=2;yellow"}, {"lane=1;state=on;red,lane=2"}, {"lane=="}, {"lane=val%252%2C"},
	{"lane=;bar=val%252%2C"}, {"lane=%C4%85%C5%9B%C4%87"}, {"a=b,%C4%85%C5%9B%C4%87=%C4%85%C5%9B%C4%87"},
	{"lane=b,%C4%85%C5%9B%C4%87=%C4%85%C5%9B%C4%87;%C4%85%C5%9B%C4%87=%C4%85%C5%9B%C4%87"}, {"lane=,,bar="},
	{"=lane"}, {"\\=value"}, {"lane=\\"}, {"lane=val%"}, {"lane=1;=v"}, {"lane=1;key\\=v"}, {"lane=1;key=\\"},
	{"lane=1;key=val%"}, {"lane=aa%ffcc;p=d%fff"}, {"lane=aa%26cc"}, {"lane=aa%ffcc%fedd%fa"}, {"lane=aacc"},
	{"key1=val1,lane=val2"}, {"key1 =   val1,  lane =val2   "}, {"key1=val1,lane=val2;prop=1"},
	{"key1=val1,lane=val2,a,val3"}, {"lane=,key2=val2"}, {"lane=val%252"},
	{"key1=val1", "lane=val2"}, {"lane=val1", "lane=val2"}, {"", "lane=val1"}, {"", ""},
	{"lane=val1,invalid-no-equals,key2=val2"}, {"lane=val1", "invalid-no-equals", "key2=val2"},
	{members(63, "k") + ",lane=bob"}, {members(64, "k") + ",lane=bob"}, {"lane=bob," + members(64, "k")},
	{members(32, "a"), members(32, "b"), "lane=bob"}, {members(32, "a"), members(31, "b"), "lane=bob"},
	{"lane=" + strings.Repeat("v", 8192-5)}, {"lane=" + strings.Repeat("v", 8192-4)},
	{"lane=bob,k=" + strings.Repeat("v", 8192-11)}, {"lane=bob,k=" + strings.Repeat("v", 8192-10)},
	{"lane=bob", "k=" + strings.Repeat("v", 8192-10)}, {"lane=bob", "k=" + strings.Repeat("v", 8192-9)},
	{"lane=bob", "", "", "k=" + strings.Repeat("v", 8192-12)}, {"lane=bob", "", "", "k=" + strings.Repeat("v", 8192-11)},
	{"lane=bob,lane=" + strings.Repeat("v", 8192-9)},
	{"bad0", "bad1", "bad2", "bad3", "bad4", "bad5", "lane=val"},
	{"bad0,bad1,bad2,bad3,bad4,bad5,bad6,lane=val"},
	{members(64, "a"), "lane=" + strings.Repeat("v", 8192)},
}

// w3cCases are the edge cases of the W3C Baggage specification
// (https://www.w3.org/TR/baggage/): its examples, optional whitespace,
// properties, percent-encoding, case, duplicates and limits.
var w3cCases = [][]string{
	{"lane=alice;property1;property2, key2 = value2, key3=value3; propertyKey=propertyValue"},
	{"userId=alice, serverNode=DF%2028, isProduction=false, lane=bob"},
	{"SomeKey=SomeValue;SomePropertyKey=SomePropertyValue,lane=bob;p=q"},
	{"lane=Bob"}, {"Lane=bob"}, {"LANE=bob"}, {"lane=%62ob"}, {"lane=%62%4Fb"}, {"lane=%20bob%20"}, {"lane=%20"},
	{"lane=b%20ob"}, {"lane=bob%"}, {"lane=bob%4"}, {"lane=%zzbob"}, {"lane=bob;"}, {"lane=bob;;"}, {"lane=bob; ;"},
	{"lane=bob;p=%"}, {"lane=bob;p="}, {"lane=bob;p =  v "}, {"lane=bob;p q"}, {"lane=bob;=x"}, {"lane=bob;p=v v"},
	{"lane;p=bob"}, {"lane=bob,lane=eve"}, {"lane=bob,lane="}, {"lane=,lane=bob"}, {"lane=bob,lane=eve;bad prop"},
	{"lane=bob,lane=e ve"}, {"lane=bob,lane=%zz"}, {"lane=bob", "lane=eve"}, {"lane=eve", "lane=bob,lane=x y"},
	{"lane=bob", ""}, {",lane=bob,"}, {" , ,lane=bob"}, {"lane=bob ,"}, {"lane=\"bob\""}, {"lane=bo,b"},
	{"lane=bob\t"}, {"\tlane\t=\tbob\t"}, {"lane=bo b"}, {"la ne=bob"}, {"lane=bob\x00"}, {"lane=\x7fbob"},
	{"lane=b\u00e9b"}, {"lane=%E6%97%A5"}, {"lane=%FF"}, {"lane=a=b"}, {"lane=-bob"}, {"lane=bob-"},
	{"lane=" + strings.Repeat("a", 63)}, {"lane=" + strings.Repeat("a", 64)}, {"lane=al_ice"}, {"lane=al.ice"},
	{"lane=alice\u00a0"}, {"\u00a0lane=alice"}, {"lane=\u3000alice"}, {"lane=alice\u0085"}, {"lane=alice\n"},
	{"lane=alice,\u00a0lane=bob"},
	{members(40, "a"), members(40, "b") + ",lane=bob"},
	{members(64, "a"), members(64, "a") + ",lane=bob"},
	{strings.Repeat("k=v,", 2000) + "lane=bob"},
	{strings.Repeat("lane=%FF,", 8192/9-2) + "lane=bob"},
	{"k=" + strings.Repeat("%FF", 2000) + ",lane=bob"},
}

// TestBaggageAgreesWithOpenTelemetry runs every case through lanes and
// through OpenTelemetry Go, and reports the tally: the cases that must agree,
// and those under each documented difference (which may agree, by chance for
// the members that OpenTelemetry drops in map order).
func TestBaggageAgreesWithOpenTelemetry(t *testing.T) {
	var all, agree, differ int
	diffs := map[string]int{}
	for _, set := range []struct {
		name  string
		cases [][]string
	}{{"otel", otelCases}, {"w3c", w3cCases}} {
		for i, vals := range set.cases {
			all++
			d, ok := compare(t, fmt.Sprintf("%s[%d]", set.name, i), vals)
			switch {
			case d != "":
				diffs[d]++
				if !ok {
					differ++
				}
			case ok:
				agree++
			}
		}
	}
	t.Logf("%d cases: %d agree; %d under a documented difference (%d of them differ this run): %v",
		all, agree, all-agree, differ, diffs)
}

// FuzzBaggageAgreesWithOpenTelemetry: on any one or two baggage headers,
// lanes and OpenTelemetry Go agree on the lane, but for the documented
// differences.
func FuzzBaggageAgreesWithOpenTelemetry(f *testing.F) {
	for _, set := range [][][]string{otelCases, w3cCases} {
		for _, vals := range set {
			if len(vals) == 1 {
				f.Add(vals[0], "", false)
			} else {
				f.Add(vals[0], strings.Join(vals[1:], ","), true)
			}
		}
	}
	f.Fuzz(func(t *testing.T, b1, b2 string, two bool) {
		vals := []string{b1}
		if two {
			vals = append(vals, b2)
		}
		compare(t, "fuzz", vals)
	})
}
