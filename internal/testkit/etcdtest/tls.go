package etcdtest

import (
	"crypto/tls"

	"go.etcd.io/etcd/client/pkg/v3/transport"

	"github.com/lanesdev/lanes/internal/testkit/tlstest"
)

// TLSFiles are PEM files made for a test: a CA, a server certificate for
// 127.0.0.1 and localhost, and a client certificate, each signed by the CA.
type TLSFiles = tlstest.Files

// ClientConfig returns the TLS configuration of a client that trusts the
// CA of f and presents its client certificate.
func ClientConfig(f *TLSFiles) (*tls.Config, error) {
	info := transport.TLSInfo{CertFile: f.ClientCert, KeyFile: f.ClientKey, TrustedCAFile: f.CA}
	return info.ClientConfig()
}

// WriteTLS makes a CA and certificates signed by it in dir, valid for a
// day.
func WriteTLS(dir string) (*TLSFiles, error) { return tlstest.Write(dir) }
