package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"

	"github.com/lanesdev/lanes/adminapi"
	"github.com/lanesdev/lanes/internal/lib/gogroup"
	"github.com/lanesdev/lanes/internal/lib/kubeclient"
	"github.com/lanesdev/lanes/kubestore"
	"github.com/lanesdev/lanes/policy"
)

// PolicyResource is the LanesPolicy resource (deploy/kubernetes/base/crd.yaml).
var PolicyResource = schema.GroupVersionResource{Group: "lanes.dev", Version: "v1alpha1", Resource: "lanespolicies"}

// PolicyApplier applies a policy document as PUT /v1/policy does, and does
// nothing when the policy in force is already what it would store
// (admin.Server.ApplyPolicy).
type PolicyApplier interface {
	ApplyPolicy(ctx context.Context, raw []byte, who string) (adminapi.PolicyDocument, error)
}

// policyController applies the LanesPolicy the control plane follows
// through the admin API's path (validation, lane lifetimes kept, history,
// revision), and writes its status: the generation it saw, the revision in
// force and, when the document is refused, the error naming the field.
// The resource is the desired state: a policy applied by other means is
// replaced by it at the next pass. Deleting the resource leaves the policy
// in force as it is.
type policyController struct {
	dyn       dynamic.Interface
	cs        *kubeclient.Clients
	configMap bool // the ConfigMap namespace/name, not the LanesPolicy
	api       PolicyApplier
	policy    policy.Store
	namespace string
	name      string
	log       *slog.Logger
	now       func() time.Time
	poke      waker
}

func (c *policyController) run(ctx context.Context, g *gogroup.Group) {
	g.Go(func() { followPolicy(ctx, c.policy, c.poke) })
	if c.configMap {
		g.Go(func() {
			followKube(ctx, c.log, "ConfigMap "+c.namespace+"/"+c.name, c.poke, func(ctx context.Context) (watch.Interface, error) {
				return c.cs.CoreV1().ConfigMaps(c.namespace).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + c.name})
			})
		})
		loop(ctx, c.log, "policy ConfigMap reconcile", c.poke, c.now, c.reconcileConfigMap)
		return
	}
	g.Go(func() {
		followKube(ctx, c.log, "LanesPolicy "+c.namespace+"/"+c.name, c.poke, func(ctx context.Context) (watch.Interface, error) {
			return c.dyn.Resource(PolicyResource).Namespace(c.namespace).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + c.name})
		})
	})
	loop(ctx, c.log, "LanesPolicy reconcile", c.poke, c.now, c.reconcile)
}

// policyStatus is the status of a LanesPolicy.
type policyStatus struct {
	ObservedGeneration int64  `json:"observedGeneration"`
	Revision           int64  `json:"revision,omitempty"`
	Error              string `json:"error,omitempty"`
	Field              string `json:"field,omitempty"`
}

// ConfigMapKey is the key of a policy ConfigMap that holds the document;
// AnnotationRevision and AnnotationError are where its outcome is written.
const (
	ConfigMapKey       = kubestore.PolicyKey
	AnnotationRevision = "lanes.dev/revision"
	AnnotationError    = "lanes.dev/error"
)

// apply applies raw and says how it went: the revision in force, and the
// refusal ("" when none) naming the field as field names it.
func (c *policyController) apply(ctx context.Context, raw []byte, who string, field func(*adminapi.Error) string) (int64, string, error) {
	doc, err := c.api.ApplyPolicy(ctx, raw, who)
	var ae *adminapi.Error
	switch {
	case err == nil:
		return doc.Revision, "", nil
	case errors.As(err, &ae) && (ae.Code == adminapi.CodeInvalidPolicy || ae.Code == adminapi.CodeBadRequest):
		c.log.Warn("policy refused", "from", who, "field", ae.Field, "line", ae.Line, "err", ae.Message)
		var rev int64
		if now, err := c.policy.Get(ctx); err == nil {
			rev = now.Revision
		}
		return rev, field(ae), nil
	}
	return 0, "", err
}

// reconcileConfigMap applies the policy ConfigMap's document and writes
// the outcome into its annotations.
func (c *policyController) reconcileConfigMap(ctx context.Context) (time.Time, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*callTimeout)
	defer cancel()
	cms := c.cs.CoreV1().ConfigMaps(c.namespace)
	cm, err := cms.Get(ctx, c.name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return time.Time{}, nil
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("read ConfigMap %s/%s: %w", c.namespace, c.name, err)
	}
	rev, refusal, err := c.apply(ctx, []byte(cm.Data[ConfigMapKey]), "ConfigMap "+c.namespace+"/"+c.name, func(ae *adminapi.Error) string {
		msg := ConfigMapKey
		if ae.Line > 0 {
			msg += ": line " + strconv.Itoa(ae.Line)
		}
		if ae.Field != "" {
			msg += ": " + ae.Field
		}
		return msg + ": " + ae.Message
	})
	if err != nil {
		return time.Time{}, err
	}
	want := strconv.FormatInt(rev, 10)
	if cm.Annotations[AnnotationRevision] == want && cm.Annotations[AnnotationError] == refusal {
		return time.Time{}, nil
	}
	if cm.Annotations == nil {
		cm.Annotations = map[string]string{}
	}
	cm.Annotations[AnnotationRevision] = want
	if refusal == "" {
		delete(cm.Annotations, AnnotationError)
	} else {
		cm.Annotations[AnnotationError] = refusal
	}
	if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil && !apierrors.IsConflict(err) {
		return time.Time{}, fmt.Errorf("write the outcome on ConfigMap %s/%s: %w", c.namespace, c.name, err)
	}
	return time.Time{}, nil
}

func (c *policyController) reconcile(ctx context.Context) (time.Time, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*callTimeout)
	defer cancel()
	res := c.dyn.Resource(PolicyResource).Namespace(c.namespace)
	obj, err := res.Get(ctx, c.name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return time.Time{}, nil
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("read LanesPolicy %s/%s: %w", c.namespace, c.name, err)
	}
	spec, ok := obj.Object["spec"]
	if !ok || spec == nil {
		spec = map[string]any{}
	}
	raw, err := json.Marshal(spec)
	if err != nil {
		return time.Time{}, err
	}
	st := policyStatus{ObservedGeneration: obj.GetGeneration()}
	st.Revision, st.Error, err = c.apply(ctx, raw, "LanesPolicy "+c.namespace+"/"+c.name, func(ae *adminapi.Error) string {
		if ae.Field == "" {
			return ae.Message
		}
		st.Field = "spec." + ae.Field
		return st.Field + ": " + ae.Message
	})
	if err != nil {
		return time.Time{}, err
	}
	if have, ok := obj.Object["status"].(map[string]any); ok {
		var was policyStatus
		b, _ := json.Marshal(have)
		if json.Unmarshal(b, &was) == nil && was == st {
			return time.Time{}, nil // written before: no write, no event
		}
	}
	var want map[string]any
	b, _ := json.Marshal(st)
	json.Unmarshal(b, &want)
	obj.Object["status"] = want
	if _, err := res.UpdateStatus(ctx, obj, metav1.UpdateOptions{}); err != nil && !apierrors.IsConflict(err) {
		return time.Time{}, fmt.Errorf("write the status of LanesPolicy %s/%s: %w", c.namespace, c.name, err)
	}
	return time.Time{}, nil
}
