package kube

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/lanesdev/lanes/internal/app/admin"
	"github.com/lanesdev/lanes/internal/lib/backoff"
	"github.com/lanesdev/lanes/internal/lib/gogroup"
	"github.com/lanesdev/lanes/internal/lib/kubeclient"
	"github.com/lanesdev/lanes/routing"
)

// ownedSelector selects the objects the fork controller made.
var ownedSelector = LabelManagedBy + "=" + ManagedBy + "," + LabelLane

// forkController makes a copy of a Deployment for each fork the admin API
// keeps, and deletes the copies whose fork has ended (deleted, its TTL
// passed, its lane expired). It is level-based: each pass lists the forks
// and the copies, whatever happened before, so that a restart, a missed
// event or a copy deleted by hand are mended by the next pass.
type forkController struct {
	cs         *kubeclient.Clients
	forks      *admin.ForkStore
	engine     *routing.Engine
	namespaces []string
	log        *slog.Logger
	now        func() time.Time
	poke       waker
	// said is the status last recorded for each fork, by its key, so
	// that a pass writes only what changed.
	said map[string]string
}

// run reconciles until ctx ends: at start, on every change of the forks,
// the policy or the copies, when a fork's time is up, and every resync.
func (c *forkController) run(ctx context.Context, g *gogroup.Group) {
	g.Go(func() { c.watchForks(ctx) })
	g.Go(func() { followEngine(ctx, c.engine, c.poke) })
	for _, ns := range c.namespaces {
		g.Go(func() {
			followKube(ctx, c.log, "the forks' deployments in "+ns, c.poke, func(ctx context.Context) (watch.Interface, error) {
				return c.cs.AppsV1().Deployments(ns).Watch(ctx, metav1.ListOptions{LabelSelector: ownedSelector})
			})
		})
		// A Service that comes to select a forked Deployment's pods, or
		// stops to, changes the copy's labels and its Services.
		g.Go(func() {
			followKube(ctx, c.log, "the services in "+ns, c.poke, func(ctx context.Context) (watch.Interface, error) {
				return c.cs.CoreV1().Services(ns).Watch(ctx, metav1.ListOptions{})
			})
		})
	}
	loop(ctx, c.log, "fork reconcile", c.poke, c.now, c.reconcile)
}

// watchForks rings the controller on every change of the forks in etcd.
func (c *forkController) watchForks(ctx context.Context) {
	bo := backoff.New(100*time.Millisecond, 10*time.Second)
	for ctx.Err() == nil {
		lctx, cancel := context.WithTimeout(ctx, callTimeout)
		_, rev, err := c.forks.List(lctx, "")
		cancel()
		if err == nil {
			c.poke.wake() // the listing may hold changes no watch saw
			for resp := range c.forks.Watch(ctx, rev) {
				if resp.Err() != nil {
					break
				}
				bo.Reset()
				c.poke.wake()
			}
		}
		if !bo.Wait(ctx) {
			return
		}
	}
}

// reconcile makes the copies match the forks once, and returns when the
// next fork ends (zero if none does).
func (c *forkController) reconcile(ctx context.Context) (time.Time, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*callTimeout)
	defer cancel()
	stored, _, err := c.forks.List(ctx, "")
	if err != nil {
		return time.Time{}, err
	}
	// The policy in force, as the routing engine has it: a lane's
	// forks end when its requests stop reaching its instances.
	pol := c.engine.Policy()
	now := c.now()
	var next time.Time
	soonest := func(t time.Time) {
		if next.IsZero() || t.Before(next) {
			next = t
		}
	}
	want := map[string]map[string]admin.StoredFork{} // namespace, copy name
	for _, f := range stored {
		if !slices.Contains(c.namespaces, f.Namespace) {
			c.log.Warn("a fork names a namespace this controller does not serve", "lane", f.Lane, "namespace", f.Namespace, "deployment", f.Deployment)
			continue
		}
		why := ""
		switch {
		case pol.Expired(f.Lane, now):
			why = "its lane expired"
		case f.Expires != nil && !now.Before(*f.Expires):
			why = "its ttl passed"
		}
		if why != "" {
			if err := c.forks.Delete(ctx, f); err != nil {
				return time.Time{}, err
			}
			c.log.Info("fork ended", "lane", f.Lane, "namespace", f.Namespace, "deployment", f.Deployment, "why", why)
			continue
		}
		if f.Expires != nil {
			soonest(*f.Expires)
		}
		if e := pol.Lanes[f.Lane].Expires; e != nil {
			soonest(*e)
		}
		if want[f.Namespace] == nil {
			want[f.Namespace] = map[string]admin.StoredFork{}
		}
		if o, taken := want[f.Namespace][f.Name]; taken {
			// deploy/a-b in lane c and deploy/a in lane b-c: one name
			c.say(ctx, f, fmt.Sprintf("not made: its name %s is the copy of deploy/%s in lane %s", f.Name, o.Deployment, o.Lane))
			continue
		}
		want[f.Namespace][f.Name] = f
	}
	live := map[string]bool{}
	for _, f := range stored {
		live[forkKey(f)] = true
	}
	for k := range c.said {
		if !live[k] {
			delete(c.said, k) // bounded by the forks there are
		}
	}
	var errs []error
	for _, ns := range c.namespaces {
		if err := c.reconcileNamespace(ctx, ns, want[ns]); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return next, fmt.Errorf("%v", errs)
	}
	return next, nil
}

