//go:build !linux

package proctest

// Listens reports true: without /proc, whoever answers on addr is taken
// to be pid.
func Listens(pid int, addr string) (bool, error) { return true, nil }
