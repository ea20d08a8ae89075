package cli

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/lanesdev/lanes/adminapi"
	"github.com/lanesdev/lanes/adminclient"
	"github.com/lanesdev/lanes/internal/lib/logs"
	"github.com/lanesdev/lanes/internal/lib/regid"
	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/registry"
)

func newDev() *cobra.Command {
	var cf clientFlags
	var service, laneName, addr, id, zone string
	var labels []string
	var claimIP, useTunnel bool
	var ttl time.Duration
	var logFormat string
	cmd := &cobra.Command{
		Use:   "dev --service S --lane L --addr HOST:PORT [--claim-ip] [--tunnel] [-- COMMAND ARGS...]",
		Short: "Put a process running here into a lane until Ctrl-C",
		Long: `dev registers a process that runs on this machine (listening on --addr) as an
instance of --service in --lane, keeps the registration alive with heartbeats,
and deregisters it on Ctrl-C (or SIGTERM). Requests that carry the lane reach
it; everything else keeps going to the shared baseline.

With --claim-ip, the address this machine reaches the control plane from is
claimed for the lane for as long as dev runs: the gateway then puts every
request from it in the lane, with no header to add.

It prints the requests that reach the instance through the gateway. The token
must be scoped to the lane (lanes token create --lane L), or be the admin
token of a local 'lanes up'.

Through a tunnel (--tunnel, and the default when --addr is a loopback address
and the admin API is not on this machine), dev opens one connection to the
admin API, over which the control plane relays the lane's requests to --addr,
and this machine's processes reach the environment: dev prints LANES_DIAL
(the SDK's transports dial instances through it), LANES_NATS (a local
forward to the environment's NATS) and LANES_REGISTRY, and passes them to
COMMAND when one follows "--". The instance lives as long as the tunnel:
when it drops, the control plane deregisters it and dev reconnects and
registers it again. See docs/dev.md.`,
		Example: `  lanes dev --service payments --lane alice --addr 127.0.0.1:9000
  LANES_TOKEN=... lanes dev --service orders --lane feature-x --addr 10.1.2.3:8080 --claim-ip
  LANES_ADMIN=https://lanes.example.com LANES_TOKEN=... lanes dev --service orders --lane alice --addr 127.0.0.1:9000 -- go run ./cmd/orders`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 && cmd.ArgsLenAtDash() != 0 {
				return fmt.Errorf("unexpected argument %q: a command to run goes after --", args[0])
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			out, errw := cmd.OutOrStdout(), cmd.ErrOrStderr()
			if err := logs.CheckFormat(logFormat); err != nil {
				return &exitError{code: ExitUsage, err: fmt.Errorf("--log-format %q: %v", logFormat, err)}
			}
			if err := registry.CheckService(service); err != nil {
				return &exitError{code: ExitUsage, err: fmt.Errorf("--service %q: %s", service, err.(*registry.FieldError).Msg)}
			}
			l, err := lane.Parse(laneName)
			if err != nil {
				return &exitError{code: ExitUsage, err: fmt.Errorf("--lane: %v", err)}
			}
			if err := registry.CheckAddr(addr); err != nil {
				return &exitError{code: ExitUsage, err: fmt.Errorf("--addr %q: %v", addr, err)}
			}
			lbl := map[string]string{}
			for _, kv := range labels {
				k, v, ok := strings.Cut(kv, "=")
				if !ok || k == "" {
					return &exitError{code: ExitUsage, err: fmt.Errorf("--label %q: want key=value", kv)}
				}
				lbl[k] = v
			}
			if _, ok := lbl[registry.LabelPath]; !ok {
				lbl[registry.LabelPath] = registry.PathDev
			}
			host, _ := os.Hostname()
			if id == "" {
				_, port, _ := net.SplitHostPort(addr)
				id = sanitizeID(l + "-" + host + "-" + port)
			}
			inst := registry.Instance{Service: service, ID: id, Addr: addr, Lane: l, Zone: zone, Host: host, Version: "lanes-dev", Labels: lbl}
			if _, err := registry.Normalize(inst); err != nil {
				return &exitError{code: ExitUsage, err: err}
			}

			c, err := cf.client()
			if err != nil {
				return err
			}
			defer c.Close()
			ctx, stop := signalContext()
			defer stop()

			ictx, cancel := context.WithTimeout(ctx, 10*time.Second)
			info, infoErr := c.Info(ictx)
			cancel()
			if infoErr != nil && !adminapi.IsCode(infoErr, adminapi.CodeNotFound) {
				return apiFailure(c, infoErr)
			}
			if !cmd.Flags().Changed("tunnel") {
				useTunnel = tunnelNeeded(c.URL(), addr)
			}
			if len(args) > 0 && !useTunnel {
				return &exitError{code: ExitUsage, err: fmt.Errorf("a command after -- runs only with --tunnel, which gives it the variables to reach the environment")}
			}
			if conn, err := net.DialTimeout("tcp", addr, time.Second); err != nil {
				fmt.Fprintf(errw, "lanes dev: warning: nothing answers at %s yet; requests in lane %s will fail until it does\n", addr, l)
			} else {
				conn.Close()
			}

			if useTunnel {
				d := &devTunnel{c: c, caFile: firstOf(cf.caFile, getenv(adminclient.EnvCAFile)), inst: inst, labels: lbl, out: out, errw: errw, claimIP: claimIP, info: info, command: args}
				return d.run(ctx)
			}

			reg := adminclient.NewRegistry(c.Client, adminclient.WithLogger(logs.Must(errw, "warn", logFormat)))
			defer reg.Close()
			rctx, cancel := context.WithTimeout(ctx, callTimeout)
			lease, err := reg.Register(rctx, inst, ttl)
			cancel()
			if err != nil {
				return apiFailure(c, err)
			}
			regID := regid.Of(lease)
			fmt.Fprintf(out, "lanes dev: %s/%s registered in lane %s at %s (registration %s)\n", service, id, l, addr, regID)

			claimed := ""
			claim := func() {
				cctx, cancel := context.WithTimeout(ctx, callTimeout)
				defer cancel()
				rid := regid.Of(lease)
				cl, err := c.Claim(cctx, adminapi.ClaimRequest{Lane: l, Registration: rid})
				if err != nil {
					fmt.Fprintf(errw, "lanes dev: could not claim this client for lane %s: %v\n", l, err)
					return
				}
				if claimed == "" {
					fmt.Fprintf(out, "lanes dev: client %s claimed for lane %s: its requests through the gateway go to lane %s\n", cl.IP, l, l)
				}
				claimed = rid
			}
			if claimIP {
				claim()
			}
			printCurls(out, info, service, l, claimIP)
			fmt.Fprintln(out, "Ctrl-C deregisters.")

			tick := time.NewTicker(2 * time.Second)
			defer tick.Stop()
			for {
				select {
				case <-ctx.Done():
					if err := lease.Close(); err != nil {
						fmt.Fprintf(errw, "lanes dev: %v\n", err)
						return &exitError{code: ExitFail}
					}
					fmt.Fprintf(out, "lanes dev: %s/%s deregistered\n", service, id)
					return nil
				case <-lease.Done():
					return &exitError{code: ExitFail, err: fmt.Errorf("registration of %s/%s ended: %v", service, id, lease.Err())}
				case <-tick.C:
					// A registration made again (after a long pause) has a new
					// lease: claim again on it.
					if claimIP && regid.Of(lease) != claimed {
						claim()
					}
				}
			}
		},
	}
	cf.add(cmd)
	cmd.Flags().StringVar(&service, "service", "", "the service the process is an instance of (required)")
	cmd.Flags().StringVar(&laneName, "lane", "", "the lane to register into (required)")
	cmd.Flags().StringVar(&addr, "addr", "", "host:port the process listens on, as the gateway and callers reach it (required)")
	cmd.Flags().BoolVar(&useTunnel, "tunnel", false, "reach the environment through a tunnel to the admin API, both ways (default: when --addr is a loopback address and the admin API is on another machine)")
	cmd.Flags().BoolVar(&claimIP, "claim-ip", false, "send every request from this machine's address through the gateway into the lane")
	cmd.Flags().StringVar(&id, "id", "", "instance id (default: <lane>-<hostname>-<port>)")
	cmd.Flags().StringVar(&zone, "zone", "", "the instance's zone")
	cmd.Flags().StringArrayVar(&labels, "label", nil, "label key=value (repeatable)")
	cf.fields = map[string]string{"ttl": "--ttl", "lane": "--lane", "addr": "--addr", "zone": "--zone", "id": "--id", "service": "--service"}
	cmd.Flags().StringVar(&logFormat, "log-format", "text", "format of the warnings about the registration: text or json")
	cmd.Flags().DurationVar(&ttl, "ttl", 10*time.Second, "registration TTL: how long the instance outlives a dev that stops without deregistering")
	for _, f := range []string{"service", "lane", "addr"} {
		cmd.MarkFlagRequired(f)
	}
	return cmd
}

