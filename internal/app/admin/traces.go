package admin

import (
	"net/http"
	"strconv"
	"time"

	"github.com/lanesdev/lanes/adminapi"
	"github.com/lanesdev/lanes/internal/app/collector"
	"github.com/lanesdev/lanes/lane"
)

// maxTraceList bounds the limit parameter of GET /v1/traces.
const maxTraceList = 1000

func (s *Server) traces() (*collector.Collector, error) {
	if s.cfg.Traces == nil {
		return nil, notFound("", "", "this control plane runs no trace collector")
	}
	return s.cfg.Traces, nil
}

// listTraces answers GET /v1/traces?lane=L&service=S&limit=N: the newest traces first.
func (s *Server) listTraces(w http.ResponseWriter, r *http.Request, _ *principal) error {
	col, err := s.traces()
	if err != nil {
		return err
	}
	q := r.URL.Query()
	f := collector.Filter{Service: q.Get("service"), Limit: 20}
	if v := q.Get("lane"); v != "" {
		if v == "-" {
			f.Lane = "-"
		} else {
			l, err := lane.Parse(v)
			if err != nil {
				return badRequest("lane", v, "%v", err)
			}
			f.Lane = l
		}
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxTraceList {
			return badRequest("limit", v, "want a whole number from 1 to %d", maxTraceList)
		}
		f.Limit = n
	}
	writeJSON(w, http.StatusOK, col.Traces(f))
	return nil
}

// getTrace answers GET /v1/traces/{id}: the trace's hops, depth first, with its findings.
func (s *Server) getTrace(w http.ResponseWriter, r *http.Request, _ *principal) error {
	col, err := s.traces()
	if err != nil {
		return err
	}
	id := r.PathValue("id")
	if !adminapi.ValidTraceID(id) {
		return badRequest("id", id, "want a trace id of 32 lower-case hex digits")
	}
	t, ok := col.Trace(id)
	if !ok {
		return notFound("id", id, "no trace %s in the store (it may not have arrived yet, or been dropped: the store keeps %d spans for %s at most)",
			id, col.Stats().MaxSpans, col.Stats().MaxAge)
	}
	writeJSON(w, http.StatusOK, t)
	return nil
}

// listFindings answers GET /v1/findings?since=1h (or an RFC 3339 time)&trace=ID: the newest
// first.
func (s *Server) listFindings(w http.ResponseWriter, r *http.Request, _ *principal) error {
	col, err := s.traces()
	if err != nil {
		return err
	}
	q := r.URL.Query()
	var since time.Time
	if v := q.Get("since"); v != "" {
		if d, err := time.ParseDuration(v); err == nil && d > 0 {
			since = s.now().Add(-d)
		} else if t, err := time.Parse(time.RFC3339, v); err == nil {
			since = t
		} else {
			return badRequest("since", v, "want a duration such as 1h or an RFC 3339 time")
		}
	}
	id := q.Get("trace")
	if id != "" && !adminapi.ValidTraceID(id) {
		return badRequest("trace", id, "want a trace id of 32 lower-case hex digits")
	}
	list := adminapi.FindingList{Findings: col.Findings(since, id)}
	if list.Findings == nil {
		list.Findings = []adminapi.Finding{}
	}
	writeJSON(w, http.StatusOK, list)
	return nil
}

// maxGraphWindow bounds the window parameter of GET /v1/graph.
const maxGraphWindow = 24 * time.Hour

// getGraph answers GET /v1/graph?window=5m: the service graph of the collected traces, edge by
// edge and lane by lane.
func (s *Server) getGraph(w http.ResponseWriter, r *http.Request, _ *principal) error {
	col, err := s.traces()
	if err != nil {
		return err
	}
	window := 5 * time.Minute
	if v := r.URL.Query().Get("window"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 || d > maxGraphWindow {
			return badRequest("window", v, "want a duration from 1s to %s, such as 5m", maxGraphWindow)
		}
		window = d
	}
	writeJSON(w, http.StatusOK, col.Graph(window))
	return nil
}
