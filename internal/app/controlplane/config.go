package controlplane

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/lanesdev/lanes/adminapi"
	"github.com/lanesdev/lanes/internal/app/collector"
	"github.com/lanesdev/lanes/internal/lib/logs"
	"github.com/lanesdev/lanes/internal/lib/strictyaml"
)

// Config is the configuration of `lanes up`. Each setting comes from, in
// order of precedence: a command-line flag, a LANES_* environment variable,
// the config file (--config), the default. See Settings.
type Config struct {
	// DataDir holds the embedded etcd's data and the admin token.
	DataDir string `yaml:"data_dir"`
	// AdminAddr is where the admin API listens.
	AdminAddr string `yaml:"admin_addr"`
	// AdminToken is the admin credential; when empty it is read from
	// <DataDir>/admin-token, which is created on first start.
	AdminToken string `yaml:"admin_token"`
	// GatewayAddr is where the gateway listens.
	GatewayAddr string `yaml:"gateway_addr"`
	// Domain makes <lane>.<Domain> hosts select a lane at the gateway.
	Domain string `yaml:"domain"`
	// Routes map hosts and path prefixes to services: "/=web",
	// "/api=orders", "shop.example.com=web", "shop.example.com/api=orders".
	Routes []string `yaml:"routes"`
	// TrustedProxies are the peers (IPs or CIDRs) whose X-Forwarded-For the
	// gateway believes.
	TrustedProxies []string `yaml:"trusted_proxies"`
	// LaneClaims are the client addresses (IPs or CIDRs) that a lane or
	// baseline token may claim for its lane (lanes dev --claim-ip):
	// loopback when empty. The admin token claims any.
	LaneClaims []string `yaml:"lane_claims"`
	// Zone is the gateway's zone, for same-zone preference.
	Zone string `yaml:"zone"`
	// Gateway holds the gateway's other settings.
	Gateway GatewaySettings `yaml:"gateway"`
	// LogLevel is debug, info, warn or error.
	LogLevel string `yaml:"log_level"`
	// LogFormat is text or json.
	LogFormat string `yaml:"log_format"`
	// Etcd says where the state lives.
	Etcd EtcdConfig `yaml:"etcd"`
	// Nats says where the message queue runs.
	Nats NatsConfig `yaml:"nats"`
	// MQ names the users' Kafka and RabbitMQ brokers, which lanes up does
	// not run: it prints them with the services' variables.
	MQ MQConfig `yaml:"mq"`
	// Traces configures the trace collector.
	Traces TracesConfig `yaml:"traces"`
	// AllowLinkLocal lets instances have link-local and cloud metadata
	// addresses (169.254.0.0/16, fe80::/10, fd00:ec2::254,
	// 100.100.100.200): the gateway dials them, the admin token and the
	// tokens whose addresses.link_local is set may register them.
	AllowLinkLocal bool `yaml:"allow_link_local"`
	// TunnelHost is the host (an IP address) that the relays of
	// `lanes dev --tunnel` listen on, where the gateway and the instances
	// reach them; empty: the address the machine reached the admin API at.
	TunnelHost string `yaml:"tunnel_host"`
	// TLS holds the certificates the listeners serve TLS with.
	TLS TLSSettings `yaml:"tls"`
	// XDS configures the xDS server for gRPC's proxyless clients.
	XDS XDSConfig `yaml:"xds"`
	// Kube runs the Kubernetes controllers: the LanesPolicy resource and
	// lanes' forks of Deployments (docs/kubernetes.md).
	Kube KubeConfig `yaml:"kube"`

	// sources records where each setting came from, for error messages.
	sources map[string]string
}

// KubeConfig configures the Kubernetes controllers of lanes up.
type KubeConfig struct {
	// Enabled runs them (lanes up --kube).
	Enabled bool `yaml:"enabled"`
	// Kubeconfig is the file of the API server's address and credentials;
	// "" is the service account of the pod lanes up runs in, else
	// $KUBECONFIG.
	Kubeconfig string `yaml:"kubeconfig"`
	// Namespaces are where forks may be made; the first is the default.
	// Default: "default".
	Namespaces []string `yaml:"namespaces"`
	// Policy is the LanesPolicy that the control plane follows,
	// "namespace/name" or "name" (default "lanes"), in the first of
	// Namespaces when it names none.
	Policy string `yaml:"policy"`
	// PolicyConfigMap reads the policy from the ConfigMap that Policy
	// names (its key policy.yaml), where CRDs are not allowed.
	PolicyConfigMap bool `yaml:"policy_configmap"`
	// MaxForks bounds the forks of each lane (default 10), MaxReplicas the
	// replicas of each fork (default 3).
	MaxForks    int `yaml:"max_forks"`
	MaxReplicas int `yaml:"max_fork_replicas"`
	// ForkImages, when set, are the prefixes that a lane token's fork's
	// image must start with.
	ForkImages []string `yaml:"fork_images"`
}

// EtcdConfig selects the embedded etcd (no Endpoints) or an external
// cluster.
type EtcdConfig struct {
	// Endpoints of an external etcd cluster; empty runs the embedded one.
	Endpoints []string `yaml:"endpoints"`
	// Prefix of every key (default /lanes/).
	Prefix string `yaml:"prefix"`
	// CA, Cert and Key are PEM files for TLS to an external cluster.
	CA   string `yaml:"ca"`
	Cert string `yaml:"cert"`
	Key  string `yaml:"key"`
	// Username and Password authenticate to an external cluster.
	Username string `yaml:"username"`
	Password string `yaml:"password"`
	// ClientAddr and PeerAddr are the embedded etcd's listeners.
	ClientAddr string `yaml:"client_addr"`
	PeerAddr   string `yaml:"peer_addr"`
	// DialTimeout bounds connecting to an external cluster.
	DialTimeout time.Duration `yaml:"dial_timeout"`
	// NoAuth leaves the embedded etcd's authentication off: anyone who
	// reaches its client port reads and writes every key, around the admin
	// API's scopes. By default authentication is on, with the root user's
	// password in <DataDir>/etcd-password (mode 0600).
	NoAuth bool `yaml:"no_auth"`
}

