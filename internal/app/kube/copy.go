package kube

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"slices"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lanesdev/lanes/adminapi"
)

// The labels and annotations of what the fork controller makes. Its objects
// are the ones with ManagedBy and an AnnotationFork: it finds them again by
// them after a restart, and touches no other.
const (
	// LabelLane puts a pod into a lane: the registry on Kubernetes reads
	// it, and a fork's selector includes it.
	LabelLane = "lanes.dev/lane"
	// LabelManagedBy and ManagedBy mark the objects the controller owns.
	LabelManagedBy = "app.kubernetes.io/managed-by"
	ManagedBy      = "lanes.dev"
	// AnnotationFork names the Deployment a copy was made of
	// ("<namespace>/<name>"), on the copy and on its ConfigMaps' copies.
	AnnotationFork = "lanes.dev/fork-of"
	// AnnotationHash is the hash of what the controller wrote; a copy
	// whose hash differs from what it would write now is updated.
	AnnotationHash = "lanes.dev/fork-hash"
)

// forkDeployment returns lane f's copy of the Deployment base, and the
// ConfigMaps it copies (their names in base, to copy as cmName).
func forkDeployment(f adminapi.Fork, base *appsv1.Deployment) (*appsv1.Deployment, []string, error) {
	d := &appsv1.Deployment{
		TypeMeta: metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"},
		ObjectMeta: metav1.ObjectMeta{
			Name:        f.Name,
			Namespace:   f.Namespace,
			Labels:      maps.Clone(base.Labels),
			Annotations: map[string]string{AnnotationFork: f.Namespace + "/" + f.Deployment},
		},
	}
	if d.Labels == nil {
		d.Labels = map[string]string{}
	}
	d.Labels[LabelLane] = f.Lane
	d.Labels[LabelManagedBy] = ManagedBy
	spec := base.Spec.DeepCopy()
	replicas := int32(f.Replicas)
	if replicas <= 0 {
		replicas = 1
	}
	spec.Replicas = &replicas
	// The copy's selector includes the lane, so that its ReplicaSets and
	// pods are apart from the baseline's.
	sel := spec.Selector.DeepCopy()
	if sel == nil {
		sel = &metav1.LabelSelector{}
	}
	if sel.MatchLabels == nil {
		sel.MatchLabels = map[string]string{}
	}
	sel.MatchLabels[LabelLane] = f.Lane
	spec.Selector = sel
	if spec.Template.Labels == nil {
		spec.Template.Labels = map[string]string{}
	}
	spec.Template.Labels[LabelLane] = f.Lane
	pod := &spec.Template.Spec
	if len(pod.Containers) == 0 {
		return nil, nil, fmt.Errorf("deployment %s/%s has no container", base.Namespace, base.Name)
	}
	c := &pod.Containers[0]
	if f.Container != "" {
		c = nil
		for i := range pod.Containers {
			if pod.Containers[i].Name == f.Container {
				c = &pod.Containers[i]
			}
		}
		if c == nil {
			return nil, nil, fmt.Errorf("deployment %s/%s has no container %q", base.Namespace, base.Name, f.Container)
		}
	}
	if f.Image != "" {
		c.Image = f.Image
	}
	for _, k := range slices.Sorted(maps.Keys(f.Env)) {
		setEnv(c, k, f.Env[k])
	}
	var cms []string
	if f.ConfigMaps {
		cms = renameConfigMaps(pod, f.Lane)
	}
	d.Spec = *spec
	h, err := hashOf(d.Labels, d.Spec)
	if err != nil {
		return nil, nil, err
	}
	d.Annotations[AnnotationHash] = h
	return d, cms, nil
}

// cmName is the name of lane's copy of the ConfigMap name.
func cmName(name, lane string) string { return name + "-" + lane }

func setEnv(c *corev1.Container, k, v string) {
	for i := range c.Env {
		if c.Env[i].Name == k {
			c.Env[i] = corev1.EnvVar{Name: k, Value: v}
			return
		}
	}
	c.Env = append(c.Env, corev1.EnvVar{Name: k, Value: v})
}

// renameConfigMaps points every reference of the pod to a ConfigMap at
// the lane's copy, and returns the ConfigMaps referred to.
func renameConfigMaps(pod *corev1.PodSpec, lane string) []string {
	seen := map[string]bool{}
	var out []string
	ref := func(name *string) {
		if *name == "" {
			return
		}
		if !seen[*name] {
			seen[*name] = true
			out = append(out, *name)
		}
		*name = cmName(*name, lane)
	}
	for i := range pod.Volumes {
		v := &pod.Volumes[i]
		if v.ConfigMap != nil {
			ref(&v.ConfigMap.Name)
		}
		if v.Projected != nil {
			for j := range v.Projected.Sources {
				if s := v.Projected.Sources[j].ConfigMap; s != nil {
					ref(&s.Name)
				}
			}
		}
	}
	for _, cs := range [][]corev1.Container{pod.InitContainers, pod.Containers} {
		for i := range cs {
			c := &cs[i]
			for j := range c.EnvFrom {
				if r := c.EnvFrom[j].ConfigMapRef; r != nil {
					ref(&r.Name)
				}
			}
			for j := range c.Env {
				if vf := c.Env[j].ValueFrom; vf != nil && vf.ConfigMapKeyRef != nil {
					ref(&vf.ConfigMapKeyRef.Name)
				}
			}
		}
	}
	return out
}

// forkConfigMap returns lane f's copy of the ConfigMap base.
func forkConfigMap(f adminapi.Fork, base *corev1.ConfigMap) *corev1.ConfigMap {
	labels := maps.Clone(base.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	labels[LabelLane] = f.Lane
	labels[LabelManagedBy] = ManagedBy
	return &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{
			Name: cmName(base.Name, f.Lane), Namespace: f.Namespace, Labels: labels,
			Annotations: map[string]string{AnnotationFork: f.Namespace + "/" + f.Deployment},
		},
		Data:       maps.Clone(base.Data),
		BinaryData: maps.Clone(base.BinaryData),
	}
}

func hashOf(v ...any) (string, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8]), nil
}
