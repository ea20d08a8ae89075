package docs

import (
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/lanesdev/lanes/internal/testkit/childproc"
	"github.com/lanesdev/lanes/internal/testkit/timing"
	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/lanesnats"
)

// wait bounds every wait: generous, for a loaded 2-core machine.
const wait = 60 * time.Second

// start runs bin with args and env added to the test's environment, its
// stdout and stderr in one stream; it is killed at cleanup if it still
// runs.
func start(t *testing.T, name string, env []string, bin string, args ...string) *childproc.Child {
	t.Helper()
	return childproc.Start(t, childproc.Spec{Name: name, Argv: append([]string{bin}, args...), Env: env, OneStream: true, Wait: wait})
}

// stop sends SIGTERM and waits for a clean exit.
func stop(t *testing.T, p *childproc.Child) {
	t.Helper()
	if p.Stop(syscall.SIGTERM) != 0 {
		t.Errorf("%s exited with %v after SIGTERM", p.Name(), p.Err())
	}
}

// programs returns the complete programs (package main, not fragments) of a
// Markdown file, in order.
func programs(t *testing.T, file string) []block {
	t.Helper()
	var out []block
	for _, b := range readBlocks(t) {
		if b.file == file && !b.fragment() && b.pkgName() == "main" {
			out = append(out, b)
		}
	}
	return out
}

// program returns the first Go block of a Markdown file, which must be a
// complete program.
func program(t *testing.T, file string) block {
	t.Helper()
	for _, b := range readBlocks(t) {
		if b.file == file {
			if b.pkgName() != "main" {
				t.Fatalf("%s: the first Go block is not a complete program (package main)", b.where())
			}
			return b
		}
	}
	t.Fatalf("%s has no Go block", file)
	return block{}
}

var exportLine = regexp.MustCompile(`(?m)^\s*export (LANES_REGISTRY=etcd://\S+.*)$`)
var adminExport = regexp.MustCompile(`(?m)^\s*export LANES_REGISTRY=(http://\S+) LANES_TOKEN=`)
var guardedAddr = regexp.MustCompile(`"addr":"[^"]*:(\d+)".*"guard":true`)
var gatewayLine = regexp.MustCompile(`(?m)^gateway\s+http://(\S+)`)

