// Package kubestore is lanes' registry on the Kubernetes API: a pod joins
// lanes by its labels, and the instances of a service are the ready
// endpoints of its EndpointSlices.
//
// A Store follows, with client-go informers (list, then watch), in the
// namespaces it is given (Options.Namespaces; all by default):
//
//   - EndpointSlices. The service of a slice is its Service's name (the
//     label kubernetes.io/service-name), or the name the Service's
//     annotation lanes.dev/service gives (AnnotationService). Each endpoint
//     is an instance: ready, or terminating but still serving (then it
//     drains: it takes no new requests); a terminating endpoint that no
//     longer serves, or one not ready, is gone. Its address is the
//     endpoint's first address and the slice's port (the one named by the
//     Service's annotation lanes.dev/port, else the first); its zone the
//     endpoint's zone; its host the endpoint's nodeName.
//   - Pods' metadata. The instance of a pod's endpoint is <pod>.<namespace>
//     (the endpoint's targetRef); its lane is the pod's label lanes.dev/lane
//     (LabelLane), its version the label app.kubernetes.io/version, and its
//     labels those of the pod's labels under lanes.dev/ (LabelPrefix),
//     without the prefix, at most MaxLabels of them. An endpoint whose pod
//     the Store has not seen yet is no instance until it has: an unknown
//     pod may be a lane's, and baseline traffic never reaches a lane
//     instance. A lane label that is no valid lane name keeps the endpoint
//     out. An endpoint with no pod takes its lane from the slice's label
//     lanes.dev/lane and is <address>-<port>.<namespace>.
//   - Services' metadata, for the annotations.
//   - lanes' own Leases (the label app.kubernetes.io/managed-by: lanes.dev).
//
// A process that runs in no pod (lanes dev, a test, a service on a laptop)
// registers as with any registry: Register writes an EndpointSlice managed
// by lanes (the label endpointslice.kubernetes.io/managed-by: lanes.dev),
// holding the instance, kept alive by a coordination.k8s.io Lease that it
// renews. See register.go for the protocol. A live registration hides a
// Service's endpoint of the same service with the same id or address, as
// registry.Union decides: a pod that registers itself in a lane is that
// lane's alone. A process in a pod
// (Options.InPod) registers nothing: its pod's endpoints are its
// registration, and Register only hands back a lease for the Serve helpers
// to hold.
//
// Importing the package (blank, for its init) makes lanesenv open
// LANES_REGISTRY=k8s:// URLs, and the in-cluster registry of a pod; see
// ParseURL for the options. docs/kubernetes.md says what RBAC each needs.
package kubestore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/lanesdev/lanes/internal/lib/gogroup"
	"github.com/lanesdev/lanes/internal/lib/kubeclient"
	"github.com/lanesdev/lanes/internal/lib/localip"
	"github.com/lanesdev/lanes/policy"
	"github.com/lanesdev/lanes/registry"
)

// The labels and annotations that the Store reads and writes.
const (
	// LabelLane is the pod label that puts the pod's endpoints in a lane.
	LabelLane = "lanes.dev/lane"
	// LabelPrefix is the prefix of the pod labels that become instance
	// labels (for the policy's tag rules), without it.
	LabelPrefix = "lanes.dev/"
	// MaxLabels bounds the labels an instance takes from its pod: a pod's
	// labels are input from outside.
	MaxLabels = 16
	// AnnotationService, on a Service, names the lanes service of its
	// endpoints (default: the Service's name).
	AnnotationService = "lanes.dev/service"
	// AnnotationPort, on a Service, names the port of its slices that
	// instances are reached on (default: the first).
	AnnotationPort = "lanes.dev/port"
	// labelManagedBy and managedBy mark the EndpointSlices that Register
	// writes (the endpointslice controller leaves them alone), and
	// labelLeaseManagedBy and managedBy the Leases that keep them.
	labelManagedBy      = discoveryv1.LabelManagedBy
	labelLeaseManagedBy = "app.kubernetes.io/managed-by"
	managedBy           = "lanes.dev"
	// labelService, on a managed slice, is its lanes service (when the
	// name is a valid label value), for kubectl's selectors. The slices
	// carry no kubernetes.io/service-name: kube-proxy and DNS must not
	// send a Service's traffic to an instance registered from outside the
	// cluster, which may be a lane's.
	labelService = "lanes.dev/service"
	// annotationInstance holds, on a managed slice, the instance as JSON.
	annotationInstance = "lanes.dev/instance"
	annotationHolder   = "lanes.dev/holder"
	annotationLease    = "lanes.dev/lease"
	annotationTTL      = "lanes.dev/ttl"
	labelVersion       = "app.kubernetes.io/version"
	maxInstanceBytes   = 64 << 10
)

