package routedcall

import (
	"errors"
	"net"
)

// Unsent reports whether err, returned by a client of the standard library
// (an http.RoundTripper, a net.Dialer), came before any byte of the request
// was sent: the dial failed (the connection was refused, or timed out). It
// is what Attempt.Unsent says.
func Unsent(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe) && oe.Op == "dial"
}
