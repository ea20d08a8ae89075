package gateway

import (
	"crypto/tls"
	"net"
)

// ServeTLS is Serve over TLS: it accepts connections on ln and serves the
// gateway on them with the certificates of tc, HTTP/2 and HTTP/1.1 as the
// client chooses by ALPN. Whatever Config.HTTP1 says, TLS connections are
// served on the net/http stack (the std path): its TLS server negotiates
// HTTP/2 and knows the connection state, which the fast path's connections
// would hide. Requests that arrive over TLS go upstream with
// X-Forwarded-Proto: https. It returns http.ErrServerClosed after Close or
// Shutdown.
func (g *Gateway) ServeTLS(ln net.Listener, tc *tls.Config) error {
	return g.std.serveTLS(g.accepting(ln), tc)
}
