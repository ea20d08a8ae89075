// Package gateway is the edge of lanes: the HTTP reverse proxy that `lanes up`
// puts in front of a fleet. It decides each incoming request's lane once, at
// the trust boundary, routes the request through the routing engine
// (routing.Engine) to an instance of the service its route names, and sends
// the lane on in the request's headers, so that every later hop keeps it.
//
// The gateway serves HTTP/1.1 and HTTP/2 without TLS (h2c, prior knowledge;
// [Gateway.Serve] enables both), or over TLS with HTTP/2 and HTTP/1.1 chosen
// by ALPN ([Gateway.ServeTLS], on net/http whatever Config.HTTP1 says), and
// passes gRPC through: a request with
// content-type application/grpc goes to the upstream over h2c, streams in both
// directions and brings its trailers back. An instance that answers the h2c
// connection with HTTP/1 (it speaks HTTP/1 only) fails the call with
// Unavailable and x-lanes-error upstream_http1, saying so; outlier detection
// ignores it (h2c.go).
//
// # Two HTTP/1.1 stacks
//
// [Config.HTTP1] chooses the stack that serves HTTP/1.1. One seam (the
// stack interface, stack.go) separates the stacks from the rules of this
// documentation, which a core that knows neither holds, once: the route
// and the lane (admit, assign), the trust rules and the forwarding and lane
// headers (forward), the routed call (routed, which makes its attempts
// through the stack's sender), the gateway's answers (laneHeaders,
// callFailed, fail) and the framing rules (framing.go: 503 while closing,
// Connection: close after a chunked request, no 1xx answer to an HTTP/1.0
// client, the client read timeout, idempotency). A stack owns its servers,
// its connections to instances, the state of a request and its body as it
// streams; it reads and writes a request through the core's small
// interfaces (fields.go). The gateway's tests run on both stacks.
//
//   - "fast" (the default): fasthttp's server parses the request, and the
//     attempts go to the instance over the gateway's own keep-alive pools
//     (one per instance address, on fasthttp's request writer and response
//     parser; the upstream package; one sweeper goroutine, from Serve to Close,
//     closes connections idle for Config.UpstreamIdleTimeout, 90 s by
//     default, and drops the pools of instances unused as long), which
//     read the answer straight into the response that fasthttp writes. A
//     lane request allocates nothing. 1xx answers (103 Early Hints) are
//     passed on as they come, without the
//     instance's x-lane and x-lane-served, and not to an HTTP/1.0 client
//     (RFC 9110, 15.2); an answer body
//     of unknown length, or larger than 1 MiB, streams, with its trailers
//     (chunked to an HTTP/1.1 client; to an HTTP/1.0 client, which has no
//     chunked coding, as it comes and ended by the end of the connection,
//     as net/http's server sends it; one that the instance
//     cuts short ends with a TCP reset instead, so that it does not look
//     whole). A
//     request body streams too, as net/http's server lends it: one of known length over
//     16 KiB, and every chunked one (with its trailers), is copied to the
//     instance as the client sends it, with its framing (Content-Length
//     kept; chunks re-framed); a smaller one of known length is read whole
//     before the attempt. While a body streams, the attempt reads the
//     answer as it writes, as net/http's transport does: an instance that
//     answers before it has read the body (a 401 from an auth check, a 413
//     to a body over its limit, a redirect) and then reads no more of it, or
//     closes, has its answer passed on at once; the rest of the body is not
//     sent, the instance's connection is not used again and the client's
//     closes after the answer, the rest of its body never read as a
//     request. That is for an answer of 300 and over: after an early 2xx
//     (a full-duplex handler) the body goes on to its end. 1xx answers go
//     on during the upload too. The net/http stack
//     closes the client's connection alike, after such an answer. Neither
//     path bounds a body's size. 100-continue is answered by the server. Upgrades (WebSocket), requests with a TE
//     header and request targets that are not an origin-form path are
//     handed to the net/http handler through fasthttpadaptor, on the same
//     connection; their bodies stream there too, unbounded (the adaptor
//     would read them whole: the fast stack lends the handler the stream
//     instead), and so does an answer over 1 MiB (the adaptor would hold
//     it whole: the fast stack flushes it). A request that fasthttp's server
//     refuses gets the gateway's error (x-lanes-error, below) with the
//     status net/http gives the same bytes, before any routing (net/http's
//     server answers a head it refuses with its own text, without
//     x-lanes-error).
//   - "std": net/http's server, httputil.ReverseProxy and net/http's
//     transport ([Gateway.ServeHTTP], which a server of your own may also
//     serve).
//
// On both, a connection that opens with the HTTP/2 preface is served by
// net/http (h2c, gRPC), on the same port, and a request head (the request
// line and the header fields) of up to 16 KiB is taken: the fast stack
// answers 431 to a longer one, net/http to one longer than 16 KiB by more
// than the up to 4 KiB it had read ahead. An instance's answer head (each
// 1xx head on its own) is bounded alike, at 16 KiB exactly (maxResponseHead):
// a longer one fails the attempt as the instance's (502 upstream, "the
// instance's response head is over 16384 bytes", logged, and a failure for
// outlier detection), as nginx refuses an upstream head over its
// proxy_buffer_size.
//
// # Routes
//
// [Config.Routes] map requests to services. A route matches on an exact host
// (compared without the port, case-insensitively), a path prefix, or both.
// The most specific route that matches wins, whatever the order of the
// routes: a route on the request's host before one without a host, then the
// longest prefix, as net/http.ServeMux and nginx choose ("/=web" and
// "/api=orders" send "/api/x" to orders in either order). A request that
// matches none gets 404. A path prefix matches whole path segments: "/orders" and "/orders/"
// both match "/orders" and "/orders/42", never "/ordersx". With StripPrefix
// the prefix is removed before the request goes upstream ("/orders/42" ->
// "/42", "/orders" -> "/"). A gateway without routes answers every request
// with 404.
//
// A prefix must be a plain, clean path (no percent-escapes, no dot or empty
// segments), and a route with the same host and prefix as an earlier one
// ("/a" then "/a/") is refused, naming both, since it could never match;
// no other route can be shadowed.
//
// # Configuration
//
// [New] checks its [Config] and refuses a bad one; [Config.Validate] makes
// the same checks without an engine and without starting or registering
// anything, so that a program (`lanes up`) can refuse a bad configuration
// before it starts any part. Errors are [*ConfigError]: the field as a
// configuration file spells it (routes[1].prefix, lane_cookie, disable[0]),
// and what is wrong with the value; for a route that can never match, also
// the earlier route that shadows it. `lanes up` sets every field from its
// settings (docs/operations.md).
//
// # Lane hosts
//
// With [Config.Domain] set (say "lanes.localhost"), a host of the form
// <label>.<rest> where <rest> is the domain or ends with "."+domain is a
// lane host: its first label names the lane. Routes are then matched against
// the host without that label: alice.lanes.localhost matches as
// lanes.localhost (so only path routes and routes on lanes.localhost apply),
// and alice.orders.lanes.localhost matches a host route on
// orders.lanes.localhost. A host that is itself the host of a route is never a
// lane host, so a route on orders.lanes.localhost keeps working for baseline
// traffic.
//
// # Lane assignment
//
// The lane of a request is the first of these sources that gives one; the
// ones after it are not looked at. A source that is present but empty (an
// empty header or cookie) counts as absent. Each source has a name
// ([Source]), used by [Config.Disable] and by the metrics.
//
//  1. Headers (lane.Propagator.Extract): the x-lane header ("header"), then
//     the "lane" member of the W3C baggage header ("baggage"), then the
//     alias headers of [Config.Aliases] in order ("alias").
//  2. The "lane" cookie ([Config.LaneCookie]; "cookie").
//  3. The lane host (above; "host").
//  4. The client address: first the static claims of the policy
//     (lanes.<lane>.clients, "policy-clients"; the most specific prefix
//     wins, and a lane past its expires time claims nothing), then the
//     dynamic claims of [Config.Claims] (registered by `lanes dev`;
//     "claims").
//  5. None of the above: the request is a baseline request, and the routing
//     engine may split it to a canary lane by the policy's canary rules. The
//     split is sticky by request key: the [Config.KeyHeader] header
//     ("x-lanes-key"), or else the [Config.KeyCookie] cookie ("lanes-key"),
//     or else the baggage member "lanes-key"; a request without one gets a
//     new random key. The key (normalised by lane.NormalizeKey) travels on
//     with the baseline request as the baggage member "lanes-key", so that
//     every hop splits it as the gateway did.
//
// Sources 1 to 3 (header, baggage, alias, cookie, host) are
// client-controlled: what the client sends decides them. The policy's
// gateway.lane_choice governs them all alike: "all" (the default) lets every
// client choose its lane through them, "none" no client, and "allowlist"
// the clients whose address is in gateway.allow. For any other client none
// of them is read: a lane header, cookie or host then selects nothing, an
// invalid value in one is no error, and the lane headers are removed before
// the request goes upstream. The client-address claims of source 4 are set
// by operators, not clients, and keep their own rule: they are only as good
// as [Config.TrustedProxies].
//
// Each source can also be turned off on its own for every client with
// [Config.Disable]. Canary splits are the policy's to turn off.
//
// A value that is not a valid lane name, from any source that is read, is
// refused with 400 Bad Request; the body names the source, the value and the
// rule of the lane-name grammar that it breaks (lane.NameError.Rule:
// "empty", "too-long", "characters" or "starts-or-ends"), and the
// x-lanes-error response header says "invalid_lane".
//
// # Trust
//
// The incoming request is the trust boundary. The client address is the
// direct peer, unless the peer is in [Config.TrustedProxies]: then the
// gateway walks X-Forwarded-For from right to left, skipping trusted
// addresses, and takes the first untrusted one (if all are trusted, the
// left-most; an entry that is not an IP address stops the walk at the last
// good one). X-Forwarded-For from any other peer is ignored, and dropped on
// the way upstream. The client address decides lane_choice: allowlist and the
// client-address claims.
//
// Upstream, the request carries what the gateway decided and nothing the
// client sent about lanes: every incoming x-lane header, the lane member of
// baggage and the alias headers are removed, and so are the spellings of
// x-lane and of the aliases that differ only by '_' for '-' (x_lane), which
// the gateway never reads but a proxy or framework upstream may merge with
// the real header (CGI's HTTP_X_LANE; nginx with underscores_in_headers on).
// For a lane request, x-lane and the baggage member lane=<lane> are set (the
// other baggage members are kept, in order).
//
// The forwarding headers upstream are:
//
//   - X-Forwarded-For: the chain a trusted proxy sent, if any, plus the peer
//     (from any other peer only the peer), as
//     httputil.ProxyRequest.SetXForwarded does;
//   - X-Forwarded-Host and X-Forwarded-Proto: a trusted proxy's, else the
//     request's host and "http";
//   - X-Real-IP: the client address the gateway decided (above), replacing
//     any the client sent, in any spelling;
//   - Forwarded is dropped.
//
// The Host header is the instance's address unless [Config.PreserveHost] is
// set.
//
// # Responses
//
// Every response carries:
//
//   - x-lane: the lane the request was given (the canary lane for a request
//     split to one); absent for a baseline request;
//   - x-lane-served: the lane of the instance that served this hop, or
//     "baseline"; on a 502, the lane of the instance that failed; absent when
//     no instance was picked (400, 404, 503);
//   - x-lane-fallback, on a lane request served by another lane than its
//     own, says why (the lane.fallback_reason of the gateway's span):
//     unknown_lane (the lane exists nowhere: no instance of any service in
//     the registry is in it and the policy does not name it, as a typo),
//     no_instance_in_lane (a known lane without an instance of this
//     service), ejected, expired or failover.
//
// An x-lane, x-lane-served or x-lane-fallback header of the upstream response is replaced by
// the gateway's own (the client learns about the gateway's hop only).
//
// Errors of the gateway itself carry x-lanes-error with a code:
//
//	400 invalid_lane      a lane source held an invalid lane name
//	400 bad_request_body  the request body broke its framing (a bad chunk)
//	                      or ended early; the connection is closed, the
//	                      instance not blamed
//	400 bad_request       the fast stack refused the request head or target
//	431 header_too_large  the fast stack refused a head over 16 KiB
//	408 request_timeout   the fast stack timed out reading the request
//	404 no_route          no route matches the host and path
//	503 no_instance       the routing engine found no instance (routing.Error)
//	503 lane_unavailable  a strict lane chain has no instance (routing.Error)
//	502 upstream          the instance could not be reached or failed mid-call
//	502 upstream_http1    a gRPC call's instance speaks HTTP/1 only (gRPC
//	                      Unavailable); the instance not blamed
//	503 not_ready         the engine had not read the policy or the service's
//	                      instances within Config.ReadyTimeout (first requests only)
//	503 closed            the gateway is closing
//
// The body names the service and the lane where they are known. A gRPC request
// gets the same codes as a gRPC status in a trailers-only response
// (InvalidArgument, Unimplemented, Unavailable) with the same x-lanes-error
// header, so that gRPC clients see a proper status.
//
// # Outlier detection and retries
//
// The gateway routes with the same routed-call step as laneshttp.Transport
// (routedcall.Call.Run: pick, outcome, report, retry, client span;
// Gateway.routed calls it in the core, with the stack's sender):
// its handler decides the route and the lane, and the routed call picks the
// instance and sends the attempts (on the net/http stack, the proxy's
// Rewrite names the service and its Transport makes the call). Every proxied call's outcome is reported
// to the engine: a connection error, an HTTP 5xx or, for gRPC, status
// Unavailable counts as a failure; a 5xx that carries x-lanes-error does not
// (it is a routing failure further downstream, answered by a healthy
// instance). When an instance refuses the connection, nothing was sent: the
// instance is ejected at once and the same request, whatever its method and
// body (gRPC calls included), moves on to the next eligible instance or along
// the lane's fallback chain. When the call fails after it was sent (reset;
// an instance that takes none of a write of the request, the head or a
// part of its body, within [Config.UpstreamWriteTimeout], 10s by default:
// hung, paused with SIGSTOP, or not reading an upload; or no response
// headers within [Config.ResponseHeaderTimeout], 10s by default, counted
// from the end of the request's write; each up to a tenth of it, at most a
// second, sooner: a connection keeps a deadline that close to the one
// asked) and the request has no body and is idempotent (GET, HEAD,
// OPTIONS, TRACE, PUT, DELETE, or any method with an Idempotency-Key or
// X-Idempotency-Key header, whatever its value: routedcall.IdempotentRequest),
// the gateway picks another instance for the same request lane and tries
// again, [Config.Retries] times (once by default): another of the lane, or, when every
// eligible instance of the lane has failed the request (its only one, say),
// the next lane of its chain, up to the baseline (never past a strict lane,
// never from the baseline to a lane); otherwise, or when the retry fails
// too, the client gets 502. A request body streams from the client (on the fast
// stack, a small one of known length is read whole first), each read of it
// within [Config.ClientReadTimeout], 2m by default (a client that sends
// nothing of its body for that long gets 400 bad_request_body): a request with a
// body moves on from a refused connection only while no attempt has read
// any of its body, so that a body part of which went to one instance is
// never sent, truncated, to another (replayable). A request whose client went away is not reported,
// unless the instance had already taken longer than the response-header
// timeout: that counts as a failure.
//
// Once an answer's head is in, each read of its body from the instance is
// bounded by [Config.UpstreamReadTimeout], 60s by default, as nginx's
// proxy_read_timeout (the time between two reads, not the whole answer):
// an instance that stalls in the middle of a body has the answer cut. Its
// head has gone to the client, so it is not retried: the client's
// connection is closed before the end of the body, the instance is reported
// failing (routedcall.BodyStalled, through stallNote) and the
// gateway logs it. The fast stack bounds each read of its upstream
// connections (the upstream package); the net/http stack, whose transport reads its
// connections on goroutines of its own, closes the transport's body when a
// read of it has waited that long (stallBody). A small body of known
// length, which the fast stack reads whole before the head goes out, fails
// the attempt there instead (502, or a retry). An answer that the instance
// cuts otherwise (it resets or closes the connection in the middle of the
// body) is cut alike. So is one to a request that the fast stack hands to
// the net/http handler, whose ReverseProxy aborts it (http.ErrAbortHandler)
// as under net/http's server (adaptedServer): fasthttpadaptor then closes
// the connection without the answer it held (up to 1 MiB), or without the
// last chunk of one it had flushed, never with a short body framed as
// whole.
//
// Each write of an answer to a client, on the connections that Serve
// accepts, is bounded by [Config.ClientWriteTimeout], 60s by default, as
// nginx's send_timeout: a client that takes none of a write for that long
// has its connection closed, which ends the call. Like the upstream write
// timeout it goes through netbound, on the fast stack's connections
// (prefixConn) and the net/http stack's (netbound.Conn); neither server's
// WriteTimeout is set, since both are a deadline for the whole answer.
//
// # Connections
//
// Serve accepts through internal/lib/accept (Gateway.accepting): an accept error
// of a process out of file descriptors (EMFILE, ENFILE) or buffers, or a
// timeout, is waited out (5ms doubling to 1s) and Serve goes on. It holds
// at most [Config.MaxConns] client connections open (by default a quarter
// of the process's open-file limit, at most 10,000); one over it is
// answered 503 with x-lanes-error: overloaded and Connection: close once
// its first bytes are in, and closed, and counted in
// lanes_gateway_errors_total{code="overloaded"}. A request's head must be
// in within [Config.ClientHeaderTimeout], 10s by default
// (the fast stack counts a connection's first head from its open, the time
// it takes to tell HTTP/1.1 from the HTTP/2 preface included, and answers
// 408 request_timeout; net/http's server closes the connection), so that a
// connection that sends part of a head and stops holds its place no longer.
//
// # Request smuggling
//
// The upstream request is written anew, with one framing; a request whose
// body breaks its framing gets 400 bad_request_body,
// and every chunked HTTP/1.1 request closes its connection after the answer
// (RFC 9112 6.1 asks it of a request that carried Content-Length too, which
// net/http does not tell the handler; Gateway.closeAfter); the fast stack refuses a header name
// with a space inside it and Transfer-Encoding: identity, which fasthttp
// takes and net/http refuses.
// docs/security.md has the table of cases (internal/testkit/smuggletest),
// run on both stacks, nginx's answers beside the gateway's, and the property
// that FuzzSmuggling checks of any bytes on both stacks.
//
// An instance's answer is parsed and written anew too, in the gateway's
// HTTP/1.1: an upstream connection that holds a byte past the answer, or
// on which the instance sent anything while it was idle (the fast stack
// looks before it reuses one, in the upstream package), is closed, never reused, so that
// no byte of one answer is read as the answer of a later request; and a
// 101 to a request that asked for no upgrade is 502 upstream, its
// connection closed. FuzzAnswer holds it under any bytes, on both stacks.
//
// # Metrics
//
// With [Config.Registerer] set, the gateway counts requests by assignment
// source (lanes_gateway_requests_total{source}: header, baggage, alias,
// cookie, host, policy-clients, claims, canary, baseline), proxied requests
// by the lane that served them (lanes_gateway_served_total{lane}, "baseline"
// for the baseline) and its own errors (lanes_gateway_errors_total{code}).
package gateway
