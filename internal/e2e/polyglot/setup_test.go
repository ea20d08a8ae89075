package polyglot

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lanesdev/lanes/internal/testkit/childproc"
)

// wait bounds every wait for an event: generous, for Node's and Python's start on a loaded
// 2-core machine.
const wait = 90 * time.Second

// python is Debian's interpreter, for which python3-grpcio is packaged.
const python = "/usr/bin/python3"

var bins struct{ lanes, ledger, dir string }

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "lanes-polyglot-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bins.dir, bins.lanes, bins.ledger = dir, filepath.Join(dir, "lanes"), filepath.Join(dir, "ledger")
	code := childproc.Run(m)
	os.RemoveAll(dir)
	os.Exit(code)
}

// example is the folder of the example's programs.
func example(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs(filepath.Join("..", "..", "..", "examples", "polyglot"))
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// prerequisites skips the test where a language's runtime or packages are missing, and returns
// the node_modules folder of the example's npm packages.
func prerequisites(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: the polyglot chain starts Node and Python processes")
	}
	if _, err := exec.LookPath("node"); err != nil {
		t.Skip("node is not installed (Debian: apt-get install nodejs npm)")
	}
	if out, err := exec.Command(python, "-c", "import grpc, google.protobuf").CombinedOutput(); err != nil {
		t.Skipf("%s cannot import grpc (Debian: apt-get install python3-grpcio): %v\n%s", python, err, out)
	}
	modules := npmPackages(t)
	buildOnce(t)
	return modules
}

// npmPackages returns the node_modules folder holding the example's package-lock.json, from the
// cache that .ci/run fills; it runs npm ci there only when LANES_POLYGLOT_INSTALL=1.
func npmPackages(t *testing.T) string {
	t.Helper()
	cache := os.Getenv("LANES_CI_CACHE")
	if cache == "" {
		base := os.Getenv("XDG_CACHE_HOME")
		if base == "" {
			home, err := os.UserHomeDir()
			if err != nil {
				t.Skipf("no cache folder for the npm packages: %v", err)
			}
			base = filepath.Join(home, ".cache")
		}
		cache = filepath.Join(base, "lanes-ci")
	}
	dir := filepath.Join(cache, "polyglot")
	lock, err := os.ReadFile(filepath.Join(example(t), "package-lock.json"))
	if err != nil {
		t.Fatal(err)
	}
	have, _ := os.ReadFile(filepath.Join(dir, "package-lock.json"))
	_, installed := os.Stat(filepath.Join(dir, "node_modules", ".package-lock.json"))
	if bytes.Equal(have, lock) && installed == nil {
		return filepath.Join(dir, "node_modules")
	}
	if os.Getenv("LANES_POLYGLOT_INSTALL") != "1" {
		t.Skipf("the npm packages of examples/polyglot are not in %s: .ci/run installs them, or set LANES_POLYGLOT_INSTALL=1 for the test to run npm ci there", dir)
	}
	if _, err := exec.LookPath("npm"); err != nil {
		t.Skip("LANES_POLYGLOT_INSTALL=1, but npm is not installed")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"package.json", "package-lock.json"} {
		b, err := os.ReadFile(filepath.Join(example(t), f))
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, f), b, 0o644)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command("npm", "ci", "--no-audit", "--no-fund", "--silent")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("npm ci in %s: %v\n%s", dir, err, out)
	}
	return filepath.Join(dir, "node_modules")
}

// buildOnce builds the lanes binary and the ledger service.
func buildOnce(t *testing.T) {
	t.Helper()
	if _, err := os.Stat(bins.ledger); err == nil {
		return
	}
	for out, pkg := range map[string]string{bins.lanes: "./cmd/lanes", bins.ledger: "./examples/polyglot/ledger"} {
		cmd := exec.Command("go", "build", "-o", out, pkg)
		cmd.Dir = filepath.Join(example(t), "..", "..")
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", pkg, err, b)
		}
	}
}

// start runs argv with env added to the test's environment (less its LANES_, OTEL_, GRPC_ and
// proxy variables), and files as its descriptors 3, 4, ...; its stdout and stderr in one stream.
// It is killed at cleanup if it still runs.
func start(t *testing.T, name string, env []string, files []*os.File, argv ...string) *childproc.Child {
	t.Helper()
	return childproc.Start(t, childproc.Spec{
		Name: name, Argv: argv, Env: env, Drop: []string{"OTEL_", "GRPC_", "HTTP_PROXY=", "HTTPS_PROXY="},
		ExtraFiles: files, OneStream: true, Wait: wait, Tail: 4000,
	})
}

// hop is who served one hop of the chain, as every service of the example answers it.
type hop struct {
	Service string `json:"service"`
	Lane    string `json:"lane"`    // the lane of the instance
	Request string `json:"request"` // the lane the request carried there
}

func (h hop) String() string {
	return fmt.Sprintf("%s@%s(carried %s)", h.Service, name(h.Lane), name(h.Request))
}

func name(l string) string {
	if l == "" {
		return "baseline"
	}
	return l
}

// answer is one call of the chain through the gateway.
type answer struct {
	hops    []hop
	traceID string
	err     error
}

// call sends one request in lane l ("" for the baseline) to the gateway.
func call(client *http.Client, gateway, l string) answer {
	req, err := http.NewRequest(http.MethodGet, gateway+"/order?id=7", nil)
	if err != nil {
		return answer{err: err}
	}
	if l != "" {
		req.Header.Set("x-lane", l)
	}
	res, err := client.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer res.Body.Close()
	body, err := io.ReadAll(io.LimitReader(res.Body, 1<<16))
	a := answer{traceID: res.Header.Get("x-trace-id"), err: err}
	if err == nil && res.StatusCode != http.StatusOK {
		a.err = fmt.Errorf("%s: %s", res.Status, strings.TrimSpace(string(body)))
	} else if err == nil {
		var v struct{ Hops []hop }
		if a.err = json.Unmarshal(body, &v); a.err == nil {
			a.hops = v.Hops
		}
	}
	return a
}

// listen opens a loopback listener on a free port and returns its address and its file, for a
// child process that must be reached at an address known before it starts.
func listen(t *testing.T) (string, *os.File) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	f, err := lis.(*net.TCPListener).File()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return lis.Addr().String(), f
}
