package etcdtest

import (
	"os"
	"syscall"
	"testing"
)

// tmpfsDir returns a new directory on /dev/shm, removed at cleanup, when
// /dev/shm is a tmpfs with room for an etcd data directory (etcd
// preallocates 64MB WAL files), else "". On tmpfs, etcd's fsyncs cost
// nothing; the etcd binary has no --unsafe-no-fsync before 3.5.
func tmpfsDir(t testing.TB) string {
	const tmpfsMagic = 0x01021994
	var st syscall.Statfs_t
	if err := syscall.Statfs("/dev/shm", &st); err != nil || st.Type != tmpfsMagic || uint64(st.Bavail)*uint64(st.Bsize) < 512<<20 {
		return ""
	}
	dir, err := os.MkdirTemp("/dev/shm", "lanes-etcdtest-")
	if err != nil {
		return ""
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}