func (c *forkController) reconcileNamespace(ctx context.Context, ns string, want map[string]admin.StoredFork) error {
	deps, err := c.cs.AppsV1().Deployments(ns).List(ctx, metav1.ListOptions{LabelSelector: ownedSelector})
	if err != nil {
		return fmt.Errorf("list the forks' deployments in %s: %w", ns, err)
	}
	have := map[string]*appsv1.Deployment{}
	for i := range deps.Items {
		d := &deps.Items[i]
		if d.Annotations[AnnotationFork] == "" {
			continue // not a copy: leave it alone
		}
		if _, ok := want[d.Name]; !ok {
			if err := c.cs.AppsV1().Deployments(ns).Delete(ctx, d.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("delete deployment %s/%s: %w", ns, d.Name, err)
			}
			c.log.Info("fork deleted", "namespace", ns, "deployment", d.Name)
			continue
		}
		have[d.Name] = d
	}
	svcs, err := c.cs.CoreV1().Services(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list the services in %s: %w", ns, err)
	}
	keepCMs := map[string]bool{}             // lane and the Deployment copied
	keepSvcs := map[string]map[string]bool{} // the same: the names of its Services' copies, nil for all
	for name, f := range want {
		k := f.Lane + " " + ns + "/" + f.Deployment
		keepCMs[k] = true
		status := "made"
		names, err := c.ensure(ctx, f, have[name], svcs.Items)
		if err != nil {
			c.log.Warn("fork not made", "lane", f.Lane, "namespace", ns, "deployment", f.Deployment, "err", err)
			status = err.Error()
		}
		keepSvcs[k] = names
		c.say(ctx, f, status)
	}
	for _, svc := range svcs.Items {
		if !isCopy(svc.ObjectMeta) || svc.Labels[LabelLane] == "" {
			continue
		}
		names, wanted := keepSvcs[svc.Labels[LabelLane]+" "+svc.Annotations[AnnotationFork]]
		if wanted && (names == nil || names[svc.Name]) {
			continue
		}
		if err := c.cs.CoreV1().Services(ns).Delete(ctx, svc.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete service %s/%s: %w", ns, svc.Name, err)
		}
	}
	cms, err := c.cs.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{LabelSelector: ownedSelector})
	if err != nil {
		return fmt.Errorf("list the forks' configmaps in %s: %w", ns, err)
	}
	for _, cm := range cms.Items {
		if cm.Annotations[AnnotationFork] == "" || keepCMs[cm.Labels[LabelLane]+" "+cm.Annotations[AnnotationFork]] {
			continue
		}
		if err := c.cs.CoreV1().ConfigMaps(ns).Delete(ctx, cm.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete configmap %s/%s: %w", ns, cm.Name, err)
		}
	}
	return nil
}

// forkKey names one write of a fork: a fork written again is news.
func forkKey(f admin.StoredFork) string {
	return f.Lane + "/" + f.Namespace + "/" + f.Deployment + "@" + strconv.FormatInt(f.ModRevision, 10)
}

// say records status for f, if it is news.
func (c *forkController) say(ctx context.Context, f admin.StoredFork, status string) {
	k := forkKey(f)
	if c.said[k] == status {
		return
	}
	if err := c.forks.SetStatus(ctx, f.ForkRequest, status); err != nil {
		c.log.Warn("fork status not recorded", "lane", f.Lane, "deployment", f.Deployment, "err", err)
		return
	}
	if c.said == nil {
		c.said = map[string]string{}
	}
	c.said[k] = status
}

