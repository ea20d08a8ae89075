//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package upstream

import (
	"net"
	"syscall"
)

// idleCheck looks, without waiting, at an idle upstream connection for
// what the instance sent on it since its last answer (upConn.spoiled): one
// recv with MSG_PEEK and MSG_DONTWAIT, through the connection's RawConn,
// which it keeps, as it keeps the function that it reads with (neither is
// made again for each look).
type idleCheck struct {
	raw  syscall.RawConn
	look func(fd uintptr) bool
	buf  [1]byte
	err  error
}

func (k *idleCheck) init(c net.Conn) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return
	}
	k.raw = raw
	k.look = func(fd uintptr) bool {
		_, _, k.err = syscall.Recvfrom(int(fd), k.buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		return true // never wait
	}
}

// spoiled reports whether the instance has sent a byte, closed the
// connection or reset it; false when nothing is there to read.
func (k *idleCheck) spoiled() bool {
	if k.raw == nil {
		return false
	}
	if err := k.raw.Read(k.look); err != nil {
		return true
	}
	if k.err == syscall.EAGAIN || k.err == syscall.EWOULDBLOCK || k.err == syscall.EINTR {
		return false
	}
	return true // a byte, the end (nil: none read), or an error
}
