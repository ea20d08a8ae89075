package cli

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/lanesdev/lanes/registry"
)

// expect checks an exit code and that stderr (or stdout) contains want.
func expect(t *testing.T, what string, code int, stdout, stderr string, wantCode int, want ...string) {
	t.Helper()
	if code != wantCode {
		t.Errorf("%s: exit %d, want %d\nstdout: %s\nstderr: %s", what, code, wantCode, stdout, stderr)
		return
	}
	for _, w := range want {
		if !strings.Contains(stdout+stderr, w) {
			t.Errorf("%s: output lacks %q\nstdout: %s\nstderr: %s", what, w, stdout, stderr)
		}
	}
}

// TestVersionAndHelp: lanes version and --version print the module version
// and the revision (or say it is unknown); --help documents the exit codes
// and shell completion, and completion works.
func TestVersionAndHelp(t *testing.T) {
	code, out, errOut := run(t, "", "version")
	expect(t, "version", code, out, errOut, 0, "lanes ", "revision ", "go1.")
	code, out2, errOut := run(t, "", "--version")
	expect(t, "--version", code, out2, errOut, 0)
	if out != out2 {
		t.Errorf("version %q and --version %q differ", out, out2)
	}
	code, out, errOut = run(t, "", "version", "-o", "json")
	expect(t, "version -o json", code, out, errOut, 0, `"module": "github.com/lanesdev/lanes"`)

	code, out, errOut = run(t, "", "--help")
	expect(t, "--help", code, out, errOut, 0, "Exit status", "0  success", "1  failure", "2  usage or bad input", "lanes completion bash", "-o text")
	code, out, errOut = run(t, "", "completion", "bash")
	expect(t, "completion bash", code, out, errOut, 0, "bash completion")
}

// TestBadFlagValues: a bad flag value exits 2 and names the flag as typed.
func TestBadFlagValues(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"lane", "expire", "alice", "--in", "soon"}, `"--in"`},
		{[]string{"lane", "expire", "alice", "--in", "-5h"}, "--in -5h0m0s: want a positive duration"},
		{[]string{"lane", "expire", "alice", "--at", "tomorrow"}, `--at "tomorrow"`},
		{[]string{"ls", "-o", "xml"}, `-o "xml": want text, json or yaml`},
		{[]string{"ls", "--service", "Bad Name"}, `--service "Bad Name"`},
		{[]string{"simulate", "-o", "xml", "x.yaml"}, `-o "xml"`},
		{[]string{"route", "explain", "orders", "-o", "table2"}, `-o "table2"`},
		{[]string{"dev", "--service", "s", "--lane", "alice", "--addr", "nope"}, `--addr "nope"`},
		{[]string{"dev", "--service", "s", "--lane", "alice", "--addr", "127.0.0.1:1", "--log-format", "xml"}, `--log-format "xml"`},
		{[]string{"policy", "apply", "a.yaml", "-f", "b.yaml"}, "give the document once"},
		{[]string{"up", "--log-format", "xml"}, `--log-format: "xml": want text or json`},
	} {
		code, out, errOut := run(t, "", tc.args...)
		expect(t, strings.Join(tc.args, " "), code, out, errOut, 2, tc.want)
	}
}

