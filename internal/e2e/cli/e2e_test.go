// Package e2e drives the real lanes binary: `lanes up` and `lanes demo` as
// child processes on free loopback ports, `lanes dev` and the other client
// commands as more children, services registered through the admin API (the
// SDK's adminclient.Registry, with scoped tokens) or straight into etcd, and
// real HTTP and gRPC clients sending requests through the gateway.
package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"

	"github.com/lanesdev/lanes/adminapi"
	"github.com/lanesdev/lanes/adminclient"
	"github.com/lanesdev/lanes/etcdstore"
	"github.com/lanesdev/lanes/internal/lib/regid"
	"github.com/lanesdev/lanes/internal/testkit/childproc"
	"github.com/lanesdev/lanes/internal/testkit/etcdtest"
	"github.com/lanesdev/lanes/registry"
)

// binary is the lanes binary built by TestMain.
var binary string

func TestMain(m *testing.M) { childproc.Main(m, &binary) }

// TestUp runs the whole control plane twice: on its embedded etcd, and on
// an external etcd server process (skipped when there is no etcd binary).
func TestUp(t *testing.T) {
	// Two control planes of their own, side by side: most of a run is
	// waiting on the lanes commands and their processes.
	t.Run("embedded", func(t *testing.T) {
		t.Parallel()
		testUp(t, "/lanes/", nil)
	})
	t.Run("external", func(t *testing.T) {
		t.Parallel()
		srv := etcdtest.Process(t)
		testUp(t, "/lanes-e2e/", []string{"--external-etcd", srv.Endpoints()[0], "--etcd-prefix", "/lanes-e2e/"})
	})
}

