package dashboard

import (
	"fmt"
	"html"
	"html/template"
	"math"
	"sort"
	"strings"

	"github.com/lanesdev/lanes/adminapi"
)

// esc escapes text for SVG markup.
func esc(s string) string { return html.EscapeString(s) }

// explainSVG draws one hop's lane chain: a box per step in the lane's
// colour, the serving step filled, arrows along the chain.
func explainSVG(e adminapi.Explanation) template.HTML {
	const w, h, gap = 170, 58, 36
	n := len(e.Steps)
	width := n*w + (n-1)*gap + 4
	if n == 0 {
		width = w
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="chain" viewBox="0 0 %d %d" width="%d" height="%d" role="img" aria-label="%s">`,
		width, h+4, width, h+4, esc(chainLabel(e)))
	b.WriteString(`<defs><marker id="arr" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" orient="auto"><path d="M0,0L10,5L0,10z" fill="#333"/></marker></defs>`)
	for i, st := range e.Steps {
		x := 2 + i*(w+gap)
		col := laneColour(st.Lane)
		fill, text := "#ffffff", col
		if st.Outcome == "serves" {
			fill, text = col, "#ffffff"
		}
		dash := ""
		if st.Outcome == "not reached" {
			dash = ` stroke-dasharray="5 4"`
		}
		fmt.Fprintf(&b, `<g class="step" data-lane="%s" data-outcome="%s"><rect x="%d" y="2" width="%d" height="%d" rx="8" fill="%s" stroke="%s" stroke-width="2"%s/>`,
			esc(st.Lane), esc(st.Outcome), x, w, h, fill, col, dash)
		fmt.Fprintf(&b, `<text x="%d" y="24" text-anchor="middle" fill="%s" font-weight="bold" font-size="14">%s</text>`, x+w/2, text, esc(laneName(st.Lane)))
		fmt.Fprintf(&b, `<text x="%d" y="44" text-anchor="middle" fill="%s" font-size="12">%s · %d eligible</text></g>`, x+w/2, text, esc(st.Outcome), len(st.Eligible))
		if i+1 < n {
			fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#333" stroke-width="2" marker-end="url(#arr)"/>`, x+w, 2+h/2, x+w+gap-2, 2+h/2)
		}
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String())
}

func chainLabel(e adminapi.Explanation) string {
	var parts []string
	for _, st := range e.Steps {
		parts = append(parts, laneName(st.Lane)+": "+st.Outcome)
	}
	return e.Service + " — " + strings.Join(parts, ", then ")
}

// graphSVG draws the service graph: services in columns by their depth from
// the entry points, one curve per edge and lane in the lane's colour, its
// width growing with the rate, labelled with calls, errors and fallbacks.
//
// laneInstances marks, under each service's name, the lanes it has
// instances in (service → lanes, "" left out).
func graphSVG(g adminapi.Graph, laneInstances map[string][]string) template.HTML {
	if len(g.Edges) == 0 {
		return ""
	}
	// Depth: longest path from a service nobody calls (bounded, for cycles).
	depth := map[string]int{}
	called := map[string]bool{}
	svcs := map[string]bool{}
	for _, s := range g.Services {
		svcs[s] = true
	}
	for _, e := range g.Edges {
		called[e.To] = true
		svcs[e.From], svcs[e.To] = true, true
	}
	names := make([]string, 0, len(svcs))
	for s := range svcs {
		names = append(names, s)
		depth[s] = 0
	}
	sort.Strings(names)
	for range len(names) {
		for _, e := range g.Edges {
			if e.From != e.To && depth[e.To] < depth[e.From]+1 && depth[e.From]+1 < len(names) {
				depth[e.To] = depth[e.From] + 1
			}
		}
	}
	cols := map[int][]string{}
	maxDepth := 0
	for _, s := range names {
		cols[depth[s]] = append(cols[depth[s]], s)
		maxDepth = max(maxDepth, depth[s])
	}
	const nodeW, nodeH, colGap, rowGap = 130, 44, 230, 150
	pos := map[string][2]int{}
	maxRows := 1
	for d := 0; d <= maxDepth; d++ {
		for i, s := range cols[d] {
			pos[s] = [2]int{20 + d*(nodeW+colGap), 70 + i*(nodeH+rowGap)}
		}
		maxRows = max(maxRows, len(cols[d]))
	}
	width := 40 + (maxDepth+1)*nodeW + maxDepth*colGap
	height := 70 + maxRows*nodeH + (maxRows-1)*rowGap + 70 // room for the fanned-out curves and labels
	// Group the edges by service pair to fan the lanes out.
	type pair struct{ from, to string }
	groups := map[pair][]adminapi.Edge{}
	var pairs []pair
	for _, e := range g.Edges {
		p := pair{e.From, e.To}
		if groups[p] == nil {
			pairs = append(pairs, p)
		}
		groups[p] = append(groups[p], e)
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="graph" viewBox="0 0 %d %d" width="%d" height="%d" role="img" aria-label="service graph: %d edges">`, width, height, width, height, len(g.Edges))
	for _, p := range pairs {
		es := groups[p]
		sort.Slice(es, func(i, j int) bool { return es[i].Lane < es[j].Lane })
		a, z := pos[p.from], pos[p.to]
		x1, y1 := float64(a[0]+nodeW), float64(a[1]+nodeH/2)
		x2, y2 := float64(z[0]), float64(z[1]+nodeH/2)
		if p.from == p.to || x2 <= x1 {
			x2, y2 = float64(z[0]+nodeW/2), float64(z[1]+nodeH)
		}
		for i, e := range es {
			off := (float64(i) - float64(len(es)-1)/2) * fanGap
			mx, my := (x1+x2)/2, (y1+y2)/2+off
			col := laneColour(e.Lane)
			sw := 2 + math.Min(6, math.Log1p(e.Rate)*2)
			dash := ""
			if e.Fallbacks > 0 {
				dash = ` stroke-dasharray="8 4"`
			}
			fmt.Fprintf(&b, `<g class="edge" data-from="%s" data-to="%s" data-lane="%s"><path d="M%.0f,%.0f Q%.0f,%.0f %.0f,%.0f" fill="none" stroke="%s" stroke-width="%.1f"%s/>`,
				esc(e.From), esc(e.To), esc(e.Lane), x1, y1, mx, my+off, x2, y2, col, sw, dash)
			label := fmt.Sprintf("%s %s", laneName(e.Lane), rateText(e))
			fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" text-anchor="middle" font-size="12" fill="%s" stroke="#fff" stroke-width="3" paint-order="stroke">%s</text></g>`, mx, labelY(x1, y1, x2, y2, (y1+y2)/2, off, i, len(es), label), col, esc(label))
		}
	}
	for _, s := range names {
		p := pos[s]
		lanes := laneInstances[s]
		ty := p[1] + nodeH/2 + 5
		if len(lanes) > 0 {
			ty = p[1] + 18
		}
		fmt.Fprintf(&b, `<g class="node" data-service="%s"><rect x="%d" y="%d" width="%d" height="%d" rx="8" fill="#f4f6f8" stroke="#333" stroke-width="1.5"/><text x="%d" y="%d" text-anchor="middle" font-size="14" fill="#111">%s</text>`,
			esc(s), p[0], p[1], nodeW, nodeH, p[0]+nodeW/2, ty, esc(s))
		for i, l := range lanes {
			fmt.Fprintf(&b, `<g class="lane-instance" data-lane="%s"><circle cx="%d" cy="%d" r="5" fill="%s"/><text x="%d" y="%d" font-size="11" fill="%s">%s</text></g>`,
				esc(l), p[0]+10+i*60, p[1]+33, laneColour(l), p[0]+18+i*60, p[1]+37, laneColour(l), esc(l))
		}
		b.WriteString(`</g>`)
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String())
}

