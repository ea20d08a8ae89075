package kubestore_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/lanesdev/lanes/etcdstore"
	"github.com/lanesdev/lanes/internal/testkit/etcdtest"
	"github.com/lanesdev/lanes/internal/testkit/kubetest"
	"github.com/lanesdev/lanes/kubestore"
	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

// watchers is how many engines watch the service, each on a registry
// client of its own, as so many processes would.
const watchers = 100

// spread measures, for each change that change makes, the time until each
// of the engines' snapshots shows it, and reports the p50 and p99 of those
// times, and the p50 of the time until the last engine has it.
func spread(b *testing.B, engines []*routing.Engine, service string, change func(i int) bool) {
	b.Helper()
	var each, all []time.Duration
	for i := 0; b.Loop(); i++ {
		times := make([]time.Duration, len(engines))
		var wg sync.WaitGroup
		chans := make([]<-chan struct{}, len(engines))
		for j, e := range engines {
			chans[j] = e.Service(service).Changed()
		}
		start := time.Now()
		if !change(i) {
			b.Fatal("change failed")
		}
		for j := range engines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				select {
				case <-chans[j]:
					times[j] = time.Since(start)
				case <-time.After(30 * time.Second):
					times[j] = -1
				}
			}()
		}
		wg.Wait()
		worst := time.Duration(0)
		for _, d := range times {
			if d < 0 {
				b.Fatal("an engine never saw the change")
			}
			worst = max(worst, d)
		}
		each = append(each, times...)
		all = append(all, worst)
	}
	pct := func(ds []time.Duration, p float64) float64 {
		slices.Sort(ds)
		return float64(ds[min(len(ds)-1, int(float64(len(ds))*p))]) / float64(time.Millisecond)
	}
	b.ReportMetric(pct(each, 0.50), "p50-ms")
	b.ReportMetric(pct(each, 0.99), "p99-ms")
	b.ReportMetric(pct(all, 0.50), "all-p50-ms")
	b.ReportMetric(0, "ns/op")
}

func engines(b *testing.B, open func() registry.Registry, service string, want func([]registry.Instance) bool) []*routing.Engine {
	out := make([]*routing.Engine, watchers)
	var wg sync.WaitGroup
	for i := range out {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i] = routing.New(routing.WithRegistry(open()))
		}()
	}
	wg.Wait()
	for _, e := range out {
		b.Cleanup(func() { e.Close() })
		kubetest.WaitInstances(b, e, service, want)
	}
	return out
}

// BenchmarkSliceToSnapshot: an EndpointSlice's endpoint flips between
// ready and terminating (draining); 100 engines, each on a Store of its
// own (its own informers and connection), watch its service.
func BenchmarkSliceToSnapshot(b *testing.B) {
	s := kubetest.Start(b)
	k := newCluster(b, s)
	addr := kubetest.PodServer(b, "x")
	k.service("orders", nil)
	k.pod("orders-a", nil)
	ep := endpoint{service: "orders", pod: "orders-a", addr: addr, ready: true, serving: true}
	k.slice("orders-1", ep)
	es := engines(b, func() registry.Registry {
		st := open(b, s, kubestore.Options{Namespaces: []string{k.ns}})
		return st
	}, "orders", func(in []registry.Instance) bool { return len(in) == 1 })
	spread(b, es, "orders", func(i int) bool {
		e := ep
		if i%2 == 0 {
			e.ready, e.term = false, true
		}
		k.slice("orders-1", e)
		return true
	})
}

// BenchmarkEtcdToSnapshot: the same on lanes' etcd registry (an embedded
// etcd): a registered instance is drained and undrained.
func BenchmarkEtcdToSnapshot(b *testing.B) {
	srv := etcdtest.Embedded(b)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	openStore := func() *etcdstore.Store {
		st, err := etcdstore.Open(ctx, etcdstore.Config{Endpoints: srv.Endpoints(), MemberTimeout: -1})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { st.Close() })
		return st
	}
	reg := openStore()
	inst := registry.Instance{Service: "orders", ID: "a", Addr: "127.0.0.1:9"}
	l, err := reg.Register(ctx, inst, registry.DefaultTTL)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { l.Close() })
	es := engines(b, func() registry.Registry { return openStore() }, "orders", func(in []registry.Instance) bool { return len(in) == 1 })
	spread(b, es, "orders", func(i int) bool {
		in := inst
		in.Drain = i%2 == 0
		if err := l.Update(ctx, in); err != nil {
			b.Log(fmt.Sprint(err))
			return false
		}
		return true
	})
}
