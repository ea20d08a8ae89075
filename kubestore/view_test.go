package kubestore

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lanesdev/lanes/registry"
)

func ptr[T any](v T) *T { return &v }

func epOf(pod, addr string, ready, serving, term *bool) discoveryv1.Endpoint {
	ep := discoveryv1.Endpoint{Addresses: []string{addr},
		Conditions: discoveryv1.EndpointConditions{Ready: ready, Serving: serving, Terminating: term}}
	if pod != "" {
		ep.TargetRef = &corev1.ObjectReference{Kind: "Pod", Name: pod}
	}
	return ep
}

func sliceObj(name, service string, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", ResourceVersion: "1",
			Labels: map[string]string{discoveryv1.LabelServiceName: service}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   eps,
		Ports:       []discoveryv1.EndpointPort{{Port: ptr(int32(8080))}},
	}
}

// TestEndpointConditions: ready is an instance; terminating and serving
// drains; terminating and not serving, or not ready, is none; an endpoint
// whose pod is not known yet is none until the pod is seen, and one whose
// pod's lane label is no lane name is none.
func TestEndpointConditions(t *testing.T) {
	v := newView(time.Now)
	w := &watcher{v: v, wake: make(chan struct{}, 1)}
	v.watchers[w] = struct{}{}
	yes, no := ptr(true), ptr(false)
	v.setPod("ns", "ready", &metav1.ObjectMeta{})
	v.setPod("ns", "draining", &metav1.ObjectMeta{Labels: map[string]string{LabelLane: "Feat"}})
	v.setPod("ns", "gone", &metav1.ObjectMeta{})
	v.setPod("ns", "notready", &metav1.ObjectMeta{})
	v.setPod("ns", "badlane", &metav1.ObjectMeta{Labels: map[string]string{LabelLane: "no lane"}})
	v.setSlice("ns", "s1", sliceObj("s1", "orders",
		epOf("ready", "10.0.0.1", nil, nil, nil),
		epOf("draining", "10.0.0.2", no, yes, yes),
		epOf("gone", "10.0.0.3", no, no, yes),
		epOf("notready", "10.0.0.4", no, no, no),
		epOf("badlane", "10.0.0.5", yes, yes, no),
		epOf("unseen", "10.0.0.6", yes, yes, no),
	))
	got := v.insts["orders"]
	if len(got) != 2 {
		t.Fatalf("instances %v, want ready and draining", got)
	}
	if in := got["ready.ns"].inst; in.Drain || in.Lane != "" || in.Addr != "10.0.0.1:8080" {
		t.Fatalf("ready: %+v", in)
	}
	if in := got["draining.ns"].inst; !in.Drain || in.Lane != "feat" {
		t.Fatalf("draining: %+v", in)
	}
	// The unseen pod appears as a lane's: its endpoint joins then, in its lane.
	v.setPod("ns", "unseen", &metav1.ObjectMeta{Labels: map[string]string{LabelLane: "x"}})
	if in := v.insts["orders"]["unseen.ns"]; in == nil || in.inst.Lane != "x" {
		t.Fatalf("unseen pod once seen: %+v", in)
	}
	// A Service's annotation moves its endpoints to another lanes service.
	v.setService("ns", "orders", &metav1.ObjectMeta{Annotations: map[string]string{AnnotationService: "orders-v2"}})
	if len(v.insts["orders"]) != 0 || len(v.insts["orders-v2"]) != 3 {
		t.Fatalf("after the mapping: %v / %v", v.insts["orders"], v.insts["orders-v2"])
	}
	// Every change reached the watcher, in order, with growing revisions.
	var st registry.State
	last := int64(0)
	for _, b := range w.pending {
		for _, ev := range b.Events {
			if ev.Revision <= last {
				t.Fatalf("revision %d after %d", ev.Revision, last)
			}
			last = ev.Revision
		}
		st.Apply(b)
	}
	if len(st.Instances("orders")) != 0 || len(st.Instances("orders-v2")) != 3 {
		t.Fatalf("the watcher's state: %v", st.Services)
	}
}

// TestPodLabelsBounded: only labels under lanes.dev/ become instance
// labels, without the prefix, and at most MaxLabels of them.
func TestPodLabelsBounded(t *testing.T) {
	labels := map[string]string{"app": "x", LabelLane: "l"}
	for i := range 3 * MaxLabels {
		labels[fmt.Sprintf("%sk%03d", LabelPrefix, i)] = "v"
	}
	got := podLabels(labels)
	if len(got) != MaxLabels || got["k000"] != "v" || got["app"] != "" || got["lane"] != "" {
		t.Fatalf("podLabels = %v", got)
	}
}

