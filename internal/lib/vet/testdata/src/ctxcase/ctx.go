package ctxcase

import (
	"context"
	"net/http"

	"github.com/lanesdev/lanes/lane"
)

func call(ctx context.Context) error { return nil }

func handler(ctx context.Context) error {
	return call(context.Background()) // want `context.Background\(\) drops the lane of the request's context ctx`
}

func todo(ctx context.Context) {
	c := context.TODO() // want `context.TODO\(\) drops the lane of the request's context ctx`
	_ = call(c)
}

func httpHandler(w http.ResponseWriter, r *http.Request) {
	_ = call(context.Background()) // want `drops the lane of the request's context r.Context\(\)`
}

func closure(ctx context.Context) {
	f := func() {
		_ = call(context.Background()) // want `request's context ctx`
	}
	f()
}

func goroutine(ctx context.Context) {
	go call(context.Background()) // want `request's context ctx`
}

// Copying the lane onto a new context by hand is what lane.Detach does: not reported.
func detachedByHand(ctx context.Context) {
	go call(lane.WithLane(context.Background(), lane.FromContext(ctx)))
	go call(lane.Detach(ctx))
}

// No request context in scope: start-up code is not reported.
func main() {
	_ = call(context.Background())
}

func init() {
	_ = call(context.TODO())
}

func startup() error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	return call(ctx)
}

// A context parameter named _ is not in scope.
func blank(_ context.Context) error {
	return call(context.Background())
}

type Server struct{ cancel context.CancelFunc }

// A lifetime of its own, outside a handler: not reported.
func (s *Server) Start(ctx context.Context) error {
	run, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	go call(run)
	return call(ctx)
}

type Req struct{}
type Resp struct{}

// In a handler, a fresh root with a timeout is how a downstream call loses its lane.
func (s *Server) Order(ctx context.Context, req *Req) (*Resp, error) {
	tctx, cancel := context.WithTimeout(context.Background(), 0) // want `context.Background\(\) drops the lane of the request's context ctx`
	defer cancel()
	return nil, call(tctx)
}

func (s *Server) Page(w http.ResponseWriter, r *http.Request) {
	tctx, cancel := context.WithTimeout(context.Background(), 0) // want `request's context r.Context\(\)`
	defer cancel()
	_ = call(tctx)
}
