package kube

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/lanesdev/lanes/adminapi"
	"github.com/lanesdev/lanes/kubestore"
)

// The labels and annotations of what the fork controller makes. Its objects
// are the ones with ManagedBy and an AnnotationFork: it finds them again by
// them after a restart, and touches no other.
const (
	// LabelLane puts a pod into a lane: the registry on Kubernetes reads
	// it, and a fork's selector includes it.
	LabelLane = kubestore.LabelLane
	// LabelManagedBy and ManagedBy mark the objects the controller owns.
	LabelManagedBy = "app.kubernetes.io/managed-by"
	ManagedBy      = "lanes.dev"
	// AnnotationFork names the Deployment a copy was made of
	// ("<namespace>/<name>"), on the copy and on its ConfigMaps' copies.
	AnnotationFork = "lanes.dev/fork-of"
	// AnnotationHash is the hash of what the controller wrote; a copy
	// whose hash differs from what it would write now is updated.
	AnnotationHash = "lanes.dev/fork-hash"
	// LabelForkOf marks the pods of a copy with the Deployment they copy
	// (its name, or a hash of a name longer than a label value may be):
	// with LabelLane, it is the copy's selector and its Services'.
	LabelForkOf = "lanes.dev/fork-of"
)

// forkDeployment returns lane f's copy of the Deployment base, the
// ConfigMaps it copies (their names in base, to copy as cmName), and the
// copies of the Services of svcs (the Services of base's namespace) that
// select base's pods.
//
// The copy's pods must not be endpoints of those Services: a client that
// reaches them without lanes (kube-proxy, the Service's DNS name) would
// send baseline traffic to the lane. A Service selects by equality, so the
// copy's pods leave out, for each of them that they still match, one label
// of its selector (the first by key), and carry LabelLane and
// LabelForkOf instead; the copy's selector is those two. Each such Service
// gets a headless copy in the lane (forkService) whose selector is the
// same two, so that the cluster lists the copy's pods as endpoints of the
// lane and lanes reads them as instances of the Service's lanes service.
func forkDeployment(f adminapi.Fork, base *appsv1.Deployment, svcs []corev1.Service) (*appsv1.Deployment, []string, []*corev1.Service, error) {
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
	own := map[string]string{LabelLane: f.Lane, LabelForkOf: forkOfValue(f.Deployment)}
	podLabels := maps.Clone(spec.Template.Labels)
	if podLabels == nil {
		podLabels = map[string]string{}
	}
	selecting := selectingServices(svcs, spec.Template.Labels)
	for _, svc := range selecting {
		if !selects(svc.Spec.Selector, podLabels) {
			continue // a label left out for another Service already
		}
		delete(podLabels, slices.Min(slices.Collect(maps.Keys(svc.Spec.Selector))))
	}
	maps.Copy(podLabels, own)
	for _, svc := range selecting {
		if selects(svc.Spec.Selector, podLabels) { // by the lane's own labels
			return nil, nil, nil, fmt.Errorf("service %s/%s selects the pods of %s by the labels of the lane's copy (%v): the copy would serve its baseline traffic", svc.Namespace, svc.Name, base.Name, svc.Spec.Selector)
		}
	}
	spec.Template.Labels = podLabels
	// The copy's ReplicaSets and pods are its own: neither the
	// baseline's selector nor another fork's matches them.
	spec.Selector = &metav1.LabelSelector{MatchLabels: maps.Clone(own)}
	pod := &spec.Template.Spec
	if len(pod.Containers) == 0 {
		return nil, nil, nil, fmt.Errorf("deployment %s/%s has no container", base.Namespace, base.Name)
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
			return nil, nil, nil, fmt.Errorf("deployment %s/%s has no container %q", base.Namespace, base.Name, f.Container)
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
		return nil, nil, nil, err
	}
	d.Annotations[AnnotationHash] = h
	var copies []*corev1.Service
	for _, svc := range selecting {
		c, err := forkService(f, base.Name, svc, own)
		if err != nil {
			return nil, nil, nil, err
		}
		copies = append(copies, c)
	}
	return d, cms, copies, nil
}

// selectingServices returns the Services of svcs whose selector selects
// pods labelled podLabels, by name. A Service without a selector selects
// no pod.
func selectingServices(svcs []corev1.Service, podLabels map[string]string) []corev1.Service {
	var out []corev1.Service
	for _, svc := range svcs {
		if len(svc.Spec.Selector) > 0 && selects(svc.Spec.Selector, podLabels) && !isCopy(svc.ObjectMeta) {
			out = append(out, svc)
		}
	}
	slices.SortFunc(out, func(a, b corev1.Service) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// selects reports whether a Service's selector selects a pod with
// podLabels, as the endpointslice controller reads it (a Service's selector
// is validated by the API server).
func selects(selector, podLabels map[string]string) bool {
	return labels.SelectorFromValidatedSet(selector).Matches(labels.Set(podLabels))
}

// isCopy reports whether an object is one the fork controller made.
func isCopy(m metav1.ObjectMeta) bool {
	return m.Labels[LabelManagedBy] == ManagedBy && m.Annotations[AnnotationFork] != ""
}

// forkOfValue is LabelForkOf's value for the Deployment name: the name,
// or, when it is longer than a label value may be, a hash of it.
func forkOfValue(name string) string {
	if len(name) <= validation.LabelValueMaxLength {
		return name
	}
	sum := sha256.Sum256([]byte(name))
	return "h-" + hex.EncodeToString(sum[:12])
}

// forkService returns lane f's copy of the Service svc, which selects the
// pods of the Deployment named deployment: headless, selecting the copy's
// pods (selector), with svc's ports, and read by lanes as svc's lanes
// service. Its name is the copy's when svc is named after the Deployment,
// the copy's and svc's otherwise, shortened by a hash to a Service name's
// length.
func forkService(f adminapi.Fork, deployment string, svc corev1.Service, selector map[string]string) (*corev1.Service, error) {
	name := f.Name
	if svc.Name != deployment {
		name = f.Name + "-" + svc.Name
	}
	if len(name) > validation.DNS1035LabelMaxLength {
		sum := sha256.Sum256([]byte(name))
		name = strings.TrimRight(name[:validation.DNS1035LabelMaxLength-13], "-") + "-" + hex.EncodeToString(sum[:6])
	}
	service := svc.Annotations[kubestore.AnnotationService]
	if service == "" {
		service = svc.Name
	}
	ann := map[string]string{AnnotationFork: f.Namespace + "/" + f.Deployment, kubestore.AnnotationService: service}
	if p, ok := svc.Annotations[kubestore.AnnotationPort]; ok {
		ann[kubestore.AnnotationPort] = p
	}
	c := &corev1.Service{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: f.Namespace, Annotations: ann,
			Labels: map[string]string{LabelLane: f.Lane, LabelManagedBy: ManagedBy},
		},
		Spec: corev1.ServiceSpec{
			ClusterIP:                corev1.ClusterIPNone,
			Selector:                 maps.Clone(selector),
			PublishNotReadyAddresses: svc.Spec.PublishNotReadyAddresses,
		},
	}
	for _, p := range svc.Spec.Ports {
		c.Spec.Ports = append(c.Spec.Ports, corev1.ServicePort{Name: p.Name, Protocol: p.Protocol, AppProtocol: p.AppProtocol, Port: p.Port, TargetPort: p.TargetPort})
	}
	h, err := hashOf(c.Labels, c.Annotations, c.Spec)
	if err != nil {
		return nil, err
	}
	c.Annotations[AnnotationHash] = h
	return c, nil
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
