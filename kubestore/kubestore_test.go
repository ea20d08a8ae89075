package kubestore_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lanesdev/lanes/internal/testkit/kubetest"
	"github.com/lanesdev/lanes/internal/testkit/leaktest"
	"github.com/lanesdev/lanes/internal/testkit/registrytest"
	"github.com/lanesdev/lanes/kubestore"
	"github.com/lanesdev/lanes/registry"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, leaktest.Options()...) }

var nsSeq atomic.Int64

// namespace makes a namespace of the test's own.
func namespace(t testing.TB, c *kubetest.Clients) string {
	t.Helper()
	name := fmt.Sprintf("t%d-%d", time.Now().UnixNano()%1e6, nsSeq.Add(1))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return name
}

func open(t testing.TB, s *kubetest.Server, o kubestore.Options) *kubestore.Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := kubestore.Open(ctx, s.Admin(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// TestRegistry: the conformance suite, each subtest in a namespace of its
// own, registering from outside any pod (managed EndpointSlices and
// Leases).
func TestRegistry(t *testing.T) {
	s := kubetest.Start(t)
	admin := s.Clientset(t)
	registrytest.Run(t, func(t *testing.T) registry.Registry {
		return open(t, s, kubestore.Options{Namespaces: []string{namespace(t, admin)}})
	})
}
