package adminclient

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/lanesdev/lanes/adminapi"
)

// TraceFilter selects traces for Traces. Zero fields select everything.
type TraceFilter struct {
	Lane    string // a lane requested somewhere in the trace; "-" for baseline-only traces
	Service string // a service with a span in the trace
	Limit   int    // at most this many, newest first (the server's default is 20)
}

// Traces lists the newest traces of the trace collector.
func (c *Client) Traces(ctx context.Context, f TraceFilter) (adminapi.TraceList, error) {
	q := url.Values{}
	if f.Lane != "" {
		q.Set("lane", f.Lane)
	}
	if f.Service != "" {
		q.Set("service", f.Service)
	}
	if f.Limit > 0 {
		q.Set("limit", strconv.Itoa(f.Limit))
	}
	var out adminapi.TraceList
	err := c.do(ctx, http.MethodGet, "/v1/traces", q, nil, &out)
	return out, err
}

// Trace returns one trace as hops, with its findings.
func (c *Client) Trace(ctx context.Context, id string) (adminapi.Trace, error) {
	var out adminapi.Trace
	err := c.do(ctx, http.MethodGet, "/v1/traces/"+url.PathEscape(id), nil, nil, &out)
	return out, err
}

// Findings lists the lane integrity findings of the last since (all that are kept, for 0),
// newest first; with traceID, those on that trace.
func (c *Client) Findings(ctx context.Context, since time.Duration, traceID string) ([]adminapi.Finding, error) {
	q := url.Values{}
	if since > 0 {
		q.Set("since", since.String())
	}
	if traceID != "" {
		q.Set("trace", traceID)
	}
	var out adminapi.FindingList
	err := c.do(ctx, http.MethodGet, "/v1/findings", q, nil, &out)
	return out.Findings, err
}

// Graph returns the service graph of the traces collected over the last window (0: the server's
// default, 5m).
func (c *Client) Graph(ctx context.Context, window time.Duration) (adminapi.Graph, error) {
	q := url.Values{}
	if window > 0 {
		q.Set("window", window.String())
	}
	var out adminapi.Graph
	err := c.do(ctx, http.MethodGet, "/v1/graph", q, nil, &out)
	return out, err
}
