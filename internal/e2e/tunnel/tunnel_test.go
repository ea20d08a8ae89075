package tunnel

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/big"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lanesdev/lanes/adminapi"
	"github.com/lanesdev/lanes/adminclient"
	"github.com/lanesdev/lanes/internal/testkit/childproc"
	"github.com/lanesdev/lanes/internal/testkit/timing"
)

// binary is the lanes command, built once by TestMain.
var binary string

func TestMain(m *testing.M) {
	if role := os.Getenv(roleEnv); role != "" {
		os.Exit(runRole(role))
	}
	childproc.Main(m, &binary)
}

// wait bounds every wait for an event: generous, for a loaded 2-core
// machine.
const wait = 60 * time.Second

// ip runs ip(8) with args.
func ip(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// topology is the test's network: an environment namespace, a laptop
// namespace linked to it by a veth pair (env .1, laptop .2 of a /30), and a
// second link from the test's own namespace to the environment (test .5,
// env .6), for the test's requests to the gateway and the admin API. The
// environment does not forward: the laptop reaches only the environment's
// address on its link, and nothing in the environment reaches the laptop's
// loopback, where its services listen.
type topology struct {
	env, laptop   string // namespace names
	laptopLink    string // the laptop's end of its link
	envOnLaptop   string // the environment's address on the laptop's link (the public address)
	envOnTest     string // the environment's address on the test's link
	suffix, rootV string
}

func newTopology(t *testing.T) *topology {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the tunnel's end-to-end test makes network namespaces: it needs root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("the tunnel's end-to-end test makes network namespaces with ip(8), which is not on PATH")
	}
	var b [3]byte
	rand.Read(b[:])
	sfx := hex.EncodeToString(b[:])
	n1, _ := rand.Int(rand.Reader, big.NewInt(150))
	n2, _ := rand.Int(rand.Reader, big.NewInt(250))
	net := fmt.Sprintf("10.%d.%d.", 100+n1.Int64(), n2.Int64())
	tp := &topology{env: "lanes-env-" + sfx, laptop: "lanes-lap-" + sfx, laptopLink: "ltl" + sfx,
		envOnLaptop: net + "1", envOnTest: net + "6", suffix: sfx, rootV: "ltr" + sfx}
	for _, ns := range []string{tp.env, tp.laptop} {
		ip(t, "netns", "add", ns)
		t.Cleanup(func() { exec.Command("ip", "netns", "delete", ns).Run() })
		ip(t, "-n", ns, "link", "set", "lo", "up")
	}
	t.Cleanup(func() { exec.Command("ip", "link", "delete", tp.rootV).Run() })
	// The laptop's link.
	ip(t, "link", "add", "lte"+sfx, "type", "veth", "peer", "name", tp.laptopLink)
	ip(t, "link", "set", "lte"+sfx, "netns", tp.env)
	ip(t, "link", "set", tp.laptopLink, "netns", tp.laptop)
	ip(t, "-n", tp.env, "addr", "add", net+"1/30", "dev", "lte"+sfx)
	ip(t, "-n", tp.laptop, "addr", "add", net+"2/30", "dev", tp.laptopLink)
	ip(t, "-n", tp.env, "link", "set", "lte"+sfx, "up")
	ip(t, "-n", tp.laptop, "link", "set", tp.laptopLink, "up")
	// The test's link.
	ip(t, "link", "add", tp.rootV, "type", "veth", "peer", "name", "ltg"+sfx)
	ip(t, "link", "set", "ltg"+sfx, "netns", tp.env)
	ip(t, "addr", "add", net+"5/30", "dev", tp.rootV)
	ip(t, "-n", tp.env, "addr", "add", net+"6/30", "dev", "ltg"+sfx)
	ip(t, "link", "set", tp.rootV, "up")
	ip(t, "-n", tp.env, "link", "set", "ltg"+sfx, "up")
	return tp
}

// start runs argv in the network namespace ns, with env added to the
// test's environment; at cleanup it is stopped with SIGTERM.
func start(t *testing.T, name, ns string, env []string, argv ...string) *childproc.Child {
	t.Helper()
	return childproc.Start(t, childproc.Spec{
		Name: name, Argv: append([]string{"ip", "netns", "exec", ns}, argv...), Env: env,
		Wait: wait, Tail: 8000, StopSignal: syscall.SIGTERM,
	})
}

