package cli

import (
	"context"
	"fmt"
	"io"
	"strings"
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
	var rows [][]string
	for _, ch := range changes {
		rows = append(rows, []string{ch.Service, laneLabel(ch.Lane), ch.Now, ch.Next})
	}
	printChanges(w, "no service or lane route changes", "SERVICE\tLANE\tNOW\tWITH "+file, rows, "route(s) would change")
	rows = nil
	for _, l := range lifetimes {
		rows = append(rows, []string{l.Lane, l.Now, l.Next})
	}
	printChanges(w, "no lane lifetime changes", "LANE\tEXPIRES NOW\tWITH "+file, rows, "lane lifetime(s) would change")
	printKept(w, file, next.Kept)
	return nil
}

// printChanges prints rows under head as a table and counts them, or says
// none when there are none.
func printChanges(w io.Writer, none, head string, rows [][]string, counted string) {
	if len(rows) == 0 {
		fmt.Fprintln(w, none)
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, head)
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	tw.Flush()
	fmt.Fprintf(w, "%d %s\n", len(rows), counted)
}

// printKept says which lane lifetimes in force an applied document did not
// set and the control plane kept.
func printKept(w io.Writer, file string, kept []adminapi.KeptLifetime) {
	for _, k := range kept {
		fmt.Fprintf(w, "kept: lane %s expires %s (%s does not set it; lift it with: lanes lane expire %s --never)\n",
			k.Lane, k.Expires.UTC().Format(time.RFC3339), file, k.Lane)
	}
}
