package dashboard_test

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/lanesdev/lanes/adminapi"
	"github.com/lanesdev/lanes/adminclient"
	"github.com/lanesdev/lanes/internal/app/dashboard"
	"github.com/lanesdev/lanes/registry"
)

var update = flag.Bool("update", false, "TestScreenshot: write docs/dashboard.png")

// EnvAxe names the file of axe-core (axe.min.js) that the browser test
// runs on every page; EnvArtefacts the folder of its screenshots.
const (
	EnvAxe       = "LANES_AXE_JS"
	EnvArtefacts = "LANES_ARTEFACTS"
)

func hasEdge(es []adminapi.Edge, from, to, lane string) bool {
	for _, e := range es {
		if e.From == from && e.To == to && e.Lane == lane {
			return true
		}
	}
	return false
}

// browser starts headless Chromium, or skips the test when there is none.
func browser(t *testing.T) context.Context {
	t.Helper()
	var bin string
	for _, n := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(n); err == nil {
			bin = p
			break
		}
	}
	if bin == "" {
		t.Skip("no chromium on PATH: install Debian's chromium package (.ci/run does) to run the browser tests")
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(bin),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.Flag("headless", true),
		chromedp.Flag("no-sandbox", true),
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("no-first-run", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.WindowSize(1280, 900),
	}
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelB := chromedp.NewContext(actx)
	t.Cleanup(func() {
		cancelB()
		cancelA()
	})
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start chromium (%s): %v", bin, err)
	}
	return ctx
}

// do runs steps with a generous deadline.
func do(t *testing.T, ctx context.Context, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	get(t, ctx, what, chromedp.Steps(steps...))
}

// get runs an action with a generous deadline and returns its value.
func get[T any](t *testing.T, ctx context.Context, what string, a chromedp.Action[T]) T {
	t.Helper()
	rctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	v, err := chromedp.Run(rctx, a)
	if err != nil {
		uctx, ucancel := context.WithTimeout(ctx, 5*time.Second)
		defer ucancel()
		url, _ := chromedp.Run(uctx, chromedp.Location())
		t.Fatalf("%s (at %s): %v", what, url, err)
	}
	return v
}

func login(t *testing.T, ctx context.Context, w *world) {
	t.Helper()
	do(t, ctx, "log in",
		chromedp.Navigate(w.admin+"/ui/"),
		chromedp.WaitVisible(chromedp.ID(`#token`)),
		chromedp.SendKeys(chromedp.ID(`#token`), w.token),
		chromedp.Submit(chromedp.ID(`#token`)),
		chromedp.WaitVisible(chromedp.CSS(`table.matrix`)),
	)
}

type pageRef struct{ name, path, ready string }

// pages are the dashboard's pages, each with what shows it loaded.
var pages = []pageRef{
	{"overview", "/ui/", `table.matrix`},
	{"service", "/ui/services/orders", `table.instances`},
	{"policy", "/ui/policy", `#document`},
	{"explain", "/ui/explain?service=web&lane=alice", `section.hop[data-service="payments"] svg`},
	{"traces", "/ui/traces", `table.traces`},
	{"graph", "/ui/graph", `svg.graph`},
}

