package collector

import (
	"compress/gzip"
	"context"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// maxRequestBytes bounds one OTLP/HTTP request body, after decompression.
const maxRequestBytes = 16 << 20

// grpcReceiver is the OTLP/gRPC trace service.
type grpcReceiver struct {
	coltracepb.UnimplementedTraceServiceServer
	c *Collector
}

// Export receives one batch of spans.
func (r grpcReceiver) Export(ctx context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	if err := ctx.Err(); err != nil {
		return nil, status.FromContextError(err).Err()
	}
	var from, header string
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		from = p.Addr.String()
	}
	if v := metadata.ValueFromIncomingContext(ctx, "authorization"); len(v) > 0 {
		header = v[0]
	}
	sender, err := r.c.authenticate(ctx, from, header)
	if err != nil {
		r.c.authFails.Add(1)
		if errors.Is(err, ErrUnauthenticated) {
			return nil, status.Error(codes.Unauthenticated, err.Error())
		}
		return nil, status.Error(codes.Unavailable, "checking the token: "+err.Error())
	}
	resp := &coltracepb.ExportTraceServiceResponse{}
	if rejected, why := r.c.ingest(req, sender); rejected > 0 {
		resp.PartialSuccess = &coltracepb.ExportTracePartialSuccess{RejectedSpans: rejected, ErrorMessage: why}
	}
	return resp, nil
}

// httpReceiver serves OTLP/HTTP: POST /v1/traces with a protobuf or JSON body, optionally
// gzip-compressed, answered in the same encoding.
func (c *Collector) httpReceiver() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/traces", func(w http.ResponseWriter, r *http.Request) {
		sender, err := c.authenticate(r.Context(), r.RemoteAddr, r.Header.Get("Authorization"))
		if err != nil {
			c.authFails.Add(1)
			if errors.Is(err, ErrUnauthenticated) {
				w.Header().Set("WWW-Authenticate", `Bearer realm="lanes"`)
				http.Error(w, err.Error(), http.StatusUnauthorized)
			} else {
				http.Error(w, "checking the token: "+err.Error(), http.StatusServiceUnavailable)
			}
			return
		}
		ct, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
		if err != nil || (ct != "application/x-protobuf" && ct != "application/json") {
			http.Error(w, fmt.Sprintf("Content-Type %q: want application/x-protobuf or application/json", r.Header.Get("Content-Type")), http.StatusUnsupportedMediaType)
			return
		}
		var body io.Reader = r.Body
		switch enc := r.Header.Get("Content-Encoding"); enc {
		case "", "identity":
		case "gzip":
			zr, err := gzip.NewReader(r.Body)
			if err != nil {
				http.Error(w, "Content-Encoding gzip: "+err.Error(), http.StatusBadRequest)
				return
			}
			defer zr.Close()
			body = zr
		default:
			http.Error(w, fmt.Sprintf("Content-Encoding %q: want gzip or none", enc), http.StatusUnsupportedMediaType)
			return
		}
		data, err := io.ReadAll(io.LimitReader(body, maxRequestBytes+1))
		if err != nil {
			http.Error(w, "reading the body: "+err.Error(), http.StatusBadRequest)
			return
		}
		if len(data) > maxRequestBytes {
			http.Error(w, fmt.Sprintf("the body is over %d bytes", maxRequestBytes), http.StatusRequestEntityTooLarge)
			return
		}
		req := &coltracepb.ExportTraceServiceRequest{}
		if ct == "application/json" {
			if err = protojson.Unmarshal(data, req); err == nil {
				hexIDs(req)
			}
		} else {
			err = proto.Unmarshal(data, req)
		}
		if err != nil {
			http.Error(w, "not an ExportTraceServiceRequest: "+err.Error(), http.StatusBadRequest)
			return
		}
		resp := &coltracepb.ExportTraceServiceResponse{}
		if rejected, why := c.ingest(req, sender); rejected > 0 {
			resp.PartialSuccess = &coltracepb.ExportTracePartialSuccess{RejectedSpans: rejected, ErrorMessage: why}
		}
		var out []byte
		if ct == "application/json" {
			out, err = protojson.Marshal(resp)
		} else {
			out, err = proto.Marshal(resp)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", ct)
		_, _ = w.Write(out)
	})
	return mux
}

// hexIDs reads the trace and span ids of an OTLP/JSON request as the OTLP specification writes
// them, in hex (OpenTelemetry's JavaScript exporters, for one), where protobuf's JSON mapping,
// which protojson follows, reads bytes in base64. protojson took a hex id for base64 and decoded
// its 32 (16) characters to 24 (12) bytes; re-encoded in base64 they are the hex digits again. An
// id of 16 (8) bytes was sent in base64 and is kept.
func hexIDs(req *coltracepb.ExportTraceServiceRequest) {
	for _, rs := range req.GetResourceSpans() {
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				sp.TraceId = hexID(sp.TraceId, 16)
				sp.SpanId = hexID(sp.SpanId, 8)
				sp.ParentSpanId = hexID(sp.ParentSpanId, 8)
				for _, l := range sp.GetLinks() {
					l.TraceId = hexID(l.TraceId, 16)
					l.SpanId = hexID(l.SpanId, 8)
				}
			}
		}
	}
}

// hexID returns the n bytes that id's base64 spells in hex, or id unchanged when it does not.
func hexID(id []byte, n int) []byte {
	if len(id) != n*3/2 {
		return id
	}
	b, err := hex.DecodeString(base64.StdEncoding.EncodeToString(id))
	if err != nil {
		return id
	}
	return b
}
