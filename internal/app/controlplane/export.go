package controlplane

import (
	"fmt"
	"io"
	"net/url"
	"strings"

	"github.com/lanesdev/lanes/etcdstore"
)

// ServiceEnv returns the variables a service exports to join this control
// plane through package lanesenv: LANES_REGISTRY with the etcd endpoints
// in use (etcd://host:port,...), LANES_ETCD_PREFIX when the prefix is not
// the default, and LANES_TRACES with the trace collector's OTLP/gRPC
// address when it runs.
func (s *Server) ServiceEnv() []string {
	etcd, _ := Value(s, EtcdKey)
	env := serviceEnv(s.cfg, etcd)
	if t, _ := Value(s, TracesKey); t.GRPCAddr != "" {
		env = append(env, "LANES_TRACES="+t.GRPCAddr)
	}
	return env
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
	if p := cfg.Etcd.Prefix; p != "" && p != etcdstore.DefaultPrefix {
		env = append(env, "LANES_ETCD_PREFIX="+p)
	}
	return env
}

// PrintServiceEnv prints the export line of ServiceEnv, and the one for
// services that register through the admin API with a token.
func PrintServiceEnv(w io.Writer, s *Server) {
	fmt.Fprintf(w, "\nServices join with (see docs/http.md, docs/grpc.md):\n  export %s\n", strings.Join(s.ServiceEnv(), " "))
	etcd, _ := Value(s, EtcdKey)
	if !etcd.Embedded && (s.cfg.Etcd.CA != "" || s.cfg.Etcd.Username != "") {
		fmt.Fprintln(w, "  (with LANES_ETCD_CA, _CERT, _KEY, _USERNAME and _PASSWORD as for lanes up)")
	}
	if a, _ := Value(s, AdminKey); a.URL != "" {
		tr := ""
		if t, _ := Value(s, TracesKey); t.GRPCAddr != "" {
			tr = " LANES_TRACES=" + t.GRPCAddr
		}
		fmt.Fprintf(w, "or, with a registration token and no etcd access:\n  export LANES_REGISTRY=%s LANES_TOKEN=<lanes token create --lane LANE>%s\n\n", a.URL, tr)
	}
}