func testUp(t *testing.T, prefix string, etcdArgs []string) {
	u := startUp(t, "up", append(etcdArgs,
		"--route", "/grpc.health.v1.Health=greeter",
		"--route", "/=web",
		"--trusted-proxy", "127.0.0.3/32")...)
	gw := u.gateway + "/"
	aliceTok := u.newToken(t, adminapi.TokenRequest{Lane: "alice", Name: "alice"})
	bobTok := u.newToken(t, adminapi.TokenRequest{Lane: "bob"})
	baseTok := u.newToken(t, adminapi.TokenRequest{Baseline: true, Name: "ci"})

	webBase, webAlice, webBob, webCanary := newBackend(t, "web-base"), newBackend(t, "web-alice"), newBackend(t, "web-bob"), newBackend(t, "web-canary")
	// The SDK way: through the admin API with scoped tokens.
	u.register(t, baseTok, registry.Instance{Service: "web", ID: "web-base", Addr: webBase.addr})
	aliceLease := u.register(t, aliceTok, registry.Instance{Service: "web", ID: "web-alice", Addr: webAlice.addr, Lane: "alice"})
	// Straight into etcd, at the endpoint `lanes up` printed.
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	st, err := etcdstore.Open(ctx, u.etcdConfig(t, prefix))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	canaryLease, err := st.Register(ctx, registry.Instance{Service: "web", ID: "web-canary", Addr: webCanary.addr, Lane: "canary"}, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer canaryLease.Close()

	// Test clients come from 127.0.0.2; lanes dev reaches the admin API
	// from 127.0.0.1, which it claims.
	c := clientFrom(t, "127.0.0.2")

	t.Run("header", func(t *testing.T) {
		expectBackend(t, c, gw, "web-base", nil)
		a := expectBackend(t, c, gw, "web-alice", header("x-lane", "alice"))
		if a.Lane != "alice" || a.Served != "alice" {
			t.Errorf("lane request: upstream saw x-lane %q, gateway says served by %q", a.Lane, a.Served)
		}
		// A lane with no instance falls back; a baseline request carries no lane.
		if a := get(t, c, gw, header("x-lane", "nobody")); a.Backend != "web-base" || a.Lane != "nobody" {
			t.Errorf("empty lane: %+v", a)
		}
		if a := get(t, c, gw, nil); a.Lane != "" {
			t.Errorf("baseline request reached upstream with x-lane %q", a.Lane)
		}
		if a := get(t, c, gw, header("x-lane", "-bad")); a.Status != http.StatusBadRequest {
			t.Errorf("invalid lane: status %d, want 400", a.Status)
		}
	})
	t.Run("cookie", func(t *testing.T) {
		expectBackend(t, c, gw, "web-alice", func(r *http.Request) { r.AddCookie(&http.Cookie{Name: "lane", Value: "alice"}) })
	})
	t.Run("host", func(t *testing.T) {
		_, port, _ := net.SplitHostPort(strings.TrimPrefix(u.gateway, "http://"))
		expectBackend(t, c, gw, "web-alice", func(r *http.Request) { r.Host = "alice.lanes.localhost:" + port })
	})

	t.Run("token-scope", func(t *testing.T) {
		reg := adminclient.NewRegistry(u.client(t, aliceTok))
		defer reg.Close()
		for _, in := range []registry.Instance{
			{Service: "web", ID: "x1", Addr: webBob.addr, Lane: "bob"}, // another lane
			{Service: "web", ID: "x2", Addr: webBob.addr},              // the baseline
		} {
			l, err := reg.Register(ctx, in, 3*time.Second)
			if !adminapi.IsCode(err, adminapi.CodeForbidden) {
				if l != nil {
					l.Close()
				}
				t.Errorf("alice's token registering %s/%s into %q: %v, want forbidden", in.Service, in.ID, in.Lane, err)
			}
		}
		// Nor can it take over an instance id of another lane.
		l, err := reg.Register(ctx, registry.Instance{Service: "web", ID: "web-base", Addr: webAlice.addr, Lane: "alice"}, 3*time.Second)
		if !adminapi.IsCode(err, adminapi.CodeConflict) {
			if l != nil {
				l.Close()
			}
			t.Errorf("alice's token taking over web-base: %v, want conflict", err)
		}
		// The baseline token registers no lane either.
		breg := adminclient.NewRegistry(u.client(t, baseTok))
		defer breg.Close()
		if l, err := breg.Register(ctx, registry.Instance{Service: "web", ID: "x3", Addr: webBob.addr, Lane: "alice"}, 3*time.Second); !adminapi.IsCode(err, adminapi.CodeForbidden) {
			if l != nil {
				l.Close()
			}
			t.Errorf("baseline token registering into alice: %v, want forbidden", err)
		}
		// lanes dev with a token of another lane fails, naming the scope.
		code, _, errOut := run(t, "", "dev", "--service", "web", "--lane", "bob", "--addr", webBob.addr, "--admin", u.admin, "--token", aliceTok)
		if code != 1 || !strings.Contains(errOut, "cannot register into lane \"bob\"") {
			t.Errorf("lanes dev with alice's token into bob: exit %d, stderr %q", code, errOut)
		}
		if a := get(t, c, gw, header("x-lane", "bob")); a.Backend != "web-base" {
			t.Errorf("a refused registration serves: %+v", a)
		}
	})

	t.Run("dev", func(t *testing.T) {
		d := start(t, "dev", "--service", "web", "--lane", "bob", "--addr", webBob.addr, "--claim-ip", "--admin", u.admin, "--token", bobTok)
		out := d.WaitOutput("Ctrl-C deregisters.")
		for _, want := range []string{
			"curl -H 'x-lane: bob' " + u.gateway + "/",
			"client 127.0.0.1 claimed for lane bob",
		} {
			if !strings.Contains(out, want) {
				t.Errorf("lanes dev output lacks %q:\n%s", want, out)
			}
		}
		expectBackend(t, c, gw, "web-bob", header("x-lane", "bob"))
		// The claim: requests from 127.0.0.1 go to bob without a header.
		c1 := clientFrom(t, "127.0.0.1")
		expectBackend(t, c1, gw, "web-bob", nil)
		if a := get(t, c, gw, nil); a.Backend != "web-base" {
			t.Errorf("from 127.0.0.2: %+v, want web-base", a)
		}
		// A trusted proxy forwards for 127.0.0.1: believed.
		expectBackend(t, clientFrom(t, "127.0.0.3"), gw, "web-bob", header("X-Forwarded-For", "127.0.0.1"))
		// An untrusted peer spoofing X-Forwarded-For: ignored.
		for range 5 {
			if a := get(t, c, gw, header("X-Forwarded-For", "127.0.0.1")); a.Backend != "web-base" {
				t.Fatalf("spoofed X-Forwarded-For from an untrusted peer: %+v, want web-base", a)
			}
		}
		// Ctrl-C deregisters, and the claim goes with the registration.
		if code := d.Stop(syscall.SIGINT); code != 0 || !strings.Contains(d.Stdout.String(), "deregistered") {
			t.Errorf("lanes dev after SIGINT: exit %d, stdout:\n%s", code, d.Stdout.String())
		}
		expectBackend(t, c1, gw, "web-base", nil)
		expectBackend(t, c, gw, "web-base", header("x-lane", "bob"))
	})

	t.Run("policy-clients", func(t *testing.T) {
		apply(t, u, "lanes:\n  alice:\n    clients: [10.9.8.7]\n")
		c3 := clientFrom(t, "127.0.0.3")
		expectBackend(t, c3, gw, "web-alice", header("X-Forwarded-For", "10.9.8.7"))
		if a := get(t, c, gw, header("X-Forwarded-For", "10.9.8.7")); a.Backend != "web-base" {
			t.Errorf("spoofed X-Forwarded-For from an untrusted peer: %+v, want web-base", a)
		}
	})

	t.Run("canary", func(t *testing.T) {
		apply(t, u, "canary:\n  - {service: web, lane: canary, percent: 50}\n")
		seen := map[string]int{}
		eventually(t, "a 50% canary split", func() string {
			a := get(t, c, gw, nil)
			seen[a.Backend]++
			if seen["web-canary"] > 0 && seen["web-base"] > 0 {
				return ""
			}
			return fmt.Sprintf("seen %v", seen)
		})
		if len(seen) != 2 {
			t.Errorf("baseline requests reached %v", seen)
		}
		// Sticky by request key.
		for _, key := range []string{"k1", "k2", "k3", "k4"} {
			first := get(t, c, gw, header("x-lanes-key", key))
			for range 5 {
				if a := get(t, c, gw, header("x-lanes-key", key)); a.Backend != first.Backend {
					t.Fatalf("key %s went to %s, then %s", key, first.Backend, a.Backend)
				}
			}
		}
		// A lane request is never split.
		for range 10 {
			if a := get(t, c, gw, header("x-lane", "alice")); a.Backend != "web-alice" {
				t.Fatalf("lane request split: %+v", a)
			}
		}
		apply(t, u, "")
		eventually(t, "no more split", func() string {
			for range 10 {
				if a := get(t, c, gw, nil); a.Backend != "web-base" {
					return "still reaching " + a.Backend
				}
			}
			return ""
		})
	})

	t.Run("grpc", func(t *testing.T) {
		gBase, gAlice := newGreeter(t, "greeter-base"), newGreeter(t, "greeter-alice")
		u.register(t, u.token, registry.Instance{Service: "greeter", ID: "greeter-base", Addr: gBase})
		u.register(t, u.token, registry.Instance{Service: "greeter", ID: "greeter-alice", Addr: gAlice, Lane: "alice"})
		conn, err := grpc.NewClient("passthrough:///"+strings.TrimPrefix(u.gateway, "http://"), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		hc := healthpb.NewHealthClient(conn)
		check := func(laneName string) string {
			cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if laneName != "" {
				cctx = metadata.AppendToOutgoingContext(cctx, "x-lane", laneName)
			}
			var md metadata.MD
			if _, err := hc.Check(cctx, &healthpb.HealthCheckRequest{}, grpc.Header(&md)); err != nil {
				return "error: " + err.Error()
			}
			return strings.Join(md.Get("x-instance"), ",")
		}
		for _, tc := range []struct{ lane, want string }{{"alice", "greeter-alice"}, {"", "greeter-base"}, {"bob", "greeter-base"}} {
			eventually(t, "gRPC in lane "+tc.lane, func() string {
				if got := check(tc.lane); got != tc.want {
					return "reached " + got
				}
				return ""
			})
		}
	})

	t.Run("policy-cli", func(t *testing.T) {
		bad := filepath.Join(t.TempDir(), "bad.yaml")
		os.WriteFile(bad, []byte("lanes:\n  alice:\n    fallback: [\"-no\"]\n"), 0o644)
		want := bad + ":3: field lanes.alice.fallback[0]: invalid lane"
		for _, cmd := range []string{"apply", "validate"} {
			code, _, errOut := u.cli(t, "policy", cmd, "-f", bad)
			if code != 2 || !strings.Contains(errOut, want) {
				t.Errorf("policy %s of an invalid file: exit %d, stderr %q, want 2 and %q", cmd, code, errOut, want)
			}
		}
		// The API itself refuses it too, naming line and field; the
		// document in force stays.
		_, err := u.client(t, u.token).PutPolicy(ctx, []byte("lanes:\n  alice:\n    fallback: [\"-no\"]\n"))
		var ae *adminapi.Error
		if !errors.As(err, &ae) || ae.Status != http.StatusUnprocessableEntity || ae.Line != 3 || ae.Field != "lanes.alice.fallback[0]" {
			t.Errorf("PUT of an invalid policy: %v (%+v)", err, ae)
		}
		good := "# team lanes\nlanes:\n  alice:\n    fallback: [team-a]\n"
		apply(t, u, good)
		if code, out, _ := u.cli(t, "policy", "get"); code != 0 || out != good {
			t.Errorf("policy get: exit %d, %q, want %q", code, out, good)
		}
		// A lane token may not apply.
		if code, _, errOut := run(t, "", "policy", "apply", "-f", bad, "--admin", u.admin, "--token", aliceTok); code != 2 {
			t.Errorf("apply of a bad file with a lane token: exit %d %s", code, errOut)
		}
		goodFile := filepath.Join(t.TempDir(), "good.yaml")
		os.WriteFile(goodFile, []byte(good), 0o644)
		if code, _, errOut := run(t, "", "policy", "apply", "-f", goodFile, "--admin", u.admin, "--token", aliceTok); code != 1 || !strings.Contains(errOut, "admin token") {
			t.Errorf("apply with a lane token: exit %d, stderr %q", code, errOut)
		}
	})

	t.Run("ls-explain", func(t *testing.T) {
		code, out, errOut := u.cli(t, "ls", "-o", "json")
		var l adminapi.Listing
		if code != 0 || json.Unmarshal([]byte(out), &l) != nil {
			t.Fatalf("ls -o json: exit %d, %s %s", code, out, errOut)
		}
		lanes := map[string]bool{}
		for _, s := range l.Services {
			if s.Name == "web" {
				for _, ln := range s.Lanes {
					lanes[ln] = true
				}
			}
		}
		if !lanes[""] || !lanes["alice"] || !lanes["canary"] {
			t.Errorf("ls: web has lanes %v, want the baseline, alice and canary", lanes)
		}
		if code, out, _ := u.cli(t, "ls"); code != 0 || !strings.Contains(out, "web-alice") || !strings.Contains(out, "SERVICE") {
			t.Errorf("ls: exit %d:\n%s", code, out)
		}
		code, out, _ = u.cli(t, "route", "explain", "web", "--lane", "alice")
		if code != 0 || !strings.Contains(out, "decision: serve from alice, reason lane, eligible web-alice") {
			t.Errorf("route explain: exit %d:\n%s", code, out)
		}
		// team-a is in no instance, policy entry or claim: a name that
		// matches nothing is refused, unless --force explains it anyway.
		if code, out, _ = u.cli(t, "route", "explain", "web", "--lane", "team-a"); code != 1 {
			t.Errorf("route explain of a lane that matches nothing: exit %d, want 1:\n%s", code, out)
		}
		code, out, _ = u.cli(t, "route", "explain", "web", "--lane", "team-a", "--force")
		if code != 0 || !strings.Contains(out, "2. baseline") || !strings.Contains(out, "reason lane-empty") {
			t.Errorf("route explain --force of an empty lane: exit %d:\n%s", code, out)
		}
	})

	t.Run("health-metrics", func(t *testing.T) {
		hc := clientFrom(t, "127.0.0.2")
		for _, p := range []struct{ path, want string }{
			{"/healthz", `"status": "ok"`},
			{"/metrics", "lanes_registrations_total"},
		} {
			resp, err := hc.Get(u.admin + p.path)
			if err != nil {
				t.Fatal(err)
			}
			body := new(strings.Builder)
			_, _ = ioCopy(body, resp)
			if resp.StatusCode != http.StatusOK || !strings.Contains(body.String(), p.want) {
				t.Errorf("GET %s: %d, lacks %q", p.path, resp.StatusCode, p.want)
			}
		}
	})

	t.Run("expiry", func(t *testing.T) {
		expectBackend(t, c, gw, "web-alice", header("x-lane", "alice"))
		if code, out, errOut := u.cli(t, "lane", "expire", "alice", "--in", "1s"); code != 0 || !strings.Contains(out, "lane alice expires at") {
			t.Fatalf("lane expire: exit %d, %s %s", code, out, errOut)
		}
		// The engine stops routing to it on time.
		expectBackend(t, c, gw, "web-base", header("x-lane", "alice"))
		// New registrations are refused, and the old one ends at its next
		// heartbeat.
		reg := adminclient.NewRegistry(u.client(t, aliceTok))
		defer reg.Close()
		l, err := reg.Register(ctx, registry.Instance{Service: "web", ID: "web-alice-2", Addr: webAlice.addr, Lane: "alice"}, 3*time.Second)
		if !adminapi.IsCode(err, adminapi.CodeLaneExpired) {
			if l != nil {
				l.Close()
			}
			t.Errorf("registration into an expired lane: %v, want lane_expired", err)
		}
		select {
		case <-aliceLease.Done():
			if err := aliceLease.Err(); !errors.Is(err, registry.ErrLeaseLost) {
				t.Errorf("lease in the expired lane ended with %v", err)
			}
		case <-time.After(wait):
			t.Errorf("the registration in the expired lane is still alive")
		}
	})
}

// apply puts a policy document in force with `lanes policy apply`.
func apply(t *testing.T, u *up, doc string) {
	t.Helper()
	f := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(f, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, out, errOut := u.cli(t, "policy", "apply", "-f", f); code != 0 || !strings.Contains(out, "policy applied") {
		t.Fatalf("policy apply: exit %d, %s %s", code, out, errOut)
	}
}

func ioCopy(b *strings.Builder, resp *http.Response) (int64, error) {
	defer resp.Body.Close()
	buf := make([]byte, 32<<10)
	var n int64
	for {
		k, err := resp.Body.Read(buf)
		b.Write(buf[:k])
		n += int64(k)
		if err != nil {
			return n, nil
		}
	}
}

// newGreeter starts a gRPC server (the health service) that names itself in
// the x-instance response header.
func newGreeter(t *testing.T, name string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		grpc.SetHeader(ctx, metadata.Pairs("x-instance", name))
		return h(ctx, req)
	}))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.Serve(ln)
	}()
	t.Cleanup(func() {
		srv.Stop()
		<-done
	})
	return ln.Addr().String()
}