// TestProgramsRun runs the complete programs of README.md, docs/http.md and
// docs/grpc.md as written against `lanes up`, with the environment that
// `lanes up` prints, a baseline and an alice instance of each: a request in
// lane alice reaches the alice instance, a baseline request never does; the
// client program of docs/grpc.md gets its answers from the same instances.
func TestProgramsRun(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs programs")
	}
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command")
	}
	tmp := t.TempDir()
	httpProg, grpcProg, readme := program(t, "docs/http.md"), program(t, "docs/grpc.md"), program(t, "README.md")
	if readme.code != httpProg.code {
		t.Errorf("%s and %s show different programs; the README's is the HTTP one", readme.where(), httpProg.where())
	}

	// Build lanes, the HTTP program (in the lanes module) and the gRPC one
	// (in a module of its own: it needs grpc-go's examples).
	lanes := filepath.Join(tmp, "lanes")
	if out, err := goCmd(t, "build", "-o", lanes, "./cmd/lanes"); err != nil {
		t.Fatalf("build lanes: %v\n%s", err, out)
	}
	hdir := filepath.Join(tmp, "hello")
	os.MkdirAll(hdir, 0o755)
	os.WriteFile(filepath.Join(hdir, "main.go"), []byte(httpProg.code), 0o644)
	if out, err := goCmd(t, "build", "-o", filepath.Join(hdir, "bin"), filepath.Join(hdir, "main.go")); err != nil {
		t.Fatalf("build %s: %v\n%s", httpProg.where(), err, out)
	}
	gdir := filepath.Join(tmp, "greeter")
	os.MkdirAll(gdir, 0o755)
	os.WriteFile(filepath.Join(gdir, "main.go"), []byte(grpcProg.code), 0o644)
	out, err := buildOwnModule(t, gdir, grpcProg.code)
	grpcOK := err == nil
	switch {
	case err == errOffline:
		t.Logf("%s not run: it needs grpc-go's examples from the Go module proxy, which cannot be reached: %s", grpcProg.where(), out)
	case err != nil:
		t.Fatalf("build %s: %v\n%s", grpcProg.where(), err, out)
	}
	// The client of docs/grpc.md: its second complete program.
	var clientBin string
	if grpcOK {
		ps := programs(t, "docs/grpc.md")
		if len(ps) < 2 {
			t.Fatal("docs/grpc.md shows no client program (a second complete program)")
		}
		cdir := filepath.Join(tmp, "greeter-client")
		os.MkdirAll(cdir, 0o755)
		os.WriteFile(filepath.Join(cdir, "main.go"), []byte(ps[1].code), 0o644)
		if out, err := buildOwnModule(t, cdir, ps[1].code); err != nil {
			t.Fatalf("build %s: %v\n%s", ps[1].where(), err, out)
		}
		clientBin = filepath.Join(cdir, "bin")
	}

	up := start(t, "lanes up", nil, lanes, "up",
		"--data-dir", filepath.Join(tmp, "lanes-data"),
		"--admin-addr", "127.0.0.1:0", "--gateway-addr", "127.0.0.1:0",
		"--etcd-client-addr", "127.0.0.1:0", "--etcd-peer-addr", "127.0.0.1:0",
		"--nats-addr", "127.0.0.1:0", "--otlp-grpc-addr", "127.0.0.1:0", "--otlp-http-addr", "127.0.0.1:0", "--log-level", "warn",
		"--route", "/helloworld.Greeter=greeter", "--route", "/=hello")
	upOut := up.WaitOutput("lanes is up.")
	m := exportLine.FindStringSubmatch(upOut)
	g := gatewayLine.FindStringSubmatch(upOut)
	if m == nil || g == nil {
		t.Fatalf("lanes up printed no export line or gateway:\n%s", upOut)
	}
	env := strings.Fields(m[1]) // as printed, with the shell's work done
	var tracesAddr string
	for i, kv := range env {
		if f, ok := strings.CutPrefix(kv, `LANES_TRACES_TOKEN="$(cat `); ok {
			tok, err := os.ReadFile(strings.TrimSuffix(f, `)"`))
			if err != nil {
				t.Fatal(err)
			}
			env[i] = "LANES_TRACES_TOKEN=" + strings.TrimSpace(string(tok))
		}
		if a, ok := strings.CutPrefix(kv, "LANES_TRACES="); ok {
			tracesAddr = a
		}
	}
	checkExportLines(t, upOut)
	gateway := g[1]
	a := adminExport.FindStringSubmatch(upOut)
	if a == nil {
		t.Fatalf("lanes up printed no export line for the admin API:\n%s", upOut)
	}
	adminURL := a[1]
	tokOut, err := exec.Command(lanes, "token", "create", "--lane", "alice", "--admin", adminURL, "--data-dir", filepath.Join(tmp, "lanes-data")).Output()
	if err != nil {
		t.Fatalf("lanes token create: %v", err)
	}
	aliceToken := strings.TrimSpace(string(tokOut))

	// The programs log as the control plane does: slog's text format, or
	// JSON with LANES_LOG_FORMAT=json (the alice instances).
	var procs []*childproc.Child
	aliceAddr := map[string]string{} // service -> loopback address of its alice instance
	progs := []struct {
		name, bin string
		ok        bool
	}{{"hello", filepath.Join(hdir, "bin"), true}, {"greeter", filepath.Join(gdir, "bin"), grpcOK}}
	for _, p := range progs {
		if !p.ok {
			continue
		}
		base := start(t, p.name+" (baseline)", env, p.bin)
		aliceEnv := append(env, "LANES_LANE=alice", "LANES_LOG_FORMAT=json")
		if p.name == "hello" {
			// The alice instance of hello joins through the admin API with
			// a lane token, as `lanes up` prints it: no etcd access.
			aliceEnv = []string{"LANES_REGISTRY=" + adminURL, "LANES_TOKEN=" + aliceToken, "LANES_TRACES=" + tracesAddr, "LANES_LANE=alice", "LANES_LOG_FORMAT=json"}
		}
		alice := start(t, p.name+" (alice)", aliceEnv, p.bin)
		baseOut := base.WaitOutput(`level=INFO msg="lanes: instance registered" service=` + p.name)
		aliceOut := alice.WaitOutput(`"msg":"lanes: instance registered","service":"` + p.name + `"`)
		procs = append(procs, base, alice)
		// Listening on ":0", each advertises the local address of its
		// route to the registry (loopback here), not the host's first
		// interface, and logs where the address comes from.
		if !regexp.MustCompile(`instance registered.* addr=127\.0\.0\.1:\d+ addr_from="the route to the registry"`).MatchString(baseOut) {
			t.Errorf("%s (baseline) does not advertise the address of its route to etcd:\n%s", p.name, baseOut)
		}
		if !regexp.MustCompile(`instance registered.*"addr":"127\.0\.0\.1:\d+","addr_from":"the route to the registry"`).MatchString(aliceOut) {
			t.Errorf("%s (alice) does not advertise the address of its route to the admin API:\n%s", p.name, aliceOut)
		}
		// Serve guards the lane instance by default: the program gives no guard.
		m := guardedAddr.FindStringSubmatch(aliceOut)
		if m == nil {
			t.Fatalf("%s's alice instance is not guarded:\n%s", p.name, aliceOut)
		}
		aliceAddr[p.name] = "127.0.0.1:" + m[1]
	}
	// Straight to alice's hello instance, bypassing the gateway: a baseline
	// request is refused, a probe of a health path is served.
	for path, want := range map[string]int{"/": http.StatusMisdirectedRequest, "/_healthz": http.StatusOK, "/health": http.StatusOK} {
		res, err := (&http.Client{Timeout: 10 * time.Second}).Get("http://" + aliceAddr["hello"] + path)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != want {
			t.Errorf("GET %s of alice's hello instance, no lane: %s, want %d", path, res.Status, want)
		}
	}
	// LANES_ADDR stays the override.
	over := start(t, "hello (LANES_ADDR)", append(env, "LANES_LANE=carol", "LANES_ADDR=127.0.0.3:9"), filepath.Join(hdir, "bin"))
	over.WaitOutput(`addr=127.0.0.3:9 addr_from=LANES_ADDR`)
	procs = append(procs, over)
	// An error ends the program logged at ERROR: a lane token that
	// registers into another lane is refused.
	for _, p := range progs {
		if !p.ok {
			continue
		}
		refused := start(t, p.name+" (refused)", []string{"LANES_REGISTRY=" + adminURL, "LANES_TOKEN=" + aliceToken, "LANES_LANE=bob"}, p.bin)
		refused.WaitExit()
		out := refused.Stdout.String()
		line := regexp.MustCompile(`(?m)^.*` + p.name + ` stopped.*$`).FindString(out)
		if refused.ExitCode() != 1 || !strings.Contains(line, "level=ERROR") || !strings.Contains(line, "403") {
			t.Errorf("%s with a token of another lane: exit %d, want 1 and the refusal logged at ERROR:\n%s",
				p.name, refused.ExitCode(), out)
		}
		if strings.Contains(out, "level=INFO") && strings.Contains(out, "refus") {
			for _, l := range strings.Split(out, "\n") {
				if strings.Contains(l, "level=INFO") && strings.Contains(l, "refus") {
					t.Errorf("%s logs a refusal at INFO: %s", p.name, l)
				}
			}
		}
	}

	defer func() {
		for _, p := range procs {
			stop(t, p)
			if !strings.Contains(p.Stdout.String(), "lanes: instance deregistered") {
				t.Errorf("%s did not log its deregistration:\n%s", p.Name(), p.Stdout.String())
			}
		}
	}()

	hc := &http.Client{Timeout: 10 * time.Second}
	get := func(l string) string {
		req, _ := http.NewRequest("GET", "http://"+gateway+"/", nil)
		if l != "" {
			req.Header.Set("x-lane", l)
		}
		res, err := hc.Do(req)
		if err != nil {
			return err.Error()
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return string(b)
	}
	const aliceHTTP, baseHTTP = `hello from lane "alice", serving a request in lane "alice"`, `hello from lane "", serving a request in lane ""`
	eventually(t, "HTTP: lane alice reaches the alice instance", func() string {
		if got := get("alice"); !strings.Contains(got, aliceHTTP) {
			return got
		}
		return ""
	})
	for i := 0; i < 20; i++ {
		if got := get(""); !strings.Contains(got, baseHTTP) {
			t.Fatalf("HTTP baseline request: %q", got)
		}
		if got := get("alice"); !strings.Contains(got, aliceHTTP) {
			t.Fatalf("HTTP alice request: %q", got)
		}
	}
	// The programs' spans are named after the service they registered and its
	// lane, not after the program (both are "bin" here).
	eventually(t, "HTTP: the trace names hello, not the program", func() string {
		req, _ := http.NewRequest("GET", "http://"+gateway+"/", nil)
		req.Header.Set("x-lane", "alice")
		res, err := hc.Do(req)
		if err != nil {
			return err.Error()
		}
		res.Body.Close()
		id := res.Header.Get("x-trace-id")
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			out, _ := exec.Command(lanes, "trace", id, "-o", "json", "--admin", adminURL, "--data-dir", filepath.Join(tmp, "lanes-data")).Output()
			if strings.Contains(string(out), `"service": "hello"`) || strings.Contains(string(out), `"service":"hello"`) {
				if strings.Contains(string(out), `"bin"`) {
					return "a span named after the program: " + string(out)
				}
				return ""
			}
		}
		return "trace " + id + " has no span of hello"
	})
	// The alice instance, behind its token, follows the policy through the
	// admin API: once bob falls back to alice, its guard admits bob's
	// requests, which the gateway sends there.
	apply := exec.Command(lanes, "policy", "apply", "-", "--admin", adminURL, "--data-dir", filepath.Join(tmp, "lanes-data"))
	apply.Stdin = strings.NewReader("lanes:\n  bob:\n    fallback: [alice]\n")
	if out, err := apply.CombinedOutput(); err != nil {
		t.Fatalf("lanes policy apply: %v\n%s", err, out)
	}
	const bobHTTP = `hello from lane "alice", serving a request in lane "bob"`
	eventually(t, "HTTP: lane bob falls back to the alice instance, which admits it", func() string {
		if got := get("bob"); !strings.Contains(got, bobHTTP) {
			return got
		}
		return ""
	})
	runMQ(t, tmp, env)
	if !grpcOK {
		return
	}

	direct, err := grpc.NewClient(aliceAddr["greeter"], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	dctx, dcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer dcancel()
	var dreply wrapperspb.StringValue
	if err := direct.Invoke(dctx, "/helloworld.Greeter/SayHello", wrapperspb.String("docs"), &dreply); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("a baseline call straight to alice's greeter: %v, want the guard's FailedPrecondition", err)
	}

	cc, err := grpc.NewClient(gateway, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	// helloworld's HelloRequest and HelloReply have one string field, 1:
	// wrapperspb.StringValue is the same on the wire.
	say := func(l string) string {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if l != "" {
			ctx = metadata.AppendToOutgoingContext(ctx, "x-lane", l)
		}
		var reply wrapperspb.StringValue
		if err := cc.Invoke(ctx, "/helloworld.Greeter/SayHello", wrapperspb.String("docs"), &reply); err != nil {
			return err.Error()
		}
		return reply.GetValue()
	}
	const aliceGRPC, baseGRPC = `hello docs from lane "alice", serving a request in lane "alice"`, `hello docs from lane "", serving a request in lane ""`
	eventually(t, "gRPC: lane alice reaches the alice instance", func() string {
		if got := say("alice"); got != aliceGRPC {
			return got
		}
		return ""
	})
	for i := 0; i < 20; i++ {
		if got := say(""); got != baseGRPC {
			t.Fatalf("gRPC baseline call: %q", got)
		}
		if got := say("alice"); got != aliceGRPC {
			t.Fatalf("gRPC alice call: %q", got)
		}
	}
	runClient(t, clientBin, env)
}