// TestBrowser drives the dashboard of `lanes demo` in headless Chromium.
func TestBrowser(t *testing.T) {
	ctx := browser(t)
	w := startWorld(t)
	w.traffic(t)
	login(t, ctx, w)
	tctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	list, err := w.api.Traces(tctx, adminclient.TraceFilter{Lane: "alice", Limit: 1})
	cancel()
	if err != nil || len(list.Traces) == 0 {
		t.Fatalf("no trace of lane alice: %v", err)
	}
	pages := append(slices.Clone(pages), pageRef{"trace", "/ui/traces/" + list.Traces[0].TraceID, "table.hops"},
		pageRef{"login", "/ui/login", "#token"})

	t.Run("every page loads", func(t *testing.T) {
		for _, p := range pages {
			do(t, ctx, p.name, chromedp.Navigate(w.admin+p.path), chromedp.WaitVisible(chromedp.CSS(p.ready)))
			h1 := get(t, ctx, p.name, chromedp.Text(chromedp.CSS(`h1`)))
			t.Logf("%s: %q", p.path, h1)
		}
	})

	t.Run("the empty editor offers a starter that validates", func(t *testing.T) {
		do(t, ctx, "starter",
			chromedp.Navigate(w.admin+"/ui/policy"),
			chromedp.WaitVisible(chromedp.ID(`#document`)))
		got := get(t, ctx, "editor", chromedp.Evaluate[string](`document.getElementById("document").value`))
		if strings.TrimSpace(got) != strings.TrimSpace(dashboard.StarterPolicy) {
			t.Fatalf("the editor, no policy in force, offers %q; want the starter", got)
		}
		do(t, ctx, "validate the starter",
			chromedp.Click(chromedp.CSS(`button[value="validate"]`)),
			chromedp.WaitVisible(chromedp.ID(`notice-valid`)))
	})

	t.Run("invalid policy refused with the field", func(t *testing.T) {
		do(t, ctx, "validate",
			chromedp.Navigate(w.admin+"/ui/policy"),
			chromedp.WaitVisible(chromedp.ID(`#document`)),
			chromedp.SetValue(chromedp.ID(`#document`), "lanes:\n  alice:\n    fallback: [-no]\n"),
			chromedp.Click(chromedp.CSS(`button[value="apply"]`)),
			chromedp.WaitVisible(chromedp.ID(`#policy-error`)),
		)
		msg := get(t, ctx, "refusal", chromedp.Text(chromedp.ID(`#policy-error`)))
		if !strings.Contains(msg, "lanes.alice.fallback[0]") || !strings.Contains(msg, "line 3") {
			t.Errorf("refusal %q: want line 3 and field lanes.alice.fallback[0]", msg)
		}
		t.Logf("refused: %s", strings.TrimSpace(msg))
	})

	served := func(t *testing.T) string {
		t.Helper()
		sel := `section.hop[data-service="orders"] [data-served-lane]`
		do(t, ctx, "explain", chromedp.Navigate(w.admin+"/ui/explain?service=orders&lane=alice"),
			chromedp.WaitVisible(chromedp.CSS(sel)))
		return get(t, ctx, "served lane", chromedp.AttributeValue(chromedp.CSS(sel), "data-served-lane")).Value
	}
	apply := func(t *testing.T, doc string) []string {
		t.Helper()
		do(t, ctx, "validate",
			chromedp.Navigate(w.admin+"/ui/policy"),
			chromedp.WaitVisible(chromedp.ID(`#document`)),
			chromedp.SetValue(chromedp.ID(`#document`), doc),
			chromedp.Click(chromedp.CSS(`button[value="validate"]`)),
			chromedp.WaitVisible(chromedp.ID(`notice-valid`)),
			chromedp.WaitVisible(chromedp.ID(`reroute`)))
		rerouted := get(t, ctx, "reroute", chromedp.Evaluate[[]string](`Array.from(document.querySelectorAll("table.reroute tbody tr")).map(r => r.dataset.service+"@"+r.dataset.lane)`))
		do(t, ctx, "apply",
			chromedp.Click(chromedp.CSS(`button[value="apply"]`)),
			chromedp.WaitVisible(chromedp.ID(`notice-applied`)),
		)
		return rerouted
	}
	// The engine follows the store a moment after the PUT.
	waitServed := func(t *testing.T, want string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			got := served(t)
			if got == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("explain orders --lane alice: served by %q, want %q", got, want)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	t.Run("policy change reroutes on the explain page", func(t *testing.T) {
		apply(t, "lanes:\n  alice:\n    strict: false\n")
		waitServed(t, "")
		rerouted := apply(t, "lanes:\n  alice:\n    fallback: [feature-x]\n")
		if !slices.Contains(rerouted, "orders@alice") {
			t.Errorf("the dry run before applying lists %q, want orders@alice among them", rerouted)
		}
		t.Logf("the dry run: %q would change", rerouted)
		waitServed(t, "feature-x")
		t.Log("orders, lane alice: baseline, then feature-x after the change")
	})

	t.Run("roll back", func(t *testing.T) {
		do(t, ctx, "roll back",
			chromedp.Navigate(w.admin+"/ui/policy"),
			chromedp.WaitVisible(chromedp.CSS(`ol.history form button[value="rollback"]`)),
			chromedp.Click(chromedp.CSS(`ol.history form button[value="rollback"]`)),
			chromedp.WaitVisible(chromedp.ID(`notice-applied`)),
		)
		doc := get(t, ctx, "read", chromedp.Value(chromedp.ID(`#document`)))
		if !strings.Contains(doc, "strict: false") {
			t.Errorf("after rollback the policy is %q", doc)
		}
		waitServed(t, "")
	})

	t.Run("instances live", func(t *testing.T) {
		do(t, ctx, "overview",
			chromedp.Navigate(w.admin+"/ui/"),
			chromedp.WaitVisible(chromedp.CSS(`table.matrix`)),
			chromedp.WaitVisible(chromedp.CSS(`body[data-live-connected]`)),
			chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
				_, err := chromedp.Evaluate[bool](`window.notReloaded = true`)(ctx, tg)
				return err
			}),
		)
		rctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := w.api.Register(rctx, adminapi.RegisterRequest{Instance: registry.Instance{Service: "inventory", ID: "inventory-alice", Addr: "127.0.0.1:1", Lane: "alice"}, TTL: adminapi.Duration(time.Minute)})
		if err != nil {
			t.Fatal(err)
		}
		do(t, ctx, "new instance shows",
			chromedp.WaitVisible(chromedp.CSS(`tr[data-service="inventory"] td[data-lane="alice"].ok`)))
		still := get(t, ctx, "no reload", chromedp.Evaluate[bool](`window.notReloaded === true`))
		if !still {
			t.Error("the page reloaded; want a live update")
		}
		_, err = w.api.Register(rctx, adminapi.RegisterRequest{Instance: registry.Instance{Service: "inventory", ID: "inventory-2", Addr: "127.0.0.1:2", Drain: true}, TTL: adminapi.Duration(time.Minute)})
		if err != nil {
			t.Fatal(err)
		}
		do(t, ctx, "drained instance marked",
			chromedp.WaitVisible(chromedp.CSS(`tr[data-service="inventory"] td[data-lane=""].warn`)),
			chromedp.Navigate(w.admin+"/ui/services/inventory"),
			chromedp.WaitVisible(chromedp.CSS(`tr[data-instance="inventory-2"][data-state="drained"]`)))
	})

	t.Run("policy live", func(t *testing.T) {
		do(t, ctx, "policy page",
			chromedp.Navigate(w.admin+"/ui/policy"),
			chromedp.WaitVisible(chromedp.CSS(`body[data-live-connected]`)),
			chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
				_, err := chromedp.Evaluate[bool](`window.notReloaded = true`)(ctx, tg)
				return err
			}))
		rctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		d, err := w.api.PutPolicy(rctx, []byte("lanes:\n  alice:\n    strict: false\n  feature-x: {}\n"))
		if err != nil {
			t.Fatal(err)
		}
		do(t, ctx, "new revision shows",
			chromedp.WaitVisible(chromedp.CSS(fmt.Sprintf(`li[data-history-revision="%d"]`, d.Revision))))
		if rev := get(t, ctx, "revision", chromedp.Text(chromedp.CSS(`[data-revision]`))); rev != fmt.Sprint(d.Revision) {
			t.Errorf("revision shown %q, want %d", rev, d.Revision)
		}
		if !get(t, ctx, "no reload", chromedp.Evaluate[bool](`window.notReloaded === true`)) {
			t.Error("the page reloaded; want a live update")
		}
	})

	t.Run("ejected instance marked", func(t *testing.T) {
		// A web instance whose port refuses connections: the gateway's
		// calls fail over to web-1 and eject it (outlier.errors, default 5).
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		dead := ln.Addr().String()
		ln.Close()
		rctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		if _, err := w.api.Register(rctx, adminapi.RegisterRequest{Instance: registry.Instance{Service: "web", ID: "web-dead", Addr: dead}, TTL: adminapi.Duration(time.Minute)}); err != nil {
			t.Fatal(err)
		}
		do(t, ctx, "overview", chromedp.Navigate(w.admin+"/ui/"), chromedp.WaitVisible(chromedp.CSS(`body[data-live-connected]`)))
		hc := &http.Client{Timeout: 10 * time.Second}
		defer hc.CloseIdleConnections()
		deadline := time.Now().Add(30 * time.Second)
		for {
			resp, err := hc.Get(w.gateway + "/")
			if err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			insts, err := w.api.Instances(rctx, "web")
			if err == nil && slices.ContainsFunc(insts, func(in adminapi.Instance) bool { return in.ID == "web-dead" && in.Outlier != nil }) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("web-dead not ejected after 30s: %+v %v", insts, err)
			}
		}
		do(t, ctx, "ejected marked",
			chromedp.Navigate(w.admin+"/ui/services/web"),
			chromedp.WaitVisible(chromedp.CSS(`tr[data-instance="web-dead"] [data-outlier="ejected"]`)),
			chromedp.Navigate(w.admin+"/ui/"),
			chromedp.WaitVisible(chromedp.CSS(`tr[data-service="web"] td[data-lane=""].warn .ejected`)))
		if err := w.api.Deregister(rctx, "web", "web-dead", ""); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("trace hops with lanes", func(t *testing.T) {
		do(t, ctx, "open trace",
			chromedp.Navigate(w.admin+"/ui/traces?lane=alice"),
			chromedp.WaitVisible(chromedp.CSS(`table.traces tbody tr a`)),
			chromedp.Click(chromedp.CSS(`table.traces tbody tr a`)),
			chromedp.WaitVisible(chromedp.CSS(`table.hops`)))
		served := get(t, ctx, "hops", chromedp.Evaluate[[]string](`Array.from(document.querySelectorAll("tr.hop-row")).map(r => r.dataset.served)`))
		if !slices.Contains(served, "alice") {
			t.Errorf("lanes served in the trace: %q, want alice among them", served)
		}
		t.Logf("trace hops, lane served: %q", served)
	})

	t.Run("graph edges of both lanes", func(t *testing.T) {
		do(t, ctx, "graph",
			chromedp.Navigate(w.admin+"/ui/graph"),
			chromedp.WaitVisible(chromedp.CSS(`svg.graph g.edge[data-lane="feature-x"]`)),
			chromedp.WaitVisible(chromedp.CSS(`svg.graph g.edge[data-lane="alice"]`)),
			// The lane instances: orders in feature-x, payments in alice.
			chromedp.WaitVisible(chromedp.CSS(`svg.graph g.node[data-service="orders"] g.lane-instance[data-lane="feature-x"]`)),
			chromedp.WaitVisible(chromedp.CSS(`svg.graph g.node[data-service="payments"] g.lane-instance[data-lane="alice"]`)))
		lanes := get(t, ctx, "edges", chromedp.Evaluate[[]string](`Array.from(document.querySelectorAll("svg.graph g.edge")).map(e => e.dataset.from+"→"+e.dataset.to+"@"+e.dataset.lane)`))
		t.Logf("graph edges: %q", lanes)
		// No label covers a curve: no point of a label's box (on a 1 px
		// grid) lies in the stroke of any edge, as Chromium draws them.
		hits := get(t, ctx, "label overlaps", chromedp.Evaluate[[]string](labelOverlaps))
		if len(hits) > 0 {
			t.Errorf("graph labels over curves: %q", hits)
		}
	})

	t.Run("graph labels clear of the curves of their bundle", func(t *testing.T) {
		e := func(from, to, l string, rate float64, fb int) adminapi.Edge {
			return adminapi.Edge{From: from, To: to, Lane: l, Calls: 10, Rate: rate, Fallbacks: fb}
		}
		// Bundles of three and two lanes. Bundles that meet at one service
		// from different rows can still cross each other's labels.
		g := adminapi.Graph{Services: []string{"gateway", "frontend", "orders", "payments"}, Edges: []adminapi.Edge{
			e("gateway", "frontend", "", 12.5, 0), e("gateway", "frontend", "alice", 3, 1), e("gateway", "frontend", "feature-x", 0.4, 0),
			e("frontend", "orders", "", 8, 0), e("frontend", "orders", "alice", 2, 0), e("frontend", "orders", "feature-x", 1, 1),
			e("orders", "payments", "", 8, 0), e("orders", "payments", "alice", 2, 1),
		}}
		svg := string(dashboard.GraphSVG(g, map[string][]string{"orders": {"feature-x"}}))
		do(t, ctx, "graph page", chromedp.Navigate(w.admin+"/ui/graph"), chromedp.WaitVisible(chromedp.CSS(`svg.graph`)))
		get(t, ctx, "synthetic graph", chromedp.Evaluate[bool](`document.querySelector("svg.graph").outerHTML = `+strconv.Quote(svg)+`; true`))
		if hits := get(t, ctx, "label overlaps", chromedp.Evaluate[[]string](labelOverlaps)); len(hits) > 0 {
			t.Errorf("graph labels over curves: %q", hits)
		}
	})

	t.Run("axe-core", func(t *testing.T) {
		path := os.Getenv(EnvAxe)
		if path == "" {
			t.Skipf("%s is not set: install axe-core with npm (.ci/run does) and set it to node_modules/axe-core/axe.min.js", EnvAxe)
		}
		src, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("%s: %v", EnvAxe, err)
		}
		for _, p := range pages {
			do(t, ctx, "axe "+p.name,
				chromedp.Navigate(w.admin+p.path),
				chromedp.WaitVisible(chromedp.CSS(p.ready)))
			get(t, ctx, "load axe", chromedp.Evaluate[bool](string(src)+";\ntrue"))
			res := get(t, ctx, "axe.run", chromedp.Evaluate[string](`axe.run(document, {resultTypes: ["violations"]}).then(r => JSON.stringify(r.violations.map(v => ({id: v.id, impact: v.impact, help: v.help, nodes: v.nodes.map(n => n.target.join(" ")).slice(0, 3)}))))`,
				chromedp.EvalAwaitPromise))
			var vs []struct {
				ID, Impact, Help string
				Nodes            []string
			}
			if err := json.Unmarshal([]byte(res), &vs); err != nil {
				t.Fatalf("axe %s: %v: %s", p.name, err, res)
			}
			bad := 0
			for _, v := range vs {
				if v.Impact == "serious" || v.Impact == "critical" {
					bad++
					t.Errorf("axe %s: %s (%s): %s at %v", p.name, v.ID, v.Impact, v.Help, v.Nodes)
				} else {
					t.Logf("axe %s: %s (%s): %s", p.name, v.ID, v.Impact, v.Help)
				}
			}
			t.Logf("axe %s: %d violations, %d serious or critical", p.name, len(vs), bad)
		}
		// axe finds what it should: an image without a text alternative.
		n := get(t, ctx, "axe self-check", chromedp.Evaluate[int](`document.body.insertAdjacentHTML("beforeend", '<img src="data:,">'); axe.run(document).then(r => r.violations.filter(v => v.id === "image-alt").length)`,
			chromedp.EvalAwaitPromise))
		if n != 1 {
			t.Errorf("axe did not report an image without alt: %d", n)
		}
	})

	t.Run("screenshots", func(t *testing.T) {
		dir := os.Getenv(EnvArtefacts)
		if dir == "" {
			var err error
			if dir, err = os.MkdirTemp("", "lanes-dashboard-"); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, width := range []int64{1280, 390} {
			for _, p := range pages {
				do(t, ctx, "screenshot "+p.name,
					chromedp.EmulateViewport(width, 900),
					chromedp.Navigate(w.admin+p.path),
					chromedp.WaitVisible(chromedp.CSS(p.ready)))
				png := get(t, ctx, "screenshot "+p.name, chromedp.FullScreenshot(100))
				f := filepath.Join(dir, fmt.Sprintf("%s-%d.png", p.name, width))
				if err := os.WriteFile(f, png, 0o644); err != nil {
					t.Fatal(err)
				}
				if width == 390 {
					overflow := get(t, ctx, "width", chromedp.Evaluate[bool](`document.documentElement.scrollWidth > window.innerWidth + 1`))
					if overflow {
						t.Errorf("%s at 390px: the page is wider than the screen", p.name)
					}
				}
			}
		}
		t.Logf("screenshots at 1280 and 390 px in %s", dir)
	})
}

