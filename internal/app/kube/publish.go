package kube

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/lanesdev/lanes/internal/lib/gogroup"
	"github.com/lanesdev/lanes/internal/lib/kubeclient"
	"github.com/lanesdev/lanes/kubestore"
	"github.com/lanesdev/lanes/policy"
)

// publishController writes the policy in force (etcd's: the LanesPolicy
// as applied, with the lanes' lifetimes) into the ConfigMap
// kubestore.PolicyConfigMap of each namespace lanes serves, where the
// services that follow the cluster (LANES_REGISTRY=k8s://) read it, so that
// they route by the same policy as the control plane. The ConfigMap is the
// control plane's: an edit by hand is replaced at the next pass, and a
// deleted one is made again; one that another control plane publishes
// (AnnotationPublisher) is left to it, and the pass fails saying so.
type publishController struct {
	cs         *kubeclient.Clients
	policy     policy.Store
	namespaces []string
	// id names this control plane (its etcd cluster and key prefix): a
	// ConfigMap that another published is left alone, so that two
	// control planes serving one namespace do not overwrite each other
	// in turn.
	id   string
	log  *slog.Logger
	now  func() time.Time
	poke waker
}

// AnnotationPublisher names the control plane that publishes a policy
// ConfigMap: its etcd cluster's id and its key prefix.
const AnnotationPublisher = "lanes.dev/publisher"

func (c *publishController) run(ctx context.Context, g *gogroup.Group) {
	g.Go(func() { followPolicy(ctx, c.policy, c.poke) })
	for _, ns := range c.namespaces {
		g.Go(func() {
			followKube(ctx, c.log, "ConfigMap "+ns+"/"+kubestore.PolicyConfigMap, c.poke, func(ctx context.Context) (watch.Interface, error) {
				return c.cs.CoreV1().ConfigMaps(ns).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + kubestore.PolicyConfigMap})
			})
		})
	}
	loop(ctx, c.log, "published policy reconcile", c.poke, c.now, c.reconcile)
}

// reconcile makes each namespace's ConfigMap hold the policy in force.
func (c *publishController) reconcile(ctx context.Context) (time.Time, error) {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	doc, err := c.policy.Get(ctx)
	if err != nil {
		return time.Time{}, fmt.Errorf("read the policy in force: %w", err)
	}
	raw, rev := string(doc.Raw), strconv.FormatInt(doc.Revision, 10)
	var errs []error
	for _, ns := range c.namespaces {
		cms := c.cs.CoreV1().ConfigMaps(ns)
		cm, err := cms.Get(ctx, kubestore.PolicyConfigMap, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			_, err = cms.Create(ctx, &corev1.ConfigMap{
				ObjectMeta: metav1.ObjectMeta{Name: kubestore.PolicyConfigMap, Labels: map[string]string{LabelManagedBy: ManagedBy},
					Annotations: map[string]string{AnnotationRevision: rev, AnnotationPublisher: c.id}},
				Data: map[string]string{kubestore.PolicyKey: raw},
			}, metav1.CreateOptions{})
		case err == nil && cm.Annotations[AnnotationPublisher] != "" && cm.Annotations[AnnotationPublisher] != c.id:
			err = fmt.Errorf("another control plane publishes there (%s %s, this one is %s)", AnnotationPublisher, cm.Annotations[AnnotationPublisher], c.id)
		case err == nil && (cm.Data[kubestore.PolicyKey] != raw || cm.Annotations[AnnotationRevision] != rev || cm.Annotations[AnnotationPublisher] != c.id || len(cm.Data) != 1):
			cm = cm.DeepCopy()
			cm.Data = map[string]string{kubestore.PolicyKey: raw}
			if cm.Annotations == nil {
				cm.Annotations = map[string]string{}
			}
			cm.Annotations[AnnotationRevision], cm.Annotations[AnnotationPublisher] = rev, c.id
			_, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("publish the policy in %s/%s: %w", ns, kubestore.PolicyConfigMap, err))
		}
	}
	return time.Time{}, errors.Join(errs...)
}