// TestClientRules runs the client commands against a `lanes up` the way a
// user does: from the folder whose .lanes is the data directory, without
// --admin or --token.
func TestClientRules(t *testing.T) {
	work := t.TempDir()
	dataDir := filepath.Join(work, ".lanes")
	u := startUpDir(t, dataDir, nil, "up")
	addr, err := os.ReadFile(filepath.Join(dataDir, "admin-addr"))
	if err != nil || strings.TrimSpace(string(addr)) != u.admin {
		t.Fatalf("admin-addr: %q %v, want %s", addr, err, u.admin)
	}

	u.register(t, u.token, registry.Instance{Service: "orders", ID: "orders-1", Addr: "127.0.0.1:1"})
	u.register(t, u.token, registry.Instance{Service: "orders", ID: "orders-alice", Addr: "127.0.0.1:2", Lane: "alice"})
	u.register(t, u.token, registry.Instance{Service: "web", ID: "web-1", Addr: "127.0.0.1:3"})

	// From the folder: the address and token come from ./.lanes.
	code, out, errOut := runIn(t, work, "", "ls", "--service", "orders")
	expect(t, "ls --service orders from the folder", code, out, errOut, 0, "orders-alice", "orders-1")
	if strings.Contains(out, "web-1") {
		t.Errorf("ls --service orders lists web:\n%s", out)
	}
	code, out, errOut = runIn(t, work, "", "ls", "-o", "yaml")
	expect(t, "ls -o yaml", code, out, errOut, 0, "instances:", "id: orders-alice")

	// No token anywhere: the error names the file looked for.
	elsewhere := t.TempDir()
	code, out, errOut = runIn(t, elsewhere, "", "token", "ls", "--admin", u.admin)
	expect(t, "token ls without a token", code, out, errOut, 1, "no token", filepath.Join(elsewhere, ".lanes", "admin-token"))

	// Typos are caught, unless --force.
	code, out, errOut = runIn(t, work, "", "lane", "expire", "nosuchlane", "--in", "1h")
	expect(t, "lane expire nosuchlane", code, out, errOut, 1, `no instance, policy entry or client claim has lane "nosuchlane"`)
	code, out, errOut = runIn(t, work, "", "lane", "expire", "nosuchlane", "--in", "1h", "--force")
	expect(t, "lane expire nosuchlane --force", code, out, errOut, 0, "lane nosuchlane expires at")
	code, out, errOut = runIn(t, work, "", "lane", "expire", "alice", "--in", "72h")
	expect(t, "lane expire alice", code, out, errOut, 0, "lane alice expires at")
	code, out, errOut = runIn(t, work, "", "route", "explain", "nosuch")
	expect(t, "route explain nosuch", code, out, errOut, 1, `no service is named "nosuch"`)
	code, out, errOut = runIn(t, work, "", "route", "explain", "nosuch", "--force")
	expect(t, "route explain nosuch --force", code, out, errOut, 1, "no_instance")
	code, out, errOut = runIn(t, work, "", "route", "explain", "orders", "--lane", "bob")
	expect(t, "route explain orders --lane bob", code, out, errOut, 1, `no instance, policy entry or client claim has lane "bob"`)
	code, out, errOut = runIn(t, work, "", "route", "explain", "orders", "--lane", "bob", "--force")
	expect(t, "route explain orders --lane bob --force", code, out, errOut, 0, "orders-1")
	code, out, errOut = runIn(t, work, "", "ls", "--service", "nosuch")
	expect(t, "ls --service nosuch", code, out, errOut, 1, `no service is named "nosuch"`)
	code, out, errOut = runIn(t, work, "", "ls", "--service", "nosuch", "--force")
	expect(t, "ls --service nosuch --force", code, out, errOut, 0)
	code, out, errOut = runIn(t, work, "", "route", "explain", "orders", "--lane", "alice", "-o", "yaml")
	expect(t, "route explain -o yaml", code, out, errOut, 0, "service: orders", "lane: alice")

	// policy validate and apply take FILE as an argument; --dry-run
	// prints the routes that change and applies nothing.
	pol := filepath.Join(work, "policy.yaml")
	os.WriteFile(pol, []byte("lanes:\n  bob:\n    fallback: [alice]\n"), 0o644)
	code, out, errOut = runIn(t, work, "", "policy", "validate", pol)
	expect(t, "policy validate FILE", code, out, errOut, 0, pol+": valid")
	code, out, errOut = runIn(t, work, "", "policy", "validate", "--offline", "-f", pol)
	expect(t, "policy validate -f FILE", code, out, errOut, 0, pol+": valid")
	code, out, errOut = runIn(t, work, "", "policy", "apply", "--dry-run", pol)
	expect(t, "policy apply --dry-run", code, out, errOut, 0, "nothing applied", "1 route(s) would change")
	if !regexp.MustCompile(`(?m)^orders\s+bob\s+\(baseline\): orders-1.*\s+alice: orders-alice`).MatchString(out) {
		t.Errorf("dry run does not show orders/bob moving to alice:\n%s", out)
	}
	code, out, errOut = runIn(t, work, "", "policy", "get", "-o", "json")
	expect(t, "policy get after the dry run", code, out, errOut, 0, `"revision"`)
	if strings.Contains(out, "bob") {
		t.Errorf("the dry run applied the policy:\n%s", out)
	}
	code, out, errOut = runIn(t, work, "", "policy", "apply", pol)
	expect(t, "policy apply FILE", code, out, errOut, 0, "policy applied")
	code, out, errOut = runIn(t, work, "", "policy", "apply", "--dry-run", pol)
	expect(t, "policy apply --dry-run, same document", code, out, errOut, 0, "no service or lane route changes")

	// simulate --live turns today's fleet and policy into a scenario that
	// passes; with another policy its failures are the routes that change.
	code, out, errOut = runIn(t, work, "", "simulate", "--live")
	expect(t, "simulate --live", code, out, errOut, 0, "instances:", "id: orders-alice", "fallback:")
	fleet := filepath.Join(work, "fleet.yaml")
	os.WriteFile(fleet, []byte(out), 0o644)
	code, out, errOut = runIn(t, work, "", "simulate", fleet)
	expect(t, "simulate the live fleet", code, out, errOut, 0, "ok   "+fleet)
	empty := filepath.Join(work, "empty.yaml")
	os.WriteFile(empty, []byte("lanes: {}\n"), 0o644)
	code, out, errOut = runIn(t, work, "", "simulate", "--live", "--policy", empty)
	expect(t, "simulate --live --policy", code, out, errOut, 0, "instances:", "id: orders-alice")
	try := filepath.Join(work, "try.yaml")
	os.WriteFile(try, []byte(out), 0o644)
	code, out, errOut = runIn(t, work, "", "simulate", try)
	expect(t, "simulate the live fleet with another policy", code, out, errOut, 1, "FAIL "+try, "1 failed", "orders-alice")

	// A refused field names the flag.
	code, out, errOut = runIn(t, work, "", "token", "create", "--lane", "-bad")
	expect(t, "token create --lane -bad", code, out, errOut, 2, "--lane")
	code, out, errOut = runIn(t, work, "", "token", "create", "--lane", "alice", "--max-instances", "-1")
	expect(t, "token create --max-instances -1", code, out, errOut, 2, "--max-instances -1")
	code, out, errOut = runIn(t, work, "", "token", "create", "--lane", "alice", "--max-instances", "3")
	expect(t, "token create --max-instances 3", code, out, errOut, 0, "lanes_")

	// ls -w lists again at every change, until SIGTERM.
	w := startEnvIn(t, work, nil, "ls", "-w", "--service", "orders")
	w.WaitOutput("orders-alice")
	u.register(t, u.token, registry.Instance{Service: "orders", ID: "orders-bob", Addr: "127.0.0.1:4", Lane: "bob"})
	w.WaitOutput("orders-bob")
	if code := w.Stop(syscall.SIGTERM); code != 0 {
		t.Errorf("ls -w after SIGTERM: exit %d", code)
	}

	// Stopping lanes up removes the admin-addr file.
	if code := u.Stop(syscall.SIGTERM); code != 0 {
		t.Errorf("lanes up: exit %d", code)
	}
	if _, err := os.Stat(filepath.Join(dataDir, "admin-addr")); !os.IsNotExist(err) {
		t.Errorf("admin-addr after stop: %v", err)
	}
}

