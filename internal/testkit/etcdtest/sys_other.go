//go:build !linux

package etcdtest

import "testing"

func tmpfsDir(testing.TB) string { return "" }
