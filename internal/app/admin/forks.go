package admin

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lanesdev/lanes/adminapi"
	"github.com/lanesdev/lanes/etcdstore"
	"github.com/lanesdev/lanes/lane"
)

// ForkLimits bound the forks of lanes (POST /v1/forks).
type ForkLimits struct {
	// PerLane is the most forks one lane may have (DefaultForkLimits when
	// 0).
	PerLane int
	// Replicas is the most replicas a fork may ask for.
	Replicas int
}

// DefaultForkLimits are the fork limits when the operator sets none.
var DefaultForkLimits = ForkLimits{PerLane: 10, Replicas: 3}

// Bounds of a fork request's fields.
const (
	maxForkEnv      = 64
	maxForkEnvBytes = 16 << 10
	maxImageLen     = 512
)

var (
	dnsLabel     = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	dnsSubdomain = regexp.MustCompile(`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`)
	envName      = regexp.MustCompile(`^[-._a-zA-Z][-._a-zA-Z0-9]*$`)
)

// ForkStore keeps the forks in etcd, one key per fork:
//
//	<prefix>forks/<lane>/<namespace>/<deployment>  the Fork, JSON
//	<prefix>forklanes/<lane>                       rewritten with each fork of the lane, deleted with its last
//	<prefix>forkstatus/<lane>/<namespace>/<deployment>  the controller's last word on the copy
//
// The admin API writes them; the Kubernetes controller of lanes up makes a
// copy of the Deployment for each, and deletes a fork whose time is up.
type ForkStore struct {
	cli      *clientv3.Client
	prefix   string
	guards   string
	statuses string
}

// NewForkStore returns the forks kept in st.
func NewForkStore(st *etcdstore.Store) *ForkStore {
	return &ForkStore{cli: st.Client(), prefix: st.Prefix() + "forks/", guards: st.Prefix() + "forklanes/", statuses: st.Prefix() + "forkstatus/"}
}

// Forks returns the forks the API keeps.
func (s *Server) Forks() *ForkStore { return s.forks }

// StoredFork is a fork with the etcd revision that last wrote it.
type StoredFork struct {
	adminapi.Fork
	ModRevision int64
}

func (fs *ForkStore) key(f adminapi.ForkRequest) string {
	return fs.prefix + f.Lane + "/" + f.Namespace + "/" + f.Deployment
}

// guard is the key that every fork written into lane l rewrites, so that
// the count of the lane's forks and a write are one transaction.
func (fs *ForkStore) guard(l string) string { return fs.guards + l }

// List returns the forks, of one lane ("" for all), and the revision of
// the listing.
func (fs *ForkStore) List(ctx context.Context, l string) ([]StoredFork, int64, error) {
	p := fs.prefix
	if l != "" {
		p += l + "/"
	}
	resp, err := fs.cli.Get(ctx, p, clientv3.WithPrefix())
	if err != nil {
		return nil, 0, etcdError("read forks", err)
	}
	out := make([]StoredFork, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		var f adminapi.Fork
		if err := json.Unmarshal(kv.Value, &f); err != nil {
			continue // not written by the API; no copy is made of it
		}
		out = append(out, StoredFork{Fork: f, ModRevision: kv.ModRevision})
	}
	return out, resp.Header.Revision, nil
}

// Watch returns the changes to the forks after revision rev: the
// controller lists, then watches, and lists again on any change.
func (fs *ForkStore) Watch(ctx context.Context, rev int64) clientv3.WatchChan {
	return fs.cli.Watch(clientv3.WithRequireLeader(ctx), fs.prefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1))
}

// maxStatus bounds a fork's status, which quotes the API server.
const maxStatus = 1 << 10

// SetStatus records the controller's last word on f's copy: "made", or
// why it is not.
func (fs *ForkStore) SetStatus(ctx context.Context, f adminapi.ForkRequest, status string) error {
	if len(status) > maxStatus {
		status = status[:maxStatus]
	}
	k := fs.key(f)
	sk := fs.statuses + strings.TrimPrefix(k, fs.prefix)
	// Only while the fork is there: a status outlives no fork.
	_, err := fs.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(k), ">", 0)).Then(clientv3.OpPut(sk, status)).Commit()
	if err != nil {
		return etcdError("store fork status", err)
	}
	return nil
}

// statusesOf returns the statuses of the forks of lane l ("" for all), by
// fork key.
func (fs *ForkStore) statusesOf(ctx context.Context, l string) (map[string]string, error) {
	p := fs.statuses
	if l != "" {
		p += l + "/"
	}
	resp, err := fs.cli.Get(ctx, p, clientv3.WithPrefix())
	if err != nil {
		return nil, etcdError("read fork statuses", err)
	}
	out := make(map[string]string, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		out[fs.prefix+strings.TrimPrefix(string(kv.Key), fs.statuses)] = string(kv.Value)
	}
	return out, nil
}

