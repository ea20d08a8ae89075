// Package kubetest runs a real Kubernetes API server for tests, as
// controller-runtime's envtest does: kube-apiserver as a child process on a
// free loopback port, storing in an embedded etcd of the test's own, with
// RBAC on and a static admin token. No controller manager, scheduler or
// kubelet runs: a test makes what they would (EndpointSlices, pod status)
// itself.
//
// The binaries are built from the Go module proxy by .ci/kube-build, which
// caches them outside the repository; Bin finds them there, on PATH, or
// through LANES_KUBE_APISERVER and LANES_KUBECTL. Tests skip with
// SkipMessage when kube-apiserver is missing.
package kubetest

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	rbacv1client "k8s.io/client-go/kubernetes/typed/rbac/v1"
	"k8s.io/client-go/rest"

	"github.com/lanesdev/lanes/internal/lib/kubeclient"
	"github.com/lanesdev/lanes/internal/testkit/etcdtest"
	"github.com/lanesdev/lanes/internal/testkit/proctest"
	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

// BinEnv and KubectlEnv name the variables that may point at the binaries.
const (
	BinEnv     = "LANES_KUBE_APISERVER"
	KubectlEnv = "LANES_KUBECTL"
)

// Version is the Kubernetes release .ci/kube-build builds by default.
const Version = "v1.34.4"

// SkipMessage is why the tests skip when there is no API server to run.
const SkipMessage = "kube-apiserver not found (on PATH, in the CI cache of .ci/kube-build, or " + BinEnv + "): run `.ci/kube-build` (about 15 minutes, once) to run the Kubernetes tests"

// cacheBin is where .ci/kube-build puts the binaries.
func cacheBin() string {
	base := os.Getenv("LANES_CI_CACHE")
	if base == "" {
		c := os.Getenv("XDG_CACHE_HOME")
		if c == "" {
			home, _ := os.UserHomeDir()
			c = filepath.Join(home, ".cache")
		}
		base = filepath.Join(c, "lanes-ci")
	}
	v := os.Getenv("LANES_KUBE_VERSION")
	if v == "" {
		v = Version
	}
	return filepath.Join(base, "kube", v, "bin")
}

// Bin returns the path of kube-apiserver, or "".
func Bin() string {
	return proctest.Find(BinEnv, "kube-apiserver", filepath.Join(cacheBin(), "kube-apiserver"))
}

// Kubectl returns the path of kubectl, or "".
func Kubectl() string {
	return proctest.Find(KubectlEnv, "kubectl", filepath.Join(cacheBin(), "kubectl"))
}

// Server is a kube-apiserver process and its etcd.
type Server struct {
	*proctest.Proc
	// URL is the server's https://127.0.0.1:port.
	URL string
	// AdminToken is a bearer token of the group system:masters.
	AdminToken string
	dir        string
	ca         []byte // the server's self-signed certificate, PEM
}

// Start runs an API server, or skips the test when there is none to run.
// It is stopped at the test's cleanup.
func Start(t testing.TB) *Server {
	t.Helper()
	bin := Bin()
	if bin == "" {
		t.Skip(SkipMessage)
	}
	etcd := etcdtest.Embedded(t)
	// The port is chosen free, then handed to the server: another process
	// may take it meanwhile, and the server exits; then another is tried.
	for attempt := 1; ; attempt++ {
		s, err := start(t, bin, etcd.Endpoints()[0])
		if err == nil {
			return s
		}
		if attempt == 3 || !s.LogContains("address already in use") {
			t.Fatal(err)
		}
		t.Logf("kube-apiserver: its port was taken before it bound; trying another (%v)", err)
	}
}