// GatewaySettings are the gateway's settings besides its address, routes,
// domain, trusted proxies and zone. Each is a field of gateway.Config; see
// the gateway package for what it does.
type GatewaySettings struct {
	// Aliases are more headers to read the lane from, after x-lane and
	// baggage (gateway.Config.Aliases).
	Aliases []string `yaml:"aliases"`
	// LaneCookie names the lane cookie (default "lane").
	LaneCookie string `yaml:"lane_cookie"`
	// KeyHeader and KeyCookie name where the request key of canary splits
	// is read (defaults "x-lanes-key" and "lanes-key").
	KeyHeader string `yaml:"key_header"`
	KeyCookie string `yaml:"key_cookie"`
	// Disable turns lane sources off for every client: header, baggage,
	// alias, cookie, host, policy-clients, claims.
	Disable []string `yaml:"disable"`
	// StripPrefixes are path prefixes of routes that are removed from the
	// path before the request goes upstream.
	StripPrefixes []string `yaml:"strip_prefixes"`
	// PreserveHost sends the client's Host header upstream instead of the
	// instance's address.
	PreserveHost bool `yaml:"preserve_host"`
	// MaxIdleConnsPerHost bounds the idle connections kept to each instance
	// (0: the gateway's default, 512).
	MaxIdleConnsPerHost int `yaml:"max_idle_conns_per_host"`
	// Retries is how many times a routed call that failed after it was
	// sent is tried again on another instance (0: the gateway's default,
	// 1; negative: none).
	Retries int `yaml:"retries"`
	// ReadyTimeout bounds how long the first requests wait for the routing
	// engine to have read the policy and a service's instances (0: the
	// gateway's default, 5s; negative, or "off" in a flag or variable:
	// none).
	ReadyTimeout time.Duration `yaml:"ready_timeout"`
	// ResponseHeaderTimeout bounds how long an instance may take to answer
	// with its response headers (0: the gateway's default, 10s; negative,
	// or "off" in a flag or variable: none).
	ResponseHeaderTimeout time.Duration `yaml:"response_header_timeout"`
	// UpstreamWriteTimeout bounds how long an instance may take to take
	// each write of a request: the head, each part of an upload as it
	// streams (0: the gateway's default, 10s; negative, or "off" in a flag
	// or variable: none).
	UpstreamWriteTimeout time.Duration `yaml:"upstream_write_timeout"`
	// UpstreamReadTimeout bounds how long an instance may send nothing of
	// an answer's body, between two reads, before the answer is cut and
	// counts against it, as nginx's proxy_read_timeout (0: the gateway's
	// default, 60s; negative, or "off" in a flag or variable: none). A
	// long poll or an event stream that stays silent longer needs it
	// raised, or off.
	UpstreamReadTimeout time.Duration `yaml:"upstream_read_timeout"`
	// ClientWriteTimeout bounds how long a client may take none of a write
	// of its answer before its connection is closed, as nginx's
	// send_timeout (0: the gateway's default, 60s; negative, or "off" in a
	// flag or variable: none). It bounds each write, not the whole answer.
	ClientWriteTimeout time.Duration `yaml:"client_write_timeout"`
	// UpstreamIdleTimeout is how long the gateway keeps a keep-alive
	// connection to an instance that no request uses, as nginx's
	// keepalive_timeout in an upstream block; keep it below the
	// instances' own idle timeout (0: the gateway's default, 90s;
	// negative, or "off" in a flag or variable: none).
	UpstreamIdleTimeout time.Duration `yaml:"upstream_idle_timeout"`
	// ClientIdleTimeout is how long a client's keep-alive connection may
	// wait for its next request before the gateway closes it, as nginx's
	// keepalive_timeout (0: the gateway's default, 2m; negative, or "off"
	// in a flag or variable: none).
	ClientIdleTimeout time.Duration `yaml:"client_idle_timeout"`
	// ClientHeaderTimeout bounds how long a client may take to send a
	// request's head, as nginx's client_header_timeout (0: the gateway's
	// default, 10s; negative, or "off" in a flag or variable: none).
	ClientHeaderTimeout time.Duration `yaml:"client_header_timeout"`
	// ClientReadTimeout bounds how long a client may send nothing of a
	// request's body, between two reads, as nginx's client_body_timeout
	// (0: the gateway's default, 2m; negative, or "off" in a flag or
	// variable: none).
	ClientReadTimeout time.Duration `yaml:"client_read_timeout"`
	// MaxConns caps the client connections open at once; a connection
	// over it is answered 503 overloaded and closed (0: the gateway's
	// default, a quarter of the open-file limit, at most 10,000).
	MaxConns int `yaml:"max_conns"`
	// HTTP1 is the stack that serves HTTP/1.1: "fast" (fasthttp, the
	// default) or "std" (net/http).
	HTTP1 string `yaml:"http1"`
}

// NatsConfig selects the embedded NATS server (no URL) or an external one.
type NatsConfig struct {
	// Addr is where the embedded NATS server listens, with JetStream on and
	// its data in <DataDir>/nats; "off" runs none.
	Addr string `yaml:"addr"`
	// URL of an external NATS server (or several, comma-separated) with
	// JetStream; when set, no embedded server runs.
	URL string `yaml:"url"`
}

// MQConfig names the message brokers of the services that lanes up does
// not run, for the variables it prints (LANES_KAFKA, LANES_AMQP).
type MQConfig struct {
	// Kafka is the Kafka brokers' host:port, comma-separated.
	Kafka string `yaml:"kafka"`
	// AMQP is the RabbitMQ broker's amqp:// (or amqps://) URL.
	AMQP string `yaml:"amqp"`
}

// NatsOff is the value of NatsConfig.Addr that runs no NATS server.
const NatsOff = "off"

// Defaults returns the configuration with every default filled in.
func Defaults() Config {
	return Config{
		DataDir:     ".lanes",
		AdminAddr:   "127.0.0.1:7700",
		GatewayAddr: "127.0.0.1:8080",
		Domain:      "lanes.localhost",
		LogLevel:    "info",
		LogFormat:   "text",
		Etcd: EtcdConfig{
			Prefix:      "/lanes/",
			ClientAddr:  "127.0.0.1:7701",
			PeerAddr:    "127.0.0.1:7702",
			DialTimeout: 5 * time.Second,
		},
		Nats: NatsConfig{Addr: "127.0.0.1:4222"},
		XDS:  XDSConfig{Addr: XDSOff, Auth: "loopback"},
		Traces: TracesConfig{
			GRPCAddr: collector.DefaultGRPCAddr,
			HTTPAddr: collector.DefaultHTTPAddr,
			MaxSpans: collector.DefaultLimits.MaxSpans,
			MaxMiB:   collector.DefaultLimits.MaxBytes >> 20,
			MaxAge:   collector.DefaultLimits.MaxAge,
			Sample:   1,

			ReceiverAuth:  collector.AuthToken,
			MaxValueBytes: collector.DefaultLimits.MaxValueBytes,
			MaxCheckMiB:   collector.DefaultLimits.MaxCheckBytes >> 20,
		},
	}
}

