package dashboard

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/lanesdev/lanes/adminapi"
	"github.com/lanesdev/lanes/adminclient"
	"github.com/lanesdev/lanes/internal/lib/reroute"
	"github.com/lanesdev/lanes/internal/lib/tunnel"
)

// view is what every template gets.
type view struct {
	Title  string
	Nav    string
	CSRF   string
	Scope  string
	Admin  bool
	Err    string
	Notice string
	// NoticeID names the notice: "valid", "applied".
	NoticeID string
	Next     string
	Data     any

	c   *adminclient.Client
	ctx context.Context
}

func (s *Server) newView(r *http.Request, sess *session) *view {
	return &view{CSRF: sess.csrf, Scope: sess.scope, Admin: sess.admin, c: s.client(sess.token),
		ctx: withRemoteAddr(r.Context(), r.RemoteAddr)}
}

var pageNames = []string{"login", "error", "overview", "service", "policy", "explain", "traces", "trace", "graph"}

func parsePages() (map[string]*template.Template, error) {
	base, err := template.New("layout.html").Funcs(funcs).ParseFS(files, "templates/layout.html")
	if err != nil {
		return nil, err
	}
	out := map[string]*template.Template{}
	for _, n := range pageNames {
		t, err := template.Must(base.Clone()).ParseFS(files, "templates/"+n+".html")
		if err != nil {
			return nil, err
		}
		out[n] = t
	}
	return out, nil
}

