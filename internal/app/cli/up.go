package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/lanesdev/lanes/internal/app/controlplane"
	"github.com/lanesdev/lanes/internal/app/kube"
	"github.com/lanesdev/lanes/internal/lib/logs"
)

// getenv is how the commands read the environment (tests replace it).
var getenv = os.Getenv

const settingsHelp = `Settings come from, in order of precedence: flags, LANES_* environment
variables, the config file (--config or LANES_CONFIG), the defaults. The
config file is YAML, read strictly (an unknown field is an error naming its
line):

  data_dir: .lanes
  admin_addr: 127.0.0.1:7700
  gateway_addr: 127.0.0.1:8080
  domain: lanes.localhost
  routes: ["/=web", "api.example.com=orders"]
  trusted_proxies: ["10.0.0.0/8"]
  gateway:
    disable: [host]
    strip_prefixes: [/api]
  etcd:
    endpoints: ["https://etcd-1:2379", "https://etcd-2:2379"]
    ca: /etc/lanes/etcd-ca.pem
    username: lanes
    password: ...
    prefix: /lanes/

`

func settingsTable() string {
	var b strings.Builder
	b.WriteString(settingsHelp)
	tw := tabwriter.NewWriter(&b, 0, 0, 1, ' ', 0)
	fmt.Fprintln(tw, "Flag\tVariable\tFile key")
	for _, s := range controlplane.Settings {
		fmt.Fprintf(tw, "--%s\t%s\t%s\n", s.Flag, s.Env, s.Key)
	}
	fmt.Fprintf(tw, "--%s\t%s\t\n", "config", controlplane.EnvConfig)
	tw.Flush()
	return b.String()
}

// addSettingFlags adds a flag for every setting of `lanes up`.
func addSettingFlags(cmd *cobra.Command) {
	d := controlplane.Defaults()
	defaults := map[string]string{
		"data-dir": d.DataDir, "admin-addr": d.AdminAddr, "gateway-addr": d.GatewayAddr, "domain": d.Domain,
		"log-level": d.LogLevel, "log-format": d.LogFormat, "etcd-prefix": d.Etcd.Prefix, "etcd-client-addr": d.Etcd.ClientAddr,
		"etcd-peer-addr": d.Etcd.PeerAddr, "etcd-dial-timeout": d.Etcd.DialTimeout.String(), "nats-addr": d.Nats.Addr,
	}
	for _, s := range controlplane.Settings {
		usage := s.Usage + " (" + s.Env + ")"
		if s.List {
			cmd.Flags().StringArray(s.Flag, nil, usage)
		} else if s.Bool {
			cmd.Flags().Bool(s.Flag, false, usage)
		} else {
			cmd.Flags().String(s.Flag, defaults[s.Flag], usage)
		}
	}
	cmd.Flags().String("config", "", "config file (YAML) ("+controlplane.EnvConfig+")")
}

// configFrom assembles the configuration: defaults, file, environment,
// flags. Its errors are usage errors.
func configFrom(cmd *cobra.Command, defaults controlplane.Config) (controlplane.Config, error) {
	cfg := defaults
	path, _ := cmd.Flags().GetString("config")
	if path == "" {
		path = getenv(controlplane.EnvConfig)
	}
	if path != "" {
		if err := cfg.LoadFile(path); err != nil {
			return cfg, err
		}
	}
	if err := cfg.ApplyEnv(getenv); err != nil {
		return cfg, err
	}
	var err error
	cmd.Flags().Visit(func(f *pflag.Flag) {
		if err != nil || f.Name == "config" {
			return
		}
		var vals []string
		if f.Value.Type() == "stringArray" {
			vals, _ = cmd.Flags().GetStringArray(f.Name)
		} else {
			vals = []string{f.Value.String()}
		}
		err = cfg.Set(f.Name, vals)
	})
	if err != nil {
		return cfg, err
	}
	return cfg, cfg.Validate()
}

// signalContext is cancelled by SIGINT or SIGTERM. After the first signal,
// a second one kills the process as usual.
func signalContext() (context.Context, context.CancelFunc) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop()
	}()
	return ctx, stop
}

func newUp(stderr io.Writer) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Run the control plane: embedded etcd, admin API and gateway",
		Long: `up runs the lanes control plane in one process: an embedded etcd with its data
in --data-dir (or a connection to an external etcd cluster), the admin API and
the gateway. It prints each address, then serves until SIGINT or SIGTERM, and
stops gracefully.

The admin credential is created on first start in <data-dir>/admin-token
(mode 0600) unless given with --admin-token or LANES_ADMIN_TOKEN; the other
commands read it from there. Registration tokens for lanes and the baseline
are made with 'lanes token create'.

` + settingsTable(),
		Example: `  lanes up --route /=web
  lanes up --route /=web --route api.example.com=orders --trusted-proxy 10.0.0.0/8
  LANES_EXTERNAL_ETCD=https://etcd-1:2379 LANES_ETCD_CA=ca.pem lanes up --config lanes.yaml`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := configFrom(cmd, controlplane.Defaults())
			if err != nil {
				return &exitError{code: ExitUsage, err: err}
			}
			ctx, stop := signalContext()
			defer stop()
			log := logs.Must(stderr, cfg.LogLevel, cfg.LogFormat)
			opts := []controlplane.Option{controlplane.WithLogger(log), controlplane.WithProgress(stderr)}
			if cfg.Kube.Enabled {
				kube.LogTo(log) // before anything of client-go runs
				opts = append(opts, controlplane.WithComponents(kube.NewComponent()))
			}
			if err := controlplane.Run(ctx, cfg, cmd.OutOrStdout(), opts...); err != nil {
				return &exitError{code: ExitFail, err: err}
			}
			return nil
		},
	}
	addSettingFlags(cmd)
	return cmd
}
