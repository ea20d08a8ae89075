package lanesgrpc

import (
	"context"
	"fmt"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/lanesdev/lanes/internal/lib/guard"
	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

// DefaultExempt lists the method prefixes a guard always admits: the gRPC
// health service and server reflection, which infrastructure calls without a
// lane. WithExemptMethods adds to them.
var DefaultExempt = []string{
	"/grpc.health.v1.Health/",
	"/grpc.reflection.v1.ServerReflection/",
	"/grpc.reflection.v1alpha.ServerReflection/",
}

// A Guard is the provider-side check of an instance registered in a lane:
// it refuses the requests whose lane chain does not contain the instance's
// lane (routing.Engine.Admits), so that a caller that routes on its own, or
// a stale one, cannot send baseline or foreign-lane traffic to it. Callers
// that route with lanes never send such requests; the guard is defence in
// depth. It is the same guard as laneshttp's.
//
// A baseline instance admits every request. So does a guard that does not
// know its instance yet: Serve tells it (SetInstance) before the server
// accepts connections.
//
// A Guard is safe for concurrent use.
type Guard = guard.Guard

// NewGuard returns a guard that follows the policy of e, which must not be
// nil. Give it to NewServer (or ServerOptions) with WithGuard.
func NewGuard(e *routing.Engine) *Guard { return guard.New(e) }

// WithExemptMethods adds full-method prefixes that the guard admits whatever
// their lane, such as "/my.pkg.Admin/" or "/my.pkg.Orders/Ping", to
// DefaultExempt (NewServer, ServerOptions, the server interceptors).
func WithExemptMethods(prefixes ...string) ServerOption {
	return serverOption(func(c *config) { c.exempt = append(c.exempt, prefixes...) })
}

// refusal is the guard's answer to a call that it did not admit.
func refusal(ctx context.Context, serving string, inst *registry.Instance) error {
	what := "a baseline request"
	if l, ok := lane.Normalize(lane.FromContext(ctx)); ok && l != "" {
		what = fmt.Sprintf("a request in lane %q, whose chain does not reach it", l)
	}
	return status.Errorf(codes.FailedPrecondition,
		"lanes: instance %q of service %q serves lane %q and does not admit %s", inst.ID, inst.Service, serving, what)
}

// exempt reports whether fullMethod is one the guard always admits.
func (si *serverInterceptor) exempt(fullMethod string) bool {
	for _, lists := range [2][]string{DefaultExempt, si.exemptMethods} {
		for _, p := range lists {
			if strings.HasPrefix(fullMethod, p) {
				return true
			}
		}
	}
	return false
}
