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
	"sync"
	"time"
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
//
// The server takes a new pair written over the files: a handshake looks at
// the files' size and time at most once every 10 seconds, and loads them
// again when either changed. A pair that does not load (a certificate
// written before its key) leaves the one in service until the next look.
func Server(certFile, keyFile string) (*tls.Config, error) {
	p := &pair{cert: certFile, key: keyFile}
	if err := p.load(); err != nil {
		return nil, err
	}
	return &tls.Config{
		GetCertificate: p.get,
		MinVersion:     tls.VersionTLS12,
		NextProtos:     []string{"h2", "http/1.1"},
	}, nil
}

// reloadCheck is how often, at most, a server looks at its certificate
// files for a new pair: a flood of handshakes costs no more than a look
// every reloadCheck.
var reloadCheck = 10 * time.Second

// pair is a server's certificate and key, reloaded when their files change.
type pair struct {
	cert, key string

	mu      sync.Mutex
	cur     *tls.Certificate
	stamp   [2]stamp  // of the files that cur was loaded from
	checked time.Time // the last look at the files
}

// stamp tells a file's versions apart.
type stamp struct {
	size int64
	mod  time.Time
}

func stampOf(path string) stamp {
	fi, err := os.Stat(path)
	if err != nil {
		return stamp{}
	}
	return stamp{size: fi.Size(), mod: fi.ModTime()}
}

// load reads the files into cur.
func (p *pair) load() error {
	st := [2]stamp{stampOf(p.cert), stampOf(p.key)}
	c, err := tls.LoadX509KeyPair(p.cert, p.key)
	if err != nil {
		return fmt.Errorf("certificate %q and key %q: %w", p.cert, p.key, unwrapPath(err))
	}
	p.cur, p.stamp = &c, st
	return nil
}

func (p *pair) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if now := time.Now(); now.Sub(p.checked) >= reloadCheck {
		p.checked = now
		if [2]stamp{stampOf(p.cert), stampOf(p.key)} != p.stamp {
			p.load() // on failure the pair in service stays
		}
	}
	return p.cur, nil
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
// leaf certificate that srv (a configuration of Server) presents, whatever the name it is reached by:
// for a process that connects to its own listener (the control plane's own
// spans, sent to its collector on 127.0.0.1 while the certificate names a
// public host).
func Pinned(srv *tls.Config) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		// The name is not checked; the certificate is, byte for byte.
		InsecureSkipVerify: true, // VerifyConnection pins the certificate
		VerifyConnection: func(cs tls.ConnectionState) error {
			leaf := served(srv)
			if leaf == nil || len(cs.PeerCertificates) == 0 || !bytes.Equal(cs.PeerCertificates[0].Raw, leaf) {
				return errors.New("the server's certificate is not the one this process serves")
			}
			return nil
		},
	}
}

// served returns the leaf certificate that srv presents now.
func served(srv *tls.Config) []byte {
	c := (*tls.Certificate)(nil)
	if srv.GetCertificate != nil {
		c, _ = srv.GetCertificate(&tls.ClientHelloInfo{})
	} else if len(srv.Certificates) > 0 {
		c = &srv.Certificates[0]
	}
	if c == nil || len(c.Certificate) == 0 {
		return nil
	}
	return c.Certificate[0]
}
