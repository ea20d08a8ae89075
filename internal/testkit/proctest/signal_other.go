//go:build !unix

package proctest

import "syscall"

// Pause and Resume need job control signals, which this system lacks: they
// fail.
const (
	sigStop = syscall.Signal(-1)
	sigCont = syscall.Signal(-1)
)