// TestDemo runs `lanes demo` and follows requests through its topology.
func TestDemo(t *testing.T) {
	u := startUp(t, "demo")
	if !strings.Contains(u.Stdout.String(), "curl -H 'x-lane: alice' "+u.gateway+"/") {
		t.Errorf("demo output lacks the curl line:\n%s", u.Stdout.String())
	}
	c := clientFrom(t, "127.0.0.2")
	type hop struct{ Service, Instance, Lane string }
	for _, tc := range []struct {
		lane string
		want []hop
	}{
		{"", []hop{{"web", "web-1", ""}, {"orders", "orders-1", ""}, {"payments", "payments-1", ""}}},
		{"feature-x", []hop{{"web", "web-1", ""}, {"orders", "orders-feature-x", "feature-x"}, {"payments", "payments-1", ""}}},
		{"alice", []hop{{"web", "web-1", ""}, {"orders", "orders-1", ""}, {"payments", "payments-alice", "alice"}}},
	} {
		req, _ := http.NewRequest(http.MethodGet, u.gateway+"/", nil)
		if tc.lane != "" {
			req.Header.Set("x-lane", tc.lane)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var got struct{ Hops []hop }
		err = json.NewDecoder(resp.Body).Decode(&got)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK || fmt.Sprint(got.Hops) != fmt.Sprint(tc.want) {
			t.Errorf("lane %q: %d %v %+v, want %+v", tc.lane, resp.StatusCode, err, got.Hops, tc.want)
		}
	}
	if code := u.Stop(syscall.SIGINT); code != 0 {
		t.Errorf("lanes demo after SIGINT: exit %d", code)
	}
}

// TestUpRefusesBadSettings checks that bad settings fail fast, with exit 2
// and a message naming where the value came from.
func TestUpRefusesBadSettings(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "lanes.yaml")
	os.WriteFile(cfg, []byte("admin_addr: 127.0.0.1:0\ngatway_addr: 127.0.0.1:0\n"), 0o644)
	code, _, errOut := run(t, "", "up", "--config", cfg, "--data-dir", dir)
	if want := cfg + ":2: field gatway_addr: unknown field"; code != 2 || !strings.Contains(errOut, want) {
		t.Errorf("unknown field: exit %d, stderr %q, want 2 and %q", code, errOut, want)
	}
	os.WriteFile(cfg, []byte("routes:\n  - /=web\n  - nonsense\n"), 0o644)
	code, _, errOut = run(t, "", "up", "--config", cfg, "--data-dir", dir)
	if want := cfg + ":3: field routes[1]"; code != 2 || !strings.Contains(errOut, want) {
		t.Errorf("bad route: exit %d, stderr %q, want 2 and %q", code, errOut, want)
	}
	code, _, errOut = run(t, "", "up", "--data-dir", dir, "--trusted-proxy", "10.0.0.0/33")
	if code != 2 || !strings.Contains(errOut, "--trusted-proxy") {
		t.Errorf("bad flag: exit %d, stderr %q", code, errOut)
	}
	// A port in use: exit 1, naming the address.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	code, _, errOut = run(t, "", "up", "--data-dir", dir, "--admin-addr", ln.Addr().String(), "--gateway-addr", "127.0.0.1:0",
		"--etcd-client-addr", "127.0.0.1:0", "--etcd-peer-addr", "127.0.0.1:0", "--nats-addr", "127.0.0.1:0", "--otlp-grpc-addr", "127.0.0.1:0", "--otlp-http-addr", "127.0.0.1:0")
	if code != 1 || !strings.Contains(errOut, ln.Addr().String()) {
		t.Errorf("admin port in use: exit %d, stderr %q", code, errOut)
	}
}