// TestScreenshot regenerates the README's screenshot of the overview,
// docs/dashboard.png:
//
//	go test ./internal/app/dashboard -run TestScreenshot -args -update
func TestScreenshot(t *testing.T) {
	if !*update {
		t.Skip("run with -args -update to write docs/dashboard.png")
	}
	ctx := browser(t)
	w := startWorld(t)
	w.traffic(t)
	login(t, ctx, w)
	do(t, ctx, "screenshot",
		chromedp.EmulateViewport(1280, 800),
		chromedp.Navigate(w.admin+"/ui/"),
		chromedp.WaitVisible(chromedp.CSS(`table.matrix`)))
	png := get(t, ctx, "screenshot", chromedp.CaptureScreenshot())
	if err := os.WriteFile(filepath.Join("..", "..", "..", "docs", "dashboard.png"), png, 0o644); err != nil {
		t.Fatal(err)
	}
}

// labelOverlaps lists, in the page's svg.graph, the edge labels whose box
// (on a 1 px grid) has a point in the stroke of an edge's curve, as
// Chromium draws them.
const labelOverlaps = `(() => {
			const svg = document.querySelector("svg.graph"), out = [];
			const paths = Array.from(svg.querySelectorAll("g.edge path"));
			for (const text of svg.querySelectorAll("g.edge text")) {
				const bb = text.getBBox();
				for (let x = bb.x; x <= bb.x + bb.width + 0.5; x += 1)
					for (let y = bb.y; y <= bb.y + bb.height + 0.5; y += 1) {
						const pt = svg.createSVGPoint(); pt.x = x; pt.y = y;
						for (const p of paths)
							if (p.isPointInStroke(pt)) { out.push(text.textContent + " covers the curve " + p.parentNode.dataset.from + "→" + p.parentNode.dataset.to + "@" + p.parentNode.dataset.lane); x = Infinity; y = Infinity; break; }
					}
			}
			return out;
		})()`
