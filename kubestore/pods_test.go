package kubestore_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lanesdev/lanes/internal/testkit/kubetest"
	"github.com/lanesdev/lanes/kubestore"
	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/laneshttp"
	"github.com/lanesdev/lanes/policy"
	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

// cluster is a namespace of a test's own on an API server, where the test
// makes what the scheduler, the kubelet and the endpointslice controller
// would: pods, their EndpointSlices.
type cluster struct {
	t   testing.TB
	c   *kubetest.Clients
	ns  string
	ctx context.Context
	rvs map[string]string // the slices this test wrote, at their versions
}

func newCluster(t testing.TB, s *kubetest.Server) *cluster {
	c := s.Clientset(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return &cluster{t: t, c: c, ns: namespace(t, c), ctx: ctx, rvs: map[string]string{}}
}

func (k *cluster) pod(name string, labels map[string]string) {
	k.t.Helper()
	_, err := k.c.CoreV1().Pods(k.ns).Create(k.ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "app"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		k.t.Fatal(err)
	}
}

func (k *cluster) service(name string, annotations map[string]string) {
	k.t.Helper()
	_, err := k.c.CoreV1().Services(k.ns).Create(k.ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: annotations},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}},
	}, metav1.CreateOptions{})
	if err != nil {
		k.t.Fatal(err)
	}
}

// endpoint is one endpoint of a slice of its own (the endpoints of a test
// listen on 127.0.0.1, each on its port).
type endpoint struct {
	service, pod, zone, node string
	addr                     string // 127.0.0.1:port
	ready, serving, term     bool
}

func (k *cluster) slice(name string, e endpoint) {
	k.t.Helper()
	es := sliceOf(k.ns, name, e)
	var got *discoveryv1.EndpointSlice
	var err error
	if rv := k.rvs[name]; rv != "" {
		es.ResourceVersion = rv
		got, err = k.c.DiscoveryV1().EndpointSlices(k.ns).Update(k.ctx, es, metav1.UpdateOptions{})
	} else {
		got, err = k.c.DiscoveryV1().EndpointSlices(k.ns).Create(k.ctx, es, metav1.CreateOptions{})
	}
	if err != nil {
		k.t.Fatal(err)
	}
	k.rvs[name] = got.ResourceVersion
}

// podClient is a client of the engine whose connections go where the pod
// network would take them.
func podClient(e *routing.Engine) *http.Client {
	return laneshttp.NewClient(e, laneshttp.WithBase(&http.Transport{DialContext: kubetest.DialPod}))
}

func sliceOf(ns, name string, e endpoint) *discoveryv1.EndpointSlice {
	host, p, _ := net.SplitHostPort(kubetest.PodAddr(e.addr))
	port, _ := strconv.Atoi(p)
	port32 := int32(port)
	pname := "http"
	ep := discoveryv1.Endpoint{
		Addresses:  []string{host},
		Conditions: discoveryv1.EndpointConditions{Ready: &e.ready, Serving: &e.serving, Terminating: &e.term},
		TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: e.pod},
	}
	if e.zone != "" {
		ep.Zone = &e.zone
	}
	if e.node != "" {
		ep.NodeName = &e.node
	}
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: e.service, discoveryv1.LabelManagedBy: "endpointslice-controller.k8s.io"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{ep},
		Ports:       []discoveryv1.EndpointPort{{Name: &pname, Port: &port32}},
	}
}

