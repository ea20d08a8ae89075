//go:build unix && !linux

package lanesnats_test

import "os/exec"

func setPdeathsig(*exec.Cmd) {}
