package controlplane

import (
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/lanesdev/lanes/etcdstore"
	"github.com/lanesdev/lanes/internal/lib/tlsfiles"
	"github.com/lanesdev/lanes/lanestrace"
)

// ServiceEnv returns the variables a service exports to join this control
// plane through package lanesenv: LANES_REGISTRY with the etcd endpoints
// in use (etcd://host:port,...), the embedded etcd's user and password
// file when its authentication is on, LANES_ETCD_PREFIX when the prefix is
// not the default, LANES_NATS with the NATS server in use when there is one,
// and LANES_TRACES with the trace collector's OTLP/gRPC address when it
// runs.
func (s *Server) ServiceEnv() []string {
	etcd, _ := Value(s, EtcdKey)
	env := serviceEnv(s.cfg, etcd)
	if n, _ := Value(s, NatsKey); n.URL != "" {
		env = append(env, natsEnv(n))
	}
	if t, _ := Value(s, TracesKey); t.GRPCAddr != "" {
		env = append(env, "LANES_TRACES="+t.GRPCAddr)
	}
	return append(env, mqEnv(s.cfg)...)
}

// mqEnv is LANES_KAFKA and LANES_AMQP, the users' brokers that lanes up
// names (--mq-kafka, --mq-amqp), the AMQP password hidden: the service
// gives its own.
func mqEnv(cfg Config) []string {
	var env []string
	if k := cfg.MQ.Kafka; k != "" {
		env = append(env, "LANES_KAFKA="+strings.ReplaceAll(k, " ", ""))
	}
	if a := cfg.MQ.AMQP; a != "" {
		env = append(env, "LANES_AMQP="+redactURLs(a))
	}
	return env
}

// natsEnv is LANES_NATS, the NATS server of lanesenv.Open, with the
// credentials of an external server's URLs hidden: the service gives its
// own.
func natsEnv(n NatsInfo) string {
	return "LANES_NATS=" + redactURLs(n.URL)
}

func serviceEnv(cfg Config, etcd EtcdInfo) []string {
	var hosts []string
	for _, ep := range etcd.Endpoints {
		if u, err := url.Parse(ep); err == nil && u.Host != "" {
			ep = u.Host
		}
		hosts = append(hosts, ep)
	}
	env := []string{"LANES_REGISTRY=etcd://" + strings.Join(hosts, ",")}
	if etcd.PasswordFile != "" {
		pw := etcd.PasswordFile
		if abs, err := filepath.Abs(pw); err == nil {
			pw = abs
		}
		env = append(env, "LANES_ETCD_USERNAME="+etcd.Username, "LANES_ETCD_PASSWORD_FILE="+pw)
	}
	if p := cfg.Etcd.Prefix; p != "" && p != etcdstore.DefaultPrefix {
		env = append(env, "LANES_ETCD_PREFIX="+p)
	}
	return env
}

