package kube

import (
	"maps"
	"slices"
	"strings"
	"testing"

	"go.uber.org/goleak"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/lanesdev/lanes/adminapi"
	"github.com/lanesdev/lanes/internal/testkit/leaktest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, leaktest.Options()...) }

func baseDeployment() *appsv1.Deployment {
	labels := map[string]string{"app": "orders", "app.kubernetes.io/managed-by": "Helm"}
	three := int32(3)
	cmRef := func(n string) corev1.LocalObjectReference { return corev1.LocalObjectReference{Name: n} }
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "orders", Namespace: "shop", Labels: labels, ResourceVersion: "7", UID: "u1",
			Annotations: map[string]string{"deployment.kubernetes.io/revision": "4"}},
		Spec: appsv1.DeploymentSpec{
			Replicas: &three,
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "orders"}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "orders"}},
				Spec: corev1.PodSpec{
					InitContainers: []corev1.Container{{Name: "init", Image: "init:1",
						Env: []corev1.EnvVar{{Name: "X", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: cmRef("shared"), Key: "x"}}}}}},
					Containers: []corev1.Container{
						{Name: "proxy", Image: "proxy:1"},
						{Name: "orders", Image: "orders:1", Env: []corev1.EnvVar{{Name: "MODE", Value: "baseline"}},
							EnvFrom: []corev1.EnvFromSource{{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: cmRef("orders-env")}}}},
					},
					Volumes: []corev1.Volume{
						{Name: "a", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: cmRef("orders-env")}}},
						{Name: "b", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
							{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: cmRef("extra")}}}}}},
					},
				},
			},
		},
	}
}

