package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/lanesdev/lanes/adminapi"
	"github.com/lanesdev/lanes/adminclient"
)

func checkOutput(o string, allowed ...string) error {
	for _, a := range allowed {
		if o == a {
			return nil
		}
	}
	return &exitError{code: ExitUsage, err: fmt.Errorf("-o %s: want %s", o, strings.Join(allowed, " or "))}
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func newLs() *cobra.Command {
	var cf clientFlags
	var output string
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List services, instances and lanes",
		Long: `ls lists what the control plane knows: the services, their instances (with the
lane each serves in after the policy's tag rules) and the lanes (from the
policy, the instances and the client claims of dev sessions).`,
		Example: `  lanes ls
  lanes ls -o json | jq '.instances[] | select(.lane == "alice")'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(output, "table", "json"); err != nil {
				return err
			}
			return cf.call(cmd, func(ctx context.Context, c *adminclient.Client) error {
				var err error
				var l adminapi.Listing
				if l.Services, err = c.Services(ctx); err != nil {
					return apiFailure(c, err)
				}
				if l.Instances, err = c.Instances(ctx, ""); err != nil {
					return apiFailure(c, err)
				}
				if l.Lanes, err = c.Lanes(ctx); err != nil {
					return apiFailure(c, err)
				}
				if output == "json" {
					return printJSON(cmd.OutOrStdout(), l)
				}
				printListing(cmd.OutOrStdout(), l)
				return nil
			})
		},
	}
	cf.add(cmd)
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table or json")
	return cmd
}

func printListing(w io.Writer, l adminapi.Listing) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SERVICE\tINSTANCES\tLANES")
	for _, s := range l.Services {
		var lanes []string
		for _, ln := range s.Lanes {
			lanes = append(lanes, laneLabel(ln))
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\n", s.Name, s.Instances, strings.Join(lanes, ", "))
	}
	if len(l.Services) == 0 {
		fmt.Fprintln(tw, "(none)\t\t")
	}
	tw.Flush()
	fmt.Fprintln(w)

	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SERVICE\tINSTANCE\tLANE\tADDR\tZONE\tWEIGHT\tSTATE")
	for _, in := range l.Instances {
		ln := laneLabel(in.EffectiveLane)
		if in.EffectiveLane != in.Lane {
			ln += " (tagged; registered " + laneLabel(in.Lane) + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\n", in.Service, in.ID, ln, in.Addr, dash(in.Zone), in.Weight, in.State)
	}
	if len(l.Instances) == 0 {
		fmt.Fprintln(tw, "(none)\t\t\t\t\t\t")
	}
	tw.Flush()
	fmt.Fprintln(w)

	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "LANE\tINSTANCES\tSERVICES\tFALLBACK\tEXPIRES\tCLIENTS")
	for _, ln := range l.Lanes {
		fb := strings.Join(ln.Fallback, ",")
		if ln.Strict {
			fb = strings.TrimPrefix(fb+" (strict)", " ")
		}
		exp := "-"
		if ln.Expires != nil {
			exp = ln.Expires.UTC().Format(time.RFC3339)
			if ln.Expired {
				exp += " (expired)"
			}
		}
		clients := append(append([]string{}, ln.Clients...), ln.Claims...)
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", ln.Name, strconv.Itoa(ln.Instances), dash(strings.Join(ln.Services, ",")), dash(fb), exp, dash(strings.Join(clients, ",")))
	}
	if len(l.Lanes) == 0 {
		fmt.Fprintln(tw, "(none)\t\t\t\t\t")
	}
	tw.Flush()
}
