package lanesnats_test

import (
	"os/exec"
	"syscall"
)

// setPdeathsig makes the kernel kill a child consumer if the test binary
// dies without stopping it.
func setPdeathsig(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
