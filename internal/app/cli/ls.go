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
	"github.com/lanesdev/lanes/internal/lib/tunnel"
	"github.com/lanesdev/lanes/registry"
)

func newLs() *cobra.Command {
	var cf clientFlags
	var output, service string
	var watch, force bool
	cmd := &cobra.Command{
		Use:   "ls [--service S] [-w]",
		Short: "List services, instances and lanes",
		Long: `ls lists what the control plane knows: the services, their instances (with the
lane each serves in after the policy's tag rules) and the lanes (from the
policy, the instances and the client claims of dev sessions).

With --service, only that service, its instances and the lanes it has
instances in; a service that no instance has registered is a typo (exit
status 1) unless --force, or -w, which waits for it. With -w (--watch), ls lists again at every change of the
instances, until Ctrl-C (with -o json or yaml, one document per change).`,
		Example: `  lanes ls
  lanes ls --service payments -w
  lanes ls -o json | jq '.instances[] | select(.lane == "alice")'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			if service != "" {
				if err := registry.CheckService(service); err != nil {
					return &exitError{code: ExitUsage, err: fmt.Errorf("--service %q: %s", service, err.(*registry.FieldError).Msg)}
				}
			}
			list := func(ctx context.Context, c *apiClient) (adminapi.Listing, error) {
				var err error
				var l adminapi.Listing
				if l.Services, err = c.Services(ctx); err != nil {
					return l, apiFailure(c, err)
				}
				if l.Instances, err = c.Instances(ctx, service); err != nil {
					return l, apiFailure(c, err)
				}
				if l.Lanes, err = c.Lanes(ctx); err != nil {
					return l, apiFailure(c, err)
				}
				if service != "" {
					l = onlyService(l, service)
				}
				return l, nil
			}
			show := func(l adminapi.Listing) error {
				out := cmd.OutOrStdout()
				switch output {
				case outJSON:
					if watch { // one document per line
						return json.NewEncoder(out).Encode(l)
					}
					return printJSON(out, l)
				case outYAML:
					if watch {
						fmt.Fprintln(out, "---")
					}
					return printYAML(out, l)
				}
				printListing(out, l)
				return nil
			}
			if !watch {
				return cf.call(cmd, func(ctx context.Context, c *apiClient) error {
					l, err := list(ctx, c)
					if err != nil {
						return err
					}
					if service != "" && !force && len(l.Services) == 0 && len(l.Instances) == 0 {
						return noService(service, "lists it")
					}
					return show(l)
				})
			}
			c, err := cf.client()
			if err != nil {
				return err
			}
			defer c.Close()
			ctx, stop := signalContext()
			defer stop()
			return watchListing(ctx, cmd, c, service, output, list, show)
		},
	}
	cf.add(cmd)
	addOutput(cmd, &output, "tables")
	cmd.Flags().StringVar(&service, "service", "", "only this service")
	cmd.Flags().BoolVarP(&watch, "watch", "w", false, "list again at every change, until Ctrl-C")
	cmd.Flags().BoolVar(&force, "force", false, "list even when no service has the name given to --service")
	return cmd
}

// watchListing prints the listing, then again at every change of the
// instances, until ctx is done. A broken stream is opened again.
func watchListing(ctx context.Context, cmd *cobra.Command, c *apiClient, service, output string,
	list func(context.Context, *apiClient) (adminapi.Listing, error), show func(adminapi.Listing) error) error {
	first := true
	for ctx.Err() == nil {
		s, err := c.WatchInstances(ctx, service)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return apiFailure(c, err)
		}
		for {
			if _, err := s.Next(); err != nil {
				break
			}
			lctx, cancel := context.WithTimeout(ctx, callTimeout)
			l, err := list(lctx, c)
			cancel()
			if err != nil {
				s.Close()
				if ctx.Err() != nil {
					return nil
				}
				return err
			}
			if !first && output == outText {
				fmt.Fprintf(cmd.OutOrStdout(), "\n--- %s\n", time.Now().Format(time.TimeOnly))
			}
			first = false
			if err := show(l); err != nil {
				s.Close()
				return err
			}
		}
		s.Close()
		if ctx.Err() == nil {
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}
	return nil
}

// onlyService keeps service s of a listing: the service, its instances, and
// the lanes it has instances in.
func onlyService(l adminapi.Listing, s string) adminapi.Listing {
	var out adminapi.Listing
	for _, sv := range l.Services {
		if sv.Name == s {
			out.Services = append(out.Services, sv)
		}
	}
	for _, in := range l.Instances {
		if in.Service == s {
			out.Instances = append(out.Instances, in)
		}
	}
	for _, ln := range l.Lanes {
		for _, sv := range ln.Services {
			if sv == s {
				out.Lanes = append(out.Lanes, ln)
				break
			}
		}
	}
	return out
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
		addr := in.Addr
		if where := tunnel.Describe(in.Labels); where != "" {
			addr += " (" + where + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\n", in.Service, in.ID, ln, addr, dash(in.Zone), in.Weight, in.State)
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
