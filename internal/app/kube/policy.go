package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"

	"github.com/lanesdev/lanes/adminapi"
	"github.com/lanesdev/lanes/internal/lib/gogroup"
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
	doc, err := c.api.ApplyPolicy(ctx, raw, "LanesPolicy "+c.namespace+"/"+c.name)
	var ae *adminapi.Error
	switch {
	case err == nil:
		st.Revision = doc.Revision
	case errors.As(err, &ae) && (ae.Code == adminapi.CodeInvalidPolicy || ae.Code == adminapi.CodeBadRequest):
		st.Error = ae.Message
		if ae.Field != "" {
			st.Field = "spec." + ae.Field
			st.Error = st.Field + ": " + ae.Message
		}
		if now, err := c.policy.Get(ctx); err == nil {
			st.Revision = now.Revision
		}
		c.log.Warn("LanesPolicy refused", "namespace", c.namespace, "name", c.name, "field", st.Field, "err", ae.Message)
	default:
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