// runClient runs the client program of docs/grpc.md (bin) as documented,
// with the environment that `lanes up` printed: a call in lane alice is
// answered by alice's greeter, a call without a lane by the baseline one,
// and a lane name that breaks the rules is refused, naming -lane, at ERROR.
func runClient(t *testing.T, bin string, env []string) {
	t.Helper()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-lane", "alice", "-name", "docs"}, `hello docs from lane "alice", serving a request in lane "alice"`},
		{[]string{"-name", "docs"}, `hello docs from lane "", serving a request in lane ""`},
	} {
		for i := 0; i < 3; i++ { // each run is a new process with a new engine
			p := start(t, "greeter-client "+strings.Join(c.args, " "), env, bin, c.args...)
			p.WaitExit()
			out := p.Stdout.String()
			if p.ExitCode() != 0 || !strings.Contains(out, c.want+"\n") {
				t.Fatalf("greeter-client %s: exit %d, want 0 and %q:\n%s", strings.Join(c.args, " "), p.ExitCode(), c.want, out)
			}
		}
	}
	bad := start(t, "greeter-client -lane 'al ice'", env, bin, "-lane", "al ice")
	bad.WaitExit()
	out := bad.Stdout.String()
	if bad.ExitCode() != 1 || !regexp.MustCompile(`ERROR.*greeter-client stopped.*-lane: .*al ice`).MatchString(out) {
		t.Errorf("greeter-client -lane 'al ice': exit %d, want 1 and the flag and value named at ERROR:\n%s", bad.ExitCode(), out)
	}
}

