package scale

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/lanesdev/lanes/etcdstore"
	"github.com/lanesdev/lanes/internal/testkit/etcdtest"
	"github.com/lanesdev/lanes/internal/testkit/leaktest"
	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

// The child process of BenchmarkChurn: one engine following a service.
const (
	childEnv     = "LANES_SCALE_ENGINE"    // the etcd endpoint the child follows
	childService = "LANES_SCALE_SERVICE"   // the service it follows
	childWant    = "LANES_SCALE_INSTANCES" // the instances it waits for before it reports ready
	// When set, the child writes a CPU profile of the churn to this file.
	childProfile = "LANES_SCALE_ENGINE_PROFILE"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		runEngine()
		return
	}
	goleak.VerifyTestMain(m, leaktest.Options()...)
}

var quiet = slog.New(slog.DiscardHandler)

// patience bounds every wait; generous for a loaded 2-core machine.
const patience = 2 * time.Minute

func servers(b *testing.B, fn func(b *testing.B, srv etcdtest.Server)) {
	b.Run("etcd=embedded", func(b *testing.B) { fn(b, etcdtest.Embedded(b)) })
	b.Run("etcd=process", func(b *testing.B) { fn(b, etcdtest.Process(b)) })
}

func open(tb testing.TB, srv etcdtest.Server) *etcdstore.Store {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	st, err := etcdstore.Open(ctx, etcdstore.Config{Endpoints: srv.Endpoints(), Options: etcdstore.Options{Logger: quiet}})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { st.Close() })
	return st
}

func instance(service string, i int) registry.Instance {
	return registry.Instance{ID: fmt.Sprintf("i%05d", i), Service: service,
		Addr: fmt.Sprintf("10.%d.%d.%d:8080", i>>16&255, i>>8&255, i&255), Zone: fmt.Sprintf("az%d", i%3), Host: fmt.Sprintf("h%d", i)}
}

// register creates n registrations of service, with a TTL that outlives the
// benchmark, by several writers at once, and returns the instances.
func register(tb testing.TB, st *etcdstore.Store, service string, n int) []registry.Instance {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	insts := make([]registry.Instance, n)
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += 16 {
				r, err := st.Registrations().Create(ctx, instance(service, i), 10*time.Minute, etcdstore.CreateOptions{})
				if err != nil {
					errs <- err
					return
				}
				insts[i] = r.Instance
				leases.Store(key(r.Instance), r.Lease)
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		tb.Fatal(err)
	}
	return insts
}

// leases holds the lease of each registration register made.
var leases sync.Map

func key(in registry.Instance) string { return in.Service + "/" + in.ID }

// update puts in under the lease that register made for it.
func update(ctx context.Context, st *etcdstore.Store, in registry.Instance) error {
	l, _ := leases.Load(key(in))
	held, err := st.Registrations().Update(ctx, l.(clientv3.LeaseID), in)
	if err == nil && !held {
		err = fmt.Errorf("the registration of %s is gone", key(in))
	}
	return err
}

func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, int(p*float64(len(sorted))))]
}

