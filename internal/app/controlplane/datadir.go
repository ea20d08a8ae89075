package controlplane

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// LockFile is the file, in the data directory, that a running control
// plane holds locked; it holds its process id.
const LockFile = "lanes.lock"

// dataDirComponent provides the data directory, created (mode 0700) and
// locked for this process when anything keeps data in it: the embedded etcd,
// the embedded NATS server or the admin token file. A second control plane
// on the same directory fails at once, naming the process that holds it,
// instead of waiting for ever on etcd's own lock.
type dataDirComponent struct {
	lock *dirLock
}

func (*dataDirComponent) Name() string    { return "datadir" }
func (*dataDirComponent) Needs() []Dep    { return nil }
func (*dataDirComponent) Provides() []Dep { return []Dep{DataDirKey} }

func (*dataDirComponent) Validate(cfg *Config) error {
	if cfg.DataDir == "" {
		return cfg.fail("data_dir", "", "the data directory must not be empty")
	}
	return nil
}

// usesDataDir reports whether anything keeps data in the data directory.
func (c *Config) usesDataDir() bool {
	return len(c.Etcd.Endpoints) == 0 || (c.Nats.URL == "" && c.Nats.Addr != NatsOff) || c.AdminToken == "" || c.needsTelemetryFile()
}

func (c *dataDirComponent) Provision(_ context.Context, rt *Runtime) error {
	dir := rt.Config.DataDir
	if rt.Config.usesDataDir() {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return fmt.Errorf("data directory: %w", err)
		}
		l, err := lockDir(dir)
		if err != nil {
			return err
		}
		c.lock = l
	}
	Provide(rt, DataDirKey, dir)
	return nil
}

func (c *dataDirComponent) Cleanup() error {
	if c.lock != nil {
		return c.lock.release()
	}
	return nil
}

// ErrDataDirInUse is the error of a data directory that another process
// holds.
var ErrDataDirInUse = errors.New("the data directory is in use")

// InUseError says which process holds a data directory.
type InUseError struct {
	Dir string
	PID int // 0 when the lock file does not say
}

func (e *InUseError) Error() string {
	holder := "another process"
	if e.PID > 0 {
		holder = fmt.Sprintf("process %d", e.PID)
	}
	return fmt.Sprintf("data directory %s is in use by %s (it holds %s): stop it, or give this one another --data-dir",
		e.Dir, holder, filepath.Join(e.Dir, LockFile))
}

func (e *InUseError) Unwrap() error { return ErrDataDirInUse }

// lockDir locks dir for this process: it takes an exclusive lock on
// <dir>/lanes.lock, without waiting, and writes the process id there.
func lockDir(dir string) (*dirLock, error) {
	path := filepath.Join(dir, LockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("data directory lock: %w", err)
	}
	held, err := tryLock(f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("data directory lock %s: %w", path, err)
	}
	if held {
		data, _ := os.ReadFile(path)
		f.Close()
		pid, _ := strconv.Atoi(strings.TrimSpace(string(data)))
		return nil, &InUseError{Dir: dir, PID: pid}
	}
	if err = f.Truncate(0); err == nil {
		_, err = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("data directory lock %s: %w", path, err)
	}
	return &dirLock{f: f}, nil
}

// dirLock is a held lock on a data directory. The file stays (removing it
// would let two processes lock two different files of the same name).
type dirLock struct {
	f *os.File
}

// release empties the lock file and unlocks it.
func (l *dirLock) release() error {
	l.f.Truncate(0)
	return l.f.Close() // closing the last descriptor releases the lock
}
