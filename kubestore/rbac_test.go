package kubestore_test

import (
	"context"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lanesdev/lanes/internal/testkit/kubetest"
	"github.com/lanesdev/lanes/kubestore"
	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

// grant binds a Role of rules in the cluster's namespace to the service
// account ns/name.
func (k *cluster) grant(name string, rules []rbacv1.PolicyRule) {
	k.t.Helper()
	if _, err := k.c.RbacV1().Roles(k.ns).Create(k.ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules}, metav1.CreateOptions{}); err != nil {
		k.t.Fatal(err)
	}
	if _, err := k.c.RbacV1().RoleBindings(k.ns).Create(k.ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: name},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: k.ns, Name: name}}}, metav1.CreateOptions{}); err != nil {
		k.t.Fatal(err)
	}
}

// TestRBAC: the rules docs/kubernetes.md gives are enough, under real
// RBAC with service accounts' tokens: to register from outside a pod and
// follow (the published policy of the namespace too), and (list and watch
// alone) to follow; with none, Open names the refusal.
func TestRBAC(t *testing.T) {
	s := kubetest.Start(t)
	k := newCluster(t, s)
	k.grant("registrant", []rbacv1.PolicyRule{
		{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"get", "list", "watch", "create", "update", "delete"}},
		{APIGroups: []string{""}, Resources: []string{"pods", "services"}, Verbs: []string{"list", "watch"}},
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "list", "watch", "create", "update", "delete"}},
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"list", "watch"}},
	})
	k.grant("follower", []rbacv1.PolicyRule{
		{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"pods", "services"}, Verbs: []string{"list", "watch"}},
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"list", "watch"}},
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	openAs := func(sa string) (*kubestore.Store, error) {
		c, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		st, err := kubestore.Open(c, s.Config(s.ServiceAccountToken(t, k.ns, sa)), kubestore.Options{Namespaces: []string{k.ns}, PolicyNamespace: k.ns})
		if err == nil {
			t.Cleanup(func() { st.Close() })
		}
		return st, err
	}
	reg, err := openAs("registrant")
	if err != nil {
		t.Fatal(err)
	}
	fol, err := openAs("follower")
	if err != nil {
		t.Fatal(err)
	}
	e := routing.New(routing.WithRegistry(fol))
	defer e.Close()
	l, err := reg.Register(ctx, registry.Instance{Service: "orders", ID: "dev", Addr: "10.0.0.1:80", Lane: "feat"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	kubetest.WaitInstances(t, e, "orders", func(in []registry.Instance) bool { return len(in) == 1 && in[0].Lane == "feat" })
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	kubetest.WaitInstances(t, e, "orders", func(in []registry.Instance) bool { return len(in) == 0 })

	// In a pod, Register writes nothing: a follower, which may write
	// nothing, registers, and no engine sees an instance.
	inPod, err := kubestore.Open(ctx, s.Config(s.ServiceAccountToken(t, k.ns, "follower")), kubestore.Options{Namespaces: []string{k.ns}, InPod: true, PolicyNamespace: k.ns})
	if err != nil {
		t.Fatal(err)
	}
	defer inPod.Close()
	pl, err := inPod.Register(ctx, registry.Instance{Service: "orders", ID: "pod", Addr: "10.0.0.2:80"}, 0)
	if err != nil {
		t.Fatalf("Register in a pod: %v", err)
	}
	if got := pl.Instance(); got.ID != "pod" {
		t.Fatalf("the pod's lease holds %+v", got)
	}
	if err := pl.Close(); err != nil {
		t.Fatal(err)
	}
	if n := len(e.Service("orders").Instances()); n != 0 {
		t.Fatalf("a registration in a pod wrote %d instances", n)
	}

	if _, err := openAs("nobody"); err == nil || !strings.Contains(err.Error(), "forbidden") {
		t.Fatalf("Open with no role = %v, want RBAC's refusal", err)
	}
}
