package gateway

import (
	"net/http"

	"github.com/lanesdev/lanes/internal/lib/routedcall"
)

// The framing rules of the gateway's answers to HTTP/1.x clients, each
// written once, here: each stack reads a request's head into a framing and
// applies the rules to the answers its server writes (stdStack through
// answerWriter, fastStack in handle), and both call the same functions.
// The client read timeout (Config.ClientReadTimeout), which bounds each read
// of a request's body, is applied by keptBody.Read, which both stacks lend
// the body through.

// framing is what the framing rules read of a request's head.
type framing struct {
	// http10 is set for an HTTP/1.0 client.
	http10 bool
	// chunked is set for an HTTP/1.x request whose body is chunked.
	chunked bool
}

// framingOf is the framing of a request of HTTP/major.minor whose body is
// chunked or not.
func framingOf(major, minor int, chunked bool) framing {
	return framing{http10: major == 1 && minor == 0, chunked: major == 1 && chunked}
}

// interimStatus reports whether an answer of status code is one that goes
// on to the client before the final one (103 Early Hints, say): a 1xx, but
// 101, which is final.
func interimStatus(code int) bool {
	return code >= 100 && code < 200 && code != http.StatusSwitchingProtocols
}

// passInterim reports whether the instance's interim answers go on to the
// client: not to an HTTP/1.0 client, which knows none (RFC 9110, 15.2).
// They go without the instance's lane headers (interimHeaders).
func (f framing) passInterim() bool { return !f.http10 }

// closeAfter reports whether the client's connection closes after the
// answer (Connection: close): after every chunked request, and while the
// gateway closes. Both servers read a chunked request that also carries a
// Content-Length as chunked, without telling the handler of the
// Content-Length; RFC 9112 6.1 then requires closing the connection after
// the answer, so that a peer in front that framed it by the Content-Length
// cannot smuggle a request in after it.
func (g *Gateway) closeAfter(f framing) bool {
	return f.chunked || g.closing.Load()
}

// closingAnswer answers a request that comes while the gateway closes: 503
// closed, and the connection closes after it.
func (g *Gateway) closingAnswer(out responder, grpc bool) {
	out.header().setVals("Connection", connClose)
	g.fail(out, grpc, http.StatusServiceUnavailable, codeClosed, "lanes: the gateway is closing")
}

// idempotent reports whether a request of method, whose header fields h
// holds, may be sent twice (routedcall.IdempotentRequest).
func idempotent(method string, h interface{ Values(key string) []string }) bool {
	return routedcall.IdempotentRequest(method, h)
}
