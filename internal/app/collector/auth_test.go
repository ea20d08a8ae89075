package collector

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/lanesdev/lanes/lanestrace"
)

// tokens is an Authenticator of fixed tokens.
func tokens(senders map[string]Sender) Authenticator {
	return func(_ context.Context, tok string) (Sender, error) {
		if s, ok := senders[tok]; ok {
			return s, nil
		}
		return Sender{}, fmt.Errorf("%w: unknown token", ErrUnauthenticated)
	}
}

// sendOTLP exports req with token over gRPC or HTTP, and returns the spans rejected, the message,
// and the gRPC code or HTTP status of a refusal.
func sendOTLP(t *testing.T, c *Collector, token string, overHTTP bool, req *coltracepb.ExportTraceServiceRequest) (rejected int64, msg string, refusal string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if !overHTTP {
		conn, err := grpc.NewClient(c.GRPCAddr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if token != "" {
			ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
		}
		resp, err := coltracepb.NewTraceServiceClient(conn).Export(ctx, req)
		if err != nil {
			return 0, status.Convert(err).Message(), status.Code(err).String()
		}
		return resp.GetPartialSuccess().GetRejectedSpans(), resp.GetPartialSuccess().GetErrorMessage(), ""
	}
	body, _ := proto.Marshal(req)
	r, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+c.HTTPAddr().String()+"/v1/traces", bytes.NewReader(body))
	r.Header.Set("Content-Type", "application/x-protobuf")
	if token != "" {
		r.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return 0, string(b), resp.Status
	}
	var out coltracepb.ExportTraceServiceResponse
	if err := proto.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out.GetPartialSuccess().GetRejectedSpans(), out.GetPartialSuccess().GetErrorMessage(), ""
}

// TestReceiverAuth: with token authentication, a request without a token or with an unknown one
// is refused over gRPC and HTTP; a lane token sends only the spans of its lane; a baseline token
// only those of baseline instances; a trusted token any. A refused span leaves no finding.
func TestReceiverAuth(t *testing.T) {
	c := start(t, Config{Auth: AuthToken, Fleet: &fleet{chains: map[string][]string{"bob": {"alice"}}}, Authenticate: tokens(map[string]Sender{
		"alice": {Lane: "alice", ID: "a1"}, "base": {Baseline: true, ID: "b1"}, "telemetry": {Trusted: true},
	})})
	var f forged
	server := func(requested, own string) *coltracepb.ExportTraceServiceRequest {
		return request("web", f.span(tracepb.Span_SPAN_KIND_SERVER, "GET /", strAttr(string(lanestrace.Requested), requested), strAttr(string(lanestrace.InstanceLane), own)))
	}
	client := func(requested, served string) *coltracepb.ExportTraceServiceRequest {
		return request("web", f.span(tracepb.Span_SPAN_KIND_CLIENT, "orders.Get", strAttr(string(lanestrace.Requested), requested),
			strAttr(string(lanestrace.Served), served), strAttr(string(lanestrace.Service), "orders")))
	}
	for _, overHTTP := range []bool{false, true} {
		for _, tok := range []string{"", "nobody"} {
			_, msg, refusal := sendOTLP(t, c, tok, overHTTP, server("", "bob"))
			if refusal != "Unauthenticated" && refusal != "401 Unauthorized" {
				t.Errorf("http %v, token %q: refusal %q (%s), want Unauthenticated", overHTTP, tok, refusal, msg)
			}
		}
		for _, tc := range []struct {
			token    string
			req      *coltracepb.ExportTraceServiceRequest
			rejected int64
		}{
			{"alice", server("", "bob"), 1},        // another lane's instance
			{"alice", server("", ""), 1},           // a baseline instance
			{"alice", client("carol", "carol"), 1}, // a request alice does not serve
			{"alice", server("", "alice"), 0},      // its own instance: its own breach to report
			{"alice", client("bob", "bob"), 0},     // bob falls back to alice, so alice serves bob's requests
			{"base", server("", "bob"), 1},
			{"base", server("alice", ""), 0},
			{"base", client("", "bob"), 0}, // a baseline service's call: any lane it carries
			{"telemetry", server("", "bob"), 0},
		} {
			rejected, msg, refusal := sendOTLP(t, c, tc.token, overHTTP, tc.req)
			if refusal != "" || rejected != tc.rejected {
				t.Errorf("http %v, token %s, %v: rejected %d (%q, %s), want %d", overHTTP, tc.token, tc.req.ResourceSpans[0].ScopeSpans[0].Spans[0].Attributes,
					rejected, msg, refusal, tc.rejected)
			}
			if tc.rejected > 0 && !strings.Contains(msg, "may not send") {
				t.Errorf("rejection message %q", msg)
			}
		}
	}
	var got []string
	kinds := map[string]int{}
	for _, fd := range c.Findings(time.Time{}, "") {
		got = append(got, fd.Kind+":"+fd.Message)
		kinds[fd.Kind]++
	}
	// Twice (gRPC and HTTP): the breaches of alice's own instance, the baseline token's call to
	// bob and the telemetry token's bob instance; and the baseline token's call, a root span
	// started while the same sender served a request in alice, is a broken trace.
	if kinds[Breach] != 6 || kinds[TraceBroken] != 2 || len(got) != 8 {
		t.Errorf("findings:\n%s", strings.Join(got, "\n"))
	}
	if st := c.Stats(); st.Refused != 8 {
		t.Errorf("refused %d spans, want 8", st.Refused)
	}
}

