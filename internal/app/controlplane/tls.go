package controlplane

import (
	"crypto/tls"
	"net"
	"strings"

	"github.com/lanesdev/lanes/internal/lib/tlsfiles"
)

// TLSSettings are the certificate files that the control plane's listeners
// serve TLS with. Cert and Key serve every listener that has no pair of its
// own; a listener's own pair (Admin*, Gateway*, Traces*) serves it alone.
// The xDS server serves with Cert and Key.
// A listener with neither serves plain HTTP, as by default.
type TLSSettings struct {
	// Cert and Key are PEM files: the certificate (with its chain) and its
	// key.
	Cert string `yaml:"cert"`
	Key  string `yaml:"key"`
	// AdminCert and AdminKey serve the admin API and the dashboard.
	AdminCert string `yaml:"admin_cert"`
	AdminKey  string `yaml:"admin_key"`
	// GatewayCert and GatewayKey serve the gateway; with lane hosts
	// (<lane>.<domain>), a wildcard certificate for *.<domain>.
	GatewayCert string `yaml:"gateway_cert"`
	GatewayKey  string `yaml:"gateway_key"`
	// TracesCert and TracesKey serve the trace collector's OTLP receivers.
	TracesCert string `yaml:"traces_cert"`
	TracesKey  string `yaml:"traces_key"`
}

// The settings of TLSSettings, in the order of --help.
func init() {
	Settings = append(Settings, tlsSettings...)
}

var tlsSettings = []Setting{
	{Flag: "tls-cert", Env: "LANES_TLS_CERT", Key: "tls.cert", Usage: "PEM file of the certificate that the admin API, the gateway and the trace collector serve TLS with, each unless it has its own, and the xDS server", set: str(func(c *Config) *string { return &c.TLS.Cert })},
	{Flag: "tls-key", Env: "LANES_TLS_KEY", Key: "tls.key", Usage: "PEM file of the key of --tls-cert", set: str(func(c *Config) *string { return &c.TLS.Key })},
	{Flag: "admin-tls-cert", Env: "LANES_ADMIN_TLS_CERT", Key: "tls.admin_cert", Usage: "PEM file of the certificate of the admin API and the dashboard", set: str(func(c *Config) *string { return &c.TLS.AdminCert })},
	{Flag: "admin-tls-key", Env: "LANES_ADMIN_TLS_KEY", Key: "tls.admin_key", Usage: "PEM file of the key of --admin-tls-cert", set: str(func(c *Config) *string { return &c.TLS.AdminKey })},
	{Flag: "gateway-tls-cert", Env: "LANES_GATEWAY_TLS_CERT", Key: "tls.gateway_cert", Usage: "PEM file of the gateway's certificate (a wildcard *.<domain> serves lane hosts)", set: str(func(c *Config) *string { return &c.TLS.GatewayCert })},
	{Flag: "gateway-tls-key", Env: "LANES_GATEWAY_TLS_KEY", Key: "tls.gateway_key", Usage: "PEM file of the key of --gateway-tls-cert", set: str(func(c *Config) *string { return &c.TLS.GatewayKey })},
	{Flag: "traces-tls-cert", Env: "LANES_TRACES_TLS_CERT", Key: "tls.traces_cert", Usage: "PEM file of the certificate of the trace collector's OTLP receivers", set: str(func(c *Config) *string { return &c.TLS.TracesCert })},
	{Flag: "traces-tls-key", Env: "LANES_TRACES_TLS_KEY", Key: "tls.traces_key", Usage: "PEM file of the key of --traces-tls-cert", set: str(func(c *Config) *string { return &c.TLS.TracesKey })},
}

// The listeners that serve TLS, as ServerTLS names them.
const (
	tlsAdmin   = "admin"
	tlsGateway = "gateway"
	tlsTraces  = "traces"
	tlsXDS     = "xds" // the shared pair only
)

// tlsPair returns the keys and values of the pair that serves listener:
// its own when set, else the shared one.
func (c *Config) tlsPair(listener string) (certKey, cert, keyKey, key string) {
	t := c.TLS
	own := map[string][2]string{
		tlsAdmin:   {t.AdminCert, t.AdminKey},
		tlsGateway: {t.GatewayCert, t.GatewayKey},
		tlsTraces:  {t.TracesCert, t.TracesKey},
	}[listener]
	if own[0] != "" || own[1] != "" {
		return "tls." + listener + "_cert", own[0], "tls." + listener + "_key", own[1]
	}
	return "tls.cert", t.Cert, "tls.key", t.Key
}

// ServerTLS returns the TLS configuration that listener ("admin",
// "gateway" or "traces") serves with, nil when it serves plain HTTP. Its
// errors name the setting, as the user gave it, and the file.
func (c *Config) ServerTLS(listener string) (*tls.Config, error) {
	certKey, cert, keyKey, key := c.tlsPair(listener)
	switch {
	case cert == "" && key == "":
		return nil, nil
	case cert == "":
		return nil, c.fail(certKey, cert, "%s is set: set the certificate too", keyKey)
	case key == "":
		return nil, c.fail(keyKey, key, "%s is set: set the key too", certKey)
	}
	tc, err := tlsfiles.Server(cert, key)
	if err != nil {
		return nil, c.fail(certKey, cert, "%v", err)
	}
	return tc, nil
}

// validateTLS loads every pair that a listener serves with.
func (c *Config) validateTLS() error {
	for _, l := range []string{tlsAdmin, tlsGateway, tlsTraces} {
		if _, err := c.ServerTLS(l); err != nil {
			return err
		}
	}
	return nil
}

// listenerURL is the URL of a listener: https:// when it serves TLS.
func listenerURL(a net.Addr, tc *tls.Config) string {
	u := httpURL(a)
	if tc != nil {
		return "https://" + strings.TrimPrefix(u, "http://")
	}
	return u
}