// eventually polls f until it holds.
func eventually(t *testing.T, what string, f func() (bool, string)) {
	t.Helper()
	timing.Eventually(t, what, wait, func() string {
		if ok, last := f(); !ok {
			return "last: " + last
		}
		return ""
	})
}

// get asks the gateway for path in lane l ("" for none).
func get(client *http.Client, url, l string) (answer, error) {
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	if l != "" {
		req.Header.Set("x-lane", l)
	}
	res, err := client.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer res.Body.Close()
	var a answer
	if res.StatusCode != http.StatusOK {
		var b strings.Builder
		fmt.Fprintf(&b, "HTTP %d", res.StatusCode)
		return a, fmt.Errorf("%s", b.String())
	}
	if err := json.NewDecoder(res.Body).Decode(&a); err != nil {
		return a, err
	}
	return a, nil
}

var (
	adminLine   = regexp.MustCompile(`(?m)^admin\s+http://\S+:(\d+)`)
	gatewayLine = regexp.MustCompile(`(?m)^gateway\s+(http://\S+)`)
	natsLine    = regexp.MustCompile(`(?m)^nats\s+(nats://\S+)`)
)

// TestLaptopThroughTunnel is the developer's laptop behind NAT: a service on
// the laptop's loopback joins lane alice through `lanes dev` and its
// tunnel, with only the control plane's public address reachable.
func TestLaptopThroughTunnel(t *testing.T) {
	tp := newTopology(t)
	dir := t.TempDir()
	up := start(t, "lanes up", tp.env, nil, binary, "up", "--data-dir", dir,
		"--admin-addr", "0.0.0.0:0", "--gateway-addr", tp.envOnTest+":0",
		"--etcd-client-addr", "127.0.0.1:0", "--etcd-peer-addr", "127.0.0.1:0", "--nats-addr", "127.0.0.1:0",
		"--otlp-grpc-addr", "127.0.0.1:0", "--otlp-http-addr", "127.0.0.1:0", "--route", "/=web", "--log-level", "info")
	out := up.WaitOutput("lanes is up.")
	adminPort := adminLine.FindStringSubmatch(out)[1]
	gateway := gatewayLine.FindStringSubmatch(out)[1]
	natsURL := natsLine.FindStringSubmatch(out)[1]
	tokB, err := os.ReadFile(filepath.Join(dir, "admin-token"))
	if err != nil {
		t.Fatal(err)
	}
	adminTok := strings.TrimSpace(string(tokB))
	admin, err := adminclient.New("http://"+tp.envOnTest+":"+adminPort, adminTok)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	laneTok, err := admin.CreateToken(ctx, adminapi.TokenRequest{Lane: testLane, Name: "laptop"})
	if err != nil {
		t.Fatal(err)
	}

	self, _ := os.Executable()
	envProc := start(t, "env services", tp.env, []string{roleEnv + "=env", "LANES_REGISTRY=http://127.0.0.1:" + adminPort,
		"LANES_TOKEN=" + adminTok, "LANES_NATS=" + natsURL, "LANES_LOG_LEVEL=warn"}, self)
	envProc.WaitOutput("ready")

	dev := start(t, "lanes dev", tp.laptop, []string{roleEnv + "=laptop", "LANES_TOKEN=" + laneTok.Secret, "LANES_LOG_LEVEL=warn"},
		binary, "dev", "--admin", "http://"+tp.envOnLaptop+":"+adminPort, "--service", "web", "--lane", testLane,
		"--addr", laptopAddr, "--id", "laptop-web", "--", self)
	devOut := dev.WaitOutput("laptop serving")
	for _, want := range []string{"through a tunnel to", "LANES_DIAL=http://127.0.0.1:", "LANES_NATS=nats://127.0.0.1:"} {
		if !strings.Contains(devOut, want) {
			t.Errorf("lanes dev's output lacks %q:\n%s", want, devOut)
		}
	}

	client := &http.Client{Timeout: 20 * time.Second}
	defer client.CloseIdleConnections()

	// The lane's requests reach the laptop; its calls reach the
	// environment through the tunnel: orders falls back to the baseline,
	// greeter has an instance in the lane.
	var a answer
	eventually(t, "a lane request served by the laptop", func() (bool, string) {
		a, err = get(client, gateway+"/", testLane)
		return err == nil && a.By == "laptop" && a.Err == "", fmt.Sprintf("%+v %v", a, err)
	})
	if a.Lane != testLane || a.Orders != "env-orders@"+testLane || a.Greeter != "env-greeter@"+testLane || a.Proxied != "env-orders@"+testLane {
		t.Errorf("lane request: %+v; want the laptop in lane %s, orders from the baseline (env-orders@%s) with the SDK and through lanes dev's proxy, greeter from the lane (env-greeter@%s)", a, testLane, testLane, testLane)
	}
	// The baseline never reaches the laptop.
	for range 20 {
		a, err := get(client, gateway+"/", "")
		if err != nil || a.By != "env-web" {
			t.Fatalf("baseline request: %+v %v; want env-web", a, err)
		}
	}
	// NATS: a message in the lane reaches the laptop's consumer; one in the
	// baseline, the environment's.
	eventually(t, "the laptop's consumer owns the lane", func() (bool, string) {
		id := fmt.Sprintf("m-%d", time.Now().UnixNano())
		if a, err := get(client, gateway+"/publish?lane="+testLane+"&msg="+id, ""); err != nil || a.Err != "" {
			return false, fmt.Sprintf("publish: %+v %v", a, err)
		}
		for range 40 {
			h, err := get(client, gateway+"/handled", testLane)
			if err == nil && slices.Contains(h.Handled, id) {
				return true, ""
			}
			time.Sleep(50 * time.Millisecond)
		}
		return false, "the laptop did not handle " + id
	})
	if a, err := get(client, gateway+"/publish?lane=&msg=base-1", ""); err != nil || a.Err != "" {
		t.Fatalf("publish in the baseline: %+v %v", a, err)
	}
	eventually(t, "the environment's consumer handles the baseline's message", func() (bool, string) {
		h, err := get(client, gateway+"/handled", "")
		return err == nil && slices.Contains(h.Handled, "base-1"), fmt.Sprintf("%+v %v", h, err)
	})
	if h, _ := get(client, gateway+"/handled", testLane); slices.Contains(h.Handled, "base-1") {
		t.Errorf("the laptop handled the baseline's message: %v", h.Handled)
	}
	if !strings.Contains(dev.Stdout.String(), "lanes dev: ← HTTP/1.1 GET / lane="+testLane+" trace=") {
		t.Errorf("lanes dev did not print the lane's requests:\n%s", dev.Stdout.String())
	}
	if strings.Contains(dev.Stdout.String(), "lane=(none)") {
		t.Errorf("a request without a lane reached the laptop:\n%s", dev.Stdout.String())
	}
	insts, err := admin.Instances(ctx, "web")
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range insts {
		if in.ID == "laptop-web" && (in.Labels["lanes.path"] != "tunnel" || in.Labels["lanes.tunnel.from"] != strings.TrimSuffix(tp.envOnLaptop, "1")+"2") {
			t.Errorf("the tunnel's instance: labels %v; want lanes.path tunnel, from the laptop's address", in.Labels)
		}
	}

	// The link drops under a request every 100 ms; the lane falls back to
	// the baseline, and the laptop serves again once the link is back.
	tr := startTraffic(client, gateway+"/", testLane)
	defer tr.stop()
	tr.wait(t, "the laptop serving the steady traffic", time.Time{}, "laptop")
	cut := time.Now()
	ip(t, "-n", tp.laptop, "link", "set", tp.laptopLink, "down")
	fellBack := tr.wait(t, "fallback to the baseline after the cut", cut, "env-web")
	dev.WaitOutput("the tunnel to")
	restored := time.Now()
	ip(t, "-n", tp.laptop, "link", "set", tp.laptopLink, "up")
	back := tr.wait(t, "the laptop serving again after the link returned", restored, "laptop")
	tr.stop()
	failed := tr.failures(cut)
	t.Logf("link cut: traffic fell back to the baseline %.2fs after the cut; the laptop served again %.2fs after the link returned; %d of %d requests failed",
		fellBack.Sub(cut).Seconds(), back.Sub(restored).Seconds(), len(failed), tr.count(cut))
	for _, s := range failed {
		t.Logf("  failed: sent %+.2fs after the cut: %s", s.sent.Sub(cut).Seconds(), s.err)
	}
	if d := fellBack.Sub(cut); d > 10*time.Second {
		t.Errorf("the lane fell back %s after the cut; want within the registration's TTL (10s)", d)
	}
	if !strings.Contains(dev.Stdout.String(), "the tunnel is back") {
		t.Errorf("lanes dev did not say it reconnected:\n%s", dev.Stdout.String())
	}

	// Ctrl-C deregisters at once.
	dev.Stop(syscall.SIGINT)
	if !strings.Contains(dev.Stdout.String(), "lanes dev: web/laptop-web deregistered") {
		t.Errorf("lanes dev did not confirm the deregistration:\n%s", dev.Stdout.String())
	}
	ctx2, cancel2 := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel2()
	insts, err = admin.Instances(ctx2, "web")
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range insts {
		if in.ID == "laptop-web" {
			t.Errorf("laptop-web is still registered after lanes dev ended: %+v", in)
		}
	}
	// lanes up stops at once: the tunnel's end closes what it relayed,
	// even a connection whose caller keeps it open (the gateway's idle
	// keep-alive one to the laptop).
	stopped := time.Now()
	up.Signal(syscall.SIGTERM)
	select {
	case <-up.Exited():
		t.Logf("lanes up stopped %v after SIGTERM", time.Since(stopped).Round(time.Millisecond))
		if code := up.ExitCode(); code != 0 {
			t.Errorf("lanes up exited with %d after SIGTERM, want 0", code)
		}
	case <-time.After(20 * time.Second):
		t.Error("lanes up did not stop within 20 s of SIGTERM")
	}
}