// Setting is one configuration setting with its three names.
type Setting struct {
	Flag  string // command-line flag, without "--"
	Env   string // environment variable
	Key   string // dotted key in the config file
	Usage string
	// List settings take a repeatable flag and a comma-separated variable.
	List bool
	// Bool settings take a flag without a value (--flag, --flag=false).
	Bool   bool
	Secret bool
	set    func(c *Config, v []string) error
}

func one(f func(c *Config, v string) error) func(*Config, []string) error {
	return func(c *Config, v []string) error { return f(c, strings.TrimSpace(v[len(v)-1])) }
}

func str(p func(c *Config) *string) func(*Config, []string) error {
	return one(func(c *Config, v string) error { *p(c) = v; return nil })
}

func boolean(p func(c *Config) *bool) func(*Config, []string) error {
	return one(func(c *Config, v string) error {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return fmt.Errorf("want true or false")
		}
		*p(c) = b
		return nil
	})
}

func duration(p func(c *Config) *time.Duration) func(*Config, []string) error {
	return one(func(c *Config, v string) error {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			return fmt.Errorf("want a duration such as 5s")
		}
		*p(c) = d
		return nil
	})
}

// durationOrOff sets a timeout: a duration, or "off" for none (-1).
func durationOrOff(p func(c *Config) *time.Duration) func(*Config, []string) error {
	return one(func(c *Config, v string) error {
		if v == "off" {
			*p(c) = -1
			return nil
		}
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			return fmt.Errorf("want a duration such as 10s, or off")
		}
		*p(c) = d
		return nil
	})
}

// mib sets a number of MiB, 1 or more.
func mib(p func(c *Config) *int64) func(*Config, []string) error {
	return one(func(c *Config, v string) error {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n <= 0 {
			return fmt.Errorf("want a whole number of MiB, 1 or more")
		}
		*p(c) = n
		return nil
	})
}

func integer(p func(c *Config) *int) func(*Config, []string) error {
	return one(func(c *Config, v string) error {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return fmt.Errorf("want a whole number, 0 or more")
		}
		*p(c) = n
		return nil
	})
}

func list(p func(c *Config) *[]string) func(*Config, []string) error {
	return func(c *Config, v []string) error {
		var out []string
		for _, s := range v {
			if s = strings.TrimSpace(s); s != "" {
				out = append(out, s)
			}
		}
		*p(c) = out
		return nil
	}
}