// serviceAnnotations are the annotations of a Service that lanes reads.
var serviceAnnotations = []string{AnnotationService, AnnotationPort}

var (
	errTooLarge = errors.New("instance annotation too large")
	errNoLease  = errors.New("managed slice names no holder or lease")
)

// requestTimeout bounds every call the Store makes to the API server.
const requestTimeout = 5 * time.Second

// Options configure a Store.
type Options struct {
	// Namespaces are the namespaces followed (all when empty).
	Namespaces []string
	// RegisterNamespace is where Register writes its slices and Leases
	// (default: the first of Namespaces, else "default").
	RegisterNamespace string
	// InPod makes Register write nothing: the process runs in a pod whose
	// endpoints are its registration.
	InPod bool
	// PolicyNamespace is the namespace whose ConfigMap PolicyConfigMap the
	// Store's Policy follows: the policy in force, which lanes up --kube
	// publishes there ("": none; Policy stays empty).
	PolicyNamespace string
	// Logger receives the Store's diagnostics (slog.Default() when nil).
	Logger *slog.Logger
}

// PolicyConfigMap is the ConfigMap, in each namespace that lanes up --kube
// serves, where it publishes the policy in force (its PolicyKey), so that
// the services that follow the cluster and not lanes' etcd route by the
// same policy as the control plane.
const PolicyConfigMap = "lanes-policy-in-force"

// PolicyKey is the key of a policy ConfigMap that holds the document.
const PolicyKey = "policy.yaml"

// Store is lanes' registry on the Kubernetes API. It implements
// registry.Registry and registry.Outages. It is safe for concurrent use.
type Store struct {
	o       Options
	cfg     *rest.Config
	http    *http.Client
	kube    *kubeclient.Clients
	meta    metadata.Interface
	log     *slog.Logger
	view    *view
	g       *gogroup.Group
	outages registry.OutageClock
	grace   time.Duration // how long past its expiry a Lease is left to its owner
	leaseCh chan struct{} // a Lease changed: the sweeper looks again

	policy    *policy.Memory // the published policy, when Options.PolicyNamespace says where
	policyRaw string         // its document as last put

	mu        sync.Mutex
	down      map[string]bool // informers whose last list or watch failed
	lastErr   error
	forbidden bool // a deletion was refused: no more
	closeOnce sync.Once
}

var (
	_ registry.Registry = (*Store)(nil)
	_ registry.Outages  = (*Store)(nil)
	_ registry.Reacher  = (*Store)(nil)
)

