// Package vet holds the analyzers of `lanes vet`: static checks, built on
// golang.org/x/tools/go/analysis, for the commonest bug of every lane system, a hop that loses the
// lane.
//
//   - lanectx: context.Background() or context.TODO() used where a request's context is in scope;
//   - lanego: a goroutine that uses the request's context and may outlive the request, without
//     lane.Detach;
//   - lanehttp: an outgoing HTTP request built without a context (http.Get, http.NewRequest, ...)
//     where one is in scope;
//   - lanebypass: a gRPC target that is not resolved through lanes, an http.Client whose transport
//     is not lanes', a request sent through http.DefaultClient, a NATS publish that does not stamp
//     the lane.
//
// A finding is silenced by a comment on its line, or alone on the line above it:
//
//	//lanes:ignore the registry itself must not be routed by lanes
//
// The reason is required; an ignore without one silences nothing.
//
// The analyzers run in three drivers: `lanes vet` (Run, in this package), `go vet
// -vettool=$(which lanes-vet)` and the lanes-vet multichecker (cmd/lanes-vet). See docs/vet.md.
package vet
