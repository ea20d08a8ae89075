// Package kube is lanes on Kubernetes: the controllers of `lanes up
// --kube` (docs/kubernetes.md).
//
// The policy controller follows one LanesPolicy resource (group lanes.dev,
// deploy/kubernetes/base/crd.yaml) and applies its spec through the admin
// API's own path, as `lanes policy apply` does (the policy package's
// validation, lane lifetimes kept, history, revision), then writes the
// resource's status: the revision in force, or the refusal naming the
// field.
//
// The fork controller makes, for each fork the admin API keeps (POST
// /v1/forks, `lanes fork`), a copy of a Deployment in the fork's lane: named
// after it with the lane's suffix, its pods and selector labelled
// lanes.dev/lane, its image and variables changed as asked, its ConfigMaps
// copied when asked; and deletes the copy when the fork is deleted, its
// TTL passes or its lane expires. It finds what it made by labels and
// annotations, so that a restart loses nothing.
//
// Both are level-based: every pass reads the whole state, and passes are
// made at start, on each event of their watches, when a fork's time is up,
// and every 30 s. Only this package and the lanes binary link client-go.
package kube

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/lanesdev/lanes/internal/app/admin"
	"github.com/lanesdev/lanes/internal/app/controlplane"
	"github.com/lanesdev/lanes/internal/lib/backoff"
	"github.com/lanesdev/lanes/internal/lib/gogroup"
	"github.com/lanesdev/lanes/internal/lib/kubeclient"
	"github.com/lanesdev/lanes/kubestore"
)

// Component runs the controllers in lanes up (controlplane.WithComponents):
// it needs the store, the engine and the admin API, and provides nothing. Of several
// lanes up on one etcd, the leader of the election <prefix>kube-controllers
// runs them; the others wait to take over.
//
// The election is etcd's (concurrency.Election, on a session lease of
// leaseTTL), on the etcd that the replicas share anyway, rather than
// client-go's leader election on a Kubernetes Lease: that package links
// every API group's informers into the binary (see internal/lib/kubeclient).
type Component struct {
	fork     *forkController
	policy   *policyController
	publish  *publishController
	mirror   *mirror // nil when the cluster has no registry to write
	etcd     *clientv3.Client
	election string // the election's key prefix
	identity string
	log      *slog.Logger
	g        *gogroup.Group
}

// leaseTTL is how long the leader's session lease lasts without renewal:
// how soon another replica takes over from a leader that died.
const leaseTTL = 15 // seconds

// NewComponent returns the Kubernetes controllers, to add to lanes up when
// its configuration has kube.enabled.
func NewComponent() *Component { return &Component{} }

func (*Component) Name() string { return "kube" }
func (*Component) Needs() []controlplane.Dep {
	return []controlplane.Dep{controlplane.StoreKey, controlplane.KubeRegistryKey, controlplane.EngineKey, controlplane.AdminKey}
}
func (*Component) Provides() []controlplane.Dep { return nil }

// Validate refuses a policy ConfigMap that is where the policy in force is
// published: the controller would read back what it wrote.
func (*Component) Validate(cfg *controlplane.Config) error {
	if ns, name := cfg.KubePolicy(); cfg.Kube.PolicyConfigMap && name == kubestore.PolicyConfigMap {
		return fmt.Errorf("kube.policy %q: %s is where lanes up publishes the policy in force; name the ConfigMap you write otherwise", ns+"/"+name, kubestore.PolicyConfigMap)
	}
	return nil
}

// RestConfig returns the client configuration of the API server: from the
// kubeconfig file path, else the pod's service account, else $KUBECONFIG,
// else ~/.kube/config, as LANES_REGISTRY=k8s:// finds it.
func RestConfig(path string) (*rest.Config, error) {
	c, err := kubestore.URL{Kubeconfig: path}.RESTConfig(nil)
	if err != nil {
		return nil, fmt.Errorf("no Kubernetes API server: not in a pod, or --kubeconfig, $KUBECONFIG or ~/.kube/config: %w", err)
	}
	return c, nil
}

// LogTo sends client-go's log (klog, one per process) into log. lanes up
// calls it before it starts, when no client-go goroutine runs yet: klog's
// logger is not safe to change under them.
func LogTo(log *slog.Logger) { klog.SetSlogLogger(log.With("component", "kube")) }