func rateText(e adminapi.Edge) string {
	s := fmt.Sprintf("%.2f/s", e.Rate)
	if e.Errors > 0 {
		s += fmt.Sprintf(" · %d err", e.Errors)
	}
	if e.Fallbacks > 0 {
		s += fmt.Sprintf(" · %d fallback", e.Fallbacks)
	}
	return s
}

// diffLine is one line of a line diff: "+", "-" or " ".
type diffLine struct {
	Op, Text string
}

// diffLines diffs two documents line by line (longest common subsequence;
// policy documents are small: at most 1 MiB, in practice a few hundred
// lines, and the table is bounded below).
func diffLines(a, b string) []diffLine {
	x, y := splitLines(a), splitLines(b)
	if len(x)*len(y) > 4_000_000 {
		out := make([]diffLine, 0, len(x)+len(y))
		for _, l := range x {
			out = append(out, diffLine{"-", l})
		}
		for _, l := range y {
			out = append(out, diffLine{"+", l})
		}
		return out
	}
	n, m := len(x), len(y)
	t := make([][]int32, n+1)
	for i := range t {
		t[i] = make([]int32, m+1)
	}
	for i := n - 1; i >= 0; i-- {
		for j := m - 1; j >= 0; j-- {
			if x[i] == y[j] {
				t[i][j] = t[i+1][j+1] + 1
			} else {
				t[i][j] = max(t[i+1][j], t[i][j+1])
			}
		}
	}
	var out []diffLine
	i, j := 0, 0
	for i < n && j < m {
		switch {
		case x[i] == y[j]:
			out = append(out, diffLine{" ", x[i]})
			i++
			j++
		case t[i+1][j] >= t[i][j+1]:
			out = append(out, diffLine{"-", x[i]})
			i++
		default:
			out = append(out, diffLine{"+", y[j]})
			j++
		}
	}
	for ; i < n; i++ {
		out = append(out, diffLine{"-", x[i]})
	}
	for ; j < m; j++ {
		out = append(out, diffLine{"+", y[j]})
	}
	return out
}

func splitLines(s string) []string {
	s = strings.TrimSuffix(s, "\n")
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

// fanGap is the distance between the apexes of the curves of one pair.
const fanGap = 34

// labelY is the baseline of the label of the i-th of n curves between two
// services (offset off from the chord, whose middle is at height ymid),
// clear of every curve of the bundle: the labels of the upper half (the
// middle curve's included) are stacked above the top curve's apex, the
// others below the bottom curve's, nearest the curve they belong to. Each
// stays past the widest stroke and the rise of the tangent at the apex
// (parallel to the chord) under half the label's width; the quadratic
// curves bend towards their chord, away from the labels, so the tangent
// bounds them.
func labelY(x1, y1, x2, y2, ymid, off float64, i, n int, label string) float64 {
	const ascent, descent, charW, halo, row, maxSW = 10, 3, 7, 3, 14, 8 // 12 px sans-serif, roughly
	halfW := float64(len([]rune(label)))*charW/2 + halo
	slope := 4.0 // a near-vertical curve: the label's box must clear it too
	if dx := x2 - x1; math.Abs(dx) > 1 {
		slope = (y2 - y1) / dx
	}
	gap := maxSW/2 + halo + math.Abs(slope)*halfW
	spread := float64(n-1) / 2 * fanGap // the outer curves' offset
	if off > 0 {
		return ymid + spread + gap + ascent + float64(n-1-i)*row
	}
	return ymid - spread - gap - descent - float64(i)*row
}