// Open connects to the API server of cfg, starts the informers and returns
// once they have listed everything, or with the reason they could not
// (for example RBAC's refusal) when ctx ends first.
func Open(ctx context.Context, cfg *rest.Config, o Options) (*Store, error) {
	if o.RegisterNamespace == "" {
		o.RegisterNamespace = "default"
		if len(o.Namespaces) > 0 {
			o.RegisterNamespace = o.Namespaces[0]
		}
	}
	if !o.InPod && len(o.Namespaces) > 0 && !slices.Contains(o.Namespaces, o.RegisterNamespace) {
		return nil, fmt.Errorf("kubestore: RegisterNamespace %q is not among Namespaces %q: the Store would never see its own registrations", o.RegisterNamespace, o.Namespaces)
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	cfg = rest.CopyConfig(cfg)
	if cfg.Proxy == nil {
		// A Proxy makes the transport the Store's own, not client-go's
		// shared one: Close closes its connections.
		cfg.Proxy = http.ProxyFromEnvironment
	}
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, err
	}
	kube, err := kubeclient.NewForConfigAndClient(cfg, hc)
	if err != nil {
		return nil, err
	}
	meta, err := metadata.NewForConfigAndClient(cfg, hc)
	if err != nil {
		return nil, err
	}
	s := &Store{o: o, cfg: cfg, http: hc, kube: kube, meta: meta, log: o.Logger, view: newView(time.Now),
		g: gogroup.New(), down: map[string]bool{}, leaseCh: make(chan struct{}, 1), policy: policy.NewMemory(),
		grace: time.Duration(rand.Int64N(int64(2 * time.Second)))}
	var synced []cache.InformerSynced
	namespaces := o.Namespaces
	if len(namespaces) == 0 {
		namespaces = []string{metav1.NamespaceAll}
	}
	var infs []*informer
	for _, ns := range namespaces {
		infs = append(infs, s.informers(ns)...)
	}
	if o.PolicyNamespace != "" {
		infs = append(infs, s.policyInformer(o.PolicyNamespace))
	}
	for _, inf := range infs {
		reg, err := inf.AddEventHandler(inf.handler)
		if err != nil {
			s.Close()
			return nil, err
		}
		synced = append(synced, reg.HasSynced)
		_ = inf.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) { s.result(inf.name, err) })
		_ = inf.SetTransform(func(o any) (any, error) {
			if m, ok := o.(metav1.Object); ok {
				m.SetManagedFields(nil)
			}
			if p, ok := o.(*metav1.PartialObjectMetadata); ok {
				// Of a pod's or a Service's metadata the informer's
				// cache keeps what lanes reads.
				a := p.Annotations
				p.Annotations, p.OwnerReferences = nil, nil
				for _, n := range serviceAnnotations {
					if val, ok := a[n]; ok {
						if p.Annotations == nil {
							p.Annotations = map[string]string{}
						}
						p.Annotations[n] = val
					}
				}
			}
			return o, nil
		})
		s.g.Go(func() { inf.RunWithContext(s.g.Context()) })
	}
	s.g.Go(s.sweep)
	for {
		all := true
		for _, ok := range synced {
			all = all && ok()
		}
		if all {
			return s, nil
		}
		select {
		case <-ctx.Done():
			s.mu.Lock()
			last := s.lastErr
			s.mu.Unlock()
			s.Close()
			if last != nil {
				return nil, fmt.Errorf("kubestore: the informers could not list: %w", last)
			}
			return nil, fmt.Errorf("kubestore: the informers did not list in time: %w", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

type informer struct {
	cache.SharedIndexInformer
	name    string
	handler cache.ResourceEventHandlerFuncs
}

var (
	podsGVR     = schema.GroupVersionResource{Version: "v1", Resource: "pods"}
	servicesGVR = schema.GroupVersionResource{Version: "v1", Resource: "services"}
)

// informers makes the informers of one namespace ("" for all).
func (s *Store) informers(ns string) []*informer {
	lw := func(resource string, list func(context.Context, metav1.ListOptions) (runtime.Object, error), w func(context.Context, metav1.ListOptions) (watch.Interface, error)) *cache.ListWatch {
		return s.listWatch(resource+"/"+ns, list, w)
	}
	slices := s.kube.DiscoveryV1().EndpointSlices(ns)
	leases := s.kube.CoordinationV1().Leases(ns)
	leaseSel := func(o metav1.ListOptions) metav1.ListOptions {
		o.LabelSelector = labelLeaseManagedBy + "=" + managedBy
		return o
	}
	pods := s.meta.Resource(podsGVR).Namespace(ns)
	services := s.meta.Resource(servicesGVR).Namespace(ns)
	metaList := func(r metadata.ResourceInterface) func(context.Context, metav1.ListOptions) (runtime.Object, error) {
		return func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return r.List(ctx, o) }
	}
	metaHandler := func(set func(ns, name string, m *metav1.ObjectMeta)) cache.ResourceEventHandlerFuncs {
		put := func(o any) {
			if p, ok := o.(*metav1.PartialObjectMetadata); ok {
				set(p.Namespace, p.Name, &p.ObjectMeta)
			}
		}
		return cache.ResourceEventHandlerFuncs{AddFunc: put, UpdateFunc: func(_, o any) { put(o) }, DeleteFunc: func(o any) {
			if p, ok := unwrap(o).(*metav1.PartialObjectMetadata); ok {
				set(p.Namespace, p.Name, nil)
			}
		}}
	}
	putSlice := func(o any) {
		if es, ok := o.(*discoveryv1.EndpointSlice); ok {
			s.view.setSlice(es.Namespace, es.Name, es)
		}
	}
	putLease := func(o any) {
		l, ok := o.(*coordinationv1.Lease)
		if !ok {
			return
		}
		lv := &lease{rv: l.ResourceVersion, seen: time.Now(), duration: registry.DefaultTTL}
		if l.Spec.HolderIdentity != nil {
			lv.holder = *l.Spec.HolderIdentity
		}
		if d := l.Spec.LeaseDurationSeconds; d != nil && *d > 0 {
			lv.duration = time.Duration(*d) * time.Second
		}
		s.view.setLease(l.Namespace, l.Name, lv)
		s.poke()
	}
	return []*informer{
		{name: "endpointslices/" + ns,
			SharedIndexInformer: cache.NewSharedIndexInformer(lw("endpointslices",
				func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return slices.List(ctx, o) },
				slices.Watch), &discoveryv1.EndpointSlice{}, 0, nil),
			handler: cache.ResourceEventHandlerFuncs{AddFunc: putSlice, UpdateFunc: func(_, o any) { putSlice(o) }, DeleteFunc: func(o any) {
				if es, ok := unwrap(o).(*discoveryv1.EndpointSlice); ok {
					s.view.setSlice(es.Namespace, es.Name, nil)
				}
			}}},
		{name: "pods/" + ns,
			SharedIndexInformer: cache.NewSharedIndexInformer(lw("pods", metaList(pods), pods.Watch), &metav1.PartialObjectMetadata{}, 0, nil),
			handler:             metaHandler(s.view.setPod)},
		{name: "services/" + ns,
			SharedIndexInformer: cache.NewSharedIndexInformer(lw("services", metaList(services), services.Watch), &metav1.PartialObjectMetadata{}, 0, nil),
			handler:             metaHandler(s.view.setService)},
		{name: "leases/" + ns,
			SharedIndexInformer: cache.NewSharedIndexInformer(lw("leases",
				func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
					return leases.List(ctx, leaseSel(o))
				},
				func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
					return leases.Watch(ctx, leaseSel(o))
				}),
				&coordinationv1.Lease{}, 0, nil),
			handler: cache.ResourceEventHandlerFuncs{AddFunc: putLease, UpdateFunc: func(_, o any) { putLease(o) }, DeleteFunc: func(o any) {
				if l, ok := unwrap(o).(*coordinationv1.Lease); ok {
					s.view.setLease(l.Namespace, l.Name, nil)
				}
			}}},
	}
}

