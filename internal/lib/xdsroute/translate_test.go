package xdsroute_test

import (
	"fmt"
	"net/netip"
	"regexp"
	"testing"
	"time"

	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/lanesdev/lanes/internal/lib/scenario"
	"github.com/lanesdev/lanes/internal/lib/xdsroute"
	"github.com/lanesdev/lanes/internal/testkit/oracle"
	"github.com/lanesdev/lanes/policy"
	"github.com/lanesdev/lanes/registry"
)

func fleet(t *testing.T, doc string, insts ...registry.Instance) xdsroute.Fleet {
	t.Helper()
	p, err := policy.Parse("policy.yaml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	return xdsroute.Fleet{Policy: p, Instances: insts, Now: time.Unix(1_700_000_000, 0)}
}

// TestOutlierDetectionEveryField: every cluster's outlier detection sets
// every field a client may read (an unset success-rate field crashed a
// grpc-js client), from the policy's settings.
func TestOutlierDetectionEveryField(t *testing.T) {
	f := fleet(t, "outlier: {errors: 3, window: 10s, ejection: 20s}\n",
		registry.Instance{ID: "b1", Service: "orders", Addr: "127.0.0.1:1"},
		registry.Instance{ID: "b2", Service: "orders", Addr: "127.0.0.1:2"},
		registry.Instance{ID: "b3", Service: "orders", Addr: "127.0.0.1:3"},
		registry.Instance{ID: "a1", Service: "orders", Addr: "127.0.0.1:4", Lane: "alice"})
	r := xdsroute.Translate(f, xdsroute.Caller{})
	n := 0
	for _, c := range r.Clusters {
		if c.GetClusterType() != nil {
			continue // an aggregate cluster has no endpoints of its own
		}
		n++
		od := c.GetOutlierDetection()
		if od == nil {
			t.Fatalf("cluster %s has no outlier detection", c.Name)
		}
		fields := od.ProtoReflect().Descriptor().Fields()
		for i := range fields.Len() {
			fd := fields.Get(i)
			if fd.Kind() != protoreflect.MessageKind || fd.IsList() {
				continue // scalars have no unset state; monitors are extensions
			}
			if !od.ProtoReflect().Has(fd) {
				t.Errorf("cluster %s: outlier_detection.%s is unset", c.Name, fd.Name())
			}
		}
		if got := od.GetInterval().AsDuration(); got != 10*time.Second {
			t.Errorf("cluster %s: interval %v, want the window 10s", c.Name, got)
		}
		if got := od.GetBaseEjectionTime().AsDuration(); got != 20*time.Second {
			t.Errorf("cluster %s: base ejection %v, want 20s", c.Name, got)
		}
		if got := od.GetFailurePercentageRequestVolume().GetValue(); got != 3 {
			t.Errorf("cluster %s: failure percentage request volume %d, want errors 3", c.Name, got)
		}
		// The baseline keeps one instance of three out of ejection.
		want := uint32(100)
		if c.Name == "orders/baseline" {
			want = 66
		}
		if got := od.GetMaxEjectionPercent().GetValue(); got != want {
			t.Errorf("cluster %s: max ejection percent %d, want %d", c.Name, got, want)
		}
	}
	if n != 2 {
		t.Errorf("%d EDS clusters, want 2 (the baseline and alice)", n)
	}
}

// TestResourcesValid: every resource passes its own validation (the rules
// of the xDS protos), and each regular expression compiles.
func TestResourcesValid(t *testing.T) {
	f := fleet(t, "lanes: {alice: {fallback: [team-a]}, team-a: {strict: true}}\ncanary: [{service: orders, lane: gray, percent: 12.5}]\n",
		registry.Instance{ID: "b1", Service: "orders", Addr: "127.0.0.1:1", Zone: "az1", Host: "h1"},
		registry.Instance{ID: "g1", Service: "orders", Addr: "127.0.0.1:2", Lane: "gray", Weight: registry.MaxWeight},
		registry.Instance{ID: "a1", Service: "payments", Addr: "[::1]:4", Lane: "alice"})
	r := xdsroute.Translate(f, xdsroute.Caller{Zone: "az1", Host: "h1"})
	for _, r := range []*xdsroute.Resources{r, xdsroute.ForEnvoy(r, xdsroute.DefaultEgress)} {
		if err := validate(r); err != nil {
			t.Error(err)
		}
	}
	if len(r.Listeners) != 2 || len(r.Routes) != 2 {
		t.Errorf("%d listeners and %d route configurations for 2 services", len(r.Listeners), len(r.Routes))
	}
}

// TestLaneCaseSpelledOut: a lane is matched in either ASCII case, and by no
// other character that Unicode folds to one of its letters.
func TestLaneCaseSpelledOut(t *testing.T) {
	f := fleet(t, "", registry.Instance{ID: "k1", Service: "orders", Addr: "127.0.0.1:1", Lane: "kilo"},
		registry.Instance{ID: "b1", Service: "orders", Addr: "127.0.0.1:2"})
	e, err := newEvaluator(xdsroute.Translate(f, xdsroute.Caller{}))
	if err != nil {
		t.Fatal(err)
	}
	for v, want := range map[string]string{"kilo": "kilo", " KiLo\t": "kilo", "\u212Ailo": "", "ki\u017Fo": ""} {
		a, err := e.eval("orders", headers{"x-lane": {v}}, "")
		if err != nil {
			t.Fatal(err)
		}
		if a.Lane != want {
			t.Errorf("x-lane %q served by %s, want lane %q", v, a, want)
		}
	}
}

// TestRandomResourcesValid holds every resource of both variants, for random
// fleets and policies, to the constraints that Envoy and go-control-plane
// check on receipt (protoc-gen-validate's rules): Envoy refuses a whole
// response for one resource that breaks them. No Envoy runs here; this
// check, and the evaluator's reading of the Envoy variant in
// TestDifferential, stand for it.
func TestRandomResourcesValid(t *testing.T) {
	n := 60
	if testing.Short() {
		n = 15
	}
	for seed := range uint64(n) {
		c := oracle.Generate(oracle.Seeded(seed), fmt.Sprintf("seed %d", seed), 2+int(seed%7))
		s, err := scenario.Parse(c.Name+".yaml", c.YAML())
		if err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		res := xdsroute.Translate(xdsroute.Fleet{Policy: s.Policy, Instances: s.Instances, Now: scenario.Epoch}, xdsroute.Caller{Zone: "az1", Host: "h1"})
		for _, r := range []*xdsroute.Resources{res, xdsroute.ForEnvoy(res, netip.MustParseAddrPort("[::1]:15001"))} {
			if err := validate(r); err != nil {
				t.Fatalf("seed %d: %v", seed, err)
			}
		}
	}
}

// validate checks each resource of r by its own rules (the xDS protos'),
// and that each regular expression of its routes compiles.
func validate(r *xdsroute.Resources) error {
	var all []interface{ ValidateAll() error }
	for _, x := range r.Listeners {
		all = append(all, x)
	}
	for _, x := range r.Routes {
		all = append(all, x)
		for _, vh := range x.VirtualHosts {
			for _, rt := range vh.Routes {
				for _, h := range rt.GetMatch().GetHeaders() {
					if re := safeRegex(h); re != "" {
						if _, err := regexp.Compile(re); err != nil {
							return fmt.Errorf("route %q: %v", rt.Name, err)
						}
					}
				}
			}
		}
	}
	for _, x := range r.Clusters {
		all = append(all, x)
	}
	for _, x := range r.Endpoints {
		all = append(all, x)
	}
	for _, v := range all {
		if err := v.ValidateAll(); err != nil {
			return fmt.Errorf("%T: %v", v, err)
		}
	}
	return nil
}