func (c *Component) Provision(ctx context.Context, rt *controlplane.Runtime) error {
	cfg := rt.Config
	rc, err := RestConfig(cfg.Kube.Kubeconfig)
	if err != nil {
		return err
	}
	rc = rest.CopyConfig(rc)
	rc.Timeout = callTimeout
	rc.UserAgent = "lanes-controller"
	cs, err := kubeclient.New(rc)
	if err != nil {
		return err
	}
	// Watches last longer than a call: a client of their own, without the
	// timeout.
	wc := rest.CopyConfig(rc)
	wc.Timeout = 0
	dyn, err := dynamic.NewForConfig(wc)
	if err != nil {
		return err
	}
	wcs, err := kubeclient.New(wc)
	if err != nil {
		return err
	}
	// The API server answers now, or lanes up says so before it serves.
	vctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	if _, err := cs.ServerVersion(vctx); err != nil || vctx.Err() != nil {
		return fmt.Errorf("the Kubernetes API server at %s: %v", rc.Host, errors.Join(err, vctx.Err()))
	}
	st := controlplane.Need(rt, controlplane.StoreKey)
	ai := controlplane.Need(rt, controlplane.AdminKey)
	log := rt.Log.With("component", "kube")
	ns := cfg.KubeNamespaces()
	pns, pname := cfg.KubePolicy()
	c.fork = &forkController{cs: wcs, forks: ai.API.Forks(), engine: controlplane.Need(rt, controlplane.EngineKey), namespaces: ns, log: log, now: time.Now, poke: newWaker()}
	cctx, ccancel := context.WithTimeout(ctx, callTimeout)
	defer ccancel()
	resp, err := st.Client().Get(cctx, st.PolicyKey(), clientv3.WithCountOnly())
	if err != nil {
		return fmt.Errorf("etcd: %w", err)
	}
	if to := controlplane.Need(rt, controlplane.KubeRegistryKey); to != nil {
		c.mirror = &mirror{from: st, to: to, log: log}
	}
	c.publish = &publishController{cs: wcs, policy: st.Policy(), namespaces: ns, id: strconv.FormatUint(resp.Header.ClusterId, 16) + st.Prefix(),
		log: log, now: time.Now, poke: newWaker()}
	c.policy = &policyController{dyn: dyn, cs: wcs, configMap: cfg.Kube.PolicyConfigMap, api: ai.API, policy: st.Policy(), namespace: pns, name: pname, log: log, now: time.Now, poke: newWaker()}
	host, _ := os.Hostname()
	c.etcd, c.election, c.identity = st.Client(), st.Prefix()+"kube-controllers/", host+"-"+admin.NewSecret()[:8]
	c.log = log
	rt.Announce(controlplane.Address{Name: "kubernetes", URL: rc.Host, Note: fmt.Sprintf("%s %s/%s; forks in %s", policyKind(cfg.Kube.PolicyConfigMap), pns, pname, strings.Join(ns, ", "))})
	return nil
}

func policyKind(configMap bool) string {
	if configMap {
		return "policy ConfigMap"
	}
	return "LanesPolicy"
}

// Start runs the controllers while this process leads.
func (c *Component) Start(context.Context) error {
	c.g = gogroup.New()
	ctx := c.g.Context()
	c.g.Go(func() {
		b := backoff.New(time.Second, 10*time.Second)
		for ctx.Err() == nil {
			if err := c.campaign(ctx); err != nil && ctx.Err() == nil {
				c.log.Warn("the Kubernetes controllers' election failed; trying again", "err", err)
				b.Wait(ctx)
				continue
			}
			b.Reset()
		}
	})
	return nil
}

// campaign waits to lead, then runs the controllers until ctx ends or the
// session's lease is lost, and resigns.
func (c *Component) campaign(ctx context.Context) error {
	// The session outlives ctx, so that Close can revoke its lease at Stop.
	s, err := concurrency.NewSession(c.etcd, concurrency.WithTTL(leaseTTL), concurrency.WithContext(context.WithoutCancel(ctx)))
	if err != nil {
		return err
	}
	defer s.Close() // revokes the lease: another replica leads at once
	e := concurrency.NewElection(s, c.election)
	if err := e.Campaign(ctx, c.identity); err != nil {
		return err
	}
	lctx, cancel := context.WithCancel(ctx)
	lost := make(chan struct{})
	go func() { // ends with lctx, which lead's return ends
		defer close(lost)
		select {
		case <-s.Done(): // the session's lease could not be kept
		case <-lctx.Done():
		}
		cancel()
	}()
	c.lead(lctx)
	cancel()
	<-lost
	if ctx.Err() == nil {
		c.log.Info("the Kubernetes controllers stop: this process no longer leads")
	}
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), callTimeout)
	defer rcancel()
	e.Resign(rctx)
	return nil
}

// lead runs the controllers until ctx ends (leadership lost, or Stop).
func (c *Component) lead(ctx context.Context) {
	c.log.Info("the Kubernetes controllers run: this process leads", "election", c.election)
	g := gogroup.New()
	stop := context.AfterFunc(ctx, func() { g.Close() })
	defer stop()
	gctx := g.Context()
	g.Go(func() { c.policy.run(gctx, g) })
	g.Go(func() { c.fork.run(gctx, g) })
	g.Go(func() { c.publish.run(gctx, g) })
	if c.mirror != nil {
		g.Go(func() { c.mirror.run(gctx) })
	}
	<-gctx.Done()
	g.Close()
}

// Stop ends the controllers and waits for them.
func (c *Component) Stop(context.Context) error {
	if c.g != nil {
		c.g.Close()
	}
	return nil
}
