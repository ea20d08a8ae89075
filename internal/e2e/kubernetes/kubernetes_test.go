// Package kubernetes runs lanes on a real Kubernetes API server
// (internal/testkit/kubetest): the manifests of deploy/kubernetes under
// `kubectl apply --dry-run=server`, then applied; lanes up with its
// Kubernetes controllers, authenticated as the manifests' service account so
// that their RBAC is what the controllers get; the LanesPolicy resource; and
// `lanes fork`. No kubelet or controller manager runs: what they would make
// (ReplicaSets, pods) is not needed by these tests.
package kubernetes

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"

	"github.com/lanesdev/lanes/adminapi"
	"github.com/lanesdev/lanes/adminclient"
	"github.com/lanesdev/lanes/internal/app/cli"
	"github.com/lanesdev/lanes/internal/app/controlplane"
	"github.com/lanesdev/lanes/internal/app/kube"
	"github.com/lanesdev/lanes/internal/testkit/etcdtest"
	"github.com/lanesdev/lanes/internal/testkit/kubetest"
	"github.com/lanesdev/lanes/internal/testkit/leaktest"
	"github.com/lanesdev/lanes/internal/testkit/timing"
	"github.com/lanesdev/lanes/kubestore"
	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/laneshttp"
	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, leaktest.Options()...) }

// manifests is the folder of the manifests.
var manifests = filepath.Join("..", "..", "..", "deploy", "kubernetes")

// cluster is an API server, kubectl and a kubeconfig of its admin.
type cluster struct {
	s       *kubetest.Server
	kubectl string
	admin   string // kubeconfig
	cs      *kubetest.Clients
	dyn     *dynamic.DynamicClient
}

func startCluster(t *testing.T) *cluster {
	t.Helper()
	s := kubetest.Start(t)
	kc := kubetest.Kubectl()
	if kc == "" {
		t.Skip("kubectl not found: run .ci/kube-build")
	}
	dyn, err := dynamic.NewForConfig(s.Admin())
	if err != nil {
		t.Fatal(err)
	}
	return &cluster{s: s, kubectl: kc, admin: s.Kubeconfig(t, s.AdminToken), cs: s.Clientset(t), dyn: dyn}
}

// run runs kubectl as the admin and returns its output.
func (c *cluster) run(t *testing.T, stdin []byte, args ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.kubectl, append([]string{"--kubeconfig", c.admin}, args...)...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("kubectl %s: %v\n%s%s", strings.Join(args, " "), err, out.String(), errb.String())
	}
	return out.Bytes()
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// TestKubernetes: the manifests pass the API server's dry run; applied, they
// give lanes up's controllers what they need (they run as the manifests'
// service account); the LanesPolicy is refused by the API server or in its
// status naming the field, or takes effect; `lanes fork` makes the lane's
// Deployment, and the fork ends with its TTL, its lane's expiry, and across
// a restart of the control plane.
func TestKubernetes(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a kube-apiserver and lanes up")
	}
	c := startCluster(t)
	t.Run("manifests", func(t *testing.T) { testManifests(t, c) })

	c.run(t, nil, "apply", "-k", filepath.Join(manifests, "base"))
	c.run(t, nil, "wait", "--for=condition=Established", "--timeout=60s", "crd/lanespolicies.lanes.dev")
	tok := c.s.ServiceAccountToken(t, "lanes-system", "lanes")
	cfg := lanesConfig(t, controlplane.KubeConfig{Enabled: true, Kubeconfig: c.s.Kubeconfig(t, tok), Namespaces: []string{"default"}, Policy: "lanes-system/lanes"})
	cp := startLanes(t, cfg)
	t.Run("policy", func(t *testing.T) { testPolicy(t, c, cp) })
	t.Run("fork", func(t *testing.T) { testFork(t, c, cp, cfg) })
	t.Run("handover", func(t *testing.T) { testHandover(t, c, cfg.Kube) })
	t.Run("policy-configmap", func(t *testing.T) { testPolicyConfigMap(t, c) })
}

