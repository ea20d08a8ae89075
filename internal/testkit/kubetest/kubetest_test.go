package kubetest_test

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lanesdev/lanes/internal/lib/kubeclient"
	"github.com/lanesdev/lanes/internal/testkit/kubetest"
	"github.com/lanesdev/lanes/internal/testkit/leaktest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, leaktest.Options()...) }

// TestServer: the admin token may do anything; a service account's token
// from the TokenRequest API may do only what RBAC grants it (nothing yet).
func TestServer(t *testing.T) {
	s := kubetest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin := s.Clientset(t)
	if _, err := admin.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "x"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tok := s.ServiceAccountToken(t, "team", "app")
	app, err := kubeclient.New(s.Config(tok))
	if err != nil {
		t.Fatal(err)
	}
	_, err = app.CoreV1().ConfigMaps("default").Get(ctx, "x", metav1.GetOptions{})
	if !apierrors.IsForbidden(err) {
		t.Fatalf("a service account with no role read a ConfigMap: err = %v, want Forbidden", err)
	}
}