// BenchmarkFanout: one instance change, reaching 1,000 engines that watch
// the service, each with a watch of its own, over 50 etcd client
// connections (a 2-core machine cannot dial 1,000 in reasonable time).
// Each op changes one instance's weight and waits until every engine has
// published it; p50-ms and p99-ms are over every engine and every change.
// cpu-ms/op is the CPU time of this process per change: the 1,000 engines
// and, for etcd=embedded, the etcd server; etcd-cpu-ms/op, for
// etcd=process, that of the etcd process. write-max-ms is the longest
// write of a change, which the latencies include; after-write-p99-ms is
// the p99 of the latencies counted from the end of their change's write
// (0 for an engine that had it before), the fan-out without etcd's commit.
// Goal: p99 under 50 ms.
func BenchmarkFanout(b *testing.B) {
	servers(b, func(b *testing.B, srv etcdtest.Server) {
		const engines, connections, service = 1000, 50, "orders"
		writer := open(b, srv)
		insts := register(b, writer, service, 10)
		clients := make([]*clientv3.Client, connections)
		for i := range clients {
			clients[i] = etcdtest.Client(b, srv.Endpoints())
		}
		svcs := make([]*routing.Service, engines)
		for i := range engines {
			st, err := etcdstore.New(clients[i%connections], etcdstore.Options{Logger: quiet})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { st.Close() })
			e := routing.New(routing.WithRegistry(st), routing.WithLogger(quiet))
			b.Cleanup(func() { e.Close() })
			svcs[i] = e.Service(service)
		}
		for _, s := range svcs {
			ctx, cancel := context.WithTimeout(context.Background(), patience)
			err := s.WaitReady(ctx)
			cancel()
			if err != nil {
				b.Fatal("an engine did not list the service")
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), patience)
		defer cancel()
		var lat []time.Duration
		var mu sync.Mutex
		weight := 100
		var writeMax time.Duration // the longest write, which every latency includes
		var afterWrite []time.Duration
		proc, _ := srv.(interface{ CPUTime() (time.Duration, error) })
		var etcdCPU time.Duration
		if proc != nil {
			etcdCPU, _ = proc.CPUTime()
		}
		cpu := cpuTime()
		for b.Loop() {
			weight = 1 + weight%200
			in := insts[0]
			in.Weight = weight
			changed := make([]<-chan struct{}, engines)
			for i, s := range svcs {
				changed[i] = s.Changed()
			}
			var wg sync.WaitGroup
			start := time.Now()
			for i := range svcs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					// Nothing else changes: the next publication is this change.
					select {
					case <-changed[i]:
					case <-ctx.Done():
						return
					}
					d := time.Since(start)
					mu.Lock()
					lat = append(lat, d)
					mu.Unlock()
				}()
			}
			if err := update(ctx, writer, in); err != nil {
				b.Fatal(err)
			}
			write := time.Since(start)
			writeMax = max(writeMax, write)
			wg.Wait()
			if ctx.Err() != nil {
				b.Fatal("not every engine saw the change")
			}
			for _, d := range lat[len(lat)-engines:] {
				afterWrite = append(afterWrite, max(0, d-write))
			}
		}
		b.ReportMetric(float64((cpuTime()-cpu).Microseconds())/1000/float64(b.N), "cpu-ms/op")
		if proc != nil {
			if d, err := proc.CPUTime(); err == nil {
				b.ReportMetric(float64((d-etcdCPU).Microseconds())/1000/float64(b.N), "etcd-cpu-ms/op")
			}
		}
		slices.Sort(lat)
		b.ReportMetric(float64(percentile(lat, 0.5).Microseconds())/1000, "p50-ms")
		b.ReportMetric(float64(percentile(lat, 0.99).Microseconds())/1000, "p99-ms")
		b.ReportMetric(float64(lat[len(lat)-1].Microseconds())/1000, "max-ms")
		b.ReportMetric(float64(writeMax.Microseconds())/1000, "write-max-ms")
		slices.Sort(afterWrite)
		b.ReportMetric(float64(percentile(afterWrite, 0.99).Microseconds())/1000, "after-write-p99-ms")
	})
}