// Settings lists every setting of `lanes up`, in the order of --help.
var Settings = []Setting{
	{Flag: "data-dir", Env: "LANES_DATA_DIR", Key: "data_dir", Usage: "directory of the embedded etcd's data and the admin token", set: str(func(c *Config) *string { return &c.DataDir })},
	{Flag: "admin-addr", Env: "LANES_ADMIN_ADDR", Key: "admin_addr", Usage: "address of the admin API (host:port; port 0 picks one)", set: str(func(c *Config) *string { return &c.AdminAddr })},
	{Flag: "admin-token", Env: "LANES_ADMIN_TOKEN", Key: "admin_token", Usage: "the admin credential (default: read from, or created in, <data-dir>/admin-token)", Secret: true, set: str(func(c *Config) *string { return &c.AdminToken })},
	{Flag: "gateway-addr", Env: "LANES_GATEWAY_ADDR", Key: "gateway_addr", Usage: "address of the gateway (host:port; port 0 picks one)", set: str(func(c *Config) *string { return &c.GatewayAddr })},
	{Flag: "tunnel-host", Env: "LANES_TUNNEL_HOST", Key: "tunnel_host", Usage: "IP address that the relays of lanes dev's tunnels listen on, where the gateway and the instances reach them (default: the address the developer's machine reached the admin API at)", set: str(func(c *Config) *string { return &c.TunnelHost })},
	{Flag: "route", Env: "LANES_ROUTES", Key: "routes", List: true, Usage: "gateway route host-or-/prefix=service, such as /=web or api.example.com=orders (repeatable)", set: list(func(c *Config) *[]string { return &c.Routes })},
	{Flag: "domain", Env: "LANES_DOMAIN", Key: "domain", Usage: "<lane>.<domain> hosts select a lane at the gateway", set: str(func(c *Config) *string { return &c.Domain })},
	{Flag: "lane-claims", Env: "LANES_LANE_CLAIMS", Key: "lane_claims", List: true, Usage: "IP or CIDR of the client addresses a lane or baseline token may claim for its lane, as lanes dev --claim-ip does (repeatable; default loopback only: a claim moves every client behind the address, behind a NAT all of them; the admin token claims any)", set: list(func(c *Config) *[]string { return &c.LaneClaims })},
	{Flag: "trusted-proxy", Env: "LANES_TRUSTED_PROXIES", Key: "trusted_proxies", List: true, Usage: "IP or CIDR of a proxy whose X-Forwarded-For the gateway believes, and whose X-Forwarded-Proto: https marks the dashboard's session cookie Secure (repeatable)", set: list(func(c *Config) *[]string { return &c.TrustedProxies })},
	{Flag: "zone", Env: "LANES_ZONE", Key: "zone", Usage: "the gateway's zone, for same-zone preference", set: str(func(c *Config) *string { return &c.Zone })},
	{Flag: "gateway-alias", Env: "LANES_GATEWAY_ALIASES", Key: "gateway.aliases", List: true, Usage: "another header the gateway reads the lane from, after x-lane and baggage, such as x-asm-prefer-tag (repeatable)", set: list(func(c *Config) *[]string { return &c.Gateway.Aliases })},
	{Flag: "gateway-lane-cookie", Env: "LANES_GATEWAY_LANE_COOKIE", Key: "gateway.lane_cookie", Usage: "name of the cookie that selects a lane at the gateway", set: str(func(c *Config) *string { return &c.Gateway.LaneCookie })},
	{Flag: "gateway-key-header", Env: "LANES_GATEWAY_KEY_HEADER", Key: "gateway.key_header", Usage: "header of the request key that keeps canary splits sticky", set: str(func(c *Config) *string { return &c.Gateway.KeyHeader })},
	{Flag: "gateway-key-cookie", Env: "LANES_GATEWAY_KEY_COOKIE", Key: "gateway.key_cookie", Usage: "cookie of the request key, when the header is absent", set: str(func(c *Config) *string { return &c.Gateway.KeyCookie })},
	{Flag: "gateway-disable", Env: "LANES_GATEWAY_DISABLE", Key: "gateway.disable", List: true, Usage: "lane source the gateway does not read, for any client: header, baggage, alias, cookie, host, policy-clients or claims (repeatable)", set: list(func(c *Config) *[]string { return &c.Gateway.Disable })},
	{Flag: "gateway-strip-prefix", Env: "LANES_GATEWAY_STRIP_PREFIXES", Key: "gateway.strip_prefixes", List: true, Usage: "path prefix of a route that the gateway removes before the request goes upstream, such as /api (repeatable)", set: list(func(c *Config) *[]string { return &c.Gateway.StripPrefixes })},
	{Flag: "gateway-preserve-host", Env: "LANES_GATEWAY_PRESERVE_HOST", Key: "gateway.preserve_host", Bool: true, Usage: "send the client's Host header upstream instead of the instance's address", set: boolean(func(c *Config) *bool { return &c.Gateway.PreserveHost })},
	{Flag: "gateway-max-idle-conns-per-host", Env: "LANES_GATEWAY_MAX_IDLE_CONNS_PER_HOST", Key: "gateway.max_idle_conns_per_host", Usage: "idle connections the gateway keeps to each instance (0: 512)", set: integer(func(c *Config) *int { return &c.Gateway.MaxIdleConnsPerHost })},
	{Flag: "gateway-ready-timeout", Env: "LANES_GATEWAY_READY_TIMEOUT", Key: "gateway.ready_timeout", Usage: "how long the first requests wait for the routing engine to know a service (0: 5s; off: no limit)", set: durationOrOff(func(c *Config) *time.Duration { return &c.Gateway.ReadyTimeout })},
	{Flag: "gateway-response-header-timeout", Env: "LANES_GATEWAY_RESPONSE_HEADER_TIMEOUT", Key: "gateway.response_header_timeout", Usage: "how long an instance may take to send its response headers before the attempt fails and counts against it (0: 10s; off: no limit)", set: durationOrOff(func(c *Config) *time.Duration { return &c.Gateway.ResponseHeaderTimeout })},
	{Flag: "gateway-upstream-write-timeout", Env: "LANES_GATEWAY_UPSTREAM_WRITE_TIMEOUT", Key: "gateway.upstream_write_timeout", Usage: "how long an instance may take to take each write of a request (the head, each part of an upload) before the attempt fails and counts against it (0: 10s; off: no limit)", set: durationOrOff(func(c *Config) *time.Duration { return &c.Gateway.UpstreamWriteTimeout })},
	{Flag: "gateway-upstream-read-timeout", Env: "LANES_GATEWAY_UPSTREAM_READ_TIMEOUT", Key: "gateway.upstream_read_timeout", Usage: "how long an instance may send nothing of an answer's body, between two reads, before the answer is cut and counts against it; a long poll or an event stream silent for longer needs more (0: 60s; off: no limit)", set: durationOrOff(func(c *Config) *time.Duration { return &c.Gateway.UpstreamReadTimeout })},
	{Flag: "gateway-client-write-timeout", Env: "LANES_GATEWAY_CLIENT_WRITE_TIMEOUT", Key: "gateway.client_write_timeout", Usage: "how long a client may take none of a write of its answer (it stopped reading) before its connection is closed; each write, not the whole answer (0: 60s; off: no limit)", set: durationOrOff(func(c *Config) *time.Duration { return &c.Gateway.ClientWriteTimeout })},
	{Flag: "gateway-upstream-idle-timeout", Env: "LANES_GATEWAY_UPSTREAM_IDLE_TIMEOUT", Key: "gateway.upstream_idle_timeout", Usage: "how long the gateway keeps an idle keep-alive connection to an instance; keep it below the instances' own idle timeout (0: 90s; off: no limit)", set: durationOrOff(func(c *Config) *time.Duration { return &c.Gateway.UpstreamIdleTimeout })},
	{Flag: "gateway-client-idle-timeout", Env: "LANES_GATEWAY_CLIENT_IDLE_TIMEOUT", Key: "gateway.client_idle_timeout", Usage: "how long a client's keep-alive connection may wait for its next request before the gateway closes it (0: 2m; off: no limit)", set: durationOrOff(func(c *Config) *time.Duration { return &c.Gateway.ClientIdleTimeout })},
	{Flag: "gateway-client-header-timeout", Env: "LANES_GATEWAY_CLIENT_HEADER_TIMEOUT", Key: "gateway.client_header_timeout", Usage: "how long a client may take to send a request's head before the gateway closes its connection (0: 10s; off: no limit)", set: durationOrOff(func(c *Config) *time.Duration { return &c.Gateway.ClientHeaderTimeout })},
	{Flag: "gateway-client-read-timeout", Env: "LANES_GATEWAY_CLIENT_READ_TIMEOUT", Key: "gateway.client_read_timeout", Usage: "how long a client may send nothing of a request's body, between two reads, before it gets 400 and its connection is closed (0: 2m; off: no limit)", set: durationOrOff(func(c *Config) *time.Duration { return &c.Gateway.ClientReadTimeout })},
	{Flag: "gateway-retries", Env: "LANES_GATEWAY_RETRIES", Key: "gateway.retries", Usage: "how many times an idempotent request without a body that an instance failed is tried on another (0: 1; negative: none)", set: integer(func(c *Config) *int { return &c.Gateway.Retries })},
	{Flag: "gateway-max-conns", Env: "LANES_GATEWAY_MAX_CONNS", Key: "gateway.max_conns", Usage: "client connections the gateway keeps open at once; one over it is answered 503 overloaded and closed (0: a quarter of the open-file limit, at most 10000)", set: integer(func(c *Config) *int { return &c.Gateway.MaxConns })},
	{Flag: "gateway-http1", Env: "LANES_GATEWAY_HTTP1", Key: "gateway.http1", Usage: "the stack that serves HTTP/1.1 at the gateway: fast (fasthttp) or std (net/http)", set: str(func(c *Config) *string { return &c.Gateway.HTTP1 })},
	{Flag: "allow-link-local", Env: "LANES_ALLOW_LINK_LOCAL", Key: "allow_link_local", Bool: true, Usage: "let instances have link-local and cloud metadata addresses (169.254.0.0/16, fe80::/10, ...): the gateway dials them, and the admin token and tokens with addresses.link_local may register them", set: boolean(func(c *Config) *bool { return &c.AllowLinkLocal })},
	{Flag: "kube", Env: "LANES_KUBE", Key: "kube.enabled", Bool: true, Usage: "run the Kubernetes controllers: the LanesPolicy resource and lanes' forks of Deployments (docs/kubernetes.md)", set: boolean(func(c *Config) *bool { return &c.Kube.Enabled })},
	{Flag: "kubeconfig", Env: "LANES_KUBECONFIG", Key: "kube.kubeconfig", Usage: "kubeconfig file of the Kubernetes API server (default: the pod's service account, else $KUBECONFIG)", set: str(func(c *Config) *string { return &c.Kube.Kubeconfig })},
	{Flag: "kube-namespace", Env: "LANES_KUBE_NAMESPACES", Key: "kube.namespaces", List: true, Usage: "namespace that lanes serves (repeatable): its pods are routed to by their lanes.dev/lane label, and forks are made in it; the first is the default and holds the LanesPolicy (default: default)", set: list(func(c *Config) *[]string { return &c.Kube.Namespaces })},
	{Flag: "kube-policy", Env: "LANES_KUBE_POLICY", Key: "kube.policy", Usage: "the LanesPolicy the control plane follows, namespace/name or name (default: lanes, in the first --kube-namespace)", set: str(func(c *Config) *string { return &c.Kube.Policy })},
	{Flag: "kube-policy-configmap", Env: "LANES_KUBE_POLICY_CONFIGMAP", Key: "kube.policy_configmap", Bool: true, Usage: "read the policy from the ConfigMap that --kube-policy names (its key policy.yaml) instead of a LanesPolicy, where CRDs are not allowed; the outcome goes to its annotations lanes.dev/revision and lanes.dev/error", set: boolean(func(c *Config) *bool { return &c.Kube.PolicyConfigMap })},
	{Flag: "kube-fork-image", Env: "LANES_KUBE_FORK_IMAGES", Key: "kube.fork_images", List: true, Usage: "prefix that the image of a lane token's fork must start with, such as registry.example.com/team/ (repeatable; default: any image)", set: list(func(c *Config) *[]string { return &c.Kube.ForkImages })},
	{Flag: "kube-max-forks", Env: "LANES_KUBE_MAX_FORKS", Key: "kube.max_forks", Usage: "forks a lane may have at most (0: 10)", set: integer(func(c *Config) *int { return &c.Kube.MaxForks })},
	{Flag: "kube-max-fork-replicas", Env: "LANES_KUBE_MAX_FORK_REPLICAS", Key: "kube.max_fork_replicas", Usage: "replicas a fork may ask for at most (0: 3)", set: integer(func(c *Config) *int { return &c.Kube.MaxReplicas })},
	{Flag: "log-level", Env: "LANES_LOG_LEVEL", Key: "log_level", Usage: "debug, info, warn or error", set: str(func(c *Config) *string { return &c.LogLevel })},
	{Flag: "log-format", Env: "LANES_LOG_FORMAT", Key: "log_format", Usage: "text or json", set: str(func(c *Config) *string { return &c.LogFormat })},
	{Flag: "external-etcd", Env: "LANES_EXTERNAL_ETCD", Key: "etcd.endpoints", List: true, Usage: "endpoints of an external etcd cluster, host:port or http(s) URLs (repeatable or comma-separated); none runs the embedded etcd", set: list(func(c *Config) *[]string { return &c.Etcd.Endpoints })},
	{Flag: "etcd-prefix", Env: "LANES_ETCD_PREFIX", Key: "etcd.prefix", Usage: "prefix of every etcd key", set: str(func(c *Config) *string { return &c.Etcd.Prefix })},
	{Flag: "etcd-ca", Env: "LANES_ETCD_CA", Key: "etcd.ca", Usage: "PEM file of the CA of an external etcd cluster", set: str(func(c *Config) *string { return &c.Etcd.CA })},
	{Flag: "etcd-cert", Env: "LANES_ETCD_CERT", Key: "etcd.cert", Usage: "PEM file of the client certificate for etcd", set: str(func(c *Config) *string { return &c.Etcd.Cert })},
	{Flag: "etcd-key", Env: "LANES_ETCD_KEY", Key: "etcd.key", Usage: "PEM file of the client key for etcd", set: str(func(c *Config) *string { return &c.Etcd.Key })},
	{Flag: "etcd-username", Env: "LANES_ETCD_USERNAME", Key: "etcd.username", Usage: "etcd user, when etcd auth is on", set: str(func(c *Config) *string { return &c.Etcd.Username })},
	{Flag: "etcd-password", Env: "LANES_ETCD_PASSWORD", Key: "etcd.password", Usage: "etcd password", Secret: true, set: str(func(c *Config) *string { return &c.Etcd.Password })},
	{Flag: "etcd-client-addr", Env: "LANES_ETCD_CLIENT_ADDR", Key: "etcd.client_addr", Usage: "client address of the embedded etcd (port 0 picks one)", set: str(func(c *Config) *string { return &c.Etcd.ClientAddr })},
	{Flag: "etcd-peer-addr", Env: "LANES_ETCD_PEER_ADDR", Key: "etcd.peer_addr", Usage: "peer address of the embedded etcd (port 0 picks one)", set: str(func(c *Config) *string { return &c.Etcd.PeerAddr })},
	{Flag: "etcd-no-auth", Env: "LANES_ETCD_NO_AUTH", Key: "etcd.no_auth", Bool: true, Usage: "leave the embedded etcd's authentication off, so that anyone who reaches its port reads and writes every key (default: on, the root password in <data-dir>/etcd-password)", set: boolean(func(c *Config) *bool { return &c.Etcd.NoAuth })},
	{Flag: "etcd-dial-timeout", Env: "LANES_ETCD_DIAL_TIMEOUT", Key: "etcd.dial_timeout", Usage: "how long to wait for an external etcd at start-up", set: one(func(c *Config, v string) error {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return fmt.Errorf("want a positive duration such as 5s")
		}
		c.Etcd.DialTimeout = d
		return nil
	})},
	{Flag: "nats-addr", Env: "LANES_NATS_ADDR", Key: "nats.addr", Usage: "address of the embedded NATS server with JetStream, data in <data-dir>/nats (host:port, default 127.0.0.1:4222; port 0 picks one; off runs none)", set: str(func(c *Config) *string { return &c.Nats.Addr })},
	{Flag: "otlp-grpc-addr", Env: "LANES_OTLP_GRPC_ADDR", Key: "traces.otlp_grpc_addr", Usage: "address of the trace collector's OTLP/gRPC receiver, which services export to (LANES_TRACES); port 0 picks one; off runs none", set: str(func(c *Config) *string { return &c.Traces.GRPCAddr })},
	{Flag: "otlp-http-addr", Env: "LANES_OTLP_HTTP_ADDR", Key: "traces.otlp_http_addr", Usage: "address of the trace collector's OTLP/HTTP receiver (POST /v1/traces); port 0 picks one; off runs none", set: str(func(c *Config) *string { return &c.Traces.HTTPAddr })},
	{Flag: "trace-max-spans", Env: "LANES_TRACE_MAX_SPANS", Key: "traces.max_spans", Usage: "spans the trace store keeps at most; the oldest traces go first", set: integer(func(c *Config) *int { return &c.Traces.MaxSpans })},
	{Flag: "trace-max-mib", Env: "LANES_TRACE_MAX_MIB", Key: "traces.max_mib", Usage: "memory the trace store uses at most, in MiB", set: mib(func(c *Config) *int64 { return &c.Traces.MaxMiB })},
	{Flag: "trace-receiver-auth", Env: "LANES_TRACE_RECEIVER_AUTH", Key: "traces.receiver_auth", Usage: "who may send spans to the trace collector: token (a registration token, sending only for its lane, or the telemetry token), loopback (any process on this machine, no token) or open (anyone who reaches it)", set: str(func(c *Config) *string { return &c.Traces.ReceiverAuth })},
	{Flag: "telemetry-token", Env: "LANES_TELEMETRY_TOKEN", Key: "traces.token", Usage: "the telemetry token, which may send any span to the trace collector (default: read from, or created in, <data-dir>/telemetry-token)", Secret: true, set: str(func(c *Config) *string { return &c.Traces.Token })},
	{Flag: "trace-max-value-bytes", Env: "LANES_TRACE_MAX_VALUE_BYTES", Key: "traces.max_value_bytes", Usage: "bytes that span names and attribute values are cut to as they arrive", set: integer(func(c *Config) *int { return &c.Traces.MaxValueBytes })},
	{Flag: "trace-max-check-mib", Env: "LANES_TRACE_MAX_CHECK_MIB", Key: "traces.max_check_mib", Usage: "memory the integrity checks use at most, in MiB: half for findings, half for what they remember per service", set: mib(func(c *Config) *int64 { return &c.Traces.MaxCheckMiB })},
	{Flag: "trace-max-age", Env: "LANES_TRACE_MAX_AGE", Key: "traces.max_age", Usage: "how long the trace store keeps a trace after its last span", set: duration(func(c *Config) *time.Duration { return &c.Traces.MaxAge })},
	{Flag: "trace-sample", Env: "LANES_TRACE_SAMPLE", Key: "traces.sample", Usage: "share of baseline requests the gateway traces, 0 to 1 (lane requests are always traced)", set: one(func(c *Config, v string) error {
		r, err := strconv.ParseFloat(v, 64)
		if err != nil || r < 0 || r > 1 {
			return fmt.Errorf("want a number from 0 to 1")
		}
		c.Traces.Sample = r
		return nil
	})},
	{Flag: "xds-addr", Env: "LANES_XDS_ADDR", Key: "xds.addr", Usage: "address of the xDS server for gRPC's proxyless clients (xds:///<service>); port 0 picks one; off (the default) runs none", set: str(func(c *Config) *string { return &c.XDS.Addr })},
	{Flag: "xds-auth", Env: "LANES_XDS_AUTH", Key: "xds.auth", Usage: "who may read the xDS routes: loopback (the default: processes on this machine, no token; xds-addr must be a loopback address) or token (a token of the admin API's token store in the stream's authorization metadata)", set: str(func(c *Config) *string { return &c.XDS.Auth })},
	{Flag: "mq-kafka", Env: "LANES_MQ_KAFKA", Key: "mq.kafka", Usage: "Kafka brokers of the services (host:port, comma-separated), printed as LANES_KAFKA with the services' variables; lanes up runs none", set: str(func(c *Config) *string { return &c.MQ.Kafka })},
	{Flag: "mq-amqp", Env: "LANES_MQ_AMQP", Key: "mq.amqp", Usage: "RabbitMQ broker of the services (amqp://host:port/vhost), printed as LANES_AMQP with the services' variables (its password hidden); lanes up runs none", set: str(func(c *Config) *string { return &c.MQ.AMQP })},
	{Flag: "nats-url", Env: "LANES_NATS_URL", Key: "nats.url", Usage: "URL of an external NATS server with JetStream, such as nats://nats-1:4222 (comma-separated for several); none runs the embedded one", set: str(func(c *Config) *string { return &c.Nats.URL })},
}

