//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package upstream

import "net"

// idleCheck does not look at an idle upstream connection on this system:
// bytes that an instance sends on an idle connection after its answer
// (after the fast path gave the connection back, having found none past
// the answer, upPool.put) are read as the next request's answer.
type idleCheck struct{}

func (k *idleCheck) init(net.Conn) {}

func (k *idleCheck) spoiled() bool { return false }
