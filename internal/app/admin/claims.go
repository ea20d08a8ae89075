package admin

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/netip"
	"sort"
	"strings"
	"sync"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lanesdev/lanes/adminapi"
	"github.com/lanesdev/lanes/etcdstore"
	"github.com/lanesdev/lanes/internal/lib/cowmap"
	"github.com/lanesdev/lanes/internal/lib/regid"
	"github.com/lanesdev/lanes/lane"
)

// A claim puts the requests from one client IP in a lane at the gateway. It
// lives at <prefix>claims/<ip>, attached to the lease of a registration in
// that lane: it vanishes when the dev session that made it ends, or stops
// sending heartbeats.

func (s *Server) claimKey(ip netip.Addr) string { return s.prefix + "claims/" + ip.String() }

func (s *Server) claims(ctx context.Context) ([]adminapi.Claim, error) {
	resp, err := s.cli.Get(ctx, s.prefix+"claims/", clientv3.WithPrefix())
	if err != nil {
		return nil, etcdError("list claims", err)
	}
	out := []adminapi.Claim{}
	for _, kv := range resp.Kvs {
		if c, ok := parseClaim(kv); ok {
			out = append(out, c)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].IP < out[j].IP })
	return out, nil
}

func parseClaim(kv *mvccpb.KeyValue) (adminapi.Claim, bool) {
	var c adminapi.Claim
	if json.Unmarshal(kv.Value, &c) != nil {
		return c, false
	}
	a, err := netip.ParseAddr(c.IP)
	if err != nil || !lane.Valid(c.Lane) || !strings.HasSuffix(string(kv.Key), "/"+a.Unmap().String()) {
		return c, false
	}
	return c, true
}

func (s *Server) listClaims(w http.ResponseWriter, r *http.Request, p *principal) error {
	out, err := s.claims(r.Context())
	if err != nil {
		return err
	}
	if !p.admin {
		// A registration id is shown to the token that made it only.
		owned, err := s.regs.Owned(r.Context(), p.token.ID)
		if err != nil {
			return etcdError("list registrations", err)
		}
		for i := range out {
			if id, ok := regid.Parse[clientv3.LeaseID](out[i].Registration); !ok || !owned[id] {
				out[i].Registration = ""
			}
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"claims": out})
	return nil
}

func (s *Server) createClaim(w http.ResponseWriter, r *http.Request, p *principal) error {
	var req adminapi.ClaimRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	l, err := lane.Parse(req.Lane)
	if err != nil {
		return badRequest("lane", req.Lane, "%v", err)
	}
	if !p.allows(l) {
		return forbidden("lane", l, "%s cannot claim clients for lane %q", p, l)
	}
	remote := remoteIP(r)
	ip := remote
	if req.IP != "" {
		a, err := netip.ParseAddr(req.IP)
		if err != nil {
			return badRequest("ip", req.IP, "not an IP address")
		}
		ip = a.Unmap()
	}
	if !ip.IsValid() {
		return badRequest("ip", req.IP, "cannot tell the address the request comes from; name it in ip")
	}
	if !p.admin && ip != remote {
		return forbidden("ip", ip.String(), "%s may claim only the address it connects from (%s)", p, remote)
	}
	if !p.admin && !claimable(s.cfg.ClaimNets, ip) {
		return forbidden("ip", ip.String(), "%s may claim only addresses in %s: a claim moves every client behind the address into the lane (behind a NAT, all of them); the operator allows more with lanes up --lane-claims, or claims it with the admin token", p, formatNets(s.cfg.ClaimNets))
	}
	ctx := r.Context()
	if err := s.refuseExpired(ctx, "lane", l); err != nil {
		return err
	}
	id, err := parseLease(req.Registration)
	if err != nil {
		return err
	}
	// The registration must be the caller's and hold an instance in the
	// lane: the claim lives as long as that dev session.
	if err := s.authorize(ctx, p, id, req.Registration); err != nil {
		return err
	}
	held, err := s.regs.Holds(ctx, id)
	if errors.Is(err, etcdstore.ErrNoRegistration) {
		return notFound("registration", req.Registration, "registration %s has expired or was never made", req.Registration)
	}
	if err != nil {
		return etcdError("read registration", err)
	}
	inLane := false
	for _, in := range held {
		inLane = inLane || in.Lane == l
	}
	if !inLane {
		return badRequest("registration", req.Registration, "registration %s holds no instance in lane %q; a claim lives with a registration of its lane", req.Registration, l)
	}
	c := adminapi.Claim{IP: ip.String(), Lane: l, Registration: req.Registration, Created: s.now().UTC()}
	val, _ := json.Marshal(c)
	key := s.claimKey(ip)
	for range 5 {
		cur, err := s.cli.Get(ctx, key)
		if err != nil {
			return etcdError("read claim", err)
		}
		cmp := clientv3.Compare(clientv3.CreateRevision(key), "=", 0)
		if len(cur.Kvs) == 1 {
			old, ok := parseClaim(cur.Kvs[0])
			if ok && old.Lane != l {
				return conflict("ip", c.IP, "%s is claimed by lane %q", c.IP, old.Lane)
			}
			cmp = clientv3.Compare(clientv3.ModRevision(key), "=", cur.Kvs[0].ModRevision)
		}
		resp, err := s.cli.Txn(ctx).If(cmp).Then(clientv3.OpPut(key, string(val), clientv3.WithLease(id))).Commit()
		if err != nil {
			return etcdError("store claim", err)
		}
		if resp.Succeeded {
			s.log.Info("client claimed", "ip", c.IP, "lane", l, "registration", req.Registration)
			writeJSON(w, http.StatusCreated, c)
			return nil
		}
	}
	return conflict("ip", c.IP, "the claim of %s keeps changing; try again", c.IP)
}

