package cli

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/lanesdev/lanes/adminapi"
	"github.com/lanesdev/lanes/adminclient"
)

func newTrace() *cobra.Command {
	var (
		cf      clientFlags
		output  string
		last    int
		laneArg string
		service string
	)
	cmd := &cobra.Command{
		Use:   "trace [TRACE_ID]",
		Short: "Show where a request went and why: a trace's hops, with lanes and integrity findings",
		Long: `trace reads the trace collector of 'lanes up'.

With a trace id (the gateway answers every request with it, in x-trace-id and
traceresponse), it prints the trace as a tree of hops: each with its service,
the instance that served it, the lane requested and served, the reason of a
fallback, the duration, and the integrity findings on it. -o json prints the
same hops as a list (depth first, each with its depth).

With --last N (and --lane L, --service S), it lists the newest traces.
'lanes trace findings' lists the integrity findings.

Exit status: 0 when the trace is shown (or the list printed), 1 when the
trace is not in the store or the admin API cannot be reached, 2 on a usage
error.`,
		Example: `  curl -si -H 'x-lane: alice' http://127.0.0.1:8080/ | grep -i x-trace-id
  lanes trace 4bf92f3577b34da6a3ce929d0e0e4736
  lanes trace --last 10 --lane alice
  lanes trace 4bf92f3577b34da6a3ce929d0e0e4736 -o json | jq '.hops[] | {service, lane_served, reason}'`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			if len(args) == 1 && (cmd.Flags().Changed("last") || laneArg != "" || service != "") {
				return &exitError{code: ExitUsage, err: fmt.Errorf("give a trace id, or --last/--lane/--service to list traces, not both")}
			}
			if len(args) == 1 {
				args[0] = strings.ToLower(strings.TrimSpace(args[0]))
				if !adminapi.ValidTraceID(args[0]) {
					return &exitError{code: ExitUsage, err: fmt.Errorf("trace id %q: want 32 hex digits, as the gateway's x-trace-id answers", args[0])}
				}
			}
			if last < 1 || last > 1000 {
				return &exitError{code: ExitUsage, err: fmt.Errorf("--last %d: want a number from 1 to 1000", last)}
			}
			return cf.call(cmd, func(ctx context.Context, c *apiClient) error {
				if len(args) == 0 {
					list, err := c.Traces(ctx, adminclient.TraceFilter{Lane: laneArg, Service: service, Limit: last})
					if err != nil {
						return apiFailure(c, err)
					}
					if output == outJSON || output == outYAML {
						return printAs(cmd.OutOrStdout(), output, list)
					}
					printTraceList(cmd.OutOrStdout(), list, time.Now())
					return nil
				}
				t, err := c.Trace(ctx, args[0])
				if err != nil {
					return apiFailure(c, err)
				}
				if output == outJSON || output == outYAML {
					return printAs(cmd.OutOrStdout(), output, t)
				}
				printTrace(cmd.OutOrStdout(), t)
				return nil
			})
		},
	}
	cf.add(cmd)
	addOutput(cmd, &output, "a summary")
	cmd.Flags().IntVar(&last, "last", 20, "list the newest N traces")
	cmd.Flags().StringVar(&laneArg, "lane", "", "list only traces with a hop in this lane (- for baseline-only traces)")
	cmd.Flags().StringVar(&service, "service", "", "list only traces with a hop of this service")
	cmd.AddCommand(newTraceFindings())
	return cmd
}