// deleteOps are the operations that delete the fork at key k.
func (fs *ForkStore) deleteOps(k string) []clientv3.Op {
	return []clientv3.Op{clientv3.OpDelete(k), clientv3.OpDelete(fs.statuses + strings.TrimPrefix(k, fs.prefix))}
}

// Delete removes f, unless it was written again since it was read.
func (fs *ForkStore) Delete(ctx context.Context, f StoredFork) error {
	k := fs.key(f.ForkRequest)
	_, err := fs.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(k), "=", f.ModRevision)).Then(fs.deleteOps(k)...).Commit()
	if err != nil {
		return etcdError("delete fork", err)
	}
	fs.dropGuard(ctx, f.Lane)
	return nil
}

// dropGuard deletes the guard key of lane l once l has no fork, so that the
// guards of lanes that forked once do not pile up. A fork written
// meanwhile keeps it (the condition is one transaction), and a fork
// written after compared the guard's revision, which the deletion changed:
// it counts again. A failure leaves the key, to the next deletion.
func (fs *ForkStore) dropGuard(ctx context.Context, l string) {
	fs.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(fs.prefix+l+"/"), "=", 0).WithPrefix()).
		Then(clientv3.OpDelete(fs.guard(l))).Commit()
}

// checkFork validates a fork request, naming the field and its value.
func (s *Server) checkFork(req *adminapi.ForkRequest) error {
	l, err := lane.Parse(req.Lane)
	if err != nil {
		return badRequest("lane", req.Lane, "%v", err)
	}
	req.Lane = l
	if len(s.cfg.ForkNamespaces) == 0 {
		return notFound("", "", "this control plane makes no forks: run lanes up --kube (docs/kubernetes.md)")
	}
	if req.Namespace == "" {
		req.Namespace = s.cfg.ForkNamespaces[0]
	}
	if !slices.Contains(s.cfg.ForkNamespaces, req.Namespace) {
		return forbidden("namespace", req.Namespace, "namespace %q: forks are made in %s only (lanes up --kube-namespace)", req.Namespace, strings.Join(s.cfg.ForkNamespaces, ", "))
	}
	name := adminapi.ForkName(req.Deployment, l)
	// The copy's pods are named after it, with two hashes: keep room.
	if req.Deployment == "" || len(name) > 200 || !dnsSubdomain.MatchString(req.Deployment) {
		return badRequest("deployment", req.Deployment, "deployment %q: want a Deployment's name (a-z, 0-9, '-' and '.'), at most 200 characters with the lane's suffix", req.Deployment)
	}
	if req.Container != "" && (len(req.Container) > 63 || !dnsLabel.MatchString(req.Container)) {
		return badRequest("container", req.Container, "container %q: want a container's name", req.Container)
	}
	if len(req.Image) > maxImageLen || strings.ContainsAny(req.Image, " \t\r\n") {
		return badRequest("image", req.Image, "image %q: want an image reference without spaces, at most %d characters", req.Image, maxImageLen)
	}
	if len(req.Env) > maxForkEnv {
		return badRequest("env", fmt.Sprint(len(req.Env)), "%d variables: at most %d", len(req.Env), maxForkEnv)
	}
	size := 0
	for k, v := range req.Env {
		if !envName.MatchString(k) {
			return badRequest("env", k, "variable name %q: want letters, digits, '_', '-' and '.', not starting with a digit", k)
		}
		size += len(k) + len(v)
	}
	if size > maxForkEnvBytes {
		return badRequest("env", "", "the variables take %d bytes: at most %d", size, maxForkEnvBytes)
	}
	if req.Replicas == 0 {
		req.Replicas = 1
	}
	if req.Replicas < 0 || req.Replicas > s.cfg.ForkLimits.Replicas {
		return forbidden("replicas", fmt.Sprint(req.Replicas), "%d replicas: a fork has 1 to %d", req.Replicas, s.cfg.ForkLimits.Replicas)
	}
	if req.TTL < 0 {
		return badRequest("ttl", req.TTL.String(), "ttl must be positive")
	}
	return nil
}

func (s *Server) forbidFork(p *principal, l string) error {
	if p.allows(l) {
		return nil
	}
	return forbidden("lane", l, "%s cannot fork into lane %s: a lane token forks only into its own lane", p, l)
}

