package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/lanesdev/lanes/policy"
	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

// dryRunPolicy prints the routes of today's fleet that the document data
// would change: for every service, and every lane of the fleet, of the
// policy in force and of data (and the baseline), where a request goes now
// and where it would go.
func dryRunPolicy(ctx context.Context, w io.Writer, c *apiClient, file string, data []byte) error {
	next, err := policy.Parse(file, data)
	if err != nil {
		return &exitError{code: ExitUsage, err: err}
	}
	doc, err := c.Policy(ctx)
	if err != nil {
		return apiFailure(c, err)
	}
	now := &policy.Policy{}
	if doc.Raw != "" {
		if now, err = policy.Parse("the policy in force", []byte(doc.Raw)); err != nil {
			return &exitError{code: ExitFail, err: err}
		}
	}
	insts, err := c.Instances(ctx, "")
	if err != nil {
		return apiFailure(c, err)
	}
	bySvc := map[string][]registry.Instance{}
	lanes := map[string]bool{"": true}
	for _, in := range insts {
		bySvc[in.Service] = append(bySvc[in.Service], in.Instance)
		lanes[in.Lane] = true
		lanes[in.EffectiveLane] = true
	}
	for _, p := range []*policy.Policy{now, next} {
		for l := range p.Lanes {
			lanes[l] = true
		}
		for _, t := range p.Tags {
			lanes[t.Lane] = true
		}
		for _, k := range p.Canary {
			lanes[k.Lane] = true
		}
	}
	routes := func(p *policy.Policy) map[[2]string]string {
		e := routing.New()
		defer e.Close()
		e.SetPolicy(p)
		out := map[[2]string]string{}
		for svc, in := range bySvc {
			e.SetInstances(svc, in)
			s := e.Service(svc)
			for l := range lanes {
				out[[2]string{svc, l}] = describe(s.Resolve(routing.Request{Lane: l}))
			}
		}
		return out
	}
	before, after := routes(now), routes(next)
	var keys [][2]string
	for k, v := range after {
		if before[k] != v {
			keys = append(keys, k)
		}
	}
	sort.Slice(keys, func(i, j int) bool {
		return keys[i][0] < keys[j][0] || keys[i][0] == keys[j][0] && keys[i][1] < keys[j][1]
	})
	fmt.Fprintf(w, "dry run: %s against the policy in force (revision %d) and %d instance(s); nothing applied\n", file, doc.Revision, len(insts))
	if len(keys) == 0 {
		fmt.Fprintln(w, "no service or lane route changes")
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SERVICE\tLANE\tNOW\tWITH "+file)
	for _, k := range keys {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", k[0], laneLabel(k[1]), before[k], after[k])
	}
	tw.Flush()
	fmt.Fprintf(w, "%d route(s) would change\n", len(keys))
	return nil
}

// describe says where a resolved request goes.
func describe(d routing.Decision, err error) string {
	var re *routing.Error
	if errors.As(err, &re) {
		return string(re.Code)
	}
	if err != nil {
		return err.Error()
	}
	ids := slices.Clone(d.Eligible)
	sort.Strings(ids)
	s := laneLabel(d.Lane) + ": " + strings.Join(ids, ",")
	if d.RequestLane != "" && d.RequestLane != d.Lane {
		s += " (lane " + d.RequestLane + ")"
	}
	return s
}