// PrintServiceEnv prints the export line of ServiceEnv, and the one for
// services that register through the admin API with a token. Where the trace
// collector needs a token, the first line has the telemetry token's
// (LANES_TRACES_TOKEN, read from its file, never printed), and a last line
// says what an OpenTelemetry SDK without lanestrace sets.
func PrintServiceEnv(w io.Writer, s *Server) {
	tr, _ := Value(s, TracesKey)
	env := s.ServiceEnv()
	if tr.GRPCAddr != "" && tr.Token != "" {
		tok := "<the telemetry token (traces.token)>"
		if tr.TokenFile != "" {
			tok = `"$(cat ` + tr.TokenFile + `)"`
		}
		env = append(env, lanestrace.EnvTracesToken+"="+tok)
	}
	fmt.Fprintf(w, "\nServices join with (see docs/http.md, docs/grpc.md, docs/mq.md):\n  export %s\n", strings.Join(env, " "))
	etcd, _ := Value(s, EtcdKey)
	if !etcd.Embedded && (s.cfg.Etcd.CA != "" || s.cfg.Etcd.Username != "") {
		fmt.Fprintln(w, "  (with LANES_ETCD_CA, _CERT, _KEY, _USERNAME and _PASSWORD as for lanes up)")
	}
	if a, _ := Value(s, AdminKey); a.URL != "" {
		traces := ""
		if n, _ := Value(s, NatsKey); n.URL != "" {
			traces = " " + natsEnv(n)
		}
		if tr.GRPCAddr != "" {
			traces += " LANES_TRACES=" + tr.GRPCAddr
		}
		if strings.HasPrefix(a.URL, "https://") || strings.Contains(traces, " LANES_TRACES=https://") {
			traces += " " + tlsfiles.EnvCAFile + "=<PEM file of the CA of the certificates>"
		}
		fmt.Fprintf(w, "or, with a registration token and no etcd access:\n  export LANES_REGISTRY=%s LANES_TOKEN=<lanes token create --lane LANE>%s\n", a.URL, traces)
	}
	if tr.GRPCAddr != "" && tr.Token != "" {
		endpoint := tr.GRPCAddr
		if !strings.Contains(endpoint, "://") {
			endpoint = "http://" + endpoint
		}
		fmt.Fprintf(w, "(the trace collector takes the token as \"Authorization: Bearer <token>\"; an OpenTelemetry SDK without lanestrace sets\n  OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=%s OTEL_EXPORTER_OTLP_TRACES_HEADERS=\"authorization=Bearer%%20$LANES_TOKEN\")\n", endpoint)
	}
	fmt.Fprintln(w)
}

// AdminAddrFile is the file, in the data directory, where a running control
// plane records the URL of its admin API, so that the commands run next to
// it (lanes ls, lanes policy, ...) find it without --admin.
const AdminAddrFile = "admin-addr"

// RecordAdmin writes the admin API's URL to <data-dir>/admin-addr and
// returns the function that removes it, for when the control plane stops.
// Without a data directory in use it records nothing.
func RecordAdmin(s *Server) (remove func()) {
	a, _ := Value(s, AdminKey)
	if a.URL == "" || !s.cfg.usesDataDir() {
		return func() {}
	}
	path := filepath.Join(s.cfg.DataDir, AdminAddrFile)
	if err := os.WriteFile(path, []byte(a.URL+"\n"), 0o600); err != nil {
		return func() {}
	}
	return func() { os.Remove(path) }
}

// startingLine says what starting component name does and waits for, for
// WithProgress ("" for components that do nothing worth saying).
func startingLine(name string, cfg Config) string {
	switch name {
	case "etcd":
		if len(cfg.Etcd.Endpoints) == 0 {
			return fmt.Sprintf("starting the embedded etcd (data in %s, clients on %s); waiting for it to serve...", filepath.Join(cfg.DataDir, "etcd"), cfg.Etcd.ClientAddr)
		}
		return fmt.Sprintf("connecting to the external etcd at %s; waiting up to %s for it to answer...", strings.Join(cfg.Etcd.Endpoints, ","), cfg.Etcd.DialTimeout)
	case "nats":
		switch {
		case cfg.Nats.URL != "":
			return "connecting to the external NATS server; waiting for JetStream to answer..."
		case cfg.Nats.Addr == NatsOff:
			return ""
		}
		return fmt.Sprintf("starting the embedded NATS server with JetStream on %s; waiting for it to be ready...", cfg.Nats.Addr)
	case "engine":
		return "reading the registry and the policy..."
	case "traces":
		var on []string
		if a := cfg.Traces.GRPCAddr; a != TracesOff {
			on = append(on, "OTLP/gRPC on "+a)
		}
		if a := cfg.Traces.HTTPAddr; a != TracesOff {
			on = append(on, "OTLP/HTTP on "+a)
		}
		if len(on) == 0 {
			return ""
		}
		return "starting the trace collector (" + strings.Join(on, ", ") + ")"
	case "gateway":
		return fmt.Sprintf("starting the gateway on %s", cfg.GatewayAddr)
	case "admin":
		return fmt.Sprintf("starting the admin API on %s", cfg.AdminAddr)
	}
	return ""
}
