// Package roles types the options of the transports by the role they
// configure, as grpc-go has DialOption and ServerOption: an option of one
// role given to the other is a type error, and an option that means the same
// for both is of both roles.
//
// A transport declares, for its config type C,
//
//	type ClientOption interface{ ApplyClient(*config) }
//	type ServerOption interface{ ApplyServer(*config) }
//
// and makes its options with Client, Server and Both. Code outside the
// transport cannot implement those interfaces: it cannot name *config.
package roles

// Client is an option of the client role.
type Client[C any] func(*C)

// ApplyClient applies the option.
func (f Client[C]) ApplyClient(c *C) { f(c) }

// Server is an option of the server role.
type Server[C any] func(*C)

// ApplyServer applies the option.
func (f Server[C]) ApplyServer(c *C) { f(c) }

// Both is an option that means the same in both roles.
type Both[C any] func(*C)

// ApplyClient applies the option.
func (f Both[C]) ApplyClient(c *C) { f(c) }

// ApplyServer applies the option.
func (f Both[C]) ApplyServer(c *C) { f(c) }

// ClientConfig applies the client options opts, nil ones skipped, to c and
// returns it.
func ClientConfig[C any, O interface{ ApplyClient(*C) }](c *C, opts []O) *C {
	for _, o := range opts {
		if any(o) != nil {
			o.ApplyClient(c)
		}
	}
	return c
}

// ServerConfig applies the server options opts, nil ones skipped, to c and
// returns it.
func ServerConfig[C any, O interface{ ApplyServer(*C) }](c *C, opts []O) *C {
	for _, o := range opts {
		if any(o) != nil {
			o.ApplyServer(c)
		}
	}
	return c
}
