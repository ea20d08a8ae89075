// Package tlsfiles turns the PEM files of lanes' TLS settings into TLS
// configurations: a server's certificate and key, and the CA file that a
// client verifies a server with (LANES_CA_FILE).
package tlsfiles

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
)

// EnvCAFile is the variable that clients of lanes' listeners (the admin
// API, the trace collector) read the CA file from: a PEM file of the
// certificates that signed the servers' certificates. Set, it replaces the
// system's roots for those connections.
const EnvCAFile = "LANES_CA_FILE"

// Server loads the certificate (with its chain) and key in certFile and
// keyFile and returns the configuration of a server that presents them,
// TLS 1.2 or later, offering HTTP/2 and HTTP/1.1 by ALPN. Its error names
// both files and says what is wrong.
func Server(certFile, keyFile string) (*tls.Config, error) {
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("certificate %q and key %q: %w", certFile, keyFile, unwrapPath(err))
	}
	return &tls.Config{
		Certificates: []tls.Certificate{pair},
		MinVersion:   tls.VersionTLS12,
		NextProtos:   []string{"h2", "http/1.1"},
	}, nil
}

// unwrapPath drops the path from a file error, which the caller names.
func unwrapPath(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// A CAError is a CA file that Client cannot use.
type CAError struct {
	File string
	Err  error
}

func (e *CAError) Error() string { return fmt.Sprintf("CA file %q: %v", e.File, e.Err) }
func (e *CAError) Unwrap() error { return e.Err }

// Client returns the configuration of a client that verifies servers with
// the certificates in caFile only; with caFile "" it returns nil (the
// system's roots). Its error names the file.
func Client(caFile string) (*tls.Config, error) {
	if caFile == "" {
		return nil, nil
	}
	data, err := os.ReadFile(caFile)
	if err != nil {
		return nil, &CAError{File: caFile, Err: unwrapPath(err)}
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		return nil, &CAError{File: caFile, Err: errors.New("no PEM certificate in it")}
	}
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
}

// Pinned returns the configuration of a client that accepts exactly the
// leaf certificate that srv presents, whatever the name it is reached by:
// for a process that connects to its own listener (the control plane's own
// spans, sent to its collector on 127.0.0.1 while the certificate names a
// public host).
func Pinned(srv *tls.Config) *tls.Config {
	var leaf []byte
	if len(srv.Certificates) > 0 && len(srv.Certificates[0].Certificate) > 0 {
		leaf = srv.Certificates[0].Certificate[0]
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		// The name is not checked; the certificate is, byte for byte.
		InsecureSkipVerify: true, // VerifyConnection pins the certificate
		VerifyConnection: func(cs tls.ConnectionState) error {
			if leaf == nil || len(cs.PeerCertificates) == 0 || !bytes.Equal(cs.PeerCertificates[0].Raw, leaf) {
				return errors.New("the server's certificate is not the one this process serves")
			}
			return nil
		},
	}
}
