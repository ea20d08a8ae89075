package kube

import (
	"slices"
	"testing"

	"go.uber.org/goleak"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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
	d, cms, err := forkDeployment(f, base)
	if err != nil {
		t.Fatal(err)
	}
	c := d.Spec.Template.Spec.Containers[1]
	switch {
	case d.Name != "orders-alice" || d.Namespace != "shop" || d.ResourceVersion != "" || d.UID != "":
		t.Errorf("meta %+v", d.ObjectMeta)
	case d.Labels[LabelManagedBy] != ManagedBy || d.Labels[LabelLane] != "alice" || d.Annotations[AnnotationFork] != "shop/orders" || d.Annotations["deployment.kubernetes.io/revision"] != "":
		t.Errorf("labels %v annotations %v", d.Labels, d.Annotations)
	case d.Spec.Selector.MatchLabels[LabelLane] != "alice" || d.Spec.Selector.MatchLabels["app"] != "orders" || d.Spec.Template.Labels[LabelLane] != "alice":
		t.Errorf("selector %v, pod labels %v", d.Spec.Selector.MatchLabels, d.Spec.Template.Labels)
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
	again, _, _ := forkDeployment(f, baseDeployment())
	f.Image = "orders:alice-2"
	changed, _, _ := forkDeployment(f, baseDeployment())
	if again.Annotations[AnnotationHash] != d.Annotations[AnnotationHash] || changed.Annotations[AnnotationHash] == d.Annotations[AnnotationHash] {
		t.Error("the hash does not follow the copy")
	}
	f.Container = "nope"
	if _, _, err := forkDeployment(f, baseDeployment()); err == nil {
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
