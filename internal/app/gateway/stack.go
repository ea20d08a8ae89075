package gateway

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
)

// The seam between the gateway's rules and the HTTP stacks that serve them.
//
// A stack owns a server (its listeners and client connections), the client
// that sends the attempts to instances (its connection pools), and the
// state of a request while it is served (pooled, with the request's body as
// it streams). The shared core (admit and assign: the route and the lane;
// forward: the trust and forwarding-header rules; routed: the routed call;
// laneHeaders, callFailed and fail: the answers) reads and writes a request
// through the interfaces of fields.go, makes the attempts through a sender,
// and knows no stack. Two stacks implement it:
//
//   - stdStack (stack_std.go): net/http's server, httputil.ReverseProxy and
//     net/http's transports. It serves HTTP/2 (h2c, gRPC, TLS) whichever
//     stack serves HTTP/1.1, and is the gateway's http.Handler.
//   - fastStack (stack_fast.go, upstream.go): fasthttp's server, and the
//     gateway's own keep-alive pools to instances. It hands the connections
//     that open with the HTTP/2 preface, and the requests it does not serve
//     itself (upgrades, TE, targets that are not a path), to stdStack.
//
// The gateway's lifecycle (Serve, Shutdown, Close) goes through the stack
// interface; the requests in flight are counted by the core (enter, exit).
type stack interface {
	// serve serves HTTP/1.1, and HTTP/2 with prior knowledge (h2c), on ln,
	// which accepts through the gateway's accept loop, until close or
	// shutdown; it returns http.ErrServerClosed then.
	serve(ln net.Listener) error
	// shutdown stops accepting and lets the open connections end once
	// their requests are answered, waiting for ctx at most (Shutdown).
	shutdown(ctx context.Context) error
	// close closes the listeners and the client connections and cuts the
	// attempts in flight (Close).
	close() error
	// release, once no request is in flight, waits for the goroutines that
	// the stack started (the connections that end once their answers are
	// written, after shutdown), or for ctx: then it closes what is left
	// and waits for that; and it closes its connections to instances.
	release(ctx context.Context)
}

// serverSet is the servers of a stack that Serve started, for Shutdown and
// Close.
type serverSet[S comparable] struct {
	mu sync.Mutex
	m  map[S]struct{}
}

// add records srv, a server of ln, unless the gateway is closing: then it
// closes ln and reports false, so that a Serve that comes after Close or
// Shutdown serves nothing.
func (s *serverSet[S]) add(closing *atomic.Bool, ln net.Listener, srv S) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if closing.Load() {
		ln.Close()
		return false
	}
	if s.m == nil {
		s.m = map[S]struct{}{}
	}
	s.m[srv] = struct{}{}
	return true
}

func (s *serverSet[S]) remove(srv S) {
	s.mu.Lock()
	delete(s.m, srv)
	s.mu.Unlock()
}

// all returns the servers now running.
func (s *serverSet[S]) all() []S {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]S, 0, len(s.m))
	for srv := range s.m {
		out = append(out, srv)
	}
	return out
}
