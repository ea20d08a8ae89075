//go:build unix

package proctest

import "syscall"

// The signals of Pause and Resume.
const (
	sigStop = syscall.SIGSTOP
	sigCont = syscall.SIGCONT
)
