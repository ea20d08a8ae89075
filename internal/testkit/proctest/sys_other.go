//go:build !linux

package proctest

import "os/exec"

func setPdeathsig(*exec.Cmd) {}