// sample is one request of the steady traffic.
type sample struct {
	sent time.Time
	done time.Time // when the answer came
	by   string
	err  string
}

// traffic sends a request in a lane every 100 ms, each on its own, and
// keeps the answers.
type traffic struct {
	mu      sync.Mutex
	samples []sample
	done    chan struct{}
	once    sync.Once
	wg      sync.WaitGroup
}

func startTraffic(client *http.Client, url, l string) *traffic {
	tr := &traffic{done: make(chan struct{})}
	tr.wg.Add(1)
	go func() {
		defer tr.wg.Done()
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-tr.done:
				return
			case <-tick.C:
			}
			tr.wg.Add(1)
			go func(sent time.Time) {
				defer tr.wg.Done()
				a, err := get(client, url, l)
				s := sample{sent: sent, done: time.Now(), by: a.By}
				if err != nil {
					s.err = err.Error()
				} else if a.Err != "" {
					s.err = a.Err
				}
				tr.mu.Lock()
				tr.samples = append(tr.samples, s)
				tr.mu.Unlock()
			}(time.Now())
		}
	}()
	return tr
}

func (tr *traffic) stop() {
	tr.once.Do(func() { close(tr.done) })
	tr.wg.Wait()
}

// wait waits for a request sent after from that by served, and returns when
// the first such answer came.
func (tr *traffic) wait(t *testing.T, what string, from time.Time, by string) time.Time {
	t.Helper()
	var at time.Time
	eventually(t, what, func() (bool, string) {
		tr.mu.Lock()
		defer tr.mu.Unlock()
		for _, s := range tr.samples {
			if s.sent.After(from) && s.by == by && s.err == "" && (at.IsZero() || s.done.Before(at)) {
				at = s.done
			}
		}
		return !at.IsZero(), fmt.Sprintf("%d samples", len(tr.samples))
	})
	return at
}

func (tr *traffic) failures(from time.Time) []sample {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	var out []sample
	for _, s := range tr.samples {
		if s.sent.After(from) && s.err != "" {
			out = append(out, s)
		}
	}
	slices.SortFunc(out, func(a, b sample) int { return a.sent.Compare(b.sent) })
	return out
}

func (tr *traffic) count(from time.Time) int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	n := 0
	for _, s := range tr.samples {
		if s.sent.After(from) {
			n++
		}
	}
	return n
}