// testHandover: two lanes up on one etcd, as the manifests' overlays run
// them; one leads the controllers, and when it stops the other takes
// over: a fork made through it then gets its copy. It forks the Deployment
// orders that testFork made. Their etcd is not the first control plane's,
// which goes on serving "default": the policy it publishes there is left
// to it.
func testHandover(t *testing.T, c *cluster, kc controlplane.KubeConfig) {
	srv := etcdtest.Embedded(t)
	published := func() map[string]string {
		t.Helper()
		cm, err := c.cs.CoreV1().ConfigMaps("default").Get(ctxT(t, time.Minute), kubestore.PolicyConfigMap, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return cm.Annotations
	}
	before := published()
	start := func() *lanes {
		cfg := lanesConfig(t, kc)
		cfg.Etcd.Endpoints, cfg.Etcd.Prefix = srv.Endpoints(), "/handover/"
		return startLanes(t, cfg)
	}
	a := start()
	// a campaigns alone: it leads once its key is the election's.
	cli, err := clientv3.New(clientv3.Config{Endpoints: srv.Endpoints(), DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	candidates := func() int64 {
		t.Helper()
		resp, err := cli.Get(ctxT(t, 10*time.Second), "/handover/kube-controllers/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		return resp.Count
	}
	for candidates() != 1 {
		wctx, cancel := context.WithTimeout(context.Background(), time.Second)
		<-cli.Watch(wctx, "/handover/kube-controllers/", clientv3.WithPrefix())
		cancel()
	}
	b := start()
	fork := func(l *lanes, lane string) {
		t.Helper()
		if code, out, errOut := lanesCmd("fork", "deploy/orders", "--lane", lane, "--admin", l.url, "--token", l.token); code != 0 {
			t.Fatalf("lanes fork: exit %d\n%s%s", code, out, errOut)
		}
	}
	fork(b, "erin") // through either: the forks are in the etcd both share
	waitDeployment(t, c.cs, "default", "orders-erin", false)
	// A laptop registered in the etcd they share: the leader mirrors it
	// into the cluster, and a service in a pod that follows the cluster
	// sees it, without a gap when the leadership changes hands.
	ctx := ctxT(t, 2*time.Minute)
	reg, err := b.api.Register(ctx, adminapi.RegisterRequest{Instance: registry.Instance{ID: "orders-gina", Service: "orders", Lane: "gina", Addr: "192.0.2.77:8080"}})
	if err != nil {
		t.Fatal(err)
	}
	gone := followGone(t, c, "orders-gina")
	holder := mirrorHolder(t, c, "orders-gina", "")
	a.close() // the leader: b takes over
	stopped := time.Now()
	fork(b, "frank")
	waitDeployment(t, c.cs, "default", "orders-frank", false)
	t.Logf("the copy made %v after the other lanes up stopped", time.Since(stopped).Round(time.Millisecond))
	mirrorHolder(t, c, "orders-gina", holder) // b's mirror took the registration over
	// What b mirrors after that reaches the pod after all that came before.
	reg2, err := b.api.Register(ctx, adminapi.RegisterRequest{Instance: registry.Instance{ID: "orders-gina-2", Service: "orders", Lane: "gina", Addr: "192.0.2.78:8080"}})
	if err != nil {
		t.Fatal(err)
	}
	if n := gone("orders-gina-2"); n != 0 {
		t.Errorf("the mirrored laptop left a pod's view %d times as the leadership changed hands, want never", n)
	}
	for id, r := range map[string]string{"orders-gina": reg.Registration, "orders-gina-2": reg2.Registration} {
		if err := b.api.Deregister(ctx, "orders", id, r); err != nil {
			t.Fatal(err)
		}
	}
	for _, l := range []string{"erin", "frank"} {
		if err := b.api.DeleteFork(ctxT(t, time.Minute), l, "default", "orders"); err != nil {
			t.Fatal(err)
		}
		waitDeployment(t, c.cs, "default", "orders-"+l, true)
	}
	// The pair serve "default" on an etcd of their own, beside the first
	// control plane: the policy it published there is left to it.
	if after := published(); after[kube.AnnotationPublisher] != before[kube.AnnotationPublisher] || after[kube.AnnotationRevision] != before[kube.AnnotationRevision] {
		t.Errorf("the published policy went from %v to %v", before, after)
	}
}

// followGone follows the instances of orders as a service in a pod that
// follows the cluster sees them, from when id appears. The function it
// returns waits until the instance next appears and says how many
// times id went meanwhile, if only for a moment.
func followGone(t *testing.T, c *cluster, id string) func(next string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	st, err := kubestore.Open(ctx, c.s.Admin(), kubestore.Options{Namespaces: []string{"default"}})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	w, err := st.Watch(ctx, "orders")
	if err != nil {
		cancel()
		st.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); w.Close(); st.Close() })
	var state registry.State
	present := func(id string) bool { _, ok := state.Services["orders"][id]; return ok }
	for !present(id) {
		b, err := w.Next(ctx)
		if err != nil {
			t.Fatalf("%s never seen in the cluster: %v", id, err)
		}
		state.Apply(b)
	}
	return func(next string) int {
		n := 0
		for !present(next) {
			b, err := w.Next(ctx)
			if err != nil {
				t.Fatalf("%s never seen in the cluster: %v", next, err)
			}
			state.Apply(b)
			if b.Reset && !present(id) {
				n++
			}
			for _, ev := range b.Events { // a batch may end it and make it again
				if ev.Type == registry.EventDelete && ev.Instance.ID == id {
					n++
				}
			}
		}
		return n
	}
}

// mirrorHolder waits until the managed EndpointSlice that mirrors the
// instance id names a holder other than not, and returns it.
func mirrorHolder(t *testing.T, c *cluster, id, not string) string {
	t.Helper()
	ctx := ctxT(t, time.Minute)
	for {
		list, err := c.cs.DiscoveryV1().EndpointSlices("default").List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelManagedBy + "=lanes.dev"})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range list.Items {
			var in registry.Instance
			if json.Unmarshal([]byte(s.Annotations["lanes.dev/instance"]), &in) == nil && in.ID == id {
				if h := s.Annotations["lanes.dev/holder"]; h != "" && h != not {
					return h
				}
			}
		}
		w, err := c.cs.DiscoveryV1().EndpointSlices("default").Watch(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelManagedBy + "=lanes.dev", ResourceVersion: list.ResourceVersion})
		if err != nil {
			t.Fatal(err)
		}
		select { // a change: look again
		case <-w.ResultChan():
		case <-ctx.Done():
			w.Stop()
			t.Fatalf("no mirror of %s held by another than %q", id, not)
		}
		w.Stop()
	}
}

// waitGoodPolicy waits, on e's changes, until e has testPolicy's good
// policy in force.
func waitGoodPolicy(ctx context.Context, t *testing.T, e *routing.Engine, who string) {
	t.Helper()
	for {
		changed := e.PolicyChanged()
		if p := e.Policy(); slices.Equal(p.Lanes["alice"].Fallback, []string{"bob"}) && p.Outlier.Errors == 3 {
			return
		}
		select {
		case <-changed:
		case <-ctx.Done():
			t.Fatalf("%s did not take the policy in: %+v", who, e.Policy())
		}
	}
}

