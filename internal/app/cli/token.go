package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/lanesdev/lanes/adminapi"
	"github.com/lanesdev/lanes/internal/lib/bearer"
)

func newToken() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "token",
		Short: "Manage registration tokens (needs the admin token)",
		Long: `token manages the credentials that services and 'lanes dev' register with.
A token is scoped to one lane, or to the baseline: a lane token registers
instances of its lane only, never of another lane or of the baseline; the
baseline needs a baseline token. etcd keeps only a hash of each token.`,
	}
	cmd.AddCommand(newTokenCreate(), newTokenLs(), newTokenRevoke(), newTokenEnvelope())
	return cmd
}

func newTokenCreate() *cobra.Command {
	var cf clientFlags
	var req adminapi.TokenRequest
	var lim adminapi.Limits
	var addrs adminapi.AddressScope
	cmd := &cobra.Command{
		Use:   "create (--lane LANE | --baseline) [--name NAME] [--max-instances N] [--cidr CIDR]... [--port PORTS]...",
		Short: "Create a token; prints it (only this once) on stdout",
		Example: `  lanes token create --lane alice --name "alice's laptop"
  export LANES_TOKEN=$(lanes token create --baseline --name ci)
  lanes token create --lane alice --cidr 10.0.0.0/8 --port 8000-8999`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if (req.Lane == "") == !req.Baseline {
				return &exitError{code: ExitUsage, err: errors.New("give exactly one of --lane LANE and --baseline")}
			}
			for flag, v := range map[string]int{"--max-instances": lim.Instances, "--max-labels": lim.Labels, "--max-instance-bytes": lim.InstanceBytes} {
				if v < 0 {
					return &exitError{code: ExitUsage, err: fmt.Errorf("%s %d: must not be negative (0 takes the control plane's default)", flag, v)}
				}
			}
			if lim != (adminapi.Limits{}) {
				req.Limits = &lim
			}
			if len(addrs.CIDRs) > 0 || len(addrs.Ports) > 0 || addrs.LinkLocal {
				req.Addresses = &addrs
				for i := range addrs.CIDRs {
					cf.fields[fmt.Sprintf("addresses.cidrs[%d]", i)] = "--cidr"
				}
				for i := range addrs.Ports {
					cf.fields[fmt.Sprintf("addresses.ports[%d]", i)] = "--port"
				}
			}
			return cf.call(cmd, func(ctx context.Context, c *apiClient) error {
				t, err := c.CreateToken(ctx, req)
				if err != nil {
					return apiFailure(c, err)
				}
				fmt.Fprintln(cmd.OutOrStdout(), t.Secret)
				fmt.Fprintf(cmd.ErrOrStderr(), "lanes: token %s created (scope: %s); it is shown only this once\n", t.ID, t.Scope())
				return nil
			})
		},
	}
	cf.add(cmd)
	cmd.Flags().StringVar(&req.Lane, "lane", "", "the lane the token registers into")
	cmd.Flags().BoolVar(&req.Baseline, "baseline", false, "the token registers into the baseline")
	cmd.Flags().StringVar(&req.Name, "name", "", "a name to recognise the token by")
	cmd.Flags().IntVar(&lim.Instances, "max-instances", 0, "registrations the token may hold at once (0: the control plane's default, 100)")
	cmd.Flags().IntVar(&lim.Labels, "max-labels", 0, "labels per instance (0: the default, 64)")
	cmd.Flags().IntVar(&lim.InstanceBytes, "max-instance-bytes", 0, "bytes per instance, as JSON (0: the default, 16384)")
	cmd.Flags().StringArrayVar(&addrs.CIDRs, "cidr", nil, "a network the token's instance addresses must be in, such as 10.0.0.0/8 (repeatable; none: any)")
	cmd.Flags().StringArrayVar(&addrs.Ports, "port", nil, "a port, or a range lo-hi, the token's instance addresses may have (repeatable; none: any)")
	cmd.Flags().BoolVar(&addrs.LinkLocal, "link-local", false, "let the token register link-local and cloud metadata addresses (the control plane must allow them: --allow-link-local)")
	cf.fields = map[string]string{"lane": "--lane", "name": "--name",
		"limits.instances": "--max-instances", "limits.labels": "--max-labels", "limits.instance_bytes": "--max-instance-bytes",
		"addresses.link_local": "--link-local"}
	return cmd
}

func newTokenLs() *cobra.Command {
	var cf clientFlags
	var output string
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List the tokens (without their secrets)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			return cf.call(cmd, func(ctx context.Context, c *apiClient) error {
				ts, err := c.Tokens(ctx)
				if err != nil {
					return apiFailure(c, err)
				}
				if output == outJSON || output == outYAML {
					return printAs(cmd.OutOrStdout(), output, map[string]any{"tokens": ts})
				}
				tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "ID\tSCOPE\tNAME\tCREATED")
				for _, t := range ts {
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", t.ID, t.Scope(), dash(t.Name), t.Created.UTC().Format(time.RFC3339))
				}
				return tw.Flush()
			})
		},
	}
	cf.add(cmd)
	addOutput(cmd, &output, "a table")
	return cmd
}