// TestUpRefusesConflictingRoutes checks that routes the gateway cannot use
// are refused before anything starts (no etcd data, no panic), with exit 2
// and a message naming the route as the user gave it.
func TestUpRefusesConflictingRoutes(t *testing.T) {
	for _, c := range []struct {
		routes []string
		want   string
	}{
		{[]string{"/=web", "/=web"}, `--route: "/=web": route "/=web" before it (--route) has the same host and path prefix, so this one can never match`},
		{[]string{"/a=web", "/a/=web"}, `--route: "/a/=web": route "/a=web" before it`},
		{[]string{"/a%zz=web"}, `--route: "/a%zz=web": invalid path prefix "/a%zz"`},
	} {
		dir := t.TempDir()
		args := []string{"up", "--data-dir", dir, "--admin-addr", "127.0.0.1:0", "--gateway-addr", "127.0.0.1:0",
			"--etcd-client-addr", "127.0.0.1:0", "--etcd-peer-addr", "127.0.0.1:0", "--nats-addr", "127.0.0.1:0", "--otlp-grpc-addr", "127.0.0.1:0", "--otlp-http-addr", "127.0.0.1:0"}
		for _, r := range c.routes {
			args = append(args, "--route", r)
		}
		code, _, errOut := run(t, "", args...)
		if code != 2 || !strings.Contains(errOut, c.want) || strings.Contains(errOut, "panic") {
			t.Errorf("%q: exit %d, stderr %q, want 2 and %q", c.routes, code, errOut, c.want)
		}
		if entries, _ := os.ReadDir(dir); len(entries) != 0 {
			t.Errorf("%q: the data directory holds %v: something started before the refusal", c.routes, entries)
		}
	}
}

