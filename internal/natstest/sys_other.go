//go:build !linux

package natstest

import "os/exec"

func setPdeathsig(*exec.Cmd) {}