// testPolicyConfigMap: where CRDs are not allowed, the policy is a
// ConfigMap's policy.yaml; a refusal names the line and the field in its
// annotation lanes.dev/error, and a good document takes effect, its
// revision in lanes.dev/revision.
func testPolicyConfigMap(t *testing.T, c *cluster) {
	ctx := ctxT(t, 2*time.Minute)
	c.run(t, nil, "create", "namespace", "lanes-cm")
	cms := c.cs.CoreV1().ConfigMaps("lanes-cm")
	cm, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "lanes-policy"},
		Data: map[string]string{kube.ConfigMapKey: "lanes:\n  a:\n    fallback: [b]\n  b:\n    fallback: [a]\n"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	l := startLanes(t, lanesConfig(t, controlplane.KubeConfig{Enabled: true, Kubeconfig: c.admin, Namespaces: []string{"lanes-cm"}, Policy: "lanes-cm/lanes-policy", PolicyConfigMap: true}))
	annotated := func(rv string, ok func(map[string]string) bool) map[string]string {
		t.Helper()
		w, err := cms.Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=lanes-policy", ResourceVersion: rv})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Stop()
		for ev := range w.ResultChan() {
			if got, isCM := ev.Object.(*corev1.ConfigMap); isCM && ok(got.Annotations) {
				return got.Annotations
			}
		}
		t.Fatal("the ConfigMap's annotations never came")
		return nil
	}
	a := annotated(cm.ResourceVersion, func(a map[string]string) bool { return a[kube.AnnotationError] != "" })
	if want := "policy.yaml: line 3: lanes.a.fallback: fallback cycle a -> b -> a"; a[kube.AnnotationError] != want {
		t.Errorf("refusal %q, want %q", a[kube.AnnotationError], want)
	}
	cm, err = cms.Get(ctx, "lanes-policy", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cm.Data[kube.ConfigMapKey] = "lanes:\n  alice:\n    fallback: [bob]\n"
	if cm, err = cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	a = annotated(cm.ResourceVersion, func(a map[string]string) bool {
		return a[kube.AnnotationError] == "" && a[kube.AnnotationRevision] != ""
	})
	doc, err := l.api.Policy(ctx)
	if err != nil || strconv.FormatInt(doc.Revision, 10) != a[kube.AnnotationRevision] || !slices.Equal(doc.Policy.Lanes["alice"].Fallback, []string{"bob"}) {
		t.Errorf("policy in force %+v (%v); annotations %v", doc, err, a)
	}
}

// lanesConfig is lanes up on free loopback ports, its embedded etcd in a
// directory of the test's, with kube as its Kubernetes settings.
func lanesConfig(t *testing.T, kube controlplane.KubeConfig) controlplane.Config {
	cfg := controlplane.Defaults()
	cfg.DataDir = t.TempDir()
	cfg.AdminAddr, cfg.GatewayAddr = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Etcd.ClientAddr, cfg.Etcd.PeerAddr = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Nats.Addr = controlplane.NatsOff
	cfg.Traces.GRPCAddr, cfg.Traces.HTTPAddr = "off", "off"
	cfg.Kube = kube
	return cfg
}

// lanes is a running lanes up.
type lanes struct {
	srv   *controlplane.Server
	url   string
	token string
	api   *adminclient.Client
}

func startLanes(t *testing.T, cfg controlplane.Config) *lanes {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	srv, err := controlplane.Start(ctx, cfg, controlplane.WithLogger(log), controlplane.WithComponents(kube.NewComponent()))
	if err != nil {
		t.Fatal(err)
	}
	l := &lanes{srv: srv}
	t.Cleanup(l.close)
	a, _ := controlplane.Value(srv, controlplane.AdminKey)
	l.url, l.token = a.URL, a.Token
	l.api, err = adminclient.New(a.URL, a.Token)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func (l *lanes) close() {
	if l.srv != nil {
		l.api.Close()
		l.srv.Close()
		l.srv = nil
	}
}

// testManifests renders the base and each overlay with kubectl's
// kustomize and has the API server check them (--dry-run=server): every
// object valid, every RBAC rule grantable.
func testManifests(t *testing.T, c *cluster) {
	// A dry run creates no namespace; the objects in it need one.
	c.run(t, nil, "create", "namespace", "lanes-system")
	for _, dir := range []string{"base", "overlays/external-etcd", "overlays/etcd-statefulset"} {
		t.Run(strings.ReplaceAll(dir, "/", "-"), func(t *testing.T) {
			rendered := c.run(t, nil, "kustomize", filepath.Join(manifests, dir))
			out := c.run(t, rendered, "apply", "--dry-run=server", "-f", "-")
			for _, want := range []string{
				"customresourcedefinition.apiextensions.k8s.io/lanespolicies.lanes.dev", "deployment.apps/lanes",
				"role.rbac.authorization.k8s.io/lanes-namespace", "role.rbac.authorization.k8s.io/lanes-control-plane",
			} {
				if !bytes.Contains(out, []byte(want)) {
					t.Errorf("%s: %s not applied:\n%s", dir, want, out)
				}
			}
			if dir == "overlays/etcd-statefulset" && !bytes.Contains(out, []byte("statefulset.apps/lanes-etcd")) {
				t.Errorf("no etcd StatefulSet:\n%s", out)
			}
			checkArgs(t, rendered)
		})
	}
}

// checkArgs checks that the arguments the manifests give lanes up are
// settings it takes, valid together.
func checkArgs(t *testing.T, rendered []byte) {
	t.Helper()
	for _, doc := range bytes.Split(rendered, []byte("\n---\n")) {
		var d appsv1.Deployment
		if err := yaml.Unmarshal(doc, &d); err != nil || d.Kind != "Deployment" || d.Name != "lanes" {
			continue
		}
		args := d.Spec.Template.Spec.Containers[0].Args
		if len(args) == 0 || args[0] != "up" {
			t.Fatalf("lanes runs %v, want up", args)
		}
		cfg := controlplane.Defaults()
		// Variables from Secrets, as an operator would make them.
		secrets := map[string]string{"LANES_ADMIN_TOKEN": "lanes_admin_" + strings.Repeat("ab", 32), "LANES_EXTERNAL_ETCD": "https://etcd-1:2379,https://etcd-2:2379"}
		env := map[string]string{}
		for _, e := range d.Spec.Template.Spec.Containers[0].Env {
			env[e.Name] = e.Value
			if e.ValueFrom != nil {
				env[e.Name] = secrets[e.Name]
			}
		}
		if err := cfg.ApplyEnv(func(k string) string { return env[k] }); err != nil {
			t.Errorf("the variables: %v", err)
		}
		for _, a := range args[1:] {
			name, val, ok := strings.Cut(strings.TrimPrefix(a, "--"), "=")
			if !ok {
				val = "true"
			}
			if err := cfg.Set(name, []string{val}); err != nil {
				t.Errorf("%s: %v", a, err)
			}
		}
		if err := cfg.Validate(); err != nil {
			t.Errorf("lanes up %s: %v", strings.Join(args[1:], " "), err)
		}
		if !cfg.Kube.Enabled {
			t.Error("lanes up runs without --kube")
		}
		return
	}
	t.Fatal("no Deployment lanes in the manifests")
}

// policyObject is a LanesPolicy with spec.
func policyObject(name string, spec map[string]any) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "lanes.dev/v1alpha1", "kind": "LanesPolicy",
		"metadata": map[string]any{"name": name, "namespace": "lanes-system"},
		"spec":     spec,
	}}
}

