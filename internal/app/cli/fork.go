package cli

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/lanesdev/lanes/adminapi"
)

// forkTarget reads "deploy/NAME" (or "deployment/NAME", or NAME).
func forkTarget(arg string) (string, error) {
	name := arg
	if kind, rest, ok := strings.Cut(arg, "/"); ok {
		switch kind {
		case "deploy", "deployment", "deployments":
			name = rest
		default:
			return "", &exitError{code: ExitUsage, err: fmt.Errorf("%q: lanes forks Deployments: write deploy/NAME", arg)}
		}
	}
	if name == "" {
		return "", &exitError{code: ExitUsage, err: fmt.Errorf("%q: name the Deployment, as deploy/orders", arg)}
	}
	return name, nil
}

func newFork() *cobra.Command {
	var cf clientFlags
	var req adminapi.ForkRequest
	var env []string
	var ttl time.Duration
	cmd := &cobra.Command{
		Use:   "fork deploy/NAME --lane LANE [--image IMAGE] [--env K=V] [--ttl DURATION] [--with-configmaps]",
		Short: "Run a lane's copy of a Kubernetes Deployment, everything else shared",
		Long: `fork asks the control plane (lanes up --kube) for a copy of the Deployment
NAME in the lane: named NAME-LANE, its pods labelled lanes.dev/lane=LANE and
kept out of the Deployment's Services, each of which gets a headless copy in
the lane (so that lanes routes the lane's requests to them and no other, and no
baseline request reaches them through a Service), with --image and
--env changed in its container (the first, or --container), one replica unless
--replicas, and the Deployment's ConfigMaps copied into the lane with
--with-configmaps. Forking the same Deployment into the same lane again
replaces the fork.

The copy is deleted when the fork is deleted (lanes fork delete), its --ttl
passes, or the lane expires (lanes lane expire). fork talks to the admin API
with your token, never to Kubernetes: a lane token forks only into its own
lane.`,
		Example: `  lanes fork deploy/orders --lane alice --image registry.example.com/orders:alice-1
  lanes fork deploy/orders --lane alice --env LOG_LEVEL=debug --ttl 4h --with-configmaps
  lanes fork ls
  lanes fork delete deploy/orders --lane alice`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name, err := forkTarget(args[0])
			if err != nil {
				return err
			}
			req.Deployment = name
			if strings.TrimSpace(req.Lane) == "" {
				return &exitError{code: ExitUsage, err: errors.New("--lane: name the lane the copy serves")}
			}
			for _, kv := range env {
				k, v, ok := strings.Cut(kv, "=")
				if !ok || k == "" {
					return &exitError{code: ExitUsage, err: fmt.Errorf("--env %q: want NAME=VALUE", kv)}
				}
				if req.Env == nil {
					req.Env = map[string]string{}
				}
				req.Env[k] = v
			}
			if ttl < 0 {
				return &exitError{code: ExitUsage, err: fmt.Errorf("--ttl %s: must be positive", ttl)}
			}
			req.TTL = adminapi.Duration(ttl)
			return cf.call(cmd, func(ctx context.Context, c *apiClient) error {
				f, err := c.Fork(ctx, req)
				if err != nil {
					return apiFailure(c, err)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "fork %s/%s of deploy/%s in lane %s", f.Namespace, f.Name, f.Deployment, f.Lane)
				if f.Expires != nil {
					fmt.Fprintf(cmd.OutOrStdout(), ", until %s", f.Expires.UTC().Format(time.RFC3339))
				}
				fmt.Fprintln(cmd.OutOrStdout(), "; the control plane makes it (lanes fork ls: its status)")
				return nil
			})
		},
	}
	cf.add(cmd)
	cmd.Flags().StringVar(&req.Lane, "lane", "", "the lane the copy serves")
	cmd.Flags().StringVarP(&req.Namespace, "namespace", "n", "", "namespace of the Deployment (default: the control plane's first --kube-namespace)")
	cmd.Flags().StringVar(&req.Image, "image", "", "image of the copy's container")
	cmd.Flags().StringVar(&req.Container, "container", "", "the container that --image and --env change (default: the first)")
	cmd.Flags().StringArrayVar(&env, "env", nil, "NAME=VALUE variable of the copy's container (repeatable)")
	cmd.Flags().IntVar(&req.Replicas, "replicas", 0, "replicas of the copy (default 1)")
	cmd.Flags().DurationVar(&ttl, "ttl", 0, "delete the copy this long after now, such as 4h (default: when the lane expires or the fork is deleted)")
	cmd.Flags().BoolVar(&req.ConfigMaps, "with-configmaps", false, "copy the ConfigMaps the pods use into the lane")
	cf.fields = map[string]string{"lane": "--lane", "namespace": "--namespace", "image": "--image", "container": "--container",
		"env": "--env", "replicas": "--replicas", "ttl": "--ttl", "deployment": "deploy/NAME"}
	cmd.AddCommand(newForkList(), newForkDelete())
	return cmd
}

