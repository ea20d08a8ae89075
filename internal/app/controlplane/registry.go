package controlplane

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/lanesdev/lanes/internal/lib/regopen"
	"github.com/lanesdev/lanes/registry"
)

// kubeScheme is the scheme of the Kubernetes registry, which a program
// links in with a blank import of package kubestore (the lanes binary does).
const kubeScheme = "k8s"

// kubeListTimeout bounds the first list of the pods that lanes up follows.
const kubeListTimeout = 30 * time.Second

// registryComponent is the registry the control plane routes from: the
// store, and with kube.enabled the pods of the namespaces of
// kube.namespaces as well, through the Kubernetes registry that regopen
// has linked in (so that this package does not link client-go). The two
// are one registry.Union, etcd first: an instance registered in etcd (a
// pod whose process registers itself through the admin API, in its lane)
// hides the endpoint of the same service at the same address, which the
// cluster alone would take for the baseline's.
type registryComponent struct {
	close func() error
}

func (*registryComponent) Name() string    { return "registry" }
func (*registryComponent) Needs() []Dep    { return []Dep{StoreKey} }
func (*registryComponent) Provides() []Dep { return []Dep{RegistryKey, KubeRegistryKey} }

func (*registryComponent) Validate(cfg *Config) error {
	if !cfg.Kube.Enabled {
		return nil
	}
	if _, ok := regopen.Get(kubeScheme); !ok {
		return cfg.fail("kube.enabled", "true", "this program does not link the Kubernetes registry (a blank import of github.com/lanesdev/lanes/kubestore)")
	}
	return nil
}

// kubeRegistryURL is the LANES_REGISTRY of the pods that the control plane
// follows: the namespaces of cfg's kube settings, through its kubeconfig.
// The policy is not read there: etcd's is the one in force, which lanes up
// publishes to the cluster. What it registers there (the mirror of etcd's
// instances, which the Kubernetes controllers keep) goes to a managed
// EndpointSlice of the first namespace, also when lanes up runs in a pod.
func kubeRegistryURL(cfg *Config) string {
	ns := cfg.KubeNamespaces()
	q := url.Values{"namespace": {strings.Join(ns, ",")}, "policy": {"off"}, "register": {"slice"}, "register-namespace": {ns[0]}}
	if cfg.Kube.Kubeconfig != "" {
		q.Set("kubeconfig", cfg.Kube.Kubeconfig)
	}
	return kubeScheme + "://?" + q.Encode()
}

func (c *registryComponent) Provision(ctx context.Context, rt *Runtime) error {
	st := Need(rt, StoreKey)
	if !rt.Config.Kube.Enabled {
		Provide[registry.Registry](rt, RegistryKey, st)
		Provide[registry.Registry](rt, KubeRegistryKey, nil)
		return nil
	}
	b, _ := regopen.Get(kubeScheme)
	ns := strings.Join(rt.Config.KubeNamespaces(), ",")
	// The informers list everything before lanes up serves; an API server
	// that refuses them (RBAC) is named once this time is up.
	octx, cancel := context.WithTimeout(ctx, kubeListTimeout)
	defer cancel()
	k, err := b.Open(octx, kubeRegistryURL(&rt.Config), nil, rt.Log.With("component", "registry"))
	if err != nil {
		return fmt.Errorf("the pods of %s: %w", ns, err)
	}
	c.close = k.Close
	Provide(rt, RegistryKey, registry.Union(st, k.Registry))
	Provide(rt, KubeRegistryKey, k.Registry)
	rt.Announce(Address{Name: "pods", URL: kubeScheme + "://?namespace=" + ns, Note: "routed to, with the instances in etcd"})
	return nil
}

func (c *registryComponent) Cleanup() error {
	if c.close != nil {
		return c.close()
	}
	return nil
}