func sanitizeID(s string) string {
	b := []byte(s)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			b[i] = '-'
		}
	}
	if len(b) > 200 {
		b = b[:200]
	}
	return string(b)
}

// printCurls prints the requests that reach the lane through the gateway.
func printCurls(w io.Writer, info adminapi.Info, service, l string, claimed bool) {
	gw := info.Gateway
	if gw.URL == "" {
		return
	}
	var rt *adminapi.Route
	for i := range gw.Routes {
		if gw.Routes[i].Service == service {
			rt = &gw.Routes[i]
			break
		}
	}
	via := ""
	if rt == nil && len(gw.Routes) > 0 {
		rt = &gw.Routes[0]
		via = fmt.Sprintf(" (through %s, which carries the lane on to %s)", rt.Service, service)
	}
	if rt == nil {
		fmt.Fprintf(w, "The gateway at %s has no routes; start lanes up with --route /=SERVICE to reach lanes through it.\n", gw.URL)
		return
	}
	path := rt.Prefix
	if path == "" {
		path = "/"
	}
	host := ""
	if rt.Host != "" {
		host = fmt.Sprintf(" -H 'Host: %s'", rt.Host)
	}
	fmt.Fprintf(w, "Reach it through the gateway%s:\n", via)
	fmt.Fprintf(w, "  curl -H 'x-lane: %s'%s %s%s\n", l, host, gw.URL, path)
	fmt.Fprintf(w, "  curl --cookie 'lane=%s'%s %s%s\n", l, host, gw.URL, path)
	if gw.Domain != "" && rt.Host == "" {
		if u, err := url.Parse(gw.URL); err == nil {
			fmt.Fprintf(w, "  curl http://%s.%s:%s%s\n", l, gw.Domain, u.Port(), path)
		}
	}
	if claimed {
		fmt.Fprintf(w, "  curl%s %s%s   # from this machine: claimed, no header needed\n", host, gw.URL, path)
	}
}

// tunnelNeeded reports whether the control plane at admin cannot reach addr:
// addr is a loopback address and the admin API is not on this machine.
func tunnelNeeded(admin, addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	ip := net.ParseIP(host)
	if host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return false
	}
	u, err := url.Parse(admin)
	if err != nil {
		return false
	}
	h := u.Hostname()
	aip := net.ParseIP(h)
	return h != "localhost" && (aip == nil || !aip.IsLoopback())
}
