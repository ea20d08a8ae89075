package xds_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	grpcxds "google.golang.org/grpc/xds"

	"github.com/lanesdev/lanes/internal/app/xds"
	"github.com/lanesdev/lanes/internal/lib/bearer"
	"github.com/lanesdev/lanes/internal/testkit/tlstest"
	"github.com/lanesdev/lanes/registry"
)

// The child's settings: the test binary runs itself as grpc-go's xDS
// client, because grpc-go reads GRPC_EXPERIMENTAL_XDS_BOOTSTRAP_CALL_CREDS
// when its packages start.
const (
	envChild     = "LANES_TEST_XDS_ENVELOPE_CHILD"
	envBootstrap = "LANES_TEST_XDS_BOOTSTRAP"
)

// TestEnvelopeChild is the child: one call to xds:///orders with the
// bootstrap of envBootstrap, whose xDS server takes a token.
func TestEnvelopeChild(t *testing.T) {
	if os.Getenv(envChild) == "" {
		t.Skip("run by TestTokenEnvelope")
	}
	rb, err := grpcxds.NewXDSResolverWithConfigForTesting([]byte(os.Getenv(envBootstrap)))
	if err != nil {
		t.Fatal(err)
	}
	cc, err := grpc.NewClient("xds:///orders", grpc.WithResolvers(rb), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true)); err != nil {
		t.Fatal(err)
	}
	// Out at once: grpc-go's certificate file watcher outlives its
	// client, which the leak check of TestMain would take for a leak.
	fmt.Println(childServed)
	os.Exit(0)
}

const childServed = "the call through xds:///orders was served"

// TestTokenEnvelope: grpc-go's own xDS client, configured by its bootstrap
// alone (TLS, and call credentials jwt_token_file naming the file that
// lanes token envelope writes), reads the resources of a server that
// takes tokens; with a token the server refuses, it reads nothing.
func TestTokenEnvelope(t *testing.T) {
	if os.Getenv(envChild) != "" {
		t.Skip("the child")
	}
	dir := t.TempDir()
	files, err := tlstest.Write(dir)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.LoadX509KeyPair(files.ServerCert, files.ServerKey)
	if err != nil {
		t.Fatal(err)
	}
	f := start(t, xds.Config{Auth: xds.AuthToken, Tokens: tokens{"lanes_good": true},
		TLS: &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}})
	serveBackend(t, f, registry.Instance{ID: "b1", Service: "orders"})

	for _, tc := range []struct {
		token string
		ok    bool
	}{{"lanes_good", true}, {"lanes_bad", false}} {
		file := filepath.Join(dir, tc.token+".jwt")
		if err := os.WriteFile(file, []byte(bearer.Envelope(tc.token, time.Now().Add(time.Hour))), 0o600); err != nil {
			t.Fatal(err)
		}
		bootstrap := fmt.Sprintf(`{
			"xds_servers": [{"server_uri": %q, "server_features": ["xds_v3"],
				"channel_creds": [{"type": "tls", "config": {"ca_certificate_file": %q}}],
				"call_creds": [{"type": "jwt_token_file", "config": {"jwt_token_file": %q}}]}],
			"node": {"id": "grpc-go-envelope"}
		}`, f.addr, files.CA, file)
		refused := sum(f.metrics, "lanes_xds_refused_total")
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run", "^TestEnvelopeChild$", "-test.v")
		cmd.Env = append(os.Environ(), envChild+"=1", envBootstrap+"="+bootstrap, "GRPC_EXPERIMENTAL_XDS_BOOTSTRAP_CALL_CREDS=true")
		if !tc.ok {
			// The child waits for the resources it will not get: it is
			// stopped once the server has refused its stream.
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			for sum(f.metrics, "lanes_xds_refused_total") == refused {
				select {
				case <-ctx.Done():
					t.Fatal("the server refused no stream of the client with a bad token")
				case <-time.After(20 * time.Millisecond):
				}
			}
			cmd.Process.Kill()
			cmd.Wait()
			cancel()
			continue
		}
		out, err := cmd.CombinedOutput()
		cancel()
		if err != nil || !strings.Contains(string(out), childServed) {
			t.Fatalf("the client with %s: %v\n%s", tc.token, err, out)
		}
		if n := sum(f.metrics, "lanes_xds_refused_total"); n != refused {
			t.Errorf("%g refusals for the good token", n-refused)
		}
	}
}
