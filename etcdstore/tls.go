package etcdstore

import (
	"crypto/tls"
	"fmt"

	"go.etcd.io/etcd/client/pkg/v3/transport"
)

// TLSFiles returns the client TLS configuration for an etcd cluster from PEM
// files: the CA that signed the servers' certificates (empty: the system
// roots), and a client certificate and its key (both or neither).
func TLSFiles(ca, cert, key string) (*tls.Config, error) {
	if (cert == "") != (key == "") {
		return nil, fmt.Errorf("etcd TLS: give the client certificate and its key together (cert %q, key %q)", cert, key)
	}
	info := transport.TLSInfo{CertFile: cert, KeyFile: key, TrustedCAFile: ca}
	tc, err := info.ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("etcd TLS (ca %q, cert %q, key %q): %w", ca, cert, key, err)
	}
	return tc, nil
}
