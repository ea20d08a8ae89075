package routing

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lanesdev/lanes/policy"
	"github.com/lanesdev/lanes/registry"
)

// inst builds an instance from "id service addr [lane=x] [zone=x] [host=x] [weight=n] [k=v labels as label.k=v]".
func inst(t testing.TB, spec string) registry.Instance {
	t.Helper()
	f := strings.Fields(spec)
	in := registry.Instance{ID: f[0], Service: f[1], Addr: f[2]}
	for _, kv := range f[3:] {
		k, v, _ := strings.Cut(kv, "=")
		switch {
		case k == "lane":
			in.Lane = v
		case k == "zone":
			in.Zone = v
		case k == "host":
			in.Host = v
		case k == "weight":
			var n int
			for _, c := range v {
				n = n*10 + int(c-'0')
			}
			if n == 0 {
				in.Drain = true
			}
			in.Weight = n
		case strings.HasPrefix(k, "label."):
			if in.Labels == nil {
				in.Labels = map[string]string{}
			}
			in.Labels[strings.TrimPrefix(k, "label.")] = v
		default:
			t.Fatalf("bad instance spec %q", spec)
		}
	}
	n, err := registry.Normalize(in)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

type fixture struct {
	t     testing.TB
	e     *Engine
	clock *ManualClock
	start time.Time
}

// newFixture makes an engine on a manual clock with the given policy and
// instance specs (see inst).
func newFixture(t testing.TB, pol string, specs ...string) *fixture {
	t.Helper()
	start := time.Unix(1_700_000_000, 0)
	clock := NewManualClock(start)
	e := New(WithClock(clock))
	t.Cleanup(func() { e.Close() })
	if pol != "" {
		p, err := policy.Parse("policy", []byte(pol))
		if err != nil {
			t.Fatal(err)
		}
		e.SetPolicy(p)
	}
	by := map[string][]registry.Instance{}
	for _, s := range specs {
		in := inst(t, s)
		by[in.Service] = append(by[in.Service], in)
	}
	for svc, ins := range by {
		e.SetInstances(svc, ins)
	}
	return &fixture{t: t, e: e, clock: clock, start: start}
}

func (f *fixture) at(d time.Duration) { f.clock.Set(f.start.Add(d)) }

// expect resolves req on svc and checks the eligible set and serving lane.
func (f *fixture) expect(svc string, req Request, want []string, wantLane string) Decision {
	f.t.Helper()
	d, err := f.e.Service(svc).Resolve(req)
	if err != nil {
		f.t.Fatalf("%s %+v: unexpected error %v", svc, req, err)
	}
	got := slices.Clone(d.Eligible)
	slices.Sort(got)
	w := slices.Clone(want)
	slices.Sort(w)
	if !slices.Equal(got, w) || d.Lane != wantLane {
		f.t.Fatalf("%s %+v: eligible %v in lane %q (reason %s), want %v in lane %q", svc, req, got, d.Lane, d.Reason, w, wantLane)
	}
	return d
}

func (f *fixture) expectErr(svc string, req Request, code Code) {
	f.t.Helper()
	d, err := f.e.Service(svc).Resolve(req)
	var re *Error
	if !errors.As(err, &re) || re.Code != code {
		f.t.Fatalf("%s %+v: got %v (eligible %v), want error %s", svc, req, err, d.Eligible, code)
	}
	if _, err := f.e.Service(svc).Pick(req); !errors.As(err, &re) || re.Code != code {
		f.t.Fatalf("%s %+v: Pick got %v, want error %s", svc, req, err, code)
	}
}

func mustPolicy(t testing.TB, doc string) *policy.Policy {
	t.Helper()
	p, err := policy.Parse("policy", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	return p
}
