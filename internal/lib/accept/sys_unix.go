//go:build unix

package accept

import (
	"net"
	"syscall"
)

// openFileLimit is the process's limit on open files (RLIMIT_NOFILE, the
// soft one, which the Go runtime raises to the hard one at start), 0 when
// unknown.
func openFileLimit() uint64 {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		return 0
	}
	return r.Cur
}

// drain reads, without waiting, what the peer of c has sent so far (up to
// 64 KiB), so that closing c ends it with a FIN after what was written to
// it, not with a reset, which can have the peer drop an answer it has not
// read yet.
func drain(c net.Conn) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return
	}
	var buf [4096]byte
	for range 16 {
		n := 0
		raw.Read(func(fd uintptr) bool {
			n, _ = syscall.Read(int(fd), buf[:])
			return true // never wait
		})
		if n < len(buf) {
			return
		}
	}
}