// TestUpRoutesLongestPrefix checks through the binary that routes match by
// the longest prefix, whatever their order: "/" given first does not shadow
// "/helloworld.Greeter", whose calls go to greeter.
func TestUpRoutesLongestPrefix(t *testing.T) {
	u := startUp(t, "up", "--route", "/=hello", "--route", "/helloworld.Greeter=greeter")
	hello, greeter := newBackend(t, "hello"), newBackend(t, "greeter")
	u.register(t, u.token, registry.Instance{Service: "hello", ID: "hello-1", Addr: hello.addr})
	u.register(t, u.token, registry.Instance{Service: "greeter", ID: "greeter-1", Addr: greeter.addr})
	c := clientFrom(t, "127.0.0.1")
	expectBackend(t, c, u.gateway+"/helloworld.Greeter/SayHello", "greeter", nil)
	expectBackend(t, c, u.gateway+"/index.html", "hello", nil)
	expectBackend(t, c, u.gateway+"/helloworld.GreeterX", "hello", nil)
}

// TestUpDataDirInUse checks that a second `lanes up` on the data directory
// of a running one fails at once (exit 1) naming the directory and the
// process that holds it, and that the first keeps serving.
func TestUpDataDirInUse(t *testing.T) {
	u := startUp(t, "up", "--route", "/=web")
	second := start(t, "up", "--data-dir", u.dataDir, "--admin-addr", "127.0.0.1:0", "--gateway-addr", "127.0.0.1:0",
		"--etcd-client-addr", "127.0.0.1:0", "--etcd-peer-addr", "127.0.0.1:0", "--nats-addr", "127.0.0.1:0", "--otlp-grpc-addr", "127.0.0.1:0", "--otlp-http-addr", "127.0.0.1:0")
	select {
	case <-second.Exited():
	case <-time.After(wait):
		t.Fatalf("a second lanes up on %s still runs after %s; want it to fail at once", u.dataDir, wait)
	}
	code, errOut := second.ExitCode(), second.Stderr.String()
	want := fmt.Sprintf("data directory %s is in use by process %d", u.dataDir, u.Pid())
	if code != 1 || !strings.Contains(errOut, want) {
		t.Errorf("second lanes up: exit %d, stderr %q, want 1 and %q", code, errOut, want)
	}
	if code, out, errOut := u.cli(t, "ls"); code != 0 {
		t.Errorf("the first lanes up stopped answering: ls exit %d %s %s", code, out, errOut)
	}
}