var (
	exportVar    = regexp.MustCompile(`\b(LANES_[A-Z_]+)=`)
	etcdExport   = regexp.MustCompile(`export LANES_REGISTRY=etcd://[^\n` + "`" + `]*`)
	adminExport2 = regexp.MustCompile(`export LANES_REGISTRY=http://[^\n` + "`" + `]*`)
)

// names lists the variables an export line sets, in order.
func names(line string) string {
	var out []string
	for _, m := range exportVar.FindAllStringSubmatch(line, -1) {
		out = append(out, m[1])
	}
	return strings.Join(out, " ")
}

// checkExportLines holds every export line of README.md and docs/*.md to
// the lines `lanes up` printed (upOut): the same variables, in the same
// order, for a service that reaches etcd and for one that registers
// through the admin API (over http://).
func checkExportLines(t *testing.T, upOut string) {
	t.Helper()
	wantEtcd, wantAdmin := names(etcdExport.FindString(upOut)), names(adminExport2.FindString(upOut))
	if wantEtcd == "" || wantAdmin == "" {
		t.Fatalf("lanes up printed no export lines:\n%s", upOut)
	}
	files, _ := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	files = append(files, filepath.Join(root, "README.md"))
	seen := 0
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range etcdExport.FindAllString(string(data), -1) {
			seen++
			if got := names(l); got != wantEtcd {
				t.Errorf("%s: %q sets %s; lanes up prints %s", filepath.Base(f), l, got, wantEtcd)
			}
		}
		for _, l := range adminExport2.FindAllString(string(data), -1) {
			if got := names(l); got != wantAdmin {
				t.Errorf("%s: %q sets %s; lanes up prints %s", filepath.Base(f), l, got, wantAdmin)
			}
		}
	}
	if seen == 0 {
		t.Error("no export line in README.md or docs/*.md")
	}
}

