// Package kubeclient is lanes' client of the Kubernetes API, written once
// for kubestore, the controllers of `lanes up --kube` and the test kit: the
// typed clients of the four API groups lanes reads and writes (core/v1,
// apps/v1, discovery.k8s.io/v1, coordination.k8s.io/v1), with the methods
// of client-go's kubernetes.Interface that return them.
//
// Not kubernetes.Interface itself: its Clientset links the clients, the
// apply configurations and the scheme of every API group Kubernetes has,
// and client-go's leader election links its informers as well. Measured
// with .ci/build-cpu on a program that links only them: 410 s of compile
// CPU for leaderelection (which pulls in kubernetes.Interface), 191 s for
// the four group clients, the informer cache and the dynamic client (58 s
// of either is the standard library); the rest of the lanes binary
// compiles in 372 s.
package kubeclient

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"

	appsv1 "k8s.io/client-go/kubernetes/typed/apps/v1"
	coordinationv1 "k8s.io/client-go/kubernetes/typed/coordination/v1"
	corev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	discoveryv1 "k8s.io/client-go/kubernetes/typed/discovery/v1"
	"k8s.io/client-go/rest"
)

// Clients are the typed clients of the API groups lanes uses.
type Clients struct {
	core         *corev1.CoreV1Client
	apps         *appsv1.AppsV1Client
	discovery    *discoveryv1.DiscoveryV1Client
	coordination *coordinationv1.CoordinationV1Client
}

// New returns the clients of cfg, on one HTTP client.
func New(cfg *rest.Config) (*Clients, error) {
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, err
	}
	return NewForConfigAndClient(cfg, hc)
}

// NewForConfigAndClient returns the clients of cfg on the HTTP client hc.
func NewForConfigAndClient(cfg *rest.Config, hc *http.Client) (*Clients, error) {
	var c Clients
	var err error
	if c.core, err = corev1.NewForConfigAndClient(cfg, hc); err != nil {
		return nil, err
	}
	if c.apps, err = appsv1.NewForConfigAndClient(cfg, hc); err != nil {
		return nil, err
	}
	if c.discovery, err = discoveryv1.NewForConfigAndClient(cfg, hc); err != nil {
		return nil, err
	}
	if c.coordination, err = coordinationv1.NewForConfigAndClient(cfg, hc); err != nil {
		return nil, err
	}
	return &c, nil
}

// CoreV1 is the client of core/v1: pods, Services, ConfigMaps, namespaces.
func (c *Clients) CoreV1() corev1.CoreV1Interface { return c.core }

// AppsV1 is the client of apps/v1: Deployments.
func (c *Clients) AppsV1() appsv1.AppsV1Interface { return c.apps }

// DiscoveryV1 is the client of discovery.k8s.io/v1: EndpointSlices.
func (c *Clients) DiscoveryV1() discoveryv1.DiscoveryV1Interface { return c.discovery }

// CoordinationV1 is the client of coordination.k8s.io/v1: Leases.
func (c *Clients) CoordinationV1() coordinationv1.CoordinationV1Interface { return c.coordination }

// ServerVersion returns the API server's version (GET /version): whether it
// answers, and what it is.
func (c *Clients) ServerVersion(ctx context.Context) (string, error) {
	var v struct {
		GitVersion string `json:"gitVersion"`
	}
	body, err := c.core.RESTClient().Get().AbsPath("/version").Do(ctx).Raw()
	if err != nil {
		return "", err
	}
	if err := json.Unmarshal(body, &v); err != nil {
		return "", fmt.Errorf("GET /version: %w", err)
	}
	return v.GitVersion, nil
}