// TestForkDeployment: the copy is named after the lane, its selector and
// pods carry the lane, it has one replica, the named container's image and
// variables change, every ConfigMap reference moves to the lane's copy,
// and nothing of the baseline's object identity or the baseline itself
// changes.
func TestForkDeployment(t *testing.T) {
	base := baseDeployment()
	before := base.DeepCopy()
	f := adminapi.Fork{ForkRequest: adminapi.ForkRequest{Lane: "alice", Namespace: "shop", Deployment: "orders", Container: "orders",
		Image: "orders:alice", Env: map[string]string{"MODE": "alice", "DEBUG": "1"}, ConfigMaps: true}, Name: "orders-alice"}
	d, cms, svcs, err := forkDeployment(f, base, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := d.Spec.Template.Spec.Containers[1]
	switch {
	case d.Name != "orders-alice" || d.Namespace != "shop" || d.ResourceVersion != "" || d.UID != "":
		t.Errorf("meta %+v", d.ObjectMeta)
	case d.Labels[LabelManagedBy] != ManagedBy || d.Labels[LabelLane] != "alice" || d.Annotations[AnnotationFork] != "shop/orders" || d.Annotations["deployment.kubernetes.io/revision"] != "":
		t.Errorf("labels %v annotations %v", d.Labels, d.Annotations)
	case !maps.Equal(d.Spec.Selector.MatchLabels, map[string]string{LabelLane: "alice", LabelForkOf: "orders"}) ||
		!maps.Equal(d.Spec.Template.Labels, map[string]string{"app": "orders", LabelLane: "alice", LabelForkOf: "orders"}):
		t.Errorf("selector %v, pod labels %v: want the lane and the Deployment, and the baseline's labels, no Service selecting them", d.Spec.Selector.MatchLabels, d.Spec.Template.Labels)
	case len(svcs) != 0:
		t.Errorf("Services copied with no Service there: %v", svcs)
	case *d.Spec.Replicas != 1:
		t.Errorf("replicas %d", *d.Spec.Replicas)
	case c.Image != "orders:alice" || len(c.Env) != 2 || c.Env[0].Value != "alice" || c.Env[1].Name != "DEBUG":
		t.Errorf("container %+v", c)
	case d.Spec.Template.Spec.Containers[0].Image != "proxy:1":
		t.Errorf("another container changed: %+v", d.Spec.Template.Spec.Containers[0])
	case !slices.Equal(cms, []string{"orders-env", "extra", "shared"}):
		t.Errorf("ConfigMaps %v", cms)
	case c.EnvFrom[0].ConfigMapRef.Name != "orders-env-alice" ||
		d.Spec.Template.Spec.Volumes[0].ConfigMap.Name != "orders-env-alice" ||
		d.Spec.Template.Spec.Volumes[1].Projected.Sources[0].ConfigMap.Name != "extra-alice" ||
		d.Spec.Template.Spec.InitContainers[0].Env[0].ValueFrom.ConfigMapKeyRef.Name != "shared-alice":
		t.Errorf("ConfigMap references %+v", d.Spec.Template.Spec)
	}
	if b, _ := hashOf(base); b != mustHash(t, before) {
		t.Error("the baseline's object changed")
	}
	// The hash follows what is written: the same fork hashes the same, a
	// changed one otherwise.
	again, _, _, _ := forkDeployment(f, baseDeployment(), nil)
	f.Image = "orders:alice-2"
	changed, _, _, _ := forkDeployment(f, baseDeployment(), nil)
	if again.Annotations[AnnotationHash] != d.Annotations[AnnotationHash] || changed.Annotations[AnnotationHash] == d.Annotations[AnnotationHash] {
		t.Error("the hash does not follow the copy")
	}
	f.Container = "nope"
	if _, _, _, err := forkDeployment(f, baseDeployment(), nil); err == nil {
		t.Error("a container the Deployment does not have was taken")
	}
}

func mustHash(t *testing.T, v any) string {
	h, err := hashOf(v)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// TestForkServices: no Service that selects the baseline's pods selects
// the copy's, each has a headless copy that selects the copy's pods alone
// and is read as the same lanes service, and a Service that selects other
// pods, or none, is left alone.
func TestForkServices(t *testing.T) {
	base := baseDeployment()
	base.Spec.Template.Labels = map[string]string{"app": "orders", "tier": "web", "team": "shop"}
	svc := func(name string, sel map[string]string, ann map[string]string) corev1.Service {
		return corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "shop", Annotations: ann},
			Spec: corev1.ServiceSpec{Selector: sel, ClusterIP: "10.0.0.7", Type: corev1.ServiceTypeNodePort,
				Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), NodePort: 30080}}}}
	}
	long := strings.Repeat("x", 60)
	svcs := []corev1.Service{
		svc("orders", map[string]string{"app": "orders"}, nil),
		svc("web", map[string]string{"tier": "web", "team": "shop"}, map[string]string{"lanes.dev/service": "frontend", "lanes.dev/port": "http"}),
		svc("both", map[string]string{"app": "orders", "tier": "web"}, nil), // shares a label with orders
		svc(long, map[string]string{"team": "shop"}, nil),
		svc("payments", map[string]string{"app": "payments"}, nil),
		svc("external", nil, nil),
	}
	f := adminapi.Fork{ForkRequest: adminapi.ForkRequest{Lane: "alice", Namespace: "shop", Deployment: "orders"}, Name: "orders-alice"}
	d, _, copies, err := forkDeployment(f, base, svcs)
	if err != nil {
		t.Fatal(err)
	}
	pod := d.Spec.Template.Labels
	for _, s := range svcs {
		if len(s.Spec.Selector) > 0 && selects(s.Spec.Selector, pod) {
			t.Errorf("Service %s (%v) selects the copy's pods %v", s.Name, s.Spec.Selector, pod)
		}
	}
	if !selects(d.Spec.Selector.MatchLabels, pod) || selects(d.Spec.Selector.MatchLabels, base.Spec.Template.Labels) {
		t.Errorf("the copy's selector %v: want its pods %v and not the baseline's", d.Spec.Selector.MatchLabels, pod)
	}
	got := map[string]*corev1.Service{}
	for _, c := range copies {
		got[c.Name] = c
		switch {
		case c.Spec.ClusterIP != corev1.ClusterIPNone || c.Spec.Type != "" || len(c.Spec.Ports) != 1 || c.Spec.Ports[0].NodePort != 0 || c.Spec.Ports[0].TargetPort.IntValue() != 8080:
			t.Errorf("copy %s: spec %+v, want headless with the ports", c.Name, c.Spec)
		case !selects(c.Spec.Selector, pod) || selects(c.Spec.Selector, base.Spec.Template.Labels):
			t.Errorf("copy %s: selector %v, want the copy's pods alone", c.Name, c.Spec.Selector)
		case !isCopy(c.ObjectMeta) || c.Labels[LabelLane] != "alice" || c.Annotations[AnnotationHash] == "":
			t.Errorf("copy %s: labels %v annotations %v", c.Name, c.Labels, c.Annotations)
		case len(c.Name) > 63:
			t.Errorf("copy %s: a name longer than a Service's", c.Name)
		}
	}
	want := map[string]string{"orders-alice": "orders", "orders-alice-web": "frontend", "orders-alice-both": "both"}
	for name, service := range want {
		if c := got[name]; c == nil || c.Annotations["lanes.dev/service"] != service {
			t.Errorf("copy %s: %v, want one read as lanes service %s", name, c, service)
		}
	}
	if got["orders-alice-web"] != nil && got["orders-alice-web"].Annotations["lanes.dev/port"] != "http" {
		t.Error("the copy of web lost its lanes.dev/port")
	}
	if len(copies) != 4 {
		t.Errorf("%d copies, want 4 (orders, web, both and the long one)", len(copies))
	}
	// A Service that would select the copy's pods by the lane's own
	// labels: no copy is made.
	laneSel := svc("lane", map[string]string{LabelLane: "alice", "tier": "web"}, nil)
	withLane := base.DeepCopy()
	withLane.Spec.Template.Labels[LabelLane] = "alice"
	if _, _, _, err := forkDeployment(f, withLane, []corev1.Service{laneSel}); err == nil || !strings.Contains(err.Error(), "service shop/lane selects") {
		t.Errorf("a Service selecting by the lane's label: %v", err)
	}
	// A Service the controller made is never copied in turn.
	if _, _, again, _ := forkDeployment(f, base, append(svcs, *copies[0])); len(again) != len(copies) {
		t.Errorf("a copy of a copy: %d copies", len(again))
	}
}
