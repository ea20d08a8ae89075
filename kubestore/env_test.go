package kubestore_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/lanesdev/lanes/internal/testkit/kubetest"
	"github.com/lanesdev/lanes/kubestore"
	"github.com/lanesdev/lanes/lanesenv"
	"github.com/lanesdev/lanes/registry"
)

func getenv(kv ...string) func(string) string {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(k string) string { return m[k] }
}

// TestParseURL: the options of k8s://, and errors that name the option
// and the value as written.
func TestParseURL(t *testing.T) {
	u, err := kubestore.ParseURL("k8s://?namespace=a,b&namespace=c&register-namespace=b&register=slice", getenv("KUBERNETES_SERVICE_HOST", "10.0.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	if o := u.Options; strings.Join(o.Namespaces, ",") != "a,b,c" || o.RegisterNamespace != "b" || o.InPod {
		t.Fatalf("options %+v", o)
	}
	if u, _ := kubestore.ParseURL("k8s://", getenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")); !u.Options.InPod || u.Options.Namespaces != nil {
		t.Fatalf("k8s:// in a pod: %+v", u.Options)
	}
	if u, _ := kubestore.ParseURL("k8s://", getenv()); u.Options.InPod {
		t.Fatalf("k8s:// outside a pod registers in the pod: %+v", u.Options)
	}
	// ?kubeconfig= is used even in a pod.
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	os.WriteFile(kc, []byte("apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: 'https://192.0.2.7:6443'}\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\ncurrent-context: x\nusers:\n- name: u\n  user: {token: t}\n"), 0o600)
	u, err = kubestore.ParseURL("k8s://?kubeconfig="+kc, getenv("KUBERNETES_SERVICE_HOST", "10.0.0.1"))
	if err != nil || u.Kubeconfig != kc {
		t.Fatalf("kubeconfig: %+v, %v", u, err)
	}
	if rc, err := u.RESTConfig(getenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")); err != nil || rc.Host != "https://192.0.2.7:6443" {
		t.Fatalf("RESTConfig with ?kubeconfig= in a pod: %v, %v; want the file's server", rc, err)
	}
	for raw, want := range map[string]string{
		"k8s://host:1":               `takes no host`,
		"k8s://?namespace=A_b":       `namespace "A_b"`,
		"k8s://?register=both":       `register "both"`,
		"k8s://?namesapce=a":         `unknown option "namesapce"`,
		"k8s://?register-namespace=": `register-namespace ""`,
	} {
		if _, err := kubestore.ParseURL(raw, getenv()); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseURL(%q) = %v, want an error with %q", raw, err, want)
		}
	}
	// Linked in: a pod with no LANES_REGISTRY follows its cluster.
	s, err := lanesenv.Parse(getenv("KUBERNETES_SERVICE_HOST", "10.0.0.1"))
	if err != nil || s.Backend != "k8s://" {
		t.Fatalf("Parse in a pod = %+v, %v; want the k8s:// backend", s, err)
	}
}

// TestLanesenv: LANES_REGISTRY=k8s:// with a kubeconfig opens an engine
// on the cluster; a registration from outside any pod reaches it.
func TestLanesenv(t *testing.T) {
	s := kubetest.Start(t)
	k := newCluster(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	env, err := lanesenv.Open(ctx, lanesenv.WithGetenv(getenv(
		lanesenv.EnvRegistry, "k8s://?namespace="+k.ns,
		"KUBECONFIG", s.Kubeconfig(t, s.AdminToken))))
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	l, err := env.Registry.Register(ctx, registry.Instance{Service: "orders", ID: "dev", Addr: "127.0.0.1:9", Lane: "feat"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	kubetest.WaitInstances(t, env.Engine, "orders", func(in []registry.Instance) bool { return len(in) == 1 && in[0].Lane == "feat" })
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	kubetest.WaitInstances(t, env.Engine, "orders", func(in []registry.Instance) bool { return len(in) == 0 })
}

// TestOpenValidates: a register namespace that the Store does not follow
// is refused before anything starts.
func TestOpenValidates(t *testing.T) {
	_, err := kubestore.Open(context.Background(), &rest.Config{Host: "https://127.0.0.1:1"}, kubestore.Options{Namespaces: []string{"a"}, RegisterNamespace: "b"})
	if err == nil || !strings.Contains(err.Error(), `RegisterNamespace "b"`) {
		t.Fatalf("Open = %v, want an error naming RegisterNamespace", err)
	}
}
