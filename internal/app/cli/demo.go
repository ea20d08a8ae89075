package cli

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"time"

	"github.com/spf13/cobra"

	"github.com/lanesdev/lanes/internal/app/controlplane"
	"github.com/lanesdev/lanes/internal/app/demo"
	"github.com/lanesdev/lanes/internal/lib/logs"
)

func newDemo(stderr io.Writer) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run the control plane with a sample topology, and show lanes at work",
		Long: `demo runs what 'lanes up' runs, plus a chain of sample HTTP services on
loopback ports: web → orders → payments, with a baseline instance of each, a
feature-x instance of orders and an alice instance of payments. The gateway
routes / to web (unless --route says otherwise), and every answer lists the
hops the request took, with the lane of each instance that served it.

It prints the commands that show lanes at work, then serves until Ctrl-C. It
takes the same settings as 'lanes up' (addresses, data directory, etcd).`,
		Example: `  lanes demo
  lanes demo --gateway-addr 127.0.0.1:9080 --admin-addr 127.0.0.1:9700 --data-dir /tmp/lanes-demo`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			defaults := controlplane.Defaults()
			defaults.Routes = []string{"/=" + demo.Entry}
			cfg, err := configFrom(cmd, defaults)
			if err != nil {
				return &exitError{code: ExitUsage, err: err}
			}
			ctx, stop := signalContext()
			defer stop()
			log := logs.Must(stderr, cfg.LogLevel, cfg.LogFormat)
			s, err := controlplane.Start(ctx, cfg, controlplane.WithLogger(log), controlplane.WithProgress(stderr))
			if err != nil {
				if ctx.Err() != nil {
					return nil // stopped while starting
				}
				return &exitError{code: ExitFail, err: err}
			}
			defer s.Close()
			store, _ := controlplane.Value(s, controlplane.StoreKey)
			engine, _ := controlplane.Value(s, controlplane.EngineKey)
			fmt.Fprintln(stderr, "lanes: starting the sample services web, orders and payments; waiting until the engine lists them (up to 30s)...")
			sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			traces, _ := controlplane.Value(s, controlplane.TracesKey)
			topo, err := demo.Start(sctx, demo.Config{Registry: store, Engine: engine, Logger: log, Traces: traces.GRPCAddr, TracesToken: traces.Token, TracesTLS: traces.ClientTLS})
			cancel()
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return &exitError{code: ExitFail, err: err}
			}
			defer topo.Close()
			out := cmd.OutOrStdout()
			controlplane.PrintAddresses(out, s.Addresses())
			controlplane.PrintServiceEnv(out, s)
			defer controlplane.RecordAdmin(s)()
			printDemoHelp(out, s)
			select {
			case <-ctx.Done():
				log.Info("stopping")
			case err := <-s.Failed():
				return &exitError{code: ExitFail, err: err}
			}
			return nil
		},
	}
	addSettingFlags(cmd)
	return cmd
}

func printDemoHelp(w io.Writer, s *controlplane.Server) {
	gateway, _ := controlplane.Value(s, controlplane.GatewayKey)
	adminAPI, _ := controlplane.Value(s, controlplane.AdminKey)
	cfg := s.Config()
	gw := gateway.URL
	port := ""
	if u, err := url.Parse(gw); err == nil {
		port = u.Port()
	}
	admin := ""
	if adminAPI.URL != "http://127.0.0.1:7700" {
		admin = " --admin " + adminAPI.URL
	}
	if cfg.DataDir != controlplane.Defaults().DataDir && cfg.AdminToken == "" {
		admin += " --data-dir " + cfg.DataDir
	}
	fmt.Fprintf(w, `
The demo runs web → orders → payments: a baseline instance of each, orders in
lane feature-x, payments in lane alice. Every answer lists the hops. Try:

  # baseline: web-1 → orders-1 → payments-1
  curl %[1]s/
  # lane feature-x: orders-feature-x; web and payments fall back to the baseline
  curl -H 'x-lane: feature-x' %[1]s/
  # lane alice: payments-alice, from a header, the host name or a cookie
  curl -H 'x-lane: alice' %[1]s/
  curl http://alice.%[2]s:%[3]s/
  curl --cookie 'lane=alice' %[1]s/

  # what the control plane knows, and why a request goes where it goes
  %[5]s ls%[4]s
  %[5]s route explain payments --lane alice%[4]s

  # where a request went: every answer names its trace in x-trace-id, and
  # 'lanes trace ID' shows it hop by hop; the last ones:
  curl -si -H 'x-lane: alice' %[1]s/ | grep -i x-trace-id
  %[5]s trace --last 5%[4]s

lanes is up. Ctrl-C stops it.
`, gw, cfg.Domain, port, admin, selfCommand())
}