// listWatch lists and watches with list and w, recording each outcome
// under name (in the outage records).
func (s *Store) listWatch(name string, list func(context.Context, metav1.ListOptions) (runtime.Object, error), w func(context.Context, metav1.ListOptions) (watch.Interface, error)) *cache.ListWatch {
	return &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			obj, err := list(ctx, o)
			s.result(name, err)
			return obj, err
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			wi, err := w(ctx, o)
			s.result(name, err)
			return wi, err
		},
	}
}

// policyInformer follows the published policy of namespace ns: each
// version of its document is put in force in the Store's Policy. A document
// that does not parse leaves the last one in force (the control plane
// validated it; a hand's edit is said in the log), and so does the
// ConfigMap's deletion: the control plane makes it again.
func (s *Store) policyInformer(ns string) *informer {
	cms := s.kube.CoreV1().ConfigMaps(ns)
	sel := func(o metav1.ListOptions) metav1.ListOptions {
		o.FieldSelector = "metadata.name=" + PolicyConfigMap
		return o
	}
	name := "configmaps/" + ns + "/" + PolicyConfigMap
	lw := s.listWatch(name,
		func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return cms.List(ctx, sel(o)) },
		func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return cms.Watch(ctx, sel(o))
		})
	put := func(o any) {
		cm, ok := o.(*corev1.ConfigMap)
		if !ok {
			return
		}
		raw := cm.Data[PolicyKey]
		s.mu.Lock()
		defer s.mu.Unlock()
		if raw == s.policyRaw {
			return
		}
		if _, err := s.policy.Put(context.Background(), []byte(raw)); err != nil {
			s.log.Warn("kubestore: the published policy does not parse; the last one stays in force", "configmap", ns+"/"+PolicyConfigMap, "err", err)
			return
		}
		s.policyRaw = raw
	}
	return &informer{name: name,
		SharedIndexInformer: cache.NewSharedIndexInformer(lw, &corev1.ConfigMap{}, 0, nil),
		handler:             cache.ResourceEventHandlerFuncs{AddFunc: put, UpdateFunc: func(_, o any) { put(o) }}}
}

// Policy returns the policy in force that the Store follows (Options.PolicyNamespace):
// empty until its ConfigMap is seen, and always when it follows none.
func (s *Store) Policy() policy.Store { return s.policy }

