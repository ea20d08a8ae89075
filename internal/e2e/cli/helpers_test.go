package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lanesdev/lanes/adminapi"
	"github.com/lanesdev/lanes/adminclient"
	"github.com/lanesdev/lanes/etcdstore"
	"github.com/lanesdev/lanes/internal/testkit/childproc"
	"github.com/lanesdev/lanes/internal/testkit/timing"
	"github.com/lanesdev/lanes/registry"
)

// quiet drops the logs of in-test clients (a lease refused on purpose).
var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// wait bounds every poll: generous, for a loaded 2-core machine under -race.
const wait = 30 * time.Second

// start runs the lanes binary with args; the process is killed at cleanup
// if it still runs, and its output is logged when the test failed.
func start(t *testing.T, args ...string) *childproc.Child {
	t.Helper()
	return startEnv(t, nil, args...)
}

// startEnv is start with more environment variables (KEY=value).
func startEnv(t *testing.T, env []string, args ...string) *childproc.Child {
	t.Helper()
	return startEnvIn(t, "", env, args...)
}

// startEnvIn is startEnv in directory dir ("" for the test's own).
func startEnvIn(t *testing.T, dir string, env []string, args ...string) *childproc.Child {
	t.Helper()
	return startProg(t, dir, env, []string{binary}, args...)
}

// startProg is startEnvIn running argv (the binary, or a command that
// execs it such as prlimit) with args.
func startProg(t *testing.T, dir string, env []string, argv []string, args ...string) *childproc.Child {
	t.Helper()
	return childproc.Start(t, childproc.Spec{
		Name: "lanes " + strings.Join(args[:min(2, len(args))], " "),
		Argv: append(argv[:len(argv):len(argv)], args...),
		Dir:  dir, Env: env, Wait: wait, Tail: 6000,
	})
}

// run runs the lanes binary to completion.
func run(t *testing.T, stdin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	return runIn(t, "", stdin, args...)
}

// runIn is run in folder dir ("" for the test's own).
func runIn(t *testing.T, dir, stdin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	cmd := exec.Command(binary, args...)
	cmd.Dir = dir
	cmd.Env = childproc.Environ()
	cmd.Stdin = strings.NewReader(stdin)
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatal(err)
	}
	return childproc.ExitCode(err), out.String(), errb.String()
}

// up is a running `lanes up` (or `lanes demo`).
type up struct {
	*childproc.Child
	dataDir string
	etcd    string
	admin   string
	gateway string
	traces  string // the trace collector's OTLP/gRPC address
	token   string // the admin token
}

var addrLine = regexp.MustCompile(`(?m)^(etcd|admin|gateway|traces)\s+((?:http://)?\S+)`)

// startUp starts `lanes <cmd>` on free loopback ports with a fresh data
// directory, and waits until it is up.
func startUp(t *testing.T, cmd string, extra ...string) *up {
	t.Helper()
	return startUpEnv(t, nil, cmd, extra...)
}

// startUpEnv is startUp with more environment variables.
func startUpEnv(t *testing.T, env []string, cmd string, extra ...string) *up {
	t.Helper()
	return startUpDir(t, t.TempDir(), env, cmd, extra...)
}

// startUpDir is startUpEnv with the data directory dir.
func startUpDir(t *testing.T, dir string, env []string, cmd string, extra ...string) *up {
	t.Helper()
	return startUpArgv(t, dir, env, []string{binary}, cmd, extra...)
}

// startUpArgv is startUpDir running argv (see startProg).
func startUpArgv(t *testing.T, dir string, env []string, argv []string, cmd string, extra ...string) *up {
	t.Helper()
	args := append([]string{cmd,
		"--data-dir", dir,
		"--admin-addr", "127.0.0.1:0",
		"--gateway-addr", "127.0.0.1:0",
		"--etcd-client-addr", "127.0.0.1:0",
		"--etcd-peer-addr", "127.0.0.1:0",
		"--nats-addr", "127.0.0.1:0",
		"--otlp-grpc-addr", "127.0.0.1:0",
		"--otlp-http-addr", "127.0.0.1:0",
		"--log-level", "warn",
	}, extra...)
	u := &up{Child: startProg(t, "", env, argv, args...), dataDir: dir}
	out := u.WaitOutput("lanes is up.")
	for _, m := range addrLine.FindAllStringSubmatch(out, -1) {
		switch m[1] {
		case "etcd":
			u.etcd = strings.Split(m[2], ",")[0]
		case "admin":
			u.admin = m[2]
		case "gateway":
			u.gateway = m[2]
		case "traces":
			u.traces = m[2]
		}
	}
	if u.etcd == "" || u.admin == "" || u.gateway == "" {
		t.Fatalf("addresses missing from the output:\n%s", out)
	}
	tok, err := os.ReadFile(filepath.Join(dir, "admin-token"))
	if err != nil {
		t.Fatalf("admin token: %v", err)
	}
	if fi, _ := os.Stat(filepath.Join(dir, "admin-token")); fi.Mode().Perm() != 0o600 {
		t.Errorf("admin-token mode %v, want 0600", fi.Mode().Perm())
	}
	u.token = strings.TrimSpace(string(tok))
	t.Cleanup(func() {
		select {
		case <-u.Exited():
			return
		default:
		}
		if code := u.Stop(syscall.SIGTERM); code != 0 {
			t.Errorf("lanes %s exited with %d after SIGTERM, want 0", cmd, code)
		}
	})
	return u
}

