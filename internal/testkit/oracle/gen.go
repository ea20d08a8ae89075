package oracle

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"time"
)

// Source is where the generator takes its choices from: a seeded PRNG
// (Seeded) for the fixed-seed runs, or the bytes of a fuzzer's input
// (Bytes), so that the fuzzer's coverage guidance steers the scenarios.
type Source interface {
	// N returns a choice in [0, n); n > 0.
	N(n int) int
}

// Seeded is a Source from a PCG seeded with seed.
func Seeded(seed uint64) Source { return pcg{rand.New(rand.NewPCG(seed, 0x6f7261636c65))} }

type pcg struct{ r *rand.Rand }

func (p pcg) N(n int) int { return p.r.IntN(n) }

// Bytes is a Source that reads its choices from b, one byte each, and
// answers 0 once b is used up.
func Bytes(b []byte) Source { return &bytesSource{b: b} }

type bytesSource struct{ b []byte }

func (s *bytesSource) N(n int) int {
	if len(s.b) == 0 {
		return 0
	}
	c := int(s.b[0])
	s.b = s.b[1:]
	return c % n
}

// The generator's vocabulary: a few of each, so that random choices meet.
var (
	genServices = []string{"orders", "payments"}
	genLanes    = []string{"alice", "bob", "team-a", "gray", "canary"}
	genZones    = []string{"az1", "az2"}
	genHosts    = []string{"h1", "h2", "h3"}
	// Raw header values: valid names in other spellings, unknown lanes and
	// invalid ones of every rule.
	genOddLanes = []string{"Alice", " bob ", "\tgray", "zed", "al_ice", "-x", "x-", strings.Repeat("a", 64),
		strings.Repeat("b", 63), "ünï", "a b", "\n", "K"}
)

// Generate makes a random scenario from src: a fleet of one or two services
// (lanes, zones, hosts, weights, labels, drained instances), a policy
// (fallback chains, strict and expiring lanes, tag rules by labels and by
// addresses, canaries, locality, outlier settings) and a sequence of
// requests, outcome reports and clock steps. size bounds the instances per
// service and the steps.
func Generate(src Source, name string, size int) *Case {
	size = max(size, 2)
	pick := func(xs []string) string { return xs[src.N(len(xs))] }
	chance := func(pct int) bool { return src.N(100) < pct }
	c := &Case{Name: name}

	services := genServices[:1+src.N(len(genServices))]
	for si, svc := range services {
		n := 1 + src.N(size)
		for i := range n {
			in := Instance{
				ID:      fmt.Sprintf("%c%d", svc[0], i+1),
				Service: svc,
				Addr:    fmt.Sprintf("10.0.%d.%d:%d", si, i+1, []int{8080, 9090}[src.N(2)]),
				Weight:  -1,
			}
			if !chance(40) {
				in.Lane = pick(genLanes)
			}
			if chance(60) {
				in.Zone = pick(genZones)
			}
			if chance(50) {
				in.Host = pick(genHosts)
			}
			switch src.N(10) {
			case 0:
				in.Weight = 0
			case 1:
				in.Weight = 50
			case 2:
				in.Weight = 200
			}
			if chance(30) {
				in.Labels = map[string]string{"version": []string{"v1", "v2"}[src.N(2)]}
			}
			// The scope of the credential that registered it: mostly
			// unrestricted; else a baseline token's, or a lane token's (its
			// own lane's, or another's where the registry was written to
			// directly).
			switch src.N(6) {
			case 0:
				in.Scope = "@baseline"
			case 1:
				in.Scope = in.Lane
			case 2:
				in.Scope = pick(genLanes)
			}
			c.Instances = append(c.Instances, in)
		}
	}

	p := &c.Policy
	// Lane settings. A lane falls back only to lanes after it in genLanes,
	// so that no fallback graph has a cycle (which validation refuses).
	for i, l := range genLanes {
		if !chance(35) {
			continue
		}
		ls := LaneSettings{Lane: l, Strict: chance(20)}
		for _, f := range genLanes[i+1:] {
			if chance(35) {
				ls.Fallback = append(ls.Fallback, f)
			}
		}
		if chance(15) {
			ls.Expires = time.Duration(1+src.N(60)) * time.Second
		}
		p.Lanes = append(p.Lanes, ls)
	}
	for range src.N(3) {
		t := Tag{Service: pick(services), Lane: pick(genLanes), Disabled: chance(20)}
		if chance(50) {
			t.Labels = map[string]string{"version": []string{"v1", "v2"}[src.N(2)]}
		} else if chance(50) {
			t.Addrs = []string{fmt.Sprintf("*:%d", []int{8080, 9090}[src.N(2)])}
		} else {
			t.Addrs = []string{c.Instances[src.N(len(c.Instances))].Addr}
		}
		p.Tags = append(p.Tags, t)
	}
	for _, svc := range services {
		left := 10000                            // in hundredths of a percent, the split's resolution
		lanes := genLanes[src.N(len(genLanes)):] // one rule per lane and service
		for _, l := range lanes[:src.N(min(3, len(lanes))+1)] {
			pct := min([]int{0, 1000, 2500, 5000, 3333, 10000}[src.N(6)], left)
			left -= pct
			p.Canary = append(p.Canary, Canary{Service: svc, Lane: l, Percent: float64(pct) / 100})
		}
	}
	p.Host = chance(50)
	if chance(80) {
		p.Errors = 1 + src.N(3)
		p.Window = time.Duration(5+src.N(26)) * time.Second
		p.Ejected = time.Duration(5+src.N(16)) * time.Second
	}

	var at time.Duration
	for range 1 + src.N(4*size) {
		if chance(40) {
			at += time.Duration(src.N(9)) * time.Second
		}
		st := Step{At: at}
		if chance(40) {
			in := c.Instances[src.N(len(c.Instances))]
			st.Report = &Report{Service: in.Service, Instance: in.ID, OK: chance(40)}
		} else {
			r := &Request{Service: pick(services)}
			switch src.N(10) {
			case 0, 1, 2:
			case 3:
				r.Lane = pick(genOddLanes)
			default:
				r.Lane = pick(genLanes)
			}
			if chance(50) {
				r.Zone = pick(genZones)
			}
			if chance(50) {
				r.Host = pick(genHosts)
			}
			// A baseline request with canaries in force carries a key,
			// so that the model knows its split; sticky keys repeat.
			if len(p.Canary) > 0 || chance(30) {
				r.Key = fmt.Sprintf("k%d", src.N(20))
			}
			st.Request = r
		}
		c.Steps = append(c.Steps, st)
	}
	return c
}