// runMQ runs the complete program of docs/mq.md as written, a baseline and
// an alice instance, with the environment that `lanes up` printed (env,
// LANES_NATS among it): an order published in lane alice is billed by the
// alice instance and its invoice published in lane alice; a baseline order
// is billed by the baseline instance. Without LANES_NATS the program ends
// with lanesnats.ErrNoConnection, logged at ERROR.
func runMQ(t *testing.T, tmp string, env []string) {
	t.Helper()
	prog := program(t, "docs/mq.md")
	dir := filepath.Join(tmp, "billing")
	os.MkdirAll(dir, 0o755)
	os.WriteFile(filepath.Join(dir, "main.go"), []byte(prog.code), 0o644)
	bin := filepath.Join(dir, "bin")
	if out, err := goCmd(t, "build", "-o", bin, filepath.Join(dir, "main.go")); err != nil {
		t.Fatalf("build %s: %v\n%s", prog.where(), err, out)
	}
	natsURL := ""
	var noNats []string
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "LANES_NATS="); ok {
			natsURL = v
			continue
		}
		noNats = append(noNats, kv)
	}
	if natsURL == "" {
		t.Fatalf("lanes up printed no LANES_NATS: %v", env)
	}

	without := start(t, "billing (no LANES_NATS)", noNats, bin)
	without.WaitExit()
	if out := without.Stdout.String(); without.ExitCode() != 1 ||
		!regexp.MustCompile(`level=ERROR msg="billing stopped" err="lanesnats: no NATS connection: set LANES_NATS`).MatchString(out) {
		t.Errorf("billing without LANES_NATS: exit %d, want 1 and the missing variable named at ERROR:\n%s", without.ExitCode(), out)
	}

	base := start(t, "billing (baseline)", env, bin)
	alice := start(t, "billing (alice)", append(env, "LANES_LANE=alice"), bin)
	base.WaitOutput(`msg="lanes: consumer registered"`)
	alice.WaitOutput(`msg="lanes: consumer registered"`)
	defer stop(t, base)
	defer stop(t, alice)

	nc, err := nats.Connect(natsURL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := lanesnats.NewPublisher(js, "orders")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if _, err := pub.Publish(lane.WithLane(ctx, "alice"), "created", []byte("A1")); err != nil {
		t.Fatal(err)
	}
	if _, err := pub.Publish(ctx, "created", []byte("B1")); err != nil {
		t.Fatal(err)
	}
	alice.WaitOutput(`msg="order billed" lane=alice`)
	base.WaitOutput(`msg="order billed" lane="" seq=`)
	if out := alice.Stdout.String(); !strings.Contains(out, "order=A1") || strings.Contains(out, "order=B1") {
		t.Errorf("the alice instance billed other orders than alice's:\n%s", out)
	}
	if out := base.Stdout.String(); !strings.Contains(out, "order=B1") || strings.Contains(out, "order=A1") {
		t.Errorf("the baseline instance billed other orders than the baseline's:\n%s", out)
	}
	// The invoice stays in the order's lane.
	eventually(t, "the invoice of A1 in lane alice", func() string {
		st, err := js.Stream(ctx, "invoices")
		if err != nil {
			return err.Error()
		}
		m, err := st.GetLastMsgForSubject(ctx, lanesnats.Subject("invoices", "alice", "invoiced"))
		if err != nil {
			return err.Error()
		}
		if string(m.Data) != "A1" {
			return "data " + string(m.Data)
		}
		return ""
	})
}

// eventually polls f until it returns "" or wait passes.
func eventually(t *testing.T, what string, f func() string) {
	t.Helper()
	timing.Eventually(t, what, wait, f)
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
