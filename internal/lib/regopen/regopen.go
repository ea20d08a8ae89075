// Package regopen is the table of registry backends that a blank import
// links in, by the scheme of LANES_REGISTRY, as grpc-go's resolver.Register
// is: package kubestore registers "k8s" in its init, so that lanesenv opens
// k8s:// without linking client-go into every service that does not ask
// for it.
package regopen

import (
	"context"
	"log/slog"
	"maps"
	"strings"
	"sync"

	"github.com/lanesdev/lanes/policy"
	"github.com/lanesdev/lanes/registry"
)

// Opened is what an Opener returns: the registry, the policy store the
// engine follows, and how to close both.
type Opened struct {
	Registry registry.Registry
	Policy   policy.Store
	Close    func() error
	// Via names the backend in lanesenv's "connected" line.
	Via string
}

// Opener opens the registry of a LANES_REGISTRY value (raw) of its
// scheme; getenv reads the process's variables. It returns an error that
// names what is wrong in raw, or why the backend could not be reached.
type Opener func(ctx context.Context, raw string, getenv func(string) string, log *slog.Logger) (Opened, error)

// Backend is a scheme's registration.
type Backend struct {
	// Check validates raw without connecting (lanesenv.Parse calls it).
	Check func(raw string) error
	Open  Opener
	// InCluster reports whether the process runs in a cluster whose
	// registry this backend follows when LANES_REGISTRY is not set, and
	// the value to use then.
	InCluster func(getenv func(string) string) (raw string, ok bool)
}

var (
	mu       sync.RWMutex
	backends = map[string]Backend{}
)

// Register links the backend of scheme in (lower case, without "://").
// Call it from an init function; a second call for a scheme replaces the
// first.
func Register(scheme string, b Backend) {
	mu.Lock()
	defer mu.Unlock()
	backends[strings.ToLower(scheme)] = b
}

// Get returns the backend of scheme, if one is linked in.
func Get(scheme string) (Backend, bool) {
	mu.RLock()
	defer mu.RUnlock()
	b, ok := backends[strings.ToLower(scheme)]
	return b, ok
}

// All returns every backend linked in, by scheme.
func All() map[string]Backend {
	mu.RLock()
	defer mu.RUnlock()
	return maps.Clone(backends)
}
