//go:build !linux

package etcdtest

import (
	"os/exec"
	"testing"
)

func setPdeathsig(*exec.Cmd) {}

func tmpfsDir(testing.TB) string { return "" }