// etcdConfig returns the configuration of a client of u's etcd with the
// key prefix: as root, with the password lanes up keeps in its data
// directory, when it runs the embedded etcd with authentication on.
func (u *up) etcdConfig(t *testing.T, prefix string) etcdstore.Config {
	t.Helper()
	cfg := etcdstore.Config{Endpoints: []string{u.etcd}, Options: etcdstore.Options{Prefix: prefix, Logger: quiet}}
	if pw, err := os.ReadFile(filepath.Join(u.dataDir, "etcd-password")); err == nil {
		cfg.Username, cfg.Password = "root", strings.TrimSpace(string(pw))
	}
	return cfg
}

// cli runs a client command against u with the admin token.
func (u *up) cli(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	return run(t, "", append(args, "--admin", u.admin, "--token", u.token)...)
}

// client returns an admin API client with token.
func (u *up) client(t *testing.T, token string) *adminclient.Client {
	t.Helper()
	c, err := adminclient.New(u.admin, token)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// register registers inst through the admin API with token; the lease is
// closed at cleanup.
func (u *up) register(t *testing.T, token string, inst registry.Instance) registry.Lease {
	t.Helper()
	reg := adminclient.NewRegistry(u.client(t, token), adminclient.WithLogger(quiet))
	t.Cleanup(func() { reg.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	l, err := reg.Register(ctx, inst, 3*time.Second)
	if err != nil {
		t.Fatalf("register %s/%s in %q: %v", inst.Service, inst.ID, inst.Lane, err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func (u *up) newToken(t *testing.T, req adminapi.TokenRequest) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	tok, err := u.client(t, u.token).CreateToken(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	return tok.Secret
}

// backend is an HTTP server that says who it is.
type backend struct {
	name string
	addr string
}

type answer struct {
	Backend string `json:"backend"`
	Lane    string `json:"lane"`  // the x-lane header it received
	Path    string `json:"path"`  // the path it received
	Proto   string `json:"proto"` // the X-Forwarded-Proto it received
	Status  int    `json:"-"`
	Served  string `json:"-"` // the gateway's X-Lane-Served
	Body    string `json:"-"`
}

func newBackend(t *testing.T, name string) *backend {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(answer{Backend: name, Lane: r.Header.Get("X-Lane"), Path: r.URL.Path, Proto: r.Header.Get("X-Forwarded-Proto")})
	})}
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.Serve(ln)
	}()
	t.Cleanup(func() {
		srv.Close()
		<-done
	})
	return &backend{name: name, addr: ln.Addr().String()}
}

// clientFrom returns an HTTP client whose connections come from the
// loopback address ip (any 127.0.0.0/8 address works on Linux).
func clientFrom(t *testing.T, ip string) *http.Client {
	tr := &http.Transport{DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}).DialContext}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

// get sends GET url through c, after edit, and decodes the backend's answer.
func get(t *testing.T, c *http.Client, url string, edit func(*http.Request)) answer {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	if edit != nil {
		edit(req)
	}
	resp, err := c.Do(req)
	if err != nil {
		return answer{Body: err.Error()}
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var a answer
	json.Unmarshal(body, &a)
	a.Status, a.Served, a.Body = resp.StatusCode, resp.Header.Get("X-Lane-Served"), string(body)
	return a
}

// eventually polls f until it returns "" (success) or wait passes; then it
// fails with f's last message.
func eventually(t *testing.T, what string, f func() string) {
	t.Helper()
	timing.Eventually(t, what, wait, f)
}

// expectBackend polls until requests edited by edit reach backend want.
func expectBackend(t *testing.T, c *http.Client, url, want string, edit func(*http.Request)) answer {
	t.Helper()
	var a answer
	eventually(t, "request reaching "+want, func() string {
		a = get(t, c, url, edit)
		if a.Status == http.StatusOK && a.Backend == want {
			return ""
		}
		return fmt.Sprintf("status %d, backend %q, body %q", a.Status, a.Backend, a.Body)
	})
	return a
}

func header(k, v string) func(*http.Request) {
	return func(r *http.Request) { r.Header.Set(k, v) }
}
