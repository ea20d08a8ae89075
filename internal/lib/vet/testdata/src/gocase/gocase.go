package gocase

import (
	"context"
	"net/http"
	"sync"

	"github.com/lanesdev/lanes/lane"
	"google.golang.org/grpc"
)

func work(ctx context.Context) {}

func handle(w http.ResponseWriter, r *http.Request) {
	go work(r.Context()) // want `goroutine uses the request's context r and may outlive the request`
}

func handleCtx(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	go func() { // want `goroutine uses the request's context ctx`
		work(ctx)
	}()
}

type Server struct{}
type Req struct{}
type Resp struct{}

// A gRPC unary method.
func (s *Server) Order(ctx context.Context, req *Req) (*Resp, error) {
	go work(ctx) // want `goroutine uses the request's context ctx`
	return &Resp{}, nil
}

// A context derived from the request's is the request's too.
func (s *Server) Derived(ctx context.Context, req *Req) (*Resp, error) {
	sub, cancel := context.WithCancel(ctx)
	_ = cancel
	go work(sub) // want `goroutine uses the request's context sub`
	return &Resp{}, nil
}

// A gRPC server stream handler.
func (s *Server) Watch(req *Req, stream grpc.ServerStream) error {
	go work(stream.Context()) // want `goroutine uses the request's context stream`
	return nil
}

// Detached: not reported.
func detached(w http.ResponseWriter, r *http.Request) {
	go work(lane.Detach(r.Context()))
	ctx := lane.Detach(r.Context())
	go func() { work(ctx) }()
	bg := context.WithoutCancel(r.Context())
	go work(bg)
}

// Waited for before the handler returns: not reported.
func joined(w http.ResponseWriter, r *http.Request) {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		work(r.Context())
	}()
	wg.Wait()
}

func received(w http.ResponseWriter, r *http.Request) {
	done := make(chan struct{})
	go func() { work(r.Context()); close(done) }()
	<-done
}

// A goroutine that does not use the request: not reported.
func unrelated(w http.ResponseWriter, r *http.Request) {
	go work(context.Background())
}

// Not a handler: lifecycle code starts goroutines with its own context.
func (s *Server) Start(ctx context.Context) error {
	go work(ctx)
	return nil
}