func (s *Server) deleteClaim(w http.ResponseWriter, r *http.Request, p *principal) error {
	a, err := netip.ParseAddr(r.PathValue("ip"))
	if err != nil {
		return badRequest("ip", r.PathValue("ip"), "not an IP address")
	}
	ctx := r.Context()
	key := s.claimKey(a.Unmap())
	cur, err := s.cli.Get(ctx, key)
	if err != nil {
		return etcdError("read claim", err)
	}
	if len(cur.Kvs) == 0 {
		return notFound("ip", a.String(), "no claim of %s", a)
	}
	if c, ok := parseClaim(cur.Kvs[0]); ok && !p.allows(c.Lane) {
		return forbidden("ip", a.String(), "%s cannot remove a claim of lane %q", p, c.Lane)
	}
	if !p.admin {
		// The claim is the registration's it hangs on: its token's.
		own, err := s.regs.Owns(ctx, p.token.ID, clientv3.LeaseID(cur.Kvs[0].Lease))
		if err != nil {
			return etcdError("read registration", err)
		}
		if !own {
			return forbidden("ip", a.String(), "%s cannot remove the claim of %s: it hangs on a registration that another token made", p, a)
		}
	}
	if _, err := s.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(key), "=", cur.Kvs[0].ModRevision)).
		Then(clientv3.OpDelete(key)).Commit(); err != nil {
		return etcdError("delete claim", err)
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// ClaimTable follows the claims in etcd, for the gateway: Lookup answers
// from memory. It follows <prefix>claims/ with etcdstore.Store.Follow, the
// Store's own list-then-watch loop.
type ClaimTable struct {
	store  *etcdstore.Store
	prefix string
	log    *slog.Logger

	m      cowmap.Map[netip.Addr, string]
	ready  chan struct{}
	once   sync.Once
	cancel context.CancelFunc
	done   chan struct{}
}

// WatchClaims starts following the claims of store. Close stops it.
func WatchClaims(store *etcdstore.Store, log *slog.Logger) *ClaimTable {
	if log == nil {
		log = slog.Default()
	}
	t := &ClaimTable{store: store, prefix: store.Prefix() + "claims/", log: log.With("component", "claims"), ready: make(chan struct{}), done: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	t.cancel = cancel
	go t.run(ctx)
	return t
}

// Lookup returns the lane that claims addr.
func (t *ClaimTable) Lookup(addr netip.Addr) (string, bool) {
	return t.m.Load(addr.Unmap())
}

// Len returns the number of claims.
func (t *ClaimTable) Len() int { return t.m.Len() }

// Ready is closed once the claims have been listed.
func (t *ClaimTable) Ready() <-chan struct{} { return t.ready }

// Close stops following and waits for the goroutine.
func (t *ClaimTable) Close() error {
	t.cancel()
	<-t.done
	return nil
}

func (t *ClaimTable) run(ctx context.Context) {
	defer close(t.done)
	err := t.store.Follow(ctx, t.prefix, t.list, t.apply)
	if ctx.Err() == nil {
		t.log.Warn("claims watch ended", "err", err)
	}
}

// list replaces the table with the claims listed.
func (t *ClaimTable) list(kvs []*mvccpb.KeyValue, _ int64) {
	m := map[netip.Addr]string{}
	for _, kv := range kvs {
		if c, ok := parseClaim(kv); ok {
			m[netip.MustParseAddr(c.IP).Unmap()] = c.Lane
		}
	}
	t.m.Replace(m)
	t.once.Do(func() { close(t.ready) })
}

// apply folds changes into a copy of the table and publishes it.
func (t *ClaimTable) apply(evs []*clientv3.Event) {
	t.m.Update(func(next map[netip.Addr]string) {
		for _, ev := range evs {
			a, err := netip.ParseAddr(strings.TrimPrefix(string(ev.Kv.Key), t.prefix))
			if err != nil {
				continue
			}
			a = a.Unmap()
			switch ev.Type {
			case clientv3.EventTypeDelete:
				delete(next, a)
			case clientv3.EventTypePut:
				if c, ok := parseClaim(ev.Kv); ok {
					next[a] = c.Lane
				} else {
					delete(next, a)
				}
			}
		}
	})
}

// claimable reports whether ip is in one of nets.
func claimable(nets []netip.Prefix, ip netip.Addr) bool {
	for _, n := range nets {
		if n.Contains(ip) {
			return true
		}
	}
	return false
}

func formatNets(nets []netip.Prefix) string {
	if len(nets) == 0 {
		return "none"
	}
	out := make([]string, len(nets))
	for i, n := range nets {
		out[i] = n.String()
	}
	return strings.Join(out, ", ")
}