// createFork makes or replaces a lane's fork of a Deployment.
func (s *Server) createFork(w http.ResponseWriter, r *http.Request, p *principal) error {
	var req adminapi.ForkRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	if err := s.checkFork(&req); err != nil {
		return err
	}
	if err := s.forbidFork(p, req.Lane); err != nil {
		return err
	}
	if err := s.refuseExpired(r.Context(), "lane", req.Lane); err != nil {
		return err
	}
	if req.Image != "" && !p.admin && len(s.cfg.ForkImages) > 0 &&
		!slices.ContainsFunc(s.cfg.ForkImages, func(pre string) bool { return strings.HasPrefix(req.Image, pre) }) {
		return forbidden("image", req.Image, "image %q: a lane's fork runs images from %s only (lanes up --kube-fork-image)", req.Image, strings.Join(s.cfg.ForkImages, ", "))
	}
	now := s.now().UTC().Truncate(time.Second)
	f := adminapi.Fork{ForkRequest: req, Name: adminapi.ForkName(req.Deployment, req.Lane), Created: now, By: p.owner()}
	if req.TTL > 0 {
		e := now.Add(req.TTL.D())
		f.Expires = &e
	}
	val, err := json.Marshal(f)
	if err != nil {
		return err
	}
	k := s.forks.key(req)
	// The lane's bound is counted and the fork written in one transaction
	// on the lane's guard key, which every fork written into the lane
	// rewrites: a concurrent fork of the lane makes this one count again.
	guard := s.forks.guard(req.Lane)
	for range 10 {
		g, err := s.cli.Get(r.Context(), guard)
		if err != nil {
			return etcdError("read forks", err)
		}
		var guardRev int64
		if len(g.Kvs) == 1 {
			guardRev = g.Kvs[0].ModRevision
		}
		have, _, err := s.forks.List(r.Context(), req.Lane)
		if err != nil {
			return err
		}
		n := 0
		for _, o := range have {
			if s.forks.key(o.ForkRequest) != k {
				n++
			}
		}
		if n >= s.cfg.ForkLimits.PerLane {
			return errorf(http.StatusForbidden, adminapi.CodeLimit, "lane", req.Lane, "lane %s has %d forks, the most a lane may have", req.Lane, n)
		}
		txn, err := s.cli.Txn(r.Context()).
			If(clientv3.Compare(clientv3.ModRevision(guard), "=", guardRev)).
			Then(clientv3.OpPut(k, string(val)), clientv3.OpPut(guard, "")).Commit()
		if err != nil {
			return etcdError("store fork", err)
		}
		if txn.Succeeded {
			s.log.Info("fork made", "lane", req.Lane, "namespace", req.Namespace, "deployment", req.Deployment, "by", p.String())
			writeJSON(w, http.StatusOK, f)
			return nil
		}
	}
	return conflict("lane", req.Lane, "the forks of lane %s keep changing; try again", req.Lane)
}

// listForks answers the forks the caller may see: every one for the
// admin, its lane's for a lane token.
func (s *Server) listForks(w http.ResponseWriter, r *http.Request, p *principal) error {
	l := ""
	if !p.admin {
		if p.token.Baseline {
			writeJSON(w, http.StatusOK, map[string]any{"forks": []adminapi.Fork{}})
			return nil
		}
		l = p.token.Lane
	}
	have, _, err := s.forks.List(r.Context(), l)
	if err != nil {
		return err
	}
	statuses, err := s.forks.statusesOf(r.Context(), l)
	if err != nil {
		return err
	}
	out := make([]adminapi.Fork, 0, len(have))
	for _, f := range have {
		f.Status = statuses[s.forks.key(f.ForkRequest)]
		out = append(out, f.Fork)
	}
	sort.Slice(out, func(i, j int) bool {
		return s.forks.key(out[i].ForkRequest) < s.forks.key(out[j].ForkRequest)
	})
	writeJSON(w, http.StatusOK, map[string]any{"forks": out})
	return nil
}

// deleteFork ends a fork: the controller deletes the copy.
func (s *Server) deleteFork(w http.ResponseWriter, r *http.Request, p *principal) error {
	req := adminapi.ForkRequest{Lane: r.PathValue("lane"), Namespace: r.PathValue("namespace"), Deployment: r.PathValue("deployment")}
	if err := s.checkFork(&req); err != nil {
		return err
	}
	if err := s.forbidFork(p, req.Lane); err != nil {
		return err
	}
	resp, err := s.cli.Txn(r.Context()).Then(s.forks.deleteOps(s.forks.key(req))...).Commit()
	if err != nil {
		return etcdError("delete fork", err)
	}
	if resp.Responses[0].GetResponseDeleteRange().Deleted == 0 {
		return notFound("deployment", req.Deployment, "lane %s has no fork of %s/%s", req.Lane, req.Namespace, req.Deployment)
	}
	s.forks.dropGuard(r.Context(), req.Lane)
	s.log.Info("fork deleted", "lane", req.Lane, "namespace", req.Namespace, "deployment", req.Deployment, "by", p.String())
	w.WriteHeader(http.StatusNoContent)
	return nil
}