// TestUpGatewaySettings checks that gateway settings given to lanes up reach
// its gateway (a stripped prefix, a lane source turned off), and that the
// policy's lane_choice governs the cookie and the lane host as it does the
// header.
func TestUpGatewaySettings(t *testing.T) {
	u := startUp(t, "up", "--route", "/api=web", "--route", "/=web", "--gateway-strip-prefix", "/api", "--gateway-disable", "baggage")
	base, alice := newBackend(t, "web-base"), newBackend(t, "web-alice")
	u.register(t, u.token, registry.Instance{Service: "web", ID: "web-base", Addr: base.addr})
	u.register(t, u.newToken(t, adminapi.TokenRequest{Lane: "alice"}), registry.Instance{Service: "web", ID: "web-alice", Addr: alice.addr, Lane: "alice"})
	c := clientFrom(t, "127.0.0.1")
	if a := expectBackend(t, c, u.gateway+"/api/orders", "web-alice", header("cookie", "lane=alice")); a.Path != "/orders" {
		t.Errorf("--gateway-strip-prefix /api: the backend got path %q, want /orders", a.Path)
	}
	if a := get(t, c, u.gateway+"/", header("baggage", "lane=alice")); a.Backend != "web-base" {
		t.Errorf("--gateway-disable baggage: baggage selected %q (%d %s)", a.Backend, a.Status, a.Body)
	}
	host := func(r *http.Request) { r.Host = "alice.lanes.localhost" }
	expectBackend(t, c, u.gateway+"/", "web-alice", host)

	apply(t, u, "gateway: {lane_choice: none}\n")
	expectBackend(t, c, u.gateway+"/", "web-base", header("cookie", "lane=alice"))
	for what, edit := range map[string]func(*http.Request){"header": header("x-lane", "alice"), "cookie": header("cookie", "lane=alice"), "host": host} {
		if a := get(t, c, u.gateway+"/", edit); a.Backend != "web-base" || a.Lane != "" {
			t.Errorf("lane_choice none: the %s selected %q (x-lane %q upstream)", what, a.Backend, a.Lane)
		}
	}
}