// ensure makes or updates f's copy (have is the one there, or nil), the
// copies of the ConfigMaps it uses, and the copies of the Services of svcs
// (those of its namespace) that select the Deployment's pods. It returns
// the names of the Services' copies, or nil when it could not tell them.
func (c *forkController) ensure(ctx context.Context, f admin.StoredFork, have *appsv1.Deployment, svcs []corev1.Service) (map[string]bool, error) {
	deps := c.cs.AppsV1().Deployments(f.Namespace)
	base, err := deps.Get(ctx, f.Deployment, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("read deployment %s/%s: %w", f.Namespace, f.Deployment, err)
	}
	d, cms, copies, err := forkDeployment(f.Fork, base, svcs)
	if err != nil {
		return nil, err
	}
	for _, name := range cms {
		if _, err := c.cs.CoreV1().ConfigMaps(f.Namespace).Get(ctx, cmName(name, f.Lane), metav1.GetOptions{}); err == nil {
			continue // made before: the lane may have changed it since
		} else if !apierrors.IsNotFound(err) {
			return nil, err
		}
		src, err := c.cs.CoreV1().ConfigMaps(f.Namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil, fmt.Errorf("read configmap %s/%s: %w", f.Namespace, name, err)
		}
		if _, err := c.cs.CoreV1().ConfigMaps(f.Namespace).Create(ctx, forkConfigMap(f.Fork, src), metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("copy configmap %s/%s: %w", f.Namespace, name, err)
		}
	}
	names := map[string]bool{}
	for _, svc := range copies {
		names[svc.Name] = true
		if err := c.ensureService(ctx, svc, svcs); err != nil {
			return nil, err
		}
	}
	switch {
	case have != nil && !apiequality.Semantic.DeepEqual(have.Spec.Selector, d.Spec.Selector):
		// A Deployment's selector cannot change: a copy made with
		// another one is made again.
		if err := deps.Delete(ctx, have.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return names, fmt.Errorf("delete deployment %s/%s: %w", f.Namespace, have.Name, err)
		}
		fallthrough
	case have == nil:
		if _, err := deps.Create(ctx, d, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return names, fmt.Errorf("create deployment %s/%s: %w", f.Namespace, d.Name, err)
		}
		c.log.Info("fork made", "lane", f.Lane, "namespace", f.Namespace, "deployment", d.Name, "of", f.Deployment)
	case have.Annotations[AnnotationHash] != d.Annotations[AnnotationHash]:
		d.ResourceVersion = have.ResourceVersion
		if _, err := deps.Update(ctx, d, metav1.UpdateOptions{}); err != nil {
			return names, fmt.Errorf("update deployment %s/%s: %w", f.Namespace, d.Name, err)
		}
		c.log.Info("fork updated", "lane", f.Lane, "namespace", f.Namespace, "deployment", d.Name)
	}
	return names, nil
}

// ensureService makes or updates the copy svc of a Service; svcs are the
// Services there are. A Service of the copy's name that is not a copy is
// left alone, and the fork not made.
func (c *forkController) ensureService(ctx context.Context, svc *corev1.Service, svcs []corev1.Service) error {
	api := c.cs.CoreV1().Services(svc.Namespace)
	i := slices.IndexFunc(svcs, func(s corev1.Service) bool { return s.Name == svc.Name })
	switch {
	case i < 0:
		if _, err := api.Create(ctx, svc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("copy service %s/%s: %w", svc.Namespace, svc.Name, err)
		}
	case !isCopy(svcs[i].ObjectMeta) || svcs[i].Annotations[AnnotationFork] != svc.Annotations[AnnotationFork] || svcs[i].Labels[LabelLane] != svc.Labels[LabelLane]:
		return fmt.Errorf("service %s/%s is there and is not this fork's: the copy of a Service is named so", svc.Namespace, svc.Name)
	case svcs[i].Annotations[AnnotationHash] != svc.Annotations[AnnotationHash]:
		svc.ResourceVersion = svcs[i].ResourceVersion
		// What the cluster allocated stays.
		svc.Spec.ClusterIPs, svc.Spec.IPFamilies, svc.Spec.IPFamilyPolicy = svcs[i].Spec.ClusterIPs, svcs[i].Spec.IPFamilies, svcs[i].Spec.IPFamilyPolicy
		if _, err := api.Update(ctx, svc, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("update service %s/%s: %w", svc.Namespace, svc.Name, err)
		}
	}
	return nil
}