func newTraceFindings() *cobra.Command {
	var (
		cf     clientFlags
		output string
		since  time.Duration
		trace  string
	)
	cmd := &cobra.Command{
		Use:   "findings",
		Short: "List lane integrity findings: breaches, needless fallbacks, lost lanes, broken traces",
		Long: `findings lists what the trace collector's integrity checks found on the spans
it received, newest first:

  breach             a baseline request served by a lane instance, or a request
                     served by a lane its chain does not reach
  needless_fallback  a hop fell back although its lane had a live instance
  lane_lost          a span whose lane differs from its parent's, with no
                     routing reason
  trace_broken       a service started a new trace while serving a lane
                     request (a call made with context.Background())

Each names the service, the span and the trace ('lanes trace TRACE_ID').`,
		Example: `  lanes trace findings --since 1h
  lanes trace findings -o json | jq 'group_by(.kind) | map({kind: .[0].kind, n: length})'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			return cf.call(cmd, func(ctx context.Context, c *apiClient) error {
				fs, err := c.Findings(ctx, since, trace)
				if err != nil {
					return apiFailure(c, err)
				}
				if output == outJSON || output == outYAML {
					return printAs(cmd.OutOrStdout(), output, fs)
				}
				printFindings(cmd.OutOrStdout(), fs)
				return nil
			})
		},
	}
	cf.add(cmd)
	addOutput(cmd, &output, "a summary")
	cmd.Flags().DurationVar(&since, "since", time.Hour, "findings of the last duration (0: every one kept)")
	cmd.Flags().StringVar(&trace, "trace", "", "findings on this trace only")
	return cmd
}

// printTrace writes the trace as a tree of hops.
func printTrace(w io.Writer, t adminapi.Trace) {
	var total time.Duration
	if len(t.Hops) > 0 {
		total = t.Hops[0].Duration.D()
	}
	fmt.Fprintf(w, "trace %s: %d hops, %s, %d findings\n", t.TraceID, len(t.Hops), roundDuration(total), len(t.Findings))
	for i, h := range t.Hops {
		indent := strings.Repeat("   ", h.Depth)
		branch := ""
		if h.Depth > 0 {
			branch = "└─ "
			if hasSibling(t.Hops, i) {
				branch = "├─ "
			}
		}
		var b strings.Builder
		switch h.Kind {
		case "client", "producer":
			fmt.Fprintf(&b, "%s → %s  %s", h.Service, firstOf(h.Callee, h.Name), h.Name)
			if h.Lanes {
				fmt.Fprintf(&b, "  lane %s → %s", laneLabel(h.Requested), laneLabel(h.Served))
				if h.Reason != "" && h.Reason != "none" {
					fmt.Fprintf(&b, " (%s)", h.Reason)
				}
			}
			if h.Instance != "" {
				fmt.Fprintf(&b, "  instance %s", h.Instance)
				if h.Address != "" {
					fmt.Fprintf(&b, " %s", h.Address)
				}
			}
			if h.Retries > 0 {
				fmt.Fprintf(&b, "  retries %d", h.Retries)
			}
		default:
			fmt.Fprintf(&b, "%s  %s", h.Service, h.Name)
			if h.Lanes {
				fmt.Fprintf(&b, "  lane %s", laneLabel(h.Requested))
				if h.Kind == "server" || h.Kind == "consumer" {
					fmt.Fprintf(&b, ", served by %s", laneLabel(h.Served))
				}
			}
		}
		fmt.Fprintf(&b, "  %s", roundDuration(h.Duration.D()))
		if h.Error {
			b.WriteString("  ERROR")
		}
		fmt.Fprintf(w, "%s%s%s\n", indent, branch, b.String())
		for _, f := range h.Findings {
			fmt.Fprintf(w, "%s%s   ! %s: %s\n", indent, strings.Repeat(" ", len([]rune(branch))), f.Kind, f.Message)
		}
	}
	// Findings on spans of other traces that point here (trace_broken's parent).
	for _, f := range t.Findings {
		if f.TraceID != t.TraceID {
			fmt.Fprintf(w, "! %s in trace %s (%s, span %s): %s\n", f.Kind, f.TraceID, f.Service, f.Span, f.Message)
		}
	}
}

// hasSibling reports whether a later hop of the same parent follows hop i.
func hasSibling(hops []adminapi.Hop, i int) bool {
	for j := i + 1; j < len(hops); j++ {
		if hops[j].Depth < hops[i].Depth {
			return false
		}
		if hops[j].Depth == hops[i].Depth {
			return true
		}
	}
	return false
}

func roundDuration(d time.Duration) time.Duration {
	switch {
	case d >= time.Second:
		return d.Round(time.Millisecond)
	case d >= time.Millisecond:
		return d.Round(10 * time.Microsecond)
	default:
		return d.Round(time.Microsecond)
	}
}

func printTraceList(w io.Writer, l adminapi.TraceList, now time.Time) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TRACE\tROOT\tSERVICE\tLANES\tSPANS\tERRORS\tFINDINGS\tDURATION\tAGE")
	for _, t := range l.Traces {
		lanes := make([]string, len(t.Lanes))
		for i, x := range t.Lanes {
			lanes[i] = laneLabel(x)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%d\t%s\t%s\n", t.TraceID, t.Root, t.Service, strings.Join(lanes, ","),
			t.Spans, t.Errors, t.Findings, roundDuration(t.Duration.D()), now.Sub(t.Start).Round(time.Second))
	}
	tw.Flush()
	fmt.Fprintf(w, "(%d traces, %d spans stored; %d traces dropped to stay within %d spans, %d MiB, %s)\n",
		l.Stats.Traces, l.Stats.Spans, l.Stats.Dropped.Traces, l.Stats.MaxSpans, l.Stats.MaxBytes>>20, l.Stats.MaxAge)
}

func printFindings(w io.Writer, fs []adminapi.Finding) {
	if len(fs) == 0 {
		fmt.Fprintln(w, "no findings")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "AT\tKIND\tSERVICE\tSPAN\tTRACE\tMESSAGE")
	for _, f := range fs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", f.At.Format(time.TimeOnly), f.Kind, f.Service, f.Span, f.TraceID, f.Message)
	}
	tw.Flush()
}