func newForkList() *cobra.Command {
	var cf clientFlags
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List the forks your token may see",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return cf.call(cmd, func(ctx context.Context, c *apiClient) error {
				forks, err := c.Forks(ctx)
				if err != nil {
					return apiFailure(c, err)
				}
				tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
				fmt.Fprintln(tw, "LANE\tNAMESPACE\tFORK\tOF\tIMAGE\tEXPIRES\tSTATUS")
				for _, f := range forks {
					exp := "-"
					if f.Expires != nil {
						exp = f.Expires.UTC().Format(time.RFC3339)
					}
					img := f.Image
					if img == "" {
						img = "(as the baseline's)"
					}
					status := f.Status
					if status == "" {
						status = "(not yet seen by the controller)"
					}
					fmt.Fprintf(tw, "%s\t%s\t%s\tdeploy/%s\t%s\t%s\t%s\n", f.Lane, f.Namespace, f.Name, f.Deployment, img, exp, status)
				}
				return tw.Flush()
			})
		},
	}
	cf.add(cmd)
	return cmd
}

func newForkDelete() *cobra.Command {
	var cf clientFlags
	var l, ns string
	cmd := &cobra.Command{
		Use:   "delete deploy/NAME --lane LANE",
		Short: "End a lane's fork of a Deployment: the control plane deletes the copy",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name, err := forkTarget(args[0])
			if err != nil {
				return err
			}
			if strings.TrimSpace(l) == "" {
				return &exitError{code: ExitUsage, err: errors.New("--lane: name the fork's lane")}
			}
			return cf.call(cmd, func(ctx context.Context, c *apiClient) error {
				space := ns
				if space == "" {
					// the fork's namespace, as the control plane chose it
					forks, err := c.Forks(ctx)
					if err != nil {
						return apiFailure(c, err)
					}
					for _, f := range forks {
						if f.Lane == strings.ToLower(strings.TrimSpace(l)) && f.Deployment == name {
							if space != "" {
								return &exitError{code: ExitUsage, err: fmt.Errorf("lane %s forks deploy/%s in several namespaces: give --namespace", l, name)}
							}
							space = f.Namespace
						}
					}
					if space == "" {
						return &exitError{code: ExitFail, err: fmt.Errorf("lane %s has no fork of deploy/%s", l, name)}
					}
				}
				if err := c.DeleteFork(ctx, l, space, name); err != nil {
					return apiFailure(c, err)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "fork of deploy/%s in lane %s deleted\n", name, l)
				return nil
			})
		},
	}
	cf.add(cmd)
	cmd.Flags().StringVar(&l, "lane", "", "the fork's lane")
	cmd.Flags().StringVarP(&ns, "namespace", "n", "", "namespace of the Deployment (default: the fork's)")
	cf.fields = map[string]string{"lane": "--lane", "namespace": "--namespace", "deployment": "deploy/NAME"}
	return cmd
}
