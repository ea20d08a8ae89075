package cli

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/lanesdev/lanes/registry"
)

// TestUpGRPCToHTTP1Only checks through the binary that a gRPC call routed
// to an instance that speaks HTTP/1 only fails with Unavailable saying so
// and naming the service, counted in lanes_gateway_errors_total with its
// own code, and that such calls, more than outlier detection's threshold,
// never eject the instance: its HTTP/1.1 traffic goes on.
func TestUpGRPCToHTTP1Only(t *testing.T) {
	u := startUp(t, "up", "--route", "/=hello")
	hello := newBackend(t, "hello")
	u.register(t, u.token, registry.Instance{Service: "hello", ID: "hello-1", Addr: hello.addr})
	c := clientFrom(t, "127.0.0.1")
	expectBackend(t, c, u.gateway+"/", "hello", nil)

	conn, err := grpc.NewClient("passthrough:///"+strings.TrimPrefix(u.gateway, "http://"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	const calls = 12 // over twice the default outlier threshold (5 errors)
	for i := range calls {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		var tr metadata.MD
		_, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Trailer(&tr))
		cancel()
		msg := status.Convert(err).Message()
		if status.Code(err) != codes.Unavailable || !strings.Contains(msg, `service "hello"`) || !strings.Contains(msg, "HTTP/1 only") {
			t.Fatalf("gRPC call %d: %v; want Unavailable naming service hello and HTTP/1 only", i, err)
		}
		if got := tr.Get("x-lanes-error"); len(got) != 1 || got[0] != "upstream_http1" {
			t.Errorf("gRPC call %d: x-lanes-error %q, want upstream_http1", i, got)
		}
	}
	if code, out, errOut := u.cli(t, "ls", "-o", "json"); code != 0 || !strings.Contains(out, `"hello-1"`) || strings.Contains(out, "ejected") {
		t.Errorf("lanes ls -o json: exit %d, %s %s; want hello-1 listed, not ejected", code, out, errOut)
	}
	expectBackend(t, c, u.gateway+"/", "hello", nil)
	resp, err := c.Get(u.admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if want := `lanes_gateway_errors_total{code="upstream_http1"} 12`; !strings.Contains(string(body), want) {
		t.Errorf("/metrics has no %s", want)
	}
}