// EnvConfig names the variable that --config falls back to.
const EnvConfig = "LANES_CONFIG"

// SettingError is a bad value, naming where it came from.
type SettingError struct {
	Source string // "--admin-addr", "LANES_ADMIN_ADDR", or "lanes.yaml:3: field admin_addr"
	Value  string
	Msg    string
}

func (e *SettingError) Error() string {
	return fmt.Sprintf("%s: %q: %s", e.Source, e.Value, e.Msg)
}

func (c *Config) setSource(key, src string) {
	if c.sources == nil {
		c.sources = map[string]string{}
	}
	c.sources[key] = src
}

// LoadFile reads a config file over c: the settings it has replace c's.
// Unknown fields, duplicate keys and values of the wrong kind are refused
// with the file, the line and the field; so are bad values (by Validate).
func (c *Config) LoadFile(path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("config file: %w", err)
	}
	lines, err := strictyaml.Decode(data, c)
	if err != nil {
		var se *strictyaml.Error
		if errors.As(err, &se) {
			se.File = path
		}
		return err
	}
	for k, line := range lines {
		c.setSource(k, fmt.Sprintf("%s:%d: field %s", path, line, k))
	}
	return nil
}

// renamedEnv are variables of earlier versions, with their new names.
var renamedEnv = map[string]string{
	// Services read LANES_REGISTRY and LANES_ETCD_*; the switch of lanes
	// up to an external etcd has its own name, so that a shell set up for a
	// service does not move lanes up off its embedded etcd.
	"LANES_ETCD_ENDPOINTS": "LANES_EXTERNAL_ETCD",
}

