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
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"

	"github.com/lanesdev/lanes/internal/app/admin"
	"github.com/lanesdev/lanes/internal/app/controlplane"
	"github.com/lanesdev/lanes/internal/lib/gogroup"
)

// Component runs the controllers in lanes up (controlplane.WithComponents):
// it needs the store, the engine and the admin API, and provides nothing. Of several
// lanes up on one cluster, the holder of the Lease lanes-controllers (in
// the first namespace) runs them; the others wait to take over.
type Component struct {
	fork   *forkController
	policy *policyController
	lock   *resourcelock.LeaseLock
	log    *slog.Logger
	g      *gogroup.Group
}

// LeaseName is the Lease of the controllers' leader.
const LeaseName = "lanes-controllers"

// NewComponent returns the Kubernetes controllers, to add to lanes up when
// its configuration has kube.enabled.
func NewComponent() *Component { return &Component{} }

func (*Component) Name() string { return "kube" }
func (*Component) Needs() []controlplane.Dep {
	return []controlplane.Dep{controlplane.StoreKey, controlplane.EngineKey, controlplane.AdminKey}
}
func (*Component) Provides() []controlplane.Dep { return nil }

// RestConfig returns the client configuration of the API server: from the
// kubeconfig file path, else the pod's service account, else $KUBECONFIG.
func RestConfig(path string) (*rest.Config, error) {
	if path == "" {
		if c, err := rest.InClusterConfig(); err == nil {
			return c, nil
		} else if os.Getenv("KUBECONFIG") == "" {
			return nil, fmt.Errorf("no Kubernetes API server: not in a pod (%v), and neither --kubeconfig nor $KUBECONFIG is set", err)
		}
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if path != "" {
		rules.ExplicitPath = path
	}
	c, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, nil).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	return c, nil
}

func (c *Component) Provision(ctx context.Context, rt *controlplane.Runtime) error {
	cfg := rt.Config
	rc, err := RestConfig(cfg.Kube.Kubeconfig)
	if err != nil {
		return err
	}
	rc = rest.CopyConfig(rc)
	rc.Timeout = callTimeout
	rc.UserAgent = "lanes-controller"
	cs, err := kubernetes.NewForConfig(rc)
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
	wcs, err := kubernetes.NewForConfig(wc)
	if err != nil {
		return err
	}
	// The API server answers now, or lanes up says so before it serves.
	vctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	if _, err := cs.Discovery().ServerVersion(); err != nil || vctx.Err() != nil {
		return fmt.Errorf("the Kubernetes API server at %s: %v", rc.Host, errors.Join(err, vctx.Err()))
	}
	st := controlplane.Need(rt, controlplane.StoreKey)
	ai := controlplane.Need(rt, controlplane.AdminKey)
	log := rt.Log.With("component", "kube")
	// client-go logs through klog: into lanes up's log, not beside it.
	klog.SetSlogLogger(log)
	ns := cfg.KubeNamespaces()
	pns, pname := cfg.KubePolicy()
	c.fork = &forkController{cs: wcs, forks: ai.API.Forks(), engine: controlplane.Need(rt, controlplane.EngineKey), namespaces: ns, log: log, now: time.Now, poke: newWaker()}
	c.policy = &policyController{dyn: dyn, cs: wcs, configMap: cfg.Kube.PolicyConfigMap, api: ai.API, policy: st.Policy(), namespace: pns, name: pname, log: log, now: time.Now, poke: newWaker()}
	host, _ := os.Hostname()
	c.lock = &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: pns, Name: LeaseName},
		Client:     cs.CoordinationV1(), // each call bounded, the release at Stop too
		LockConfig: resourcelock.ResourceLockConfig{Identity: host + "-" + admin.NewSecret()[:8]},
	}
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
		for ctx.Err() == nil {
			leaderelection.RunOrDie(ctx, leaderelection.LeaderElectionConfig{
				Lock:            c.lock,
				LeaseDuration:   15 * time.Second,
				RenewDeadline:   10 * time.Second,
				RetryPeriod:     2 * time.Second,
				ReleaseOnCancel: true,
				Name:            LeaseName,
				Callbacks: leaderelection.LeaderCallbacks{
					OnStartedLeading: c.lead,
					OnStoppedLeading: func() { c.log.Info("the Kubernetes controllers stop: this process no longer leads") },
				},
			})
		}
	})
	return nil
}

// lead runs the controllers until ctx ends (leadership lost, or Stop).
func (c *Component) lead(ctx context.Context) {
	c.log.Info("the Kubernetes controllers run: this process leads", "lease", c.lock.LeaseMeta.Namespace+"/"+LeaseName)
	g := gogroup.New()
	stop := context.AfterFunc(ctx, func() { g.Close() })
	defer stop()
	gctx := g.Context()
	g.Go(func() { c.policy.run(gctx, g) })
	g.Go(func() { c.fork.run(gctx, g) })
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
