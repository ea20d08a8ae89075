package kubestore_test

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lanesdev/lanes/internal/testkit/kubetest"
	"github.com/lanesdev/lanes/kubestore"
	"github.com/lanesdev/lanes/policy"
)

// TestPolicy: a Store follows the policy that lanes up publishes in its
// namespace's ConfigMap: empty until there is one, then each version;
// a document that does not parse leaves the last in force. A Store told
// to follow none stays empty.
func TestPolicy(t *testing.T) {
	s := kubetest.Start(t)
	k := newCluster(t, s)
	st := open(t, s, kubestore.Options{Namespaces: []string{k.ns}, PolicyNamespace: k.ns})
	none := open(t, s, kubestore.Options{Namespaces: []string{k.ns}})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	doc, err := st.Policy().Get(ctx)
	if err != nil || len(doc.Policy.Lanes) != 0 {
		t.Fatalf("before any is published: %+v, %v", doc, err)
	}
	w, err := st.Policy().Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	w.Next(ctx) // what is in force now
	next := func() policy.Document {
		t.Helper()
		d, err := w.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	cms := k.c.CoreV1().ConfigMaps(k.ns)
	cm, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: kubestore.PolicyConfigMap},
		Data: map[string]string{kubestore.PolicyKey: "lanes:\n  alice:\n    strict: true\n"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if d := next(); !d.Policy.Lanes["alice"].Strict {
		t.Fatalf("published: %s", d.Raw)
	}
	cm.Data[kubestore.PolicyKey] = "lanes: [this is not a policy"
	if cm, err = cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	cm.Data[kubestore.PolicyKey] = "lanes:\n  alice:\n    fallback: [staging]\n"
	if _, err = cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if d := next(); d.Policy.Lanes["alice"].Strict || len(d.Policy.Lanes["alice"].Fallback) != 1 {
		t.Fatalf("the next good one: %s", d.Raw)
	}
	if doc, _ := none.Policy().Get(ctx); len(doc.Policy.Lanes) != 0 {
		t.Fatalf("a Store that follows no policy: %s", doc.Raw)
	}
}

// TestPolicyNamespace: which namespace's policy a k8s:// registry follows.
func TestPolicyNamespace(t *testing.T) {
	for raw, want := range map[string]string{
		"k8s://":                           "default",
		"k8s://?namespace=shop,web":        "shop",
		"k8s://?namespace=shop&policy=web": "web",
		"k8s://?policy=off":                "",
	} {
		u, err := kubestore.ParseURL(raw, getenv())
		if err != nil {
			t.Fatal(err)
		}
		if got := u.PolicyNamespace(); got != want {
			t.Errorf("%s: follows the policy of %q, want %q", raw, got, want)
		}
	}
	if _, err := kubestore.ParseURL("k8s://?policy=No", getenv()); err == nil {
		t.Error("policy=No: no error")
	}
}