// ApplyEnv applies the LANES_* variables that are set (non-empty) over c.
//
// The TLS and auth variables of an external etcd (LANES_ETCD_CA, _CERT,
// _KEY, _USERNAME, _PASSWORD) are the ones services read too (package
// lanesenv); with the embedded etcd they are ignored.
func (c *Config) ApplyEnv(getenv func(string) string) error {
	if getenv == nil {
		getenv = os.Getenv
	}
	for old, now := range renamedEnv {
		if v := getenv(old); strings.TrimSpace(v) != "" {
			return &SettingError{Source: old, Value: v, Msg: "renamed " + now}
		}
	}
	for _, s := range Settings {
		v := getenv(s.Env)
		if strings.TrimSpace(v) == "" {
			continue
		}
		vals := []string{v}
		if s.List {
			vals = strings.Split(v, ",")
		}
		if err := s.set(c, vals); err != nil {
			return &SettingError{Source: s.Env, Value: v, Msg: err.Error()}
		}
		c.setSource(s.Key, s.Env)
	}
	return nil
}

// Set applies one flag's values over c.
func (c *Config) Set(flag string, vals []string) error {
	for _, s := range Settings {
		if s.Flag != flag {
			continue
		}
		if s.List {
			var split []string
			for _, v := range vals {
				split = append(split, strings.Split(v, ",")...)
			}
			vals = split
		}
		if len(vals) == 0 {
			vals = []string{""}
		}
		if err := s.set(c, vals); err != nil {
			return &SettingError{Source: "--" + flag, Value: strings.Join(vals, ","), Msg: err.Error()}
		}
		c.setSource(s.Key, "--"+flag)
		return nil
	}
	return fmt.Errorf("unknown setting --%s", flag)
}

