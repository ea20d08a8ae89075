package cli

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/lanesdev/lanes/adminapi"
)

func newRoute() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "route",
		Short: "Explain how requests are routed",
	}
	cmd.AddCommand(newRouteExplain())
	return cmd
}

func newRouteExplain() *cobra.Command {
	var cf clientFlags
	var laneName, zone, host, key, output string
	var force bool
	cmd := &cobra.Command{
		Use:   "explain SERVICE [--lane L] [--zone Z] [--host H]",
		Short: "Walk a request's lane chain to a service and show the decision",
		Long: `explain shows, for a request to SERVICE carrying lane L (none: a baseline
request) from zone Z and host H, each step of the lane chain — the lane, its
fallbacks, the baseline — with the instances there and why each is or is not
eligible (drained, expired, on another host when the policy turns on
locality.host, in another zone), then the routing engine's decision.

Exit status: 0 when an instance may serve the request, 1 when none may
(no_instance or lane_unavailable), or when no service has the name SERVICE
or no instance, policy entry or client claim has lane L (a typo, unless
--force).`,
		Example: `  lanes route explain payments --lane alice
  lanes route explain orders --lane feature-x --zone az1 -o json
  lanes route explain orders --host build-7`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			return cf.call(cmd, func(ctx context.Context, c *apiClient) error {
				if !force {
					if err := checkService(ctx, c, args[0], "explains it"); err != nil {
						return err
					}
					if laneName != "" {
						if err := checkLane(ctx, c, laneName, "explains it"); err != nil {
							return err
						}
					}
				}
				ex, err := c.Explain(ctx, adminapi.ExplainRequest{Service: args[0], Lane: laneName, Zone: zone, Host: host, Key: key})
				if err != nil {
					return apiFailure(c, err)
				}
				if output == outJSON || output == outYAML {
					printAs(cmd.OutOrStdout(), output, ex)
				} else {
					printExplanation(cmd.OutOrStdout(), ex)
				}
				if ex.Error != nil {
					return &exitError{code: ExitFail}
				}
				return nil
			})
		},
	}
	cf.add(cmd)
	cmd.Flags().StringVar(&laneName, "lane", "", "the request's lane (none: a baseline request)")
	cmd.Flags().StringVar(&zone, "zone", "", "the caller's zone")
	cmd.Flags().StringVar(&host, "host", "", "the caller's host, for the policy's locality.host")
	cmd.Flags().StringVar(&key, "key", "", "the request key of sticky canary splits")
	addOutput(cmd, &output, "the steps and the decision")
	cmd.Flags().BoolVar(&force, "force", false, "explain even when no service has that name or nothing has that lane")
	cf.fields = map[string]string{"lane": "--lane", "zone": "--zone", "key": "--key", "host": "--host", "service": "SERVICE"}
	return cmd
}

func printExplanation(w io.Writer, ex adminapi.Explanation) {
	head := fmt.Sprintf("%s, ", ex.Service)
	if ex.Lane == "" {
		head += "baseline request"
	} else {
		head += "lane " + ex.Lane
	}
	if ex.Zone != "" {
		head += ", zone " + ex.Zone
	}
	if ex.Host != "" {
		head += ", host " + ex.Host
		if !ex.HostFirst {
			head += " (locality.host is off)"
		}
	}
	if ex.Key != "" {
		head += ", key " + ex.Key
	}
	fmt.Fprintln(w, head)
	for i, st := range ex.Steps {
		name := st.Role
		if st.Lane != "" {
			name += " " + st.Lane
		}
		if st.Expired {
			name += " (expired)"
		}
		line := fmt.Sprintf("  %d. %-22s %s", i+1, name, st.Outcome)
		var parts []string
		for _, in := range st.Instances {
			p := in.ID + " " + in.Addr
			var notes []string
			if in.Host != "" && ex.HostFirst {
				notes = append(notes, "host "+in.Host)
			}
			if in.Zone != "" {
				notes = append(notes, "zone "+in.Zone)
			}
			if in.State != "eligible" {
				notes = append(notes, in.State)
			}
			if in.RegisteredLane != "" {
				notes = append(notes, "tagged from "+in.RegisteredLane)
			}
			if len(notes) > 0 {
				p += " (" + strings.Join(notes, ", ") + ")"
			}
			parts = append(parts, p)
		}
		if len(parts) > 0 {
			line += ": " + strings.Join(parts, "; ")
		}
		if st.Note != "" {
			line += " — " + st.Note
		}
		fmt.Fprintln(w, line)
	}
	for _, c := range ex.Canaries {
		state := fmt.Sprintf("%d instance(s)", c.Instances)
		if c.Instances == 0 {
			state = "no instance: takes no share"
		}
		fmt.Fprintf(w, "  canary %s: %g%% of baseline requests (%s)\n", c.Lane, c.Percent, state)
	}
	if d := ex.Decision; d != nil {
		fmt.Fprintf(w, "decision: serve from %s, reason %s, eligible %s", laneLabel(d.Lane), d.Reason, strings.Join(d.Eligible, ", "))
		if d.RequestLane != "" {
			fmt.Fprintf(w, "; lane %s travels downstream", d.RequestLane)
		}
		fmt.Fprintln(w)
	}
	if ex.Error != nil {
		fmt.Fprintf(w, "decision: %s (%s)\n", ex.Error.Code, ex.Error.Message)
	}
	if len(ex.Paths) > 0 {
		var parts []string
		for _, p := range ex.Paths {
			parts = append(parts, fmt.Sprintf("%s %s %d", p.Side, p.Path, p.Count))
		}
		fmt.Fprintln(w, "paths: "+strings.Join(parts, ", "))
		for _, p := range ex.Paths {
			if p.Side == "callers" {
				fmt.Fprintf(w, "note: the %s callers route by lanes' xDS resources, where some rules do not hold (canary stickiness by key, retries along the chain, the half-open probe): docs/routing.md, \"Each data path\"\n", p.Path)
			}
		}
	}
	for _, n := range ex.Notes {
		fmt.Fprintln(w, "note: "+n)
	}
}
