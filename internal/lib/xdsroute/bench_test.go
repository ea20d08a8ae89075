package xdsroute_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/lanesdev/lanes/internal/lib/xdsroute"
	"github.com/lanesdev/lanes/registry"
)

// BenchmarkTranslate: the resources of 50 services of 20 instances each
// (a quarter of them in 5 lanes), for one caller.
func BenchmarkTranslate(b *testing.B) {
	var insts []registry.Instance
	for s := range 50 {
		for i := range 20 {
			in := registry.Instance{ID: fmt.Sprintf("i%d", i), Service: fmt.Sprintf("svc%d", s),
				Addr: fmt.Sprintf("10.%d.%d.1:8080", s, i), Zone: []string{"az1", "az2"}[i%2], Host: fmt.Sprintf("h%d", i%7)}
			if i%4 == 0 {
				in.Lane = fmt.Sprintf("lane%d", i%5)
			}
			insts = append(insts, in)
		}
	}
	f := xdsroute.Fleet{Instances: insts, Now: time.Now()}
	b.ReportAllocs()
	for b.Loop() {
		xdsroute.Translate(f, xdsroute.Caller{Zone: "az1", Host: "h3"})
	}
}

// BenchmarkFor: the endpoints of the same fleet for one more caller, the
// cost of each client locality at a push.
func BenchmarkFor(b *testing.B) {
	var insts []registry.Instance
	for s := range 50 {
		for i := range 20 {
			insts = append(insts, registry.Instance{ID: fmt.Sprintf("i%d", i), Service: fmt.Sprintf("svc%d", s),
				Addr: fmt.Sprintf("10.%d.%d.1:8080", s, i), Zone: []string{"az1", "az2"}[i%2], Host: fmt.Sprintf("h%d", i%7)})
		}
	}
	pr := xdsroute.Prepare(xdsroute.Fleet{Instances: insts, Now: time.Now()})
	b.ReportAllocs()
	for b.Loop() {
		pr.For(xdsroute.Caller{Zone: "az1", Host: "h3"})
	}
}
