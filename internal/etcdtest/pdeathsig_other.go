//go:build !linux

package etcdtest

import "os/exec"

func setPdeathsig(*exec.Cmd) {}