// TestPodsJoinByLabel: a pod joins a lane by its label alone. Its
// endpoint is an instance of the lane, with the endpoint's zone and node
// and the pod's lanes.dev/ labels; a lane request reaches it, a baseline
// request never does. Its endpoint going terminating (still serving), then
// not ready, moves the lane's calls to the baseline with no failed call,
// while a call goes every 30ms.
func TestPodsJoinByLabel(t *testing.T) {
	s := kubetest.Start(t)
	k := newCluster(t, s)
	base, feat := kubetest.PodServer(t, "base"), kubetest.PodServer(t, "feat")
	k.service("orders", nil)
	k.pod("orders-base", nil)
	k.pod("orders-feat", map[string]string{kubestore.LabelLane: "feat", "lanes.dev/track": "fast", "app.kubernetes.io/version": "v2", "other": "x"})
	k.slice("orders-1", endpoint{service: "orders", pod: "orders-base", addr: base, ready: true, serving: true, zone: "z1", node: "n1"})
	featEP := endpoint{service: "orders", pod: "orders-feat", addr: feat, ready: true, serving: true, zone: "z2", node: "n2"}
	k.slice("orders-2", featEP)

	st := open(t, s, kubestore.Options{Namespaces: []string{k.ns}})
	e := routing.New(routing.WithRegistry(st))
	defer e.Close()
	got := kubetest.WaitInstances(t, e, "orders", func(in []registry.Instance) bool { return len(in) == 2 })
	for _, in := range got {
		want := registry.Instance{ID: "orders-base." + k.ns, Service: "orders", Addr: kubetest.PodAddr(base), Zone: "z1", Host: "n1", Weight: registry.DefaultWeight}
		if in.Lane != "" {
			want = registry.Instance{ID: "orders-feat." + k.ns, Service: "orders", Addr: kubetest.PodAddr(feat), Lane: "feat", Zone: "z2", Host: "n2",
				Version: "v2", Weight: registry.DefaultWeight, Labels: map[string]string{"track": "fast"}}
		}
		if !in.Equal(want) {
			t.Fatalf("instance %+v, want %+v", in, want)
		}
	}

	c := podClient(e)
	defer c.CloseIdleConnections()
	call := func(l string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if l != "" {
			ctx = lane.WithLane(ctx, l)
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://orders/", nil)
		resp, err := c.Do(req)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			return string(b), fmt.Errorf("status %s", resp.Status)
		}
		return string(b), err
	}
	for range 20 {
		if who, err := call(""); err != nil || who != "base" {
			t.Fatalf("baseline call answered by %q (%v), want base", who, err)
		}
		if who, err := call("feat"); err != nil || who != "feat" {
			t.Fatalf("lane call answered by %q (%v), want feat", who, err)
		}
	}

	// The policy's tag rules apply to the pods' labels, above the
	// registry: a rule on track=fast moves the lane's pod into gray.
	pol := policy.NewMemory()
	if _, err := pol.Put(k.ctx, []byte("tags:\n  - service: orders\n    lane: gray\n    labels: {track: fast}\n")); err != nil {
		t.Fatal(err)
	}
	e2 := routing.New(routing.WithRegistry(st), routing.WithPolicyStore(pol))
	defer e2.Close()
	<-e2.PolicyReady()
	kubetest.WaitInstances(t, e2, "orders", func(in []registry.Instance) bool { return len(in) == 2 })
	if res, err := e2.Service("orders").Pick(routing.Request{Lane: "gray"}); err != nil || res.Instance.Addr != kubetest.PodAddr(feat) {
		t.Fatalf("a gray pick = %+v, %v; want the pod labelled track=fast", res, err)
	}

	for _, change := range []struct {
		name string
		ep   func(endpoint) endpoint
	}{
		{"terminating", func(e endpoint) endpoint { e.ready, e.serving, e.term = false, true, true; return e }},
		{"not ready", func(e endpoint) endpoint { e.ready, e.serving, e.term = false, false, false; return e }},
	} {
		t.Run(change.name, func(t *testing.T) {
			k.slice("orders-2", featEP) // the lane's pod ready again
			kubetest.WaitInstances(t, e, "orders", func(in []registry.Instance) bool {
				return len(in) == 2 && !in[0].Drain && !in[1].Drain
			})
			// A call of the lane every 30ms, across the change.
			var mu sync.Mutex
			var answers []string
			var failed []error
			stop := make(chan struct{})
			done := make(chan struct{})
			warm := make(chan struct{}) // closed after 5 calls that the lane's pod answered
			go func() {
				defer close(done)
				tick := time.NewTicker(30 * time.Millisecond)
				defer tick.Stop()
				since := -1 // calls since the first that the baseline answered
				for since < 10 {
					who, err := call("feat")
					b, berr := call("")
					mu.Lock()
					answers = append(answers, who)
					if err != nil {
						failed = append(failed, err)
					}
					if berr != nil || b != "base" {
						failed = append(failed, fmt.Errorf("baseline call answered by %q (%v)", b, berr))
					}
					mu.Unlock()
					if who == "base" || since >= 0 {
						since++
					}
					if len(answers) == 5 {
						close(warm)
					}
					select {
					case <-stop:
						return
					case <-tick.C:
					}
				}
			}()
			select {
			case <-warm:
			case <-done:
			}
			k.slice("orders-2", change.ep(featEP))
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				close(stop)
				<-done
				t.Fatalf("the lane's calls never moved to the baseline: %v", answers)
			}
			if len(failed) > 0 {
				t.Fatalf("%d failed calls across the change: %v", len(failed), failed)
			}
			after := false
			for _, who := range answers {
				after = after || who == "base"
				if after && who != "base" {
					t.Fatalf("a lane call reached the lane's pod after the move: %v", answers)
				}
			}
			t.Logf("%d lane calls across the change, none failed", len(answers))
		})
	}
}