func (c *Config) fail(key, value, format string, args ...any) error {
	src := c.sources[key]
	if src == "" {
		src = "default " + key
	}
	return &SettingError{Source: src, Value: value, Msg: fmt.Sprintf(format, args...)}
}

// Validate checks every setting, as Start does before it starts anything,
// and returns the first bad one, naming its source (flag, variable, or
// file, line and field).
func (c *Config) Validate() error {
	if err := c.validateOwn(); err != nil {
		return err
	}
	return validate(builtins(), c)
}

// validateOwn checks the settings that belong to no component; each
// component's Validate checks its own.
func (c *Config) validateOwn() error {
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		return c.fail("log_level", c.LogLevel, "want debug, info, warn or error")
	}
	if err := logs.CheckFormat(c.LogFormat); err != nil {
		return c.fail("log_format", c.LogFormat, "%v", err)
	}
	if err := c.validateMQ(); err != nil {
		return err
	}
	if err := c.validateKube(); err != nil {
		return err
	}
	return c.validateTLS()
}

var kubeName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

// validateKube checks the settings of the Kubernetes controllers.
func (c *Config) validateKube() error {
	for _, ns := range c.Kube.Namespaces {
		if len(ns) > 63 || !kubeName.MatchString(ns) {
			return c.fail("kube.namespaces", ns, "want a Kubernetes namespace name (a-z, 0-9 and '-', at most 63 characters)")
		}
	}
	if p := c.Kube.Policy; p != "" {
		ns, name, ok := strings.Cut(p, "/")
		if !ok {
			ns, name = "default", p
		}
		if len(ns) > 63 || !kubeName.MatchString(ns) || len(name) > 63 || !kubeName.MatchString(name) {
			return c.fail("kube.policy", p, "want namespace/name or name, each a-z, 0-9 and '-', at most 63 characters")
		}
	}
	if c.Kube.MaxForks < 0 {
		return c.fail("kube.max_forks", strconv.Itoa(c.Kube.MaxForks), "want 0 (the default, 10) or more")
	}
	if c.Kube.MaxReplicas < 0 {
		return c.fail("kube.max_fork_replicas", strconv.Itoa(c.Kube.MaxReplicas), "want 0 (the default, 3) or more")
	}
	return nil
}

// KubeNamespaces returns the namespaces where forks may be made, the
// default first ("default" when none is set).
func (c *Config) KubeNamespaces() []string {
	if len(c.Kube.Namespaces) == 0 {
		return []string{"default"}
	}
	return c.Kube.Namespaces
}

// KubePolicy returns the namespace and the name of the LanesPolicy the
// control plane follows.
func (c *Config) KubePolicy() (namespace, name string) {
	p := c.Kube.Policy
	if p == "" {
		p = "lanes"
	}
	if ns, name, ok := strings.Cut(p, "/"); ok {
		return ns, name
	}
	return c.KubeNamespaces()[0], p
}

// validateMQ checks the brokers that lanes up only names.
func (c *Config) validateMQ() error {
	if c.MQ.Kafka != "" {
		for i, b := range strings.Split(c.MQ.Kafka, ",") {
			if _, port, err := net.SplitHostPort(strings.TrimSpace(b)); err != nil || port == "" {
				return c.fail("mq.kafka", c.MQ.Kafka, "broker %d %q: want host:port[,host:port...]", i+1, strings.TrimSpace(b))
			}
		}
	}
	if c.MQ.AMQP != "" {
		u, err := url.Parse(c.MQ.AMQP)
		if err != nil || (u.Scheme != "amqp" && u.Scheme != "amqps") || u.Host == "" {
			return c.fail("mq.amqp", redactURLs(c.MQ.AMQP), "want amqp://user:password@host:port/vhost (or amqps://)")
		}
	}
	return nil
}