type status struct {
	ObservedGeneration int64  `json:"observedGeneration"`
	Revision           int64  `json:"revision"`
	Error              string `json:"error"`
	Field              string `json:"field"`
}

// waitStatus waits for the status of the LanesPolicy name to answer the
// generation gen, watching from the resource version rv.
func waitStatus(t *testing.T, c *cluster, name string, gen int64, rv string) status {
	t.Helper()
	res := c.dyn.Resource(kube.PolicyResource).Namespace("lanes-system")
	w, err := res.Watch(ctxT(t, time.Minute), metav1.ListOptions{FieldSelector: "metadata.name=" + name, ResourceVersion: rv})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	for ev := range w.ResultChan() {
		u, ok := ev.Object.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		var st status
		b, _ := json.Marshal(u.Object["status"])
		json.Unmarshal(b, &st)
		if st.ObservedGeneration >= gen {
			return st
		}
	}
	t.Fatalf("LanesPolicy %s: no status for generation %d within a minute", name, gen)
	return status{}
}

func testPolicy(t *testing.T, c *cluster, l *lanes) {
	ctx := ctxT(t, 2*time.Minute)
	res := c.dyn.Resource(kube.PolicyResource).Namespace("lanes-system")

	// Refused by the API server: the schema and the CEL rules.
	for _, bad := range []struct {
		spec      map[string]any
		field, is string
	}{
		{map[string]any{"tags": []any{map[string]any{"service": "orders", "lane": "alice", "addrs": []any{"10.0.0.1:80"}, "labels": map[string]any{"v": "2"}}}},
			"spec.tags[0]", "set exactly one of addrs and labels"},
		{map[string]any{"canary": []any{map[string]any{"service": "orders", "lane": "alice", "percent": 150}}},
			"spec.canary[0].percent", "less than or equal to 100"},
		{map[string]any{"gateway": map[string]any{"lane_choice": "all", "allow": []any{"10.0.0.0/8"}}},
			"spec.gateway", "allow is used only with lane_choice: allowlist"},
	} {
		_, err := res.Create(ctx, policyObject("lanes", bad.spec), metav1.CreateOptions{})
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), bad.field) || !strings.Contains(err.Error(), bad.is) {
			t.Errorf("%v: the API server answered %v; want Invalid naming %s: %s", bad.spec, err, bad.field, bad.is)
		}
	}

	// Past the schema, refused by the policy package: the status names the
	// field, as lanes policy validate does.
	cycle := map[string]any{"lanes": map[string]any{"a": map[string]any{"fallback": []any{"b"}}, "b": map[string]any{"fallback": []any{"a"}}}}
	obj, err := res.Create(ctx, policyObject("lanes", cycle), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	st := waitStatus(t, c, "lanes", obj.GetGeneration(), obj.GetResourceVersion())
	raw, _ := json.Marshal(cycle)
	_, verr := l.api.ValidatePolicy(ctx, raw)
	ae, ok := verr.(*adminapi.Error)
	if !ok || st.Field != "spec."+ae.Field || st.Field != "spec.lanes.a.fallback" || !strings.Contains(st.Error, "fallback cycle") {
		t.Errorf("status %+v; lanes policy validate: %v", st, verr)
	}
	before := st.Revision

	// A good one takes effect: applied through the admin API's path
	// (history, revision), and the engine routes by it.
	good := map[string]any{"lanes": map[string]any{"alice": map[string]any{"fallback": []any{"bob"}}}, "outlier": map[string]any{"errors": 3}}
	if obj, err = res.Get(ctx, "lanes", metav1.GetOptions{}); err != nil { // with its status
		t.Fatal(err)
	}
	obj.Object["spec"] = good
	obj, err = res.Update(ctx, obj, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	st = waitStatus(t, c, "lanes", obj.GetGeneration(), obj.GetResourceVersion())
	if st.Error != "" || st.Revision <= before {
		t.Fatalf("status %+v after a good spec (revision before: %d)", st, before)
	}
	engine, _ := controlplane.Value(l.srv, controlplane.EngineKey)
	waitGoodPolicy(ctx, t, engine, "the engine")
	ex, err := l.api.Explain(ctx, adminapi.ExplainRequest{Service: "orders", Lane: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := json.Marshal(ex); !bytes.Contains(b, []byte(`"bob"`)) {
		t.Errorf("route explain of lane alice does not fall back to bob: %s", b)
	}
	hist, err := l.api.PolicyHistory(ctx)
	if err != nil || len(hist) == 0 || hist[0].Revision != st.Revision || hist[0].By != "LanesPolicy lanes-system/lanes" {
		t.Errorf("history: %+v, %v", hist, err)
	}

	// The policy in force is published where the services that follow
	// the cluster read it: a pod's engine (LANES_REGISTRY=k8s://, here a
	// kubestore of the namespace) routes by it too.
	pod, err := kubestore.Open(ctx, c.s.Admin(), kubestore.Options{Namespaces: []string{"default"}, PolicyNamespace: "default"})
	if err != nil {
		t.Fatal(err)
	}
	defer pod.Close()
	pe := routing.New(routing.WithRegistry(pod), routing.WithPolicyStore(pod.Policy()))
	defer pe.Close()
	waitGoodPolicy(ctx, t, pe, "a pod's engine")
	cm, err := c.cs.CoreV1().ConfigMaps("default").Get(ctx, kubestore.PolicyConfigMap, metav1.GetOptions{})
	if err != nil || cm.Annotations[kube.AnnotationRevision] != strconv.FormatInt(st.Revision, 10) {
		t.Errorf("the published policy: %+v, %v; want revision %d", cm, err, st.Revision)
	}
}

// waitDeployment waits until the Deployment ns/name exists (gone false)
// or is gone (gone true), watching it.
func waitDeployment(t *testing.T, cs *kubetest.Clients, ns, name string, gone bool) *appsv1.Deployment {
	t.Helper()
	ctx := ctxT(t, time.Minute)
	list, err := cs.AppsV1().Deployments(ns).List(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) == 1 && !gone {
		return &list.Items[0]
	}
	if len(list.Items) == 0 && gone {
		return nil
	}
	w, err := cs.AppsV1().Deployments(ns).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name, ResourceVersion: list.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	for ev := range w.ResultChan() {
		switch {
		case ev.Type == watch.Deleted && gone:
			return nil
		case (ev.Type == watch.Added || ev.Type == watch.Modified) && !gone:
			return ev.Object.(*appsv1.Deployment)
		}
	}
	t.Fatalf("deployment %s/%s: not %s within a minute", ns, name, map[bool]string{true: "deleted", false: "made"}[gone])
	return nil
}

// testServed makes what a kubelet and the endpointslice controller would
// for the baseline and its fork d: a pod of each template, and its
// endpoint, pointing at a listener of the test's; then a lane request, on
// the registry on Kubernetes, is served by the fork once its endpoint is
// ready, and a baseline request never is.
// testServed: lanes up routes to the pods of the namespaces it serves, by
// their labels, beside what registers in its etcd: a lane request reaches
// the fork's pod once its endpoint is ready, a baseline request never does,
// and a pod whose process registers itself through the admin API is the
// registration's (its lane), not the baseline's that its endpoint alone
// would make it.
func testServed(t *testing.T, c *cluster, l *lanes, base, d *appsv1.Deployment) *appsv1.Deployment {
	ctx := ctxT(t, time.Minute)
	baseSvc, err := c.cs.CoreV1().Services("default").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "orders"},
		Spec:       corev1.ServiceSpec{Selector: base.Spec.Selector.MatchLabels, Ports: []corev1.ServicePort{{Name: "http", Port: 80}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The Service selects the baseline's pods: the controller takes the
	// copy's pods out of it, and gives the lane a headless copy of it.
	var laneSvc *corev1.Service
	timing.Eventually(t, "the copy's pods out of Service orders, and its copy in lane alice", time.Minute, func() string {
		dep, err := c.cs.AppsV1().Deployments("default").Get(ctx, d.Name, metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		d = dep
		if labels.SelectorFromSet(baseSvc.Spec.Selector).Matches(labels.Set(d.Spec.Template.Labels)) {
			return fmt.Sprintf("Service orders selects the copy's pods %v", d.Spec.Template.Labels)
		}
		laneSvc, err = c.cs.CoreV1().Services("default").Get(ctx, "orders-alice", metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		return ""
	})
	switch {
	case laneSvc.Spec.ClusterIP != corev1.ClusterIPNone || laneSvc.Annotations[kubestore.AnnotationService] != "orders":
		t.Errorf("the lane's copy of Service orders: clusterIP %q, annotations %v", laneSvc.Spec.ClusterIP, laneSvc.Annotations)
	case !labels.SelectorFromSet(laneSvc.Spec.Selector).Matches(labels.Set(d.Spec.Template.Labels)) ||
		labels.SelectorFromSet(laneSvc.Spec.Selector).Matches(labels.Set(base.Spec.Template.Labels)):
		t.Errorf("the lane's copy of Service orders selects %v: want the copy's pods %v alone", laneSvc.Spec.Selector, d.Spec.Template.Labels)
	}
	pod := func(name string, tpl corev1.PodTemplateSpec) {
		if _, err := c.cs.CoreV1().Pods("default").Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: tpl.Labels}, Spec: tpl.Spec,
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	pod("orders-5d8f-base1", base.Spec.Template)
	pod("orders-alice-7c9b-x1", d.Spec.Template)
	// The endpointslice controller's slices: each pod's, of the Service
	// that selects it.
	slice := func(name, podName, addr string, ready bool) {
		host, p, _ := net.SplitHostPort(kubetest.PodAddr(addr))
		port, _ := strconv.Atoi(p)
		port32, pname := int32(port), "http"
		svc := baseSvc.Name
		if podName != "orders-5d8f-base1" {
			svc = laneSvc.Name
		}
		es := &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: svc, discoveryv1.LabelManagedBy: "endpointslice-controller.k8s.io"}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Endpoints: []discoveryv1.Endpoint{{Addresses: []string{host}, Conditions: discoveryv1.EndpointConditions{Ready: &ready, Serving: &ready},
				TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: "default", Name: podName}}},
			Ports: []discoveryv1.EndpointPort{{Name: &pname, Port: &port32}},
		}
		old, err := c.cs.DiscoveryV1().EndpointSlices("default").Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			es.ResourceVersion = old.ResourceVersion
			_, err = c.cs.DiscoveryV1().EndpointSlices("default").Update(ctx, es, metav1.UpdateOptions{})
		} else {
			_, err = c.cs.DiscoveryV1().EndpointSlices("default").Create(ctx, es, metav1.CreateOptions{})
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	baseAddr, laneAddr := kubetest.PodServer(t, "baseline"), kubetest.PodServer(t, "alice")
	slice("orders-base", "orders-5d8f-base1", baseAddr, true)
	slice("orders-alice", "orders-alice-7c9b-x1", laneAddr, false) // starting

	// lanes up's own engine: the one its gateway, admin API and xDS
	// server route with.
	e, _ := controlplane.Value(l.srv, controlplane.EngineKey)
	hc := podClient(e)
	defer hc.CloseIdleConnections()
	// callVia calls orders in lane l through hc, and returns who answered.
	callVia := func(hc *http.Client, l string) string {
		t.Helper()
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if l != "" {
			cctx = lane.WithLane(cctx, l)
		}
		req, _ := http.NewRequestWithContext(cctx, http.MethodGet, "http://orders/", nil)
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("lane %q: %v", l, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	call := func(l string) string { t.Helper(); return callVia(hc, l) }
	kubetest.WaitInstances(t, e, "orders", func(in []registry.Instance) bool { return len(in) == 1 })
	if who := call("alice"); who != "baseline" {
		t.Errorf("lane alice before its pod is ready: served by %q, want the baseline (fallback)", who)
	}
	slice("orders-alice", "orders-alice-7c9b-x1", laneAddr, true) // ready
	kubetest.WaitInstances(t, e, "orders", func(in []registry.Instance) bool { return len(in) == 2 })
	for range 10 {
		if who := call("alice"); who != "alice" {
			t.Fatalf("lane alice: served by %q, want the fork", who)
		}
		if who := call(""); who != "baseline" {
			t.Fatalf("baseline: served by %q", who)
		}
	}
	// The admin API lists the pods with the registrations.
	views, err := l.api.Instances(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	lanesOf := map[string]string{}
	for _, v := range views {
		lanesOf[v.ID] = v.EffectiveLane
	}
	if len(views) != 2 || lanesOf["orders-5d8f-base1.default"] != "" || lanesOf["orders-alice-7c9b-x1.default"] != "alice" {
		t.Errorf("lanes ls orders: %+v, want the two pods in their lanes", views)
	}

	// A service in a pod that follows the cluster alone
	// (LANES_REGISTRY=k8s://; here a kubestore engine).
	pst, err := kubestore.Open(ctx, c.s.Admin(), kubestore.Options{Namespaces: []string{"default"}})
	if err != nil {
		t.Fatal(err)
	}
	defer pst.Close()
	pe := routing.New(routing.WithRegistry(pst))
	defer pe.Close()

	// The baseline pod's process registers itself in the lane bob through
	// the admin API: that pod is bob's now, and no baseline request
	// reaches it (there is no other baseline instance: they fail), neither
	// through lanes up nor from a pod that follows the cluster, which sees
	// the registration as the mirror writes it.
	reg, err := l.api.Register(ctx, adminapi.RegisterRequest{Instance: registry.Instance{
		ID: "orders-self", Service: "orders", Lane: "bob", Addr: kubetest.PodAddr(baseAddr)}})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range []*routing.Engine{e, pe} {
		kubetest.WaitInstances(t, e, "orders", func(in []registry.Instance) bool {
			return len(in) == 2 && slices.ContainsFunc(in, func(in registry.Instance) bool { return in.ID == "orders-self" })
		})
		if res, err := e.Pick("orders", routing.Request{}); err == nil {
			t.Errorf("baseline request with the baseline pod registered in bob: picked %+v, want none", res.Instance)
		}
	}
	if who := call("bob"); who != "baseline" { // the pod's own answer
		t.Errorf("lane bob: served by %q, want the pod registered in bob", who)
	}
	if err := l.api.Deregister(ctx, "orders", "orders-self", reg.Registration); err != nil {
		t.Fatal(err)
	}
	for _, e := range []*routing.Engine{e, pe} {
		kubetest.WaitInstances(t, e, "orders", func(in []registry.Instance) bool {
			return len(in) == 2 && slices.ContainsFunc(in, func(in registry.Instance) bool { return in.ID == "orders-5d8f-base1.default" })
		})
	}
	if who := call(""); who != "baseline" {
		t.Errorf("baseline after the registration ended: served by %q", who)
	}

	// What registers through the admin API (a laptop, here) is mirrored
	// into the cluster: a service in a pod that follows the cluster alone
	// (pe, above) reaches it too.
	phc := podClient(pe)
	defer phc.CloseIdleConnections()
	laptop := kubetest.PodAddr(kubetest.PodServer(t, "carol's laptop"))
	lreg, err := l.api.Register(ctx, adminapi.RegisterRequest{Instance: registry.Instance{ID: "orders-laptop", Service: "orders", Lane: "carol", Addr: laptop}})
	if err != nil {
		t.Fatal(err)
	}
	kubetest.WaitInstances(t, pe, "orders", func(in []registry.Instance) bool {
		return slices.ContainsFunc(in, func(in registry.Instance) bool { return in.ID == "orders-laptop" && in.Lane == "carol" })
	})
	if who := callVia(phc, "carol"); who != "carol's laptop" {
		t.Errorf("lane carol from a pod: served by %q, want the laptop", who)
	}
	if err := l.api.Deregister(ctx, "orders", "orders-laptop", lreg.Registration); err != nil {
		t.Fatal(err)
	}
	kubetest.WaitInstances(t, pe, "orders", func(in []registry.Instance) bool {
		return !slices.ContainsFunc(in, func(in registry.Instance) bool { return in.ID == "orders-laptop" })
	})
	return d
}

// podClient is a client of the engine whose connections go where the pod
// network would take them.
func podClient(e *routing.Engine) *http.Client {
	return laneshttp.NewClient(e, laneshttp.WithBase(&http.Transport{DialContext: kubetest.DialPod}))
}

// waitDeploymentNot waits until the Deployment ns/name exists as another
// object than uid.
func waitDeploymentNot(t *testing.T, cs *kubetest.Clients, ns, name string, uid types.UID) *appsv1.Deployment {
	t.Helper()
	ctx := ctxT(t, time.Minute)
	w, err := cs.AppsV1().Deployments(ns).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	for ev := range w.ResultChan() {
		if d, ok := ev.Object.(*appsv1.Deployment); ok && ev.Type != watch.Deleted && d.UID != uid {
			return d
		}
	}
	t.Fatalf("deployment %s/%s: not made again within a minute", ns, name)
	return nil
}

// waitStatusKey waits until the controller has recorded the status of
// the fork lane/namespace/deployment, watching etcd from its first
// revision.
func waitStatusKey(t *testing.T, l *lanes, fork string) {
	t.Helper()
	st, _ := controlplane.Value(l.srv, controlplane.StoreKey)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for resp := range st.Client().Watch(ctx, st.Prefix()+"forkstatus/"+fork, clientv3.WithRev(1)) {
		if len(resp.Events) > 0 {
			return
		}
	}
	t.Fatalf("fork %s: no status within a minute", fork)
}

// waitConfigMapGone waits until the ConfigMap ns/name is gone.
func waitConfigMapGone(t *testing.T, cs *kubetest.Clients, ns, name string) {
	t.Helper()
	ctx := ctxT(t, time.Minute)
	list, err := cs.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) == 0 {
		return
	}
	w, err := cs.CoreV1().ConfigMaps(ns).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name, ResourceVersion: list.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	for ev := range w.ResultChan() {
		if ev.Type == watch.Deleted {
			return
		}
	}
	t.Fatalf("configmap %s/%s outlived its fork", ns, name)
}

// lanesCmd runs the lanes command line in the process.
func lanesCmd(args ...string) (code int, stdout, stderr string) {
	var out, errb bytes.Buffer
	code = cli.Main(args, &out, &errb)
	return code, out.String(), errb.String()
}

func testFork(t *testing.T, c *cluster, l *lanes, cfg controlplane.Config) {
	ctx := ctxT(t, 3*time.Minute)
	// The baseline: orders, with a ConfigMap for its environment and a
	// volume.
	if _, err := c.cs.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "orders-config"}, Data: map[string]string{"GREETING": "hello"},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{"app": "orders"}
	one := int32(3)
	base := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "orders", Labels: labels},
		Spec: appsv1.DeploymentSpec{
			Replicas: &one,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					Containers: []corev1.Container{{
						Name: "orders", Image: "orders:1",
						Env:     []corev1.EnvVar{{Name: "MODE", Value: "baseline"}},
						EnvFrom: []corev1.EnvFromSource{{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "orders-config"}}}},
					}},
					Volumes: []corev1.Volume{{Name: "conf", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
						LocalObjectReference: corev1.LocalObjectReference{Name: "orders-config"}}}}},
				},
			},
		},
	}
	if _, err := c.cs.AppsV1().Deployments("default").Create(ctx, base, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	alice, err := l.api.CreateToken(ctx, adminapi.TokenRequest{Lane: "alice"})
	if err != nil {
		t.Fatal(err)
	}

	// lanes fork, with alice's token, makes the lane's Deployment.
	code, out, errOut := lanesCmd("fork", "deploy/orders", "--lane", "alice", "--image", "orders:alice", "--env", "MODE=alice",
		"--with-configmaps", "--admin", l.url, "--token", alice.Secret)
	if code != 0 {
		t.Fatalf("lanes fork: exit %d\n%s%s", code, out, errOut)
	}
	d := waitDeployment(t, c.cs, "default", "orders-alice", false)
	tpl := d.Spec.Template.Spec.Containers[0]
	switch {
	case d.Spec.Selector.MatchLabels[kube.LabelLane] != "alice" || d.Spec.Selector.MatchLabels[kube.LabelForkOf] != "orders" || len(d.Spec.Selector.MatchLabels) != 2:
		t.Errorf("selector %v: want the lane and the Deployment", d.Spec.Selector.MatchLabels)
	case d.Spec.Template.Labels[kube.LabelLane] != "alice":
		t.Errorf("pod labels %v", d.Spec.Template.Labels)
	case *d.Spec.Replicas != 1:
		t.Errorf("replicas %d, want 1", *d.Spec.Replicas)
	case tpl.Image != "orders:alice" || len(tpl.Env) != 1 || tpl.Env[0].Value != "alice":
		t.Errorf("container %+v", tpl)
	case tpl.EnvFrom[0].ConfigMapRef.Name != "orders-config-alice" || d.Spec.Template.Spec.Volumes[0].ConfigMap.Name != "orders-config-alice":
		t.Errorf("the copy does not use the lane's ConfigMap: %+v", d.Spec.Template.Spec)
	case d.Labels[kube.LabelManagedBy] != kube.ManagedBy || d.Annotations[kube.AnnotationFork] != "default/orders":
		t.Errorf("ownership: labels %v, annotations %v", d.Labels, d.Annotations)
	}
	cm, err := c.cs.CoreV1().ConfigMaps("default").Get(ctx, "orders-config-alice", metav1.GetOptions{})
	if err != nil || cm.Data["GREETING"] != "hello" {
		t.Errorf("the lane's ConfigMap: %v, %v", cm, err)
	}
	d = testServed(t, c, l, base, d)

	// The controller's word on each fork: lanes fork ls shows the copy
	// made, and why a fork of a Deployment that is not there is not.
	code, out, errOut = lanesCmd("fork", "deploy/nosuch", "--lane", "alice", "--admin", l.url, "--token", alice.Secret)
	if code != 0 {
		t.Fatalf("lanes fork deploy/nosuch: exit %d\n%s%s", code, out, errOut)
	}
	waitStatusKey(t, l, "alice/default/orders")
	waitStatusKey(t, l, "alice/default/nosuch")
	code, out, errOut = lanesCmd("fork", "ls", "--admin", l.url, "--token", alice.Secret)
	if code != 0 || !regexp.MustCompile(`(?m)^alice +default +orders-alice +deploy/orders +orders:alice +- +made$`).MatchString(out) ||
		!strings.Contains(out, `deployments.apps "nosuch" not found`) {
		t.Errorf("lanes fork ls: exit %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = lanesCmd("fork", "delete", "deploy/nosuch", "--lane", "alice", "--admin", l.url, "--token", alice.Secret)
	if code != 0 {
		t.Errorf("lanes fork delete: exit %d\n%s%s", code, out, errOut)
	}

	// alice's token cannot fork into bob.
	code, out, errOut = lanesCmd("fork", "deploy/orders", "--lane", "bob", "--admin", l.url, "--token", alice.Secret)
	if code == 0 || !strings.Contains(errOut, "cannot fork into lane bob") {
		t.Errorf("alice's token forking into bob: exit %d\n%s%s", code, out, errOut)
	}
	if _, err := c.cs.AppsV1().Deployments("default").Get(ctx, "orders-bob", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("orders-bob: %v", err)
	}

	// A TTL ends a fork: the copy is made, then deleted.
	w, err := c.cs.AppsV1().Deployments("default").Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=orders-dave"})
	if err != nil {
		t.Fatal(err)
	}
	code, out, errOut = lanesCmd("fork", "deploy/orders", "--lane", "dave", "--ttl", "2s", "--admin", l.url, "--token", l.token)
	if code != 0 {
		t.Fatalf("lanes fork --ttl: exit %d\n%s%s", code, out, errOut)
	}
	var seen []watch.EventType
	for ev := range w.ResultChan() {
		seen = append(seen, ev.Type)
		if ev.Type == watch.Deleted {
			break
		}
	}
	w.Stop()
	if len(seen) == 0 || seen[0] != watch.Added || seen[len(seen)-1] != watch.Deleted {
		t.Errorf("orders-dave with a TTL: events %v, want it made then deleted", seen)
	}

	// A copy deleted by hand is made again: the controller is level-based.
	if err := c.cs.AppsV1().Deployments("default").Delete(ctx, "orders-alice", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if again := waitDeploymentNot(t, c.cs, "default", "orders-alice", d.UID); again.Spec.Template.Spec.Containers[0].Image != "orders:alice" {
		t.Errorf("made again as %+v", again.Spec.Template.Spec.Containers[0])
	}

	// The controller restarts: it finds what it made, and the lane's
	// expiry deletes it.
	l.close()
	l = startLanes(t, cfg)
	past := time.Now().Add(-time.Second)
	if _, err := l.api.UpdateLane(ctx, "alice", adminapi.LaneUpdate{Expires: &past}); err != nil {
		t.Fatal(err)
	}
	waitDeployment(t, c.cs, "default", "orders-alice", true)
	waitConfigMapGone(t, c.cs, "default", "orders-config-alice")
	timing.Eventually(t, "the lane's copy of Service orders deleted with the fork", time.Minute, func() string {
		if _, err := c.cs.CoreV1().Services("default").Get(ctx, "orders-alice", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return fmt.Sprintf("Service orders-alice: %v", err)
		}
		return ""
	})
	if _, err := c.cs.CoreV1().Services("default").Get(ctx, "orders", metav1.GetOptions{}); err != nil {
		t.Errorf("the baseline's Service: %v", err)
	}
	if forks, err := l.api.Forks(ctx); err != nil || len(forks) != 0 {
		t.Errorf("forks after the lane expired: %+v, %v", forks, err)
	}
	if _, err := c.cs.AppsV1().Deployments("default").Get(ctx, "orders", metav1.GetOptions{}); err != nil {
		t.Errorf("the baseline: %v", err)
	}
}
