package cli

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/lanesdev/lanes/adminapi"
	"github.com/lanesdev/lanes/internal/lib/reroute"
	"github.com/lanesdev/lanes/policy"
)

// dryRunPolicy prints the routes of today's fleet and the lane lifetimes
// that applying the document data would change (package reroute). The
// control plane says what it would store, lifetimes kept included.
func dryRunPolicy(ctx context.Context, w io.Writer, c *apiClient, file string, data []byte) error {
	if _, err := policy.Parse(file, data); err != nil {
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
	next, err := c.ValidatePolicy(ctx, data)
	if err != nil {
		return policyRefusal(c, file, err)
	}
	insts, err := c.Instances(ctx, "")
	if err != nil {
		return apiFailure(c, err)
	}
	changes := reroute.Changes(now, next.Policy, insts)
	lifetimes := reroute.Lifetimes(now, next.Policy)
	fmt.Fprintf(w, "dry run: %s against the policy in force (revision %d) and %d instance(s); nothing applied\n", file, doc.Revision, len(insts))
	if len(changes) == 0 {
		fmt.Fprintln(w, "no service or lane route changes")
	} else {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "SERVICE\tLANE\tNOW\tWITH "+file)
		for _, ch := range changes {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", ch.Service, laneLabel(ch.Lane), ch.Now, ch.Next)
		}
		tw.Flush()
		fmt.Fprintf(w, "%d route(s) would change\n", len(changes))
	}
	if len(lifetimes) == 0 {
		fmt.Fprintln(w, "no lane lifetime changes")
	} else {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "LANE\tEXPIRES NOW\tWITH "+file)
		for _, l := range lifetimes {
			fmt.Fprintf(tw, "%s\t%s\t%s\n", l.Lane, l.Now, l.Next)
		}
		tw.Flush()
		fmt.Fprintf(w, "%d lane lifetime(s) would change\n", len(lifetimes))
	}
	printKept(w, file, next.Kept)
	return nil
}

// printKept says which lane lifetimes in force an applied document did not
// set and the control plane kept.
func printKept(w io.Writer, file string, kept []adminapi.KeptLifetime) {
	for _, k := range kept {
		fmt.Fprintf(w, "kept: lane %s expires %s (%s does not set it; lift it with: lanes lane expire %s --never)\n",
			k.Lane, k.Expires.UTC().Format(time.RFC3339), file, k.Lane)
	}
}