func unwrap(o any) any {
	if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
		return d.Obj
	}
	return o
}

// result records how an informer's list or watch went: a failure is an
// outage, and so is the first success after one (registry.Outages: the
// Leases that expired meanwhile were not deregistrations).
func (s *Store) result(name string, err error) {
	if err != nil && (apierrors.IsResourceExpired(err) || apierrors.IsGone(err) || s.g.Closed()) {
		return // history compacted: the informer lists again; no outage
	}
	s.mu.Lock()
	was := s.down[name]
	s.down[name] = err != nil
	if err != nil {
		s.lastErr = err
	}
	s.mu.Unlock()
	if err == nil && !was {
		return
	}
	s.outages.Mark(time.Now())
	if strings.HasPrefix(name, "leases/") {
		s.view.staleLeases(err != nil)
		s.poke()
	}
	if err != nil && !was {
		s.log.Warn("kubestore: the API server does not answer; routing on what was seen", "resource", name, "err", err)
	} else if err == nil {
		s.log.Info("kubestore: the API server answers again", "resource", name)
	}
}

// LastOutage implements registry.Outages: the last list or watch that
// failed, the first that succeeded after one, or a Lease renewal that
// failed.
func (s *Store) LastOutage() time.Time { return s.outages.Last() }

// LocalIP implements registry.Reacher: the local address of this host's
// route to the API server.
func (s *Store) LocalIP() net.IP { return localip.Toward(s.cfg.Host) }

func (s *Store) poke() {
	select {
	case s.leaseCh <- struct{}{}:
	default:
	}
}

// sweep expires the managed slices whose Lease ran out, at the moment it
// does, and deletes them with their Lease once they have been expired for
// the Store's grace (a random delay under 2s, so that the Stores that see
// the same expiry do not all try at once; a deletion is conditional on the
// version seen, so only one succeeds).
func (s *Store) sweep() {
	ctx := s.g.Context()
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		next, slices, leases := s.view.expire(s.grace)
		for _, sl := range slices {
			rv := sl.obj.ResourceVersion
			s.delete(ctx, "endpointslice", sl.key, func(c context.Context, o metav1.DeleteOptions) error {
				o.Preconditions = &metav1.Preconditions{ResourceVersion: &rv}
				return s.kube.DiscoveryV1().EndpointSlices(sl.ns).Delete(c, sl.obj.Name, o)
			})
		}
		for _, k := range leases {
			ns, name := splitKey(k)
			s.delete(ctx, "lease", k, func(c context.Context, o metav1.DeleteOptions) error {
				return s.kube.CoordinationV1().Leases(ns).Delete(c, name, o)
			})
		}
		wait := time.Minute
		if !next.IsZero() {
			wait = time.Until(next) + time.Millisecond
		}
		t.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-s.leaseCh:
		}
		if !t.Stop() {
			select {
			case <-t.C:
			default:
			}
		}
	}
}

func (s *Store) delete(ctx context.Context, what, k string, del func(context.Context, metav1.DeleteOptions) error) {
	s.mu.Lock()
	forbidden := s.forbidden
	s.mu.Unlock()
	if forbidden {
		return
	}
	c, cancel := context.WithTimeout(ctx, requestTimeout)
	err := del(c, metav1.DeleteOptions{})
	cancel()
	switch {
	case err == nil:
		s.log.Info("kubestore: deleted an expired registration", "kind", what, "name", k)
	case apierrors.IsForbidden(err):
		s.mu.Lock()
		s.forbidden = true
		s.mu.Unlock()
		s.log.Warn("kubestore: may not delete expired registrations; leaving them to another", "kind", what, "name", k, "err", err)
	case apierrors.IsNotFound(err), apierrors.IsConflict(err):
		// Another got there first, or it was renewed.
	default:
		s.log.Debug("kubestore: could not delete an expired registration", "kind", what, "name", k, "err", err)
	}
}

func splitKey(k string) (ns, name string) {
	ns, name, _ = strings.Cut(k, "/")
	return ns, name
}

// Close implements registry.Registry: it stops the informers and ends
// every watcher. Registrations still open expire with their Lease.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		v := s.view
		v.mu.Lock()
		v.closed = true
		for w := range v.watchers {
			w.closeLocked()
		}
		v.signal()
		v.mu.Unlock()
		s.g.Close()
		s.http.CloseIdleConnections()
	})
	return nil
}