// TestUpExternalEtcdAuth runs `lanes up` on an etcd server process with
// authentication on, configured by a config file and LANES_* variables, as
// a user whose role may only read and write the lanes prefix: everything
// the control plane writes (instances, tokens, claims, the policy) stays
// under it. A wrong password fails the start-up with exit status 1.
func TestUpExternalEtcdAuth(t *testing.T) {
	srv := etcdtest.Process(t)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	c := etcdtest.Client(t, srv.Endpoints())
	const prefix = "/lanes-auth/"
	if err := etcdtest.EnableAuth(ctx, c, "lanes", "s3cret", prefix); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(t.TempDir(), "lanes.yaml")
	os.WriteFile(cfg, []byte("routes: [/=web]\netcd:\n  endpoints: ["+srv.Endpoints()[0]+"]\n  prefix: "+prefix+"\n"), 0o644)

	code, _, errOut := run(t, "", "up", "--config", cfg, "--data-dir", t.TempDir(), "--etcd-username", "lanes", "--etcd-password", "wrong",
		"--etcd-dial-timeout", "3s", "--admin-addr", "127.0.0.1:0", "--gateway-addr", "127.0.0.1:0")
	if code != 1 || !strings.Contains(errOut, "authentication failed") {
		t.Errorf("wrong password: exit %d, stderr %q", code, errOut)
	}

	u := startUpEnv(t, []string{"LANES_ETCD_USERNAME=lanes", "LANES_ETCD_PASSWORD=s3cret"}, "up", "--config", cfg)
	if !strings.Contains(u.Stdout.String(), "external") {
		t.Errorf("start-up output:\n%s", u.Stdout.String())
	}
	tok := u.newToken(t, adminapi.TokenRequest{Lane: "alice"})
	b := newBackend(t, "web-alice")
	base := newBackend(t, "web-base")
	l := u.register(t, tok, registry.Instance{Service: "web", ID: "web-alice", Addr: b.addr, Lane: "alice"})
	u.register(t, u.token, registry.Instance{Service: "web", ID: "web-base", Addr: base.addr})
	if _, err := u.client(t, tok).Claim(ctx, adminapi.ClaimRequest{Lane: "alice", Registration: regid.Of(l)}); err != nil {
		t.Errorf("claim: %v", err)
	}
	gc := clientFrom(t, "127.0.0.2")
	expectBackend(t, gc, u.gateway+"/", "web-alice", header("x-lane", "alice"))
	expectBackend(t, clientFrom(t, "127.0.0.1"), u.gateway+"/", "web-alice", nil) // the claim
	if code, out, errOut := u.cli(t, "ls"); code != 0 || !strings.Contains(out, "web-alice") {
		t.Errorf("ls: exit %d %s %s", code, out, errOut)
	}
}
