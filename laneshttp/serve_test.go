package laneshttp_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/laneshttp"
	"github.com/lanesdev/lanes/registry"
)

// journal records the order of events in a test.
type journal struct {
	mu     sync.Mutex
	events []string
}

func (j *journal) add(e string) { j.mu.Lock(); j.events = append(j.events, e); j.mu.Unlock() }
func (j *journal) String() string {
	j.mu.Lock()
	defer j.mu.Unlock()
	return strings.Join(j.events, ",")
}

// recordingRegistry notes registrations and deregistrations in a journal.
type recordingRegistry struct {
	registry.Registry
	j *journal
}

func (r recordingRegistry) Register(ctx context.Context, in registry.Instance, ttl time.Duration) (registry.Lease, error) {
	l, err := r.Registry.Register(ctx, in, ttl)
	if err != nil {
		return nil, err
	}
	r.j.add("register")
	return recordingLease{l, r.j}, nil
}

type recordingLease struct {
	registry.Lease
	j *journal
}

func (l recordingLease) Close() error { l.j.add("deregister"); return l.Lease.Close() }

func listen(t *testing.T) net.Listener {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return lis
}

// TestServe: Serve registers the instance once serving, wraps the handler
// with the middleware and the guard, and on shutdown deregisters before
// shutting the server down.
func TestServe(t *testing.T) {
	f := newFleet(t, "")
	var j journal
	reg := recordingRegistry{f.reg, &j}
	lis := listen(t)
	addr := lis.Addr().String()
	srv := &http.Server{Handler: laneEcho}
	// http.Server runs the functions of RegisterOnShutdown in goroutines of
	// their own: wait for this one before reading the journal.
	shutDown := make(chan struct{})
	srv.RegisterOnShutdown(func() { j.add("shutdown"); close(shutDown) })

	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- laneshttp.Serve(ctx, srv, lis, reg, registry.Instance{Service: "orders"},
			laneshttp.WithGuard(laneshttp.NewGuard(f.e)), laneshttp.WithLane("Alice"), laneshttp.WithZone("az1"),
			laneshttp.WithEnv(noEnv), laneshttp.WithLogger(quiet))
	}()
	f.await("orders", 1)
	in := f.e.Service("orders").Instances()[0]
	_, port, _ := net.SplitHostPort(addr)
	if in.Addr != addr || in.Lane != "alice" || in.Zone != "az1" || !strings.Contains(in.ID, "-"+port+"-") {
		t.Fatalf("registered %+v, listening on %s", in, addr)
	}

	c := f.client()
	if code, body := get(t, lane.WithLane(bg(t), "alice"), c, "http://orders/"); code != 200 || body != "alice" {
		t.Fatalf("through lanes: %d %q", code, body)
	}
	// The guard is on: a baseline request sent straight to it is refused.
	if code, _ := get(t, bg(t), plainClient(t), "http://"+addr+"/"); code != http.StatusMisdirectedRequest {
		t.Fatalf("baseline request straight to the lane instance: %d", code)
	}
	if code, _ := get(t, bg(t), plainClient(t), "http://"+addr+"/healthz"); code != 200 {
		t.Fatalf("health check: %d", code)
	}

	stop()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(patience):
		t.Fatal("Serve did not return")
	}
	select {
	case <-shutDown:
	case <-time.After(patience):
		t.Fatal("the server's shutdown functions did not run")
	}
	if got := j.String(); got != "register,deregister,shutdown" {
		t.Fatalf("events %s, want register,deregister,shutdown", got)
	}
	f.await("orders", 0)
	if _, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		t.Fatal("still listening")
	}
}

// TestServeEnv: the LANES_* variables place the instance; code wins.
func TestServeEnv(t *testing.T) {
	f := newFleet(t, "")
	env := map[string]string{"LANES_LANE": "bob", "LANES_ZONE": "az2", "LANES_ID": "env-id", "LANES_VERSION": "v9"}
	getenv := func(k string) string { return env[k] }
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- laneshttp.Serve(ctx, &http.Server{Handler: laneEcho}, listen(t), f.reg,
			registry.Instance{Service: "orders", Zone: "az9"}, laneshttp.WithEnv(getenv), laneshttp.WithLogger(quiet))
	}()
	f.await("orders", 1)
	in := f.e.Service("orders").Instances()[0]
	if in.Lane != "bob" || in.Zone != "az9" || in.ID != "env-id" || in.Version != "v9" {
		t.Fatalf("registered %+v", in)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestServeRegisterFails: a registration that fails stops the server and is
// returned.
func TestServeRegisterFails(t *testing.T) {
	reg := registry.NewMemory()
	reg.Close()
	lis := listen(t)
	err := laneshttp.Serve(context.Background(), &http.Server{}, lis, reg, registry.Instance{Service: "orders"}, laneshttp.WithEnv(noEnv), laneshttp.WithLogger(quiet))
	if !errors.Is(err, registry.ErrClosed) {
		t.Fatalf("err %v", err)
	}
	if _, err := net.DialTimeout("tcp", lis.Addr().String(), time.Second); err == nil {
		t.Fatal("still listening")
	}
	// An invalid instance is refused before serving.
	lis = listen(t)
	if err := laneshttp.Serve(context.Background(), &http.Server{}, lis, reg, registry.Instance{Service: "orders", Lane: "-x"}, laneshttp.WithEnv(noEnv)); err == nil || !strings.Contains(err.Error(), "lane") {
		t.Fatalf("err %v", err)
	}
}

// TestServeShutdownWaitsForRequests: a request in flight when ctx ends is
// answered, after the deregistration.
func TestServeShutdownWaitsForRequests(t *testing.T) {
	f := newFleet(t, "")
	started, release := make(chan struct{}), make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-release
		w.Write([]byte("finished"))
	})
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- laneshttp.Serve(ctx, &http.Server{Handler: h}, listen(t), f.reg, registry.Instance{Service: "orders"}, laneshttp.WithEnv(noEnv), laneshttp.WithLogger(quiet))
	}()
	f.await("orders", 1)
	type answer struct {
		body string
		err  error
	}
	got := make(chan answer, 1)
	c := f.client()
	go func() {
		_, body, _, err := call(bg(t), c, http.MethodGet, "http://orders/", nil)
		got <- answer{body, err}
	}()
	<-started
	stop()
	f.await("orders", 0) // deregistered while the request is in flight
	close(release)
	if a := <-got; a.err != nil || a.body != "finished" {
		t.Fatalf("in-flight request: %q %v", a.body, a.err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
