package cli

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"

	"github.com/lanesdev/lanes/internal/app/sidecar"
	"github.com/lanesdev/lanes/lanesenv"
	"github.com/lanesdev/lanes/lanesmetrics"
)

func newSidecar() *cobra.Command {
	var cfg sidecar.Config
	cmd := &cobra.Command{
		Use:   "sidecar --service S [--lane L] --listen HOST:PORT --app HOST:PORT [--proxy 127.0.0.1:PORT]",
		Short: "Join a service in any language to lanes, from a process beside it",
		Long: `sidecar runs beside a service that does not use a lanes SDK, and joins it to
its lane:

  - it registers the service's instance (--service, --lane; the baseline
    without --lane) once the app answers at --app (a TCP connection, or a
    2xx/3xx from --ready-path), deregisters it when the app stops answering,
    and on SIGINT or SIGTERM deregisters it at once, then drains;
  - inbound, on --listen (the address registered, unless --advertise), it
    applies the lane guard and passes the requests on to the app, with the
    lane's headers (x-lane, baggage) and a traceparent, for the app to
    forward on its own calls;
  - outbound, on --proxy (loopback only), it routes the app's HTTP calls to
    lanes services by the lane they carry: set HTTP_PROXY=http://PROXY in the
    app, or call the proxy with the service as the Host header.

With --direct it registers the app's own address (or --advertise) and takes
no traffic: for a gRPC app whose clients reach it proxyless over xDS. The
guard is then the app's to apply.

The registry is LANES_REGISTRY (with LANES_TOKEN for the admin API), traces
go to LANES_TRACES, as for the SDK (lanesenv).`,
		Example: `  lanes sidecar --service orders --lane alice --listen 0.0.0.0:8080 --app 127.0.0.1:8081
  lanes sidecar --service orders --listen 127.0.0.1:0 --app 127.0.0.1:8081 --proxy 127.0.0.1:3128 --ready-path /healthz
  lanes sidecar --service pricing --lane alice --direct --app 127.0.0.1:50051`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if cmd.Flags().Changed("drain") && cfg.Drain == 0 {
				cfg.Drain = -1 // none, where Config's 0 is the default
			}
			if err := cfg.Validate(); err != nil {
				return &exitError{code: ExitUsage, err: err}
			}
			if _, err := lanesenv.Parse(nil); err != nil {
				return &exitError{code: ExitUsage, err: err}
			}
			ctx, stop := signalContext()
			defer stop()
			env, err := lanesenv.Open(ctx)
			if err != nil {
				var ee *lanesenv.Error
				if errors.As(err, &ee) {
					return &exitError{code: ExitUsage, err: err}
				}
				return &exitError{code: ExitFail, err: err}
			}
			defer env.Close()
			pr := prometheus.NewRegistry()
			if cfg.Metrics, err = lanesmetrics.New(pr); err != nil {
				return &exitError{code: ExitFail, err: err}
			}
			cfg.Gatherer = pr
			cfg.Out, cfg.Logger = cmd.OutOrStdout(), env.Logger
			s, err := sidecar.Listen(cfg, env.Registry, env.Engine)
			if err != nil {
				return &exitError{code: ExitFail, err: err}
			}
			if err := s.Run(ctx); err != nil {
				return &exitError{code: ExitFail, err: fmt.Errorf("lanes sidecar: %w", err)}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Service, "service", "", "the service the app is an instance of (required)")
	f.StringVar(&cfg.Lane, "lane", "", "the lane of the instance (default: the baseline)")
	f.StringVar(&cfg.Listen, "listen", "", "host:port of the inbound listener, which the instance is registered at (port 0: any; required unless --direct)")
	f.StringVar(&cfg.App, "app", "", "host:port of the app (required)")
	f.StringVar(&cfg.Proxy, "proxy", sidecar.DefaultProxy, "host:port of the outbound proxy, on loopback only (port 0: any)")
	f.StringVar(&cfg.Advertise, "advertise", "", "host:port to register instead of the inbound listener's (with --direct: of --app)")
	f.StringVar(&cfg.ReadyPath, "ready-path", "", "path of the app that answers 2xx or 3xx when it is ready (default: a TCP connection is the check)")
	f.BoolVar(&cfg.Direct, "direct", false, "register the app's own address and take no traffic (no guard: the app's to apply)")
	f.BoolVar(&cfg.PassThrough, "pass-through", false, "send outbound calls to hosts that are not lanes services on, as a plain proxy (default: refused with 502)")
	f.DurationVar(&cfg.TTL, "ttl", 0, "registration TTL: how long the instance outlives a sidecar that dies without deregistering (default 10s)")
	f.DurationVar(&cfg.Drain, "drain", sidecar.DefaultDrain, "how long to serve on after deregistering, on exit or when the app stops answering")
	f.DurationVar(&cfg.ReadyInterval, "ready-interval", sidecar.DefaultReadyInterval, "how often the app's readiness is checked")
	f.IntVar(&cfg.MaxConns, "max-conns", 0, "open connections at once on each listener (default: a quarter of the open-file limit, at most 10000)")
	return cmd
}
