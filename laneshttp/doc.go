// Package laneshttp is the HTTP transport of lanes: a client side that routes
// each request by its lane, and a server side that reads the lane of incoming
// requests and guards lane instances.
//
// # Client
//
// [Transport] is an [http.RoundTripper]. For a request to http://orders/..., the
// URL host without its port ("orders") is the service name. The transport
// asks the routing engine for an instance of orders in the lane of the
// request's context ([lane.FromContext]), sends the request to the instance's
// address, writes the lane that must travel downstream ("x-lane" and the "lane"
// member of W3C baggage; none for a baseline request, whose stale lane headers
// are removed), and reports the outcome to outlier detection. [NewClient]
// returns an [http.Client] with such a transport:
//
//	client := laneshttp.NewClient(engine)
//	req, _ := http.NewRequestWithContext(ctx, "GET", "http://orders/hello", nil)
//	res, err := client.Do(req) // served in the lane of ctx
//
// Hosts that are not lanes services (by default, any host with a dot, an IP
// address, "localhost") go to the base transport untouched. When no instance
// may serve the request, RoundTrip returns an error that wraps the
// [*routing.Error]; [WriteError] turns it into an HTTP 503 for proxies.
//
// Idempotent requests that fail with a connection error are retried once on
// another instance, within the caller's deadline: another of the lane, or,
// when every eligible instance of the lane has failed the request, one
// further along the lane chain (docs/http.md, Retries).
//
// # Server
//
// [Handler] wraps an [http.Handler]: it puts the lane of each incoming request
// in the request's context, so that the calls the handler makes with that
// context stay in the lane. With a guard ([WithGuard]), a lane instance also
// refuses, with 421 Misdirected Request, the requests whose lane chain does
// not include its lane; health and metrics paths are exempt.
//
// [Serve] runs an [http.Server] as an instance of a service: it places the
// instance from options and LANES_* variables ([registry.ApplyEnv]), wraps the
// handler, registers the instance once serving, and on shutdown deregisters it
// before shutting the server down.
//
// docs/http.md is the guide: joining lanes in five minutes, outcome
// classification, retries and the guard.
package laneshttp