// TestReceiverLoopback: a loopback-only receiver takes spans from loopback peers without a token,
// and the check of the peer's address refuses every other.
func TestReceiverLoopback(t *testing.T) {
	c := start(t, Config{Auth: AuthLoopback})
	var f forged
	if rejected, msg, refusal := sendOTLP(t, c, "", false, request("web", f.span(tracepb.Span_SPAN_KIND_SERVER, "GET /"))); rejected != 0 || refusal != "" {
		t.Errorf("from loopback: %d rejected, %s %s", rejected, refusal, msg)
	}
	for addr, want := range map[string]bool{"127.0.0.1:5": true, "127.8.9.10:5": true, "[::1]:5": true, "[::ffff:127.0.0.1]:5": true,
		"10.0.0.1:5": false, "[2001:db8::1]:5": false, "0.0.0.0:5": false, "localhost:5": false, "": false} {
		if isLoopback(addr) != want {
			t.Errorf("isLoopback(%q) = %v, want %v", addr, !want, want)
		}
	}
}

// TestTraceBrokenSender: the trace_broken check matches a root span only with a lane request
// served under the same credential, so a lane token cannot pin a broken trace on a request that
// another sender served.
func TestTraceBrokenSender(t *testing.T) {
	c := start(t, Config{Auth: AuthToken, Fleet: &fleet{}, Authenticate: tokens(map[string]Sender{
		"alice": {Lane: "alice", ID: "a1"}, "telemetry": {Trusted: true},
	})})
	var f forged
	now := uint64(time.Now().UnixNano())
	srv := f.span(tracepb.Span_SPAN_KIND_SERVER, "GET /", strAttr(string(lanestrace.Requested), "bob"), strAttr(string(lanestrace.InstanceLane), "bob"))
	srv.StartTimeUnixNano, srv.EndTimeUnixNano = now, now+uint64(time.Second)
	if rejected, msg, refusal := sendOTLP(t, c, "telemetry", false, request("web", srv)); rejected != 0 || refusal != "" {
		t.Fatalf("%d %s %s", rejected, msg, refusal)
	}
	root := f.span(tracepb.Span_SPAN_KIND_CLIENT, "orders.Get")
	root.StartTimeUnixNano = now + uint64(time.Millisecond)
	if rejected, msg, refusal := sendOTLP(t, c, "alice", false, request("web", root)); rejected != 0 || refusal != "" {
		t.Fatalf("%d %s %s", rejected, msg, refusal)
	}
	if got := c.Findings(time.Time{}, ""); len(got) != 0 {
		t.Errorf("findings %+v, want none", got)
	}
	root2 := f.span(tracepb.Span_SPAN_KIND_CLIENT, "orders.Get")
	root2.StartTimeUnixNano = now + uint64(time.Millisecond)
	sendOTLP(t, c, "telemetry", false, request("web", root2))
	if got := c.Findings(time.Time{}, ""); len(got) != 1 || got[0].Kind != TraceBroken {
		t.Errorf("findings %+v, want one trace_broken", got)
	}
}