func start(t testing.TB, bin, etcdURL string) (*Server, error) {
	dir := t.TempDir()
	addr, err := proctest.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	host, port, _ := net.SplitHostPort(addr)
	s := &Server{URL: "https://" + addr, AdminToken: randomToken(), dir: dir}
	tokens := filepath.Join(dir, "tokens.csv")
	if err := os.WriteFile(tokens, []byte(s.AdminToken+`,lanes-test-admin,lanes-test-admin,"system:masters"`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	saKey := filepath.Join(dir, "sa.key")
	if err := writeRSAKey(saKey); err != nil {
		t.Fatal(err)
	}
	certs := filepath.Join(dir, "certs")
	args := []string{
		"--etcd-servers=" + etcdURL,
		"--etcd-prefix=/registry-" + randomToken()[:8],
		"--bind-address=" + host,
		"--advertise-address=" + host,
		"--secure-port=" + port,
		"--cert-dir=" + certs,
		"--token-auth-file=" + tokens,
		"--authorization-mode=RBAC",
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file=" + saKey,
		"--service-account-signing-key-file=" + saKey,
		// No controller manager makes the default service accounts.
		"--disable-admission-plugins=ServiceAccount",
		"--service-cluster-ip-range=10.0.0.0/24",
		"--allow-privileged=true",
		// Its own loopback client, for its post-start hooks; no cloud.
		"--profiling=false",
		"--v=1",
	}
	s.Proc = proctest.New(t, proctest.Spec{
		Name: "kube-apiserver", Bin: bin, LogPath: filepath.Join(dir, "kube-apiserver.log"),
		Args: func() []string { return args }, Timeout: 2 * time.Minute,
		Ready: func(ctx context.Context, pid int, exited <-chan struct{}) error {
			return s.waitReady(ctx, certs, exited)
		},
	})
	return s, s.Start()
}

// waitReady waits for the server's certificate, then for /readyz to answer
// 200 to the admin.
func (s *Server) waitReady(ctx context.Context, certs string, exited <-chan struct{}) error {
	var last error
	for {
		if s.ca == nil {
			if b, err := os.ReadFile(filepath.Join(certs, "apiserver.crt")); err == nil && len(b) > 0 {
				s.ca = b
			}
		}
		if s.ca != nil {
			last = s.readyz(ctx)
			if last == nil {
				return nil
			}
		}
		select {
		case <-exited:
			return fmt.Errorf("exited before serving on %s", s.URL)
		case <-ctx.Done():
			return fmt.Errorf("not ready at %s: %w (%v)", s.URL, ctx.Err(), last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (s *Server) readyz(ctx context.Context) error {
	c, err := rest.HTTPClientFor(s.Config(s.AdminToken))
	if err != nil {
		return err
	}
	defer c.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.URL+"/readyz", nil)
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("/readyz: %s", resp.Status)
	}
	return nil
}

// Config returns a client configuration for the server with a bearer
// token.
func (s *Server) Config(token string) *rest.Config {
	return &rest.Config{
		Host:            s.URL,
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{CAData: s.ca},
		Timeout:         30 * time.Second,
		QPS:             -1, // no client-side rate limit: the tests make bursts
	}
}

// Admin returns a client configuration of the admin.
func (s *Server) Admin() *rest.Config { return s.Config(s.AdminToken) }

// Clients are the admin's clients: lanes' own, and RBAC's, for a test to
// grant roles with.
type Clients struct {
	*kubeclient.Clients
	rbac *rbacv1client.RbacV1Client
}

// RbacV1 is the client of rbac.authorization.k8s.io/v1.
func (c *Clients) RbacV1() rbacv1client.RbacV1Interface { return c.rbac }

// Clientset returns the admin's clients.
func (s *Server) Clientset(t testing.TB) *Clients {
	t.Helper()
	c, err := kubeclient.New(s.Admin())
	if err != nil {
		t.Fatal(err)
	}
	r, err := rbacv1client.NewForConfig(s.Admin())
	if err != nil {
		t.Fatal(err)
	}
	return &Clients{Clients: c, rbac: r}
}

// Kubeconfig writes a kubeconfig file for token (for kubectl, or for
// KUBECONFIG) and returns its path.
func (s *Server) Kubeconfig(t testing.TB, token string) string {
	t.Helper()
	ca := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(ca, s.ca, 0o600); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	doc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: test
  cluster:
    server: %s
    certificate-authority: %s
users:
- name: test
  user:
    token: %s
contexts:
- name: test
  context: {cluster: test, user: test}
current-context: test
`, s.URL, ca, token)
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// ServiceAccountToken creates the namespace and the service account (if
// missing) and returns a token of it from the TokenRequest API, so that a
// test can act with exactly the rights RBAC gives that account.
func (s *Server) ServiceAccountToken(t testing.TB, namespace, name string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := s.Clientset(t)
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if _, err := c.CoreV1().ServiceAccounts(namespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	hour := int64(3600)
	tr, err := c.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, &authv1.TokenRequest{Spec: authv1.TokenRequestSpec{ExpirationSeconds: &hour}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

// ServiceAccountUser is the user name RBAC knows a service account by.
func ServiceAccountUser(namespace, name string) string {
	return "system:serviceaccount:" + namespace + ":" + name
}

func randomToken() string {
	b := make([]byte, 16)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func writeRSAKey(path string) error {
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return err
	}
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600)
}

// PodNet stands in for the pod network, which no test here has: the API
// server refuses loopback addresses in an endpoint, so a test's pod
// listening on 127.0.0.1:port has the endpoint 192.0.2.1:port (TEST-NET-1,
// never routed; PodAddr), and DialPod takes 192.0.2.x back to 127.0.0.x.
const PodNet = "192.0.2."

// PodAddr is the endpoint address of a test's pod listening at loopback.
func PodAddr(loopback string) string { return strings.Replace(loopback, "127.0.0.", PodNet, 1) }

// DialPod connects where the pod network would take a connection to addr,
// an address on PodNet; any other is refused. It is an
// http.Transport.DialContext.
func DialPod(ctx context.Context, network, addr string) (net.Conn, error) {
	if !strings.HasPrefix(addr, PodNet) {
		return nil, fmt.Errorf("%s is not on the test's pod network", addr)
	}
	d := net.Dialer{Timeout: 5 * time.Second}
	return d.DialContext(ctx, network, strings.Replace(addr, PodNet, "127.0.0.", 1))
}

// PodServer is a test's pod: it answers every request with name, on a
// loopback port (its endpoint is PodAddr of the address it returns). It is
// closed at the test's cleanup.
func PodServer(t testing.TB, name string) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, name) }),
		ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() { defer close(done); srv.Serve(lis) }()
	t.Cleanup(func() { srv.Close(); <-done })
	return lis.Addr().String()
}

// WaitInstances waits, on the engine's change notifications, until the
// instances of service satisfy ok, and returns them; it fails the test
// after 30s.
func WaitInstances(t testing.TB, e *routing.Engine, service string, ok func([]registry.Instance) bool) []registry.Instance {
	t.Helper()
	svc := e.Service(service)
	deadline := time.After(30 * time.Second)
	for {
		ch := svc.Changed()
		if got := svc.Instances(); ok(got) {
			return got
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("%s: instances never as wanted: %+v", service, svc.Instances())
		}
	}
}