// TestLeaseExpiry: a managed slice is an instance while its Lease, by the
// view's own clock from when it saw the Lease renewed, has not expired;
// while the Lease informer cannot be trusted nothing expires, and once it
// is back every Lease counts afresh.
func TestLeaseExpiry(t *testing.T) {
	now := time.Unix(1000, 0)
	v := newView(func() time.Time { return now })
	in := registry.Instance{Service: "orders", ID: "dev", Addr: "10.0.0.1:80"}
	raw, _ := json.Marshal(in)
	v.setSlice("ns", "s", &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "s", Namespace: "ns", ResourceVersion: "1",
		Labels:      map[string]string{labelManagedBy: managedBy},
		Annotations: map[string]string{annotationInstance: string(raw), annotationHolder: "tok", annotationLease: "l", annotationTTL: "2s"}}})
	if v.insts["orders"]["dev"] != nil {
		t.Fatal("shown before its Lease was seen")
	}
	renew := func(rv string) {
		v.setLease("ns", "l", &lease{rv: rv, holder: "tok", duration: 2 * time.Second, seen: now})
	}
	renew("1")
	shown := func() bool { v.expire(0); return v.insts["orders"]["dev"] != nil }
	if !shown() {
		t.Fatal("not shown with its Lease")
	}
	now = now.Add(1500 * time.Millisecond)
	renew("2")
	now = now.Add(1500 * time.Millisecond)
	if !shown() {
		t.Fatal("expired although renewed")
	}
	v.staleLeases(true)
	now = now.Add(time.Minute)
	if !shown() {
		t.Fatal("expired while the Lease informer could not be trusted")
	}
	v.staleLeases(false)
	now = now.Add(1500 * time.Millisecond)
	if !shown() {
		t.Fatal("expired at once when the Lease informer came back")
	}
	now = now.Add(time.Second)
	if shown() {
		t.Fatal("still shown past its Lease")
	}
	// Another holder's Lease does not hold the slice.
	v.setLease("ns", "l", &lease{rv: "3", holder: "other", duration: time.Hour, seen: now})
	if shown() {
		t.Fatal("shown under another registration's Lease")
	}
}

// TestRegistrationShadowsEndpoint: a live registration hides a Service's
// endpoint at its address, as registry.Union does: a pod without a lane
// label that registers itself in lane alice is alice's, never the
// baseline's; once the registration ends, the endpoint is back.
func TestRegistrationShadowsEndpoint(t *testing.T) {
	now := time.Unix(1000, 0)
	v := newView(func() time.Time { return now })
	v.setPod("ns", "p", &metav1.ObjectMeta{})
	v.setPod("ns", "q", &metav1.ObjectMeta{})
	v.setSlice("ns", "s1", sliceObj("s1", "orders", epOf("p", "10.0.0.1", nil, nil, nil), epOf("q", "10.0.0.2", nil, nil, nil)))
	register := func(name string, in registry.Instance) {
		raw, _ := json.Marshal(in)
		v.setSlice("ns", name, &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", ResourceVersion: "1",
			Labels:      map[string]string{labelManagedBy: managedBy},
			Annotations: map[string]string{annotationInstance: string(raw), annotationHolder: "tok", annotationLease: "l", annotationTTL: "2s"}}})
	}
	register("a-0", registry.Instance{Service: "orders", ID: "p-in-alice", Addr: "10.0.0.1:8080", Lane: "alice"})
	register("a-1", registry.Instance{Service: "orders", ID: "elsewhere", Addr: "10.0.0.9:8080", Lane: "alice"})
	v.setLease("ns", "l", &lease{rv: "1", holder: "tok", duration: 2 * time.Second, seen: now})
	v.expire(0)
	lanes := func() map[string]string {
		got := map[string]string{}
		for id, sh := range v.insts["orders"] {
			got[id] = sh.inst.Lane
		}
		return got
	}
	if got, want := lanes(), map[string]string{"p-in-alice": "alice", "elsewhere": "alice", "q.ns": ""}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("with the registrations: %v, want %v", got, want)
	}
	now = now.Add(3 * time.Second)
	v.expire(0)
	if got, want := lanes(), map[string]string{"p.ns": "", "q.ns": ""}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("once the registrations expired: %v, want %v", got, want)
	}
}
