package collector

import (
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"mime"
	"net/http"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
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
	rejected := r.c.Ingest(req)
	resp := &coltracepb.ExportTraceServiceResponse{}
	if rejected > 0 {
		resp.PartialSuccess = &coltracepb.ExportTracePartialSuccess{RejectedSpans: rejected, ErrorMessage: "spans without a valid trace or span id"}
	}
	return resp, nil
}

// httpReceiver serves OTLP/HTTP: POST /v1/traces with a protobuf or JSON body, optionally
// gzip-compressed, answered in the same encoding.
func (c *Collector) httpReceiver() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/traces", func(w http.ResponseWriter, r *http.Request) {
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
			err = protojson.Unmarshal(data, req)
		} else {
			err = proto.Unmarshal(data, req)
		}
		if err != nil {
			http.Error(w, "not an ExportTraceServiceRequest: "+err.Error(), http.StatusBadRequest)
			return
		}
		resp := &coltracepb.ExportTraceServiceResponse{}
		if rejected := c.Ingest(req); rejected > 0 {
			resp.PartialSuccess = &coltracepb.ExportTracePartialSuccess{RejectedSpans: rejected, ErrorMessage: "spans without a valid trace or span id"}
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