func (s *Server) render(w http.ResponseWriter, status int, name string, v *view) {
	var buf bytes.Buffer
	if err := s.pages[name].ExecuteTemplate(&buf, "layout.html", v); err != nil {
		s.log.Error("render page", "page", name, "err", err)
		http.Error(w, "render "+name+": "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	w.Write(buf.Bytes())
}

// laneName shows a lane ("" is the baseline).
func laneName(l string) string {
	if l == "" {
		return "baseline"
	}
	return l
}

// palette holds lane colours with a contrast of at least 4.5:1 on white.
var palette = []string{"#1f5fa8", "#a8331f", "#1d7a3a", "#7a3fa0", "#8a5a00", "#006d7a", "#b0246a", "#4a5a1a"}

// baselineColour is the baseline's.
const baselineColour = "#555555"

func laneColour(l string) string {
	if l == "" {
		return baselineColour
	}
	var h uint32 = 2166136261
	for i := 0; i < len(l); i++ {
		h = (h ^ uint32(l[i])) * 16777619
	}
	return palette[h%uint32(len(palette))]
}

var funcs = template.FuncMap{
	"lane": laneName,
	// tunnelOf says where an instance of lanes dev's tunnel really runs.
	"tunnelOf": tunnel.Describe,
	"colour":   laneColour,
	"ago": func(t time.Time) string {
		if t.IsZero() {
			return "—"
		}
		return time.Since(t).Round(time.Second).String() + " ago"
	},
	"clock": func(t time.Time) string { return t.UTC().Format("15:04:05") },
	"dur": func(d adminapi.Duration) string {
		v := d.D()
		switch {
		case v >= time.Second:
			return v.Round(time.Millisecond).String()
		case v >= time.Millisecond:
			return v.Round(10 * time.Microsecond).String()
		}
		return v.Round(time.Microsecond).String()
	},
	"indent": func(depth int) int { return depth * 18 },
	"pct":    func(f float64) string { return fmt.Sprintf("%.1f%%", f*100) },
	"rate":   func(f float64) string { return fmt.Sprintf("%.2f/s", f) },
	"join":   strings.Join,
	"add":    func(a, b int) int { return a + b },
	"plus64": func(a, b int64) int64 { return a + b },
	"mib":    func(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) },
	"swatch": func(l string) template.HTML {
		return template.HTML(`<svg class="swatch" width="12" height="12" aria-hidden="true"><circle cx="6" cy="6" r="6" fill="` + laneColour(l) + `"/></svg>`)
	},
}

// --- overview

type cell struct {
	Count, Ready, Drained, Expired, Ejected int
}

type laneRow struct {
	adminapi.Lane
	Chain    []string // the lane, its fallbacks, the baseline (unless strict)
	TimeLeft string
	Owners   []string // the registration tokens of the lane (admin sessions only)
}

type overviewData struct {
	Lanes    []string // columns: "" (baseline) first
	Services []string
	Cells    map[string]map[string]cell // service → lane → cell
	LaneRows []laneRow
	Findings []adminapi.Finding
	FindErr  string
	Admin    bool // owners are shown
}

func (s *Server) overview(w http.ResponseWriter, r *http.Request, v *view) error {
	insts, err := v.c.Instances(v.ctx, "")
	if err != nil {
		return err
	}
	lanes, err := v.c.Lanes(v.ctx)
	if err != nil {
		return err
	}
	d := overviewData{Cells: map[string]map[string]cell{}, Admin: v.Admin}
	owners := map[string][]string{}
	if v.Admin {
		if toks, err := v.c.Tokens(v.ctx); err == nil {
			for _, t := range toks {
				if t.Lane != "" {
					n := t.Name
					if n == "" {
						n = t.ID
					}
					owners[t.Lane] = append(owners[t.Lane], n)
				}
			}
		}
	}
	seenLane := map[string]bool{"": true}
	d.Lanes = []string{""}
	for _, l := range lanes {
		if !seenLane[l.Name] {
			seenLane[l.Name] = true
			d.Lanes = append(d.Lanes, l.Name)
		}
		row := laneRow{Lane: l, Chain: append([]string{l.Name}, l.Fallback...), Owners: owners[l.Name]}
		if !l.Strict && (len(row.Chain) == 0 || row.Chain[len(row.Chain)-1] != "") {
			row.Chain = append(row.Chain, "")
		}
		switch {
		case l.Expired:
			row.TimeLeft = "expired"
		case l.Expires != nil:
			row.TimeLeft = l.Expires.Sub(s.now()).Round(time.Second).String()
		default:
			row.TimeLeft = "no expiry"
		}
		d.LaneRows = append(d.LaneRows, row)
	}
	for _, in := range insts {
		if d.Cells[in.Service] == nil {
			d.Cells[in.Service] = map[string]cell{}
			d.Services = append(d.Services, in.Service)
		}
		if !seenLane[in.EffectiveLane] {
			seenLane[in.EffectiveLane] = true
			d.Lanes = append(d.Lanes, in.EffectiveLane)
		}
		c := d.Cells[in.Service][in.EffectiveLane]
		c.Count++
		switch in.State {
		case "drained":
			c.Drained++
		case "expired":
			c.Expired++
		default:
			c.Ready++
		}
		if in.Outlier != nil {
			c.Ejected++
		}
		d.Cells[in.Service][in.EffectiveLane] = c
	}
	sort.Strings(d.Services)
	slices.Sort(d.Lanes[1:])
	d.Findings, err = v.c.Findings(v.ctx, time.Hour, "")
	if err != nil {
		d.FindErr = err.Error()
	}
	v.Title, v.Nav, v.Data = "Overview", "overview", d
	s.render(w, http.StatusOK, "overview", v)
	return nil
}

// --- service

type serviceData struct {
	Name      string
	Instances []adminapi.Instance
}

func (s *Server) service(w http.ResponseWriter, r *http.Request, v *view) error {
	name := r.PathValue("name")
	insts, err := v.c.Instances(v.ctx, name)
	if err != nil {
		return err
	}
	sort.Slice(insts, func(i, j int) bool {
		if insts[i].EffectiveLane != insts[j].EffectiveLane {
			return insts[i].EffectiveLane < insts[j].EffectiveLane
		}
		return insts[i].ID < insts[j].ID
	})
	v.Title, v.Nav, v.Data = "Service "+name, "overview", serviceData{Name: name, Instances: insts}
	s.render(w, http.StatusOK, "service", v)
	return nil
}

// --- policy

type policyData struct {
	Doc     adminapi.PolicyDocument
	Text    string // what the editor shows
	Problem *adminapi.Error
	Valid   bool
	// Reroute lists what the validated document would reroute, Lifetimes
	// the lane lifetimes it would change and Kept those in force that it
	// does not set, which applying it keeps (Valid).
	Reroute   []reroute.Change
	Lifetimes []reroute.Lifetime
	Kept      []adminapi.KeptLifetime
	Applied   bool
	History   []historyEntry
	HistErr   string
	Baseline  string
}

type historyEntry struct {
	adminapi.PolicyRevision
	Diff    []diffLine
	Current bool
}

func (s *Server) policyData(v *view) (policyData, error) {
	doc, err := v.c.Policy(v.ctx)
	if err != nil {
		return policyData{}, err
	}
	d := policyData{Doc: doc, Text: doc.Raw}
	if strings.TrimSpace(doc.Raw) == "" {
		d.Text = StarterPolicy
	}
	hist, err := v.c.PolicyHistory(v.ctx)
	if err != nil {
		d.HistErr = err.Error()
	}
	for i, h := range hist {
		prev := ""
		if i+1 < len(hist) {
			prev = hist[i+1].Raw
		}
		d.History = append(d.History, historyEntry{PolicyRevision: h, Diff: diffLines(prev, h.Raw), Current: h.Revision == doc.Revision})
	}
	return d, nil
}

func (s *Server) policyPage(w http.ResponseWriter, r *http.Request, v *view) error {
	d, err := s.policyData(v)
	if err != nil {
		return err
	}
	v.Title, v.Nav, v.Data = "Policy", "policy", d
	if r.URL.Query().Get("applied") != "" {
		v.Notice, v.NoticeID = fmt.Sprintf("Applied: revision %d is in force.", d.Doc.Revision), "applied"
	}
	s.render(w, http.StatusOK, "policy", v)
	return nil
}

func (s *Server) policyPost(w http.ResponseWriter, r *http.Request, v *view) error {
	text := r.PostFormValue("document")
	action := r.PostFormValue("action")
	if action == "rollback" {
		rev := r.PostFormValue("revision")
		hist, err := v.c.PolicyHistory(v.ctx)
		if err != nil {
			return err
		}
		found := false
		for _, h := range hist {
			if fmt.Sprint(h.Revision) == rev {
				text, found = h.Raw, true
			}
		}
		if !found {
			return fmt.Errorf("no revision %q in the policy history", rev)
		}
		action = "apply"
	}
	d, err := s.policyData(v)
	if err != nil {
		return err
	}
	d.Text = text
	v.Title, v.Nav = "Policy", "policy"
	var perr error
	switch action {
	case "validate":
		var next adminapi.PolicyDocument
		next, perr = v.c.ValidatePolicy(v.ctx, []byte(text))
		if perr == nil {
			d.Valid = true
			v.Notice, v.NoticeID = "Valid: the document may be applied.", "valid"
			insts, err := v.c.Instances(v.ctx, "")
			if err != nil {
				return err
			}
			d.Reroute = reroute.Changes(d.Doc.Policy, next.Policy, insts)
			d.Lifetimes, d.Kept = reroute.Lifetimes(d.Doc.Policy, next.Policy), next.Kept
		}
	case "apply":
		_, perr = v.c.PutPolicy(v.ctx, []byte(text))
		if perr == nil {
			http.Redirect(w, r, Prefix+"policy?applied=1", http.StatusSeeOther)
			return nil
		}
	default:
		return fmt.Errorf("unknown action %q", action)
	}
	status := http.StatusOK
	if perr != nil {
		var ae *adminapi.Error
		if errors.As(perr, &ae) {
			d.Problem = ae
			status = ae.Status
			if status < 400 {
				status = http.StatusBadRequest
			}
		} else {
			return perr
		}
	}
	v.Data = d
	s.render(w, status, "policy", v)
	return nil
}

// --- explain

type explainData struct {
	Services []string
	Lanes    []string
	Service  string
	Lane     string
	Hops     []explainHop
}

type explainHop struct {
	adminapi.Explanation
	Err string
	SVG template.HTML
}

func (s *Server) explain(w http.ResponseWriter, r *http.Request, v *view) error {
	svcs, err := v.c.Services(v.ctx)
	if err != nil {
		return err
	}
	lanes, err := v.c.Lanes(v.ctx)
	if err != nil {
		return err
	}
	d := explainData{Service: r.URL.Query().Get("service"), Lane: r.URL.Query().Get("lane")}
	for _, sv := range svcs {
		d.Services = append(d.Services, sv.Name)
	}
	for _, l := range lanes {
		d.Lanes = append(d.Lanes, l.Name)
	}
	if d.Service != "" {
		// The entry service, then the services it calls, as the collected
		// traces know them.
		order := []string{d.Service}
		if g, err := v.c.Graph(v.ctx, 0); err == nil {
			order = downstream(d.Service, g.Edges)
		}
		for _, svc := range order {
			e, err := v.c.Explain(v.ctx, adminapi.ExplainRequest{Service: svc, Lane: d.Lane})
			hop := explainHop{Explanation: e}
			if err != nil {
				hop.Explanation.Service = svc
				hop.Err = err.Error()
			} else {
				hop.SVG = explainSVG(e)
			}
			d.Hops = append(d.Hops, hop)
		}
	}
	v.Title, v.Nav, v.Data = "Route explain", "explain", d
	s.render(w, http.StatusOK, "explain", v)
	return nil
}

// downstream lists from and the services reachable from it, breadth first.
func downstream(from string, edges []adminapi.Edge) []string {
	out := []string{from}
	seen := map[string]bool{from: true}
	for i := 0; i < len(out); i++ {
		var next []string
		for _, e := range edges {
			if e.From == out[i] && !seen[e.To] {
				seen[e.To] = true
				next = append(next, e.To)
			}
		}
		sort.Strings(next)
		out = append(out, next...)
	}
	return out
}

// --- traces

type tracesData struct {
	Lane, Service string
	List          adminapi.TraceList
}

func (s *Server) traces(w http.ResponseWriter, r *http.Request, v *view) error {
	q := r.URL.Query()
	d := tracesData{Lane: q.Get("lane"), Service: q.Get("service")}
	list, err := v.c.Traces(v.ctx, adminclient.TraceFilter{Lane: d.Lane, Service: d.Service, Limit: 50})
	if err != nil {
		return err
	}
	d.List = list
	v.Title, v.Nav, v.Data = "Traces", "traces", d
	s.render(w, http.StatusOK, "traces", v)
	return nil
}

func (s *Server) trace(w http.ResponseWriter, r *http.Request, v *view) error {
	tr, err := v.c.Trace(v.ctx, r.PathValue("id"))
	if err != nil {
		return err
	}
	v.Title, v.Nav, v.Data = "Trace "+tr.TraceID, "traces", tr
	s.render(w, http.StatusOK, "trace", v)
	return nil
}

// --- graph

type graphData struct {
	Graph adminapi.Graph
	SVG   template.HTML
	Lanes []string
}

func (s *Server) graph(w http.ResponseWriter, r *http.Request, v *view) error {
	var window time.Duration
	if ws := r.URL.Query().Get("window"); ws != "" {
		d, err := time.ParseDuration(ws)
		if err != nil || d <= 0 {
			return fmt.Errorf("window %q: want a duration such as 5m", ws)
		}
		window = d
	}
	g, err := v.c.Graph(v.ctx, window)
	if err != nil {
		return err
	}
	insts, err := v.c.Instances(v.ctx, "")
	if err != nil {
		return err
	}
	laneInstances := map[string][]string{}
	for _, in := range insts {
		if l := in.EffectiveLane; l != "" && !slices.Contains(laneInstances[in.Service], l) {
			laneInstances[in.Service] = append(laneInstances[in.Service], l)
		}
	}
	for _, ls := range laneInstances {
		slices.Sort(ls)
	}
	d := graphData{Graph: g, SVG: graphSVG(g, laneInstances)}
	seen := map[string]bool{}
	for _, e := range g.Edges {
		if !seen[e.Lane] {
			seen[e.Lane] = true
			d.Lanes = append(d.Lanes, e.Lane)
		}
	}
	sort.Strings(d.Lanes)
	v.Title, v.Nav, v.Data = "Service graph", "graph", d
	s.render(w, http.StatusOK, "graph", v)
	return nil
}

// StarterPolicy is what the policy editor offers while no document is in
// force: an example that changes nothing as it stands (every setting is
// commented out) and that validates once its settings are uncommented
// (remove "# " from the lines that do not start with "##"), as
// docs/policy.md shows.
const StarterPolicy = `## No policy document is in force: every lane falls back to the baseline.
## An example, after docs/policy.md: remove the "# " in front of the settings
## you want, edit them, then Validate and Apply.
# lanes:
#   alice:
#     fallback: [team-a]        # tried in order after alice, before the baseline
#     strict: false             # true: never fall back to the baseline
#     expires: 2030-01-01T00:00:00Z   # after this the lane takes no traffic
# canary:
#   - service: orders
#     lane: canary
#     percent: 10               # 0..100
# outlier:
#   errors: 5                   # failures within the window that eject an instance
#   window: 30s
#   ejection: 30s
`
