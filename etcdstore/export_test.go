package etcdstore

import (
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lanesdev/lanes/policy"
	"github.com/lanesdev/lanes/registry"
)

// WatchFrom starts a registry watcher of every service as if it had listed
// at revision rev and sent that list: its first batch is whatever comes
// after rev. Tests use it to start a watch from a revision since compacted.
// It takes every key to have held a valid instance at rev.
func WatchFrom(s *Store, rev int64) (registry.Watcher, error) {
	return s.startWatcher(s.InstancesPrefix(), nil, rev, map[string]struct{}{})
}

// PolicyWatchFrom starts a policy watcher as if it had read the key absent at
// revision rev.
func PolicyWatchFrom(s *Store, rev int64) (policy.Watcher, error) {
	p := s.policy
	return p.startWatcher(p.newWatcher(), rev)
}

// SetProgressTimes sets how long a watch stays silent before it asks etcd
// for progress, and how long it waits for the answer. Call it before any
// watch starts (from TestMain).
func SetProgressTimes(after, timeout time.Duration) {
	progressAfter, progressTimeout = after, timeout
}

// OnRenew has f told of every grant and renewal of the Leases s.Register
// makes from now on: the instance's key, the lease, and when the request
// etcd answered was sent (the lease lasts its TTL from then at least).
// Call it before Register.
func OnRenew(s *Store, f func(key string, lease clientv3.LeaseID, sent time.Time)) {
	s.renewed = f
}
