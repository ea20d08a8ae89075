package kube

import (
	"context"
	"log/slog"
	"time"

	"github.com/lanesdev/lanes/internal/lib/backoff"
	"github.com/lanesdev/lanes/registry"
)

// MaxMirrored bounds the instances of etcd that the mirror writes to the
// cluster; past it, the rest are left out and the log says so.
const MaxMirrored = 1000

// mirror keeps each instance registered in lanes' etcd (through the admin
// API: lanes dev, a laptop's tunnel, a service outside the cluster)
// registered in the cluster too, as a managed EndpointSlice, so that the
// services in pods that follow the cluster (LANES_REGISTRY=k8s://) reach
// them as lanes up's own engine does. It runs on the controllers' leader;
// a registration it made ends with the instance in etcd. When the
// leadership ends, the mirror leaves its registrations to the next leader,
// which takes them over (or to their TTL).
type mirror struct {
	from   registry.Registry // etcd's registry
	to     registry.Registry // the cluster's
	log    *slog.Logger
	warned bool      // that some were left out
	said   time.Time // when a failed write was last logged
	failed int       // failed writes since
}

// sayFailed logs a failed write at most every 30 s, with how many failed
// since: a cluster that refuses every write (RBAC) would otherwise log one
// line per instance and change.
func (m *mirror) sayFailed(what string, in registry.Instance, err error) {
	m.failed++
	if now := time.Now(); now.Sub(m.said) >= 30*time.Second {
		m.log.Warn("mirror: "+what+" in the cluster", "service", in.Service, "id", in.ID, "err", err, "failed_since_last_said", m.failed)
		m.said, m.failed = now, 0
	}
}

func (m *mirror) run(ctx context.Context) {
	leases := map[[2]string]registry.Lease{} // service, id
	defer func() {
		// The mirror stops with the leadership: the next leader registers
		// the same instances again, taking over the registrations left
		// here, so that the services that follow the cluster never lose
		// them meanwhile (TestKubernetes/handover). With no next leader,
		// they expire within their TTL.
		for _, l := range leases {
			if lv, ok := l.(interface{ Leave() }); ok {
				lv.Leave()
			} else {
				l.Close()
			}
		}
	}()
	bo := backoff.New(100*time.Millisecond, 10*time.Second)
	for ctx.Err() == nil {
		w, err := m.from.Watch(ctx, "")
		if err != nil {
			m.log.Warn("mirror: watch etcd's instances", "err", err)
			bo.Wait(ctx)
			continue
		}
		var st registry.State
		for {
			b, err := w.Next(ctx)
			if err != nil {
				break
			}
			bo.Reset()
			st.Apply(b)
			m.reconcile(ctx, &st, leases)
		}
		w.Close()
		bo.Wait(ctx)
	}
}

// reconcile makes the registrations in the cluster those of st.
func (m *mirror) reconcile(ctx context.Context, st *registry.State, leases map[[2]string]registry.Lease) {
	want := map[[2]string]registry.Instance{}
	over := false
	for svc, ins := range st.Services {
		for id, in := range ins {
			if len(want) == MaxMirrored {
				over = true
				break
			}
			want[[2]string{svc, id}] = in
		}
	}
	if over && !m.warned {
		m.log.Warn("mirror: more instances in etcd than it writes to the cluster; the rest are left out", "max", MaxMirrored)
	}
	m.warned = over
	for k, l := range leases {
		if _, ok := want[k]; !ok || l.Err() != nil {
			l.Close()
			delete(leases, k)
		}
	}
	for k, in := range want {
		cctx, cancel := context.WithTimeout(ctx, callTimeout)
		if l := leases[k]; l == nil {
			l, err := m.to.Register(cctx, in, 0)
			if err != nil {
				m.sayFailed("register", in, err)
			} else {
				leases[k] = l
			}
		} else if !l.Instance().Equal(in) {
			if err := l.Update(cctx, in); err != nil {
				m.sayFailed("update", in, err)
			}
		}
		cancel()
	}
}
