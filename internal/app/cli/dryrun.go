package cli

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/lanesdev/lanes/internal/lib/reroute"
	"github.com/lanesdev/lanes/policy"
)

// dryRunPolicy prints the routes of today's fleet that the document data
// would change (package reroute).
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
	changes := reroute.Changes(now, next, insts)
	fmt.Fprintf(w, "dry run: %s against the policy in force (revision %d) and %d instance(s); nothing applied\n", file, doc.Revision, len(insts))
	if len(changes) == 0 {
		fmt.Fprintln(w, "no service or lane route changes")
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SERVICE\tLANE\tNOW\tWITH "+file)
	for _, ch := range changes {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", ch.Service, laneLabel(ch.Lane), ch.Now, ch.Next)
	}
	tw.Flush()
	fmt.Fprintf(w, "%d route(s) would change\n", len(changes))
	return nil
}