// BenchmarkChurn: an engine following a service of 10,000 instances while
// 100 of them change every second. The engine runs in a child process (this
// test binary), so that its CPU time is its own: cpu-% is the child's CPU
// time over the churn, in percent of one core. Each op is one second of
// churn. rebuilds/s counts the snapshots the engine published (changes are
// coalesced; see routing's watcher), lag-ms the staleness the last change
// saw. Goal: under 5% of a core.
func BenchmarkChurn(b *testing.B) {
	servers(b, func(b *testing.B, srv etcdtest.Server) {
		const n, perSecond, service = 10000, 100, "orders"
		writer := open(b, srv)
		insts := register(b, writer, service, n)

		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), childEnv+"="+srv.Endpoints()[0], childService+"="+service, childWant+"="+strconv.Itoa(n))
		stdin, err := cmd.StdinPipe()
		if err != nil {
			b.Fatal(err)
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			b.Fatal(err)
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		defer cmd.Process.Kill()
		lines := bufio.NewScanner(stdout)
		readLine := func(prefix string) []string {
			for lines.Scan() {
				if f := strings.Fields(lines.Text()); len(f) > 0 && f[0] == prefix {
					return f[1:]
				}
			}
			b.Fatalf("the engine process ended before %q: %v", prefix, lines.Err())
			return nil
		}
		readLine("ready")

		ctx, cancel := context.WithTimeout(context.Background(), patience)
		defer cancel()
		rng := rand.New(rand.NewPCG(1, 2))
		tick := time.NewTicker(time.Second / perSecond)
		defer tick.Stop()
		start := time.Now()
		changes := 0
		var writes sync.WaitGroup
		sem := make(chan struct{}, 8) // writes in flight, so that slow ones do not slow the rate
		errs := make(chan error, 1)
		for b.Loop() {
			for range perSecond {
				<-tick.C
				in := insts[rng.IntN(n)]
				in.Weight = 1 + rng.IntN(200)
				sem <- struct{}{}
				writes.Add(1)
				go func() {
					defer writes.Done()
					defer func() { <-sem }()
					if err := update(ctx, writer, in); err != nil {
						select {
						case errs <- err:
						default:
						}
					}
				}()
				changes++
			}
		}
		writes.Wait()
		elapsed := time.Since(start)
		select {
		case err := <-errs:
			b.Fatal(err)
		default:
		}
		io.WriteString(stdin, "stop\n")
		f := readLine("cpu")
		stdin.Close()
		cmd.Wait()
		cpu, _ := time.ParseDuration(f[0])
		rebuilds, _ := strconv.Atoi(f[1])
		b.ReportMetric(100*cpu.Seconds()/elapsed.Seconds(), "cpu-%")
		b.ReportMetric(float64(rebuilds)/elapsed.Seconds(), "rebuilds/s")
		b.ReportMetric(float64(changes)/elapsed.Seconds(), "changes/s")
	})
}

// runEngine is the child process of BenchmarkChurn: an engine that follows
// the service until told to stop on stdin. It prints "ready" once it lists
// every instance, then, on "stop", "cpu <CPU time since ready> <snapshots
// published since ready>".
func runEngine() {
	ctx := context.Background()
	st, err := etcdstore.Open(ctx, etcdstore.Config{Endpoints: []string{os.Getenv(childEnv)}, Options: etcdstore.Options{Logger: quiet}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	e := routing.New(routing.WithRegistry(st), routing.WithLogger(quiet))
	svc := e.Service(os.Getenv(childService))
	want, _ := strconv.Atoi(os.Getenv(childWant))
	for {
		ch := svc.Changed()
		if len(svc.Instances()) >= want {
			break
		}
		<-ch
	}
	var mu sync.Mutex
	published := 0
	go func() {
		for {
			ch := svc.Changed()
			<-ch
			mu.Lock()
			published++
			mu.Unlock()
		}
	}()
	var prof *os.File
	if name := os.Getenv(childProfile); name != "" {
		prof, err = os.Create(name)
		if err == nil {
			err = pprof.StartCPUProfile(prof)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	cpu := cpuTime()
	fmt.Println("ready")
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() && in.Text() != "stop" {
	}
	used := cpuTime() - cpu
	if prof != nil {
		pprof.StopCPUProfile()
		prof.Close()
	}
	mu.Lock()
	fmt.Println("cpu", used, published)
	mu.Unlock()
	os.Exit(0)
}

// cpuTime is the CPU time the process has used, user and system.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