func newTokenRevoke() *cobra.Command {
	var cf clientFlags
	cmd := &cobra.Command{
		Use:   "revoke ID",
		Short: "Revoke a token: it registers and renews nothing from now on",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return cf.call(cmd, func(ctx context.Context, c *apiClient) error {
				if err := c.RevokeToken(ctx, args[0]); err != nil {
					return apiFailure(c, err)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "token %s revoked\n", args[0])
				return nil
			})
		},
	}
	cf.add(cmd)
	return cmd
}

func newLane() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "lane",
		Short: "Manage lane lifetimes (needs the admin token)",
	}
	var cf clientFlags
	var in time.Duration
	var at string
	var never, force bool
	expire := &cobra.Command{
		Use:   "expire LANE (--in DURATION | --at TIME | --never)",
		Short: "Set when a lane expires: its instances then take no traffic and no new ones register",
		Long: `expire sets lanes.<LANE>.expires in the policy document, keeping the rest of
the document as it is. From that time on the lane's instances take no traffic
(requests for the lane fall back as for an empty lane), registrations into it
are refused and its registrations end at their next heartbeat.

A LANE that no instance, policy entry or client claim has is refused as a
likely typo (exit 1), unless --force.`,
		Example: `  lanes lane expire feature-x --in 72h
  lanes lane expire alice --at 2026-12-24T18:00:00Z
  lanes lane expire alice --never`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var u adminapi.LaneUpdate
			n := 0
			if cmd.Flags().Changed("in") {
				if in <= 0 {
					return &exitError{code: ExitUsage, err: fmt.Errorf("--in %s: want a positive duration such as 72h", in)}
				}
				u.ExpiresIn = adminapi.Duration(in)
				n++
			}
			if at != "" {
				t, err := time.Parse(time.RFC3339, at)
				if err != nil {
					return &exitError{code: ExitUsage, err: fmt.Errorf("--at %q: want an RFC 3339 time such as 2026-12-24T18:00:00Z", at)}
				}
				u.Expires = &t
				n++
			}
			if never {
				u.NoExpiry = true
				n++
			}
			if n != 1 {
				return &exitError{code: ExitUsage, err: errors.New("give exactly one of --in, --at and --never")}
			}
			return cf.call(cmd, func(ctx context.Context, c *apiClient) error {
				if !force {
					if err := checkLane(ctx, c, args[0], "sets its expiry"); err != nil {
						return err
					}
				}
				l, err := c.UpdateLane(ctx, args[0], u)
				if err != nil {
					return apiFailure(c, err)
				}
				if l.Expires == nil {
					fmt.Fprintf(cmd.OutOrStdout(), "lane %s does not expire\n", l.Name)
				} else {
					fmt.Fprintf(cmd.OutOrStdout(), "lane %s expires at %s\n", l.Name, l.Expires.UTC().Format(time.RFC3339))
				}
				return nil
			})
		},
	}
	cf.add(expire)
	expire.Flags().DurationVar(&in, "in", 0, "expire after this long, such as 72h")
	expire.Flags().StringVar(&at, "at", "", "expire at this RFC 3339 time")
	expire.Flags().BoolVar(&never, "never", false, "remove the expiry")
	expire.Flags().BoolVar(&force, "force", false, "set the expiry even when no instance or policy entry has that lane")
	cf.fields = map[string]string{"expires_in": "--in", "expires": "--at", "no_expiry": "--never", "lane": "LANE"}
	cmd.AddCommand(expire)
	return cmd
}

func newTokenEnvelope() *cobra.Command {
	var cf clientFlags
	var out string
	var in time.Duration
	cmd := &cobra.Command{
		Use:   "envelope --out FILE [--expires-in DURATION]",
		Short: "Write the token in the envelope that gRPC's xDS bootstrap sends by itself",
		Long: `envelope writes the token (from --token, LANES_TOKEN, ...) into FILE as an
unsigned JSON Web Token whose exp claim is --expires-in from now: the form that
gRPC's xDS bootstrap sends as a bearer token by itself (call credentials
"jwt_token_file", over TLS). The xDS server of 'lanes up' (xds.auth: token)
takes the token out of the envelope and checks it as it checks any token. The
envelope proves nothing by itself: keep FILE as secret as the token.`,
		Example: `  LANES_TOKEN=... lanes token envelope --out /etc/lanes/xds-token.jwt`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if strings.TrimSpace(out) == "" {
				return &exitError{code: ExitUsage, err: errors.New("--out: give the file to write")}
			}
			if in <= 0 {
				return &exitError{code: ExitUsage, err: fmt.Errorf("--expires-in %s: must be positive", in)}
			}
			c, err := cf.client()
			if err != nil {
				return err
			}
			defer c.Close()
			if c.token == "" {
				return &exitError{code: ExitUsage, err: errors.New("no token: give --token, --token-file, LANES_TOKEN or LANES_TOKEN_FILE")}
			}
			exp := time.Now().Add(in)
			if err := os.WriteFile(out, []byte(bearer.Envelope(c.token, exp)+"\n"), 0o600); err != nil {
				return fmt.Errorf("--out %q: %v", out, err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote the token of %s into %s, in an envelope that expires at %s\n", c.tokenFrom, out, exp.UTC().Format(time.RFC3339))
			return nil
		},
	}
	cf.add(cmd)
	cmd.Flags().StringVar(&out, "out", "", "the file to write (mode 0600)")
	cmd.Flags().DurationVar(&in, "expires-in", 30*24*time.Hour, "how long the envelope is taken (its exp claim); the token inside keeps its own limits")
	return cmd
}