// validateEtcd checks the etcd settings.
func (c *Config) validateEtcd() error {
	e := c.Etcd
	if len(e.Endpoints) == 0 {
		for _, a := range []struct{ key, v string }{{"etcd.client_addr", e.ClientAddr}, {"etcd.peer_addr", e.PeerAddr}} {
			if err := checkListen(a.v); err != nil {
				return c.fail(a.key, a.v, "%v", err)
			}
		}
		for _, k := range []string{"etcd.ca", "etcd.cert", "etcd.key", "etcd.username", "etcd.password"} {
			src, set := c.sources[k]
			if set && c.get(k) != "" && !strings.HasPrefix(src, "LANES_") {
				return c.fail(k, c.get(k), "only for an external etcd: set --external-etcd too")
			}
		}
	} else {
		for i, ep := range e.Endpoints {
			if !strings.HasPrefix(ep, "http://") && !strings.HasPrefix(ep, "https://") {
				if _, _, err := net.SplitHostPort(ep); err != nil {
					return c.fail("etcd.endpoints", ep, "endpoint %d: want host:port or an http(s) URL", i+1)
				}
			}
		}
		if (e.Cert == "") != (e.Key == "") {
			return c.fail("etcd.cert", e.Cert, "set both the client certificate and its key, or neither")
		}
		if (e.Username == "") != (e.Password == "") {
			return c.fail("etcd.username", e.Username, "set both the etcd username and password, or neither")
		}
	}
	if e.Prefix == "" || !strings.HasPrefix(e.Prefix, "/") {
		return c.fail("etcd.prefix", e.Prefix, "want a key prefix starting with /, such as /lanes/")
	}
	if e.DialTimeout <= 0 {
		return c.fail("etcd.dial_timeout", e.DialTimeout.String(), "want a positive duration")
	}
	return nil
}

// validateNats checks the NATS settings.
func (c *Config) validateNats() error {
	n := c.Nats
	if n.URL == "" {
		if n.Addr != NatsOff {
			if err := checkListen(n.Addr); err != nil {
				return c.fail("nats.addr", n.Addr, "%v (or off)", err)
			}
		}
		return nil
	}
	if _, set := c.sources["nats.addr"]; set {
		return c.fail("nats.addr", n.Addr, "only for the embedded NATS server: leave it out with an external one (nats url)")
	}
	for i, u := range strings.Split(n.URL, ",") {
		if _, err := natsURL(strings.TrimSpace(u)); err != nil {
			return c.fail("nats.url", redactURLs(n.URL), "URL %d: %v", i+1, err)
		}
	}
	return nil
}

// natsURL parses one NATS server URL: nats://, tls://, ws:// or wss://
// with a host, or a bare host:port.
func natsURL(s string) (*url.URL, error) {
	if s == "" {
		return nil, errors.New("empty")
	}
	if !strings.Contains(s, "://") {
		if _, _, err := net.SplitHostPort(s); err != nil {
			return nil, errors.New("want nats://host:port or host:port")
		}
		s = "nats://" + s
	}
	u, err := url.Parse(s)
	if err != nil {
		return nil, errors.New("not a URL")
	}
	switch u.Scheme {
	case "nats", "tls", "ws", "wss":
	default:
		return nil, fmt.Errorf("scheme %q: want nats, tls, ws or wss", u.Scheme)
	}
	if u.Hostname() == "" {
		return nil, errors.New("no host")
	}
	return u, nil
}

// redactURLs hides the passwords of comma-separated URLs, for messages.
func redactURLs(s string) string {
	parts := strings.Split(s, ",")
	for i, p := range parts {
		p = strings.TrimSpace(p)
		if j, k := strings.Index(p, "://"), strings.LastIndex(p, "@"); k > j && (j >= 0 || !strings.Contains(p, "/")) {
			scheme := ""
			if j >= 0 {
				scheme = p[:j+3]
			}
			p = scheme + "xxxxx" + p[k:]
		}
		parts[i] = p
	}
	return strings.Join(parts, ",")
}

func (c *Config) get(key string) string {
	switch key {
	case "etcd.ca":
		return c.Etcd.CA
	case "etcd.cert":
		return c.Etcd.Cert
	case "etcd.key":
		return c.Etcd.Key
	case "etcd.username":
		return c.Etcd.Username
	case "etcd.password":
		return "(hidden)"
	}
	return ""
}

func checkListen(addr string) error {
	if strings.Contains(addr, "://") {
		return fmt.Errorf("want host:port, not a URL")
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("want host:port")
	}
	if port == "" {
		return fmt.Errorf("empty port")
	}
	return nil
}

// routeSource names where route i came from.
func (c *Config) routeSource(i int) string {
	if src := c.sources[fmt.Sprintf("routes[%d]", i)]; src != "" {
		return src
	}
	if src := c.sources["routes"]; src != "" {
		return src
	}
	return "route"
}

// ParseRoute reads the syntax "host-or-/prefix=service": "/=web",
// "/api=orders", "shop.example.com=web", "shop.example.com/api=orders". The
// gateway's validation (gateway.Config.Validate) checks the parts.
func ParseRoute(s string) (adminapi.Route, error) {
	i := strings.LastIndex(s, "=")
	if i < 0 {
		return adminapi.Route{}, errors.New("want host-or-/prefix=service, such as /=web or api.example.com=orders")
	}
	match, svc := strings.TrimSpace(s[:i]), strings.TrimSpace(s[i+1:])
	if match == "" {
		return adminapi.Route{}, errors.New("empty host and path before '='; use / for every path")
	}
	r := adminapi.Route{Service: svc}
	if strings.HasPrefix(match, "/") {
		r.Prefix = match
	} else if j := strings.Index(match, "/"); j >= 0 {
		r.Host, r.Prefix = match[:j], match[j:]
	} else {
		r.Host = match
	}
	return r, nil
}

// ParsedTrustedProxies parses the trusted proxies; a bare IP is a /32 (or
// /128) prefix.
func (c *Config) ParsedTrustedProxies() ([]netip.Prefix, error) {
	return c.parsePrefixes("trusted_proxies", c.TrustedProxies, "10.0.0.0/8")
}

// ParsedLaneClaims parses the lane claims, as ParsedTrustedProxies does;
// nil when none are set (the admin API's default, loopback).
func (c *Config) ParsedLaneClaims() ([]netip.Prefix, error) {
	return c.parsePrefixes("lane_claims", c.LaneClaims, "10.1.0.0/16")
}

// parsePrefixes parses the IPs and CIDRs of the setting key.
func (c *Config) parsePrefixes(key string, vals []string, example string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range vals {
		p, err := parsePrefix(s)
		if err != nil {
			return nil, c.fail(key, s, "want an IP address or a CIDR such as %s", example)
		}
		out = append(out, p)
	}
	return out, nil
}

func parsePrefix(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		return p.Masked(), err
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	a = a.Unmap()
	return netip.PrefixFrom(a, a.BitLen()), nil
}

// Sources describes where each setting that is not a default came from,
// sorted by key, for `lanes up --print-config`-like diagnostics.
func (c *Config) Sources() []string {
	var out []string
	for k, v := range c.sources {
		out = append(out, k+" from "+v)
	}
	sort.Strings(out)
	return out
}