// TestDemoCommandsWork: the commands lanes demo prints run as printed.
func TestDemoCommandsWork(t *testing.T) {
	u := startUp(t, "demo")
	out := u.Stdout.String()
	var ran int
	for _, l := range strings.Split(out, "\n") {
		l = strings.TrimSpace(l)
		if !strings.HasPrefix(l, binary+" ") {
			continue
		}
		args := strings.Fields(strings.TrimPrefix(l, binary+" "))
		code, stdout, stderr := run(t, "", args...)
		expect(t, l, code, stdout, stderr, 0)
		ran++
	}
	if ran < 2 {
		t.Errorf("the demo printed %d lanes commands:\n%s", ran, out)
	}
	if !strings.Contains(out, "export LANES_REGISTRY=etcd://"+strings.TrimPrefix(u.etcd, "http://")) {
		t.Errorf("the demo does not print the export line for %s:\n%s", u.etcd, out)
	}
}

// TestUpLogFormat: --log-format json makes lanes up log JSON lines.
func TestUpLogFormat(t *testing.T) {
	u := startUp(t, "up", "--log-level", "info", "--log-format", "json")
	eventually(t, "a JSON log line", func() string {
		for _, l := range strings.Split(u.Stderr.String(), "\n") {
			if strings.HasPrefix(l, `{"time":`) && strings.Contains(l, `"level":"INFO"`) {
				return ""
			}
		}
		return u.Stderr.String()
	})
}

// TestStartupProgress: lanes up and lanes demo say what they start and
// what they wait for.
func TestStartupProgress(t *testing.T) {
	for _, cmd := range []string{"up", "demo"} {
		u := startUp(t, cmd)
		// The process writes these lines before "lanes is up." on stdout,
		// but its stderr is copied into u.Stderr apart: wait for the last
		// ones.
		for _, last := range []string{"lanes: starting the admin API on 127.0.0.1:0", "lanes: starting the sample services"} {
			if last == "lanes: starting the sample services" && cmd != "demo" {
				continue
			}
			eventually(t, "stderr to say "+last, func() string {
				if s := u.Stderr.String(); !strings.Contains(s, last) {
					return s
				}
				return ""
			})
		}
		errOut := u.Stderr.String()
		for _, want := range []string{"lanes: starting the embedded etcd (data in ", "waiting for it to serve...",
			"lanes: reading the registry and the policy...", "lanes: starting the trace collector (OTLP/gRPC on 127.0.0.1:0", "lanes: starting the gateway on 127.0.0.1:0", "lanes: starting the admin API on 127.0.0.1:0"} {
			if !strings.Contains(errOut, want) {
				t.Errorf("lanes %s: stderr lacks %q:\n%s", cmd, want, errOut)
			}
		}
		if cmd == "demo" && !strings.Contains(errOut, "lanes: starting the sample services") {
			t.Errorf("lanes demo: stderr lacks the sample services:\n%s", errOut)
		}
	}
}
