package lanesenv_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/lanesdev/lanes/internal/testkit/etcdtest"
	"github.com/lanesdev/lanes/internal/testkit/leaktest"
	"github.com/lanesdev/lanes/internal/testkit/timing"
	"github.com/lanesdev/lanes/lanesenv"
	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
	"github.com/twmb/franz-go/pkg/kfake"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, leaktest.Options()...) }

func env(kv ...string) func(string) string {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(k string) string { return m[k] }
}

// TestParseErrors: every refusal names the variable as the user wrote it,
// the value (secrets hidden) and the expected form.
func TestParseErrors(t *testing.T) {
	cases := []struct {
		name string
		env  func(string) string
		want string
	}{
		{"missing", env(), `lanes: LANES_REGISTRY is not set: set it to etcd://host:port`},
		{"no scheme", env("LANES_REGISTRY", "127.0.0.1:7701"), `lanes: LANES_REGISTRY="127.0.0.1:7701": want etcd://host:port[,host:port...] or http(s)://admin-address`},
		{"bad scheme", env("LANES_REGISTRY", "consul://x:1"), `LANES_REGISTRY="consul://x:1": scheme "consul"`},
		{"no port", env("LANES_REGISTRY", "etcd://a:1,b"), `LANES_REGISTRY="etcd://a:1,b": endpoint 2 "b": want etcd://host:port`},
		{"path", env("LANES_REGISTRY", "etcd://a:1/x"), `endpoint 1 "a:1/x"`},
		{"cert without key", env("LANES_REGISTRY", "etcd://a:1", "LANES_ETCD_CERT", "c.pem"), `LANES_ETCD_CERT="c.pem": set LANES_ETCD_CERT and LANES_ETCD_KEY together`},
		{"password without user", env("LANES_REGISTRY", "etcd://a:1", "LANES_ETCD_PASSWORD", "s3cret"), `LANES_ETCD_USERNAME is not set: LANES_ETCD_PASSWORD is set`},
		{"password and password file", env("LANES_REGISTRY", "etcd://a:1", "LANES_ETCD_USERNAME", "root", "LANES_ETCD_PASSWORD", "s3cret", "LANES_ETCD_PASSWORD_FILE", "pw"), `LANES_ETCD_PASSWORD_FILE="pw": LANES_ETCD_PASSWORD is set too`},
		{"password file missing", env("LANES_REGISTRY", "etcd://a:1", "LANES_ETCD_USERNAME", "root", "LANES_ETCD_PASSWORD_FILE", "/nonexistent/etcd-password"), `LANES_ETCD_PASSWORD_FILE="/nonexistent/etcd-password": open /nonexistent/etcd-password: no such file or directory`},
		{"prefix", env("LANES_REGISTRY", "etcd://a:1", "LANES_ETCD_PREFIX", "lanes"), `LANES_ETCD_PREFIX="lanes": want a key prefix starting with /`},
		{"admin without token", env("LANES_REGISTRY", "http://127.0.0.1:7700"), `LANES_TOKEN is not set: LANES_REGISTRY is the admin API`},
		{"admin with etcd password", env("LANES_REGISTRY", "http://127.0.0.1:7700", "LANES_TOKEN", "t", "LANES_ETCD_PASSWORD", "s3cret"), `LANES_ETCD_PASSWORD="(hidden)": only for an etcd://`},
		{"admin query", env("LANES_REGISTRY", "http://127.0.0.1:7700/?x=1", "LANES_TOKEN", "t"), `want http(s)://host:port of the admin API`},
		{"log format", env("LANES_REGISTRY", "etcd://a:1", "LANES_LOG_FORMAT", "xml"), `LANES_LOG_FORMAT="xml": want text or json`},
		{"log level", env("LANES_REGISTRY", "etcd://a:1", "LANES_LOG_LEVEL", "loud"), `LANES_LOG_LEVEL="loud": want debug, info, warn or error`},
		{"nats without port", env("LANES_REGISTRY", "etcd://a:1", "LANES_NATS", "nats://a:4222,nats://u:pw@b"), `LANES_NATS="nats://a:4222,nats://xxxxx@b": server 2: want nats://host:port`},
		{"kafka without port", env("LANES_REGISTRY", "etcd://a:1", "LANES_KAFKA", "a:9092,b"), `LANES_KAFKA="a:9092,b": broker 2 "b": want host:port`},
		{"amqp scheme", env("LANES_REGISTRY", "etcd://a:1", "LANES_AMQP", "http://u:pw@a:5672/"), `LANES_AMQP="http://u:xxxxx@a:5672/": want amqp://user:password@host:port/vhost`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := lanesenv.Parse(c.env)
			var le *lanesenv.Error
			if !errors.As(err, &le) {
				t.Fatalf("err = %v (%T), want *lanesenv.Error", err, err)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("err = %q\nwant it to contain %q", err, c.want)
			}
			if strings.Contains(err.Error(), "s3cret") {
				t.Errorf("err shows the secret: %q", err)
			}
			// Open refuses the same way, before connecting to anything.
			env, err := lanesenv.Open(context.Background(), lanesenv.WithGetenv(c.env))
			if env != nil || !errors.As(err, &le) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("Open: %v, %v", env, err)
			}
		})
	}
}

// TestPasswordFile: LANES_ETCD_PASSWORD_FILE gives the password from the
// first line of a file.
func TestPasswordFile(t *testing.T) {
	f := filepath.Join(t.TempDir(), "etcd-password")
	if err := os.WriteFile(f, []byte("  s3cret \nignored\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := lanesenv.Parse(env("LANES_REGISTRY", "etcd://a:1", "LANES_ETCD_USERNAME", "root", "LANES_ETCD_PASSWORD_FILE", f))
	if err != nil || s.Username != "root" || s.Password != "s3cret" {
		t.Fatalf("Parse: %+v %v", s, err)
	}
	if err := os.WriteFile(f, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := lanesenv.Parse(env("LANES_REGISTRY", "etcd://a:1", "LANES_ETCD_USERNAME", "root", "LANES_ETCD_PASSWORD_FILE", f)); err == nil || !strings.Contains(err.Error(), "holds no password") {
		t.Errorf("an empty file: %v", err)
	}
}

func TestParse(t *testing.T) {
	s, err := lanesenv.Parse(env("LANES_REGISTRY", " etcd://10.0.0.1:2379, 10.0.0.2:2379/ ", "LANES_ETCD_PREFIX", "/shop/"))
	if err != nil || len(s.Etcd) != 2 || s.Etcd[0] != "10.0.0.1:2379" || s.Etcd[1] != "10.0.0.2:2379" || s.Prefix != "/shop/" {
		t.Errorf("etcd: %+v, %v", s, err)
	}
	s, err = lanesenv.Parse(env("LANES_REGISTRY", "https://lanes.internal:7700", "LANES_TOKEN", "tok"))
	if err != nil || s.Admin != "https://lanes.internal:7700" || s.Token != "tok" || s.Etcd != nil {
		t.Errorf("admin: %+v, %v", s, err)
	}
}

// TestOpenUnreachable: a registry that does not answer is an error naming
// LANES_REGISTRY and its value, within the timeout.
func TestOpenUnreachable(t *testing.T) {
	for _, reg := range []string{"etcd://127.0.0.1:1", "http://127.0.0.1:1"} {
		_, err := lanesenv.Open(context.Background(), lanesenv.WithTimeout(2*time.Second), lanesenv.WithLogger(quiet),
			lanesenv.WithGetenv(env("LANES_REGISTRY", reg, "LANES_TOKEN", "tok")))
		if err == nil || !strings.Contains(err.Error(), `LANES_REGISTRY="`+reg+`": cannot reach`) {
			t.Errorf("%s: %v", reg, err)
		}
	}
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// TestOpenEtcd: Open on etcd gives an engine that sees the registry and
// follows the policy: a strict lane with no instance fails, a fallback
// chain reaches the lane it names.
func TestOpenEtcd(t *testing.T) {
	srv := etcdtest.Embedded(t)
	reg := strings.Replace(srv.Endpoints()[0], "http://", "etcd://", 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	e, err := lanesenv.Open(ctx, lanesenv.WithLogger(quiet), lanesenv.WithGetenv(env("LANES_REGISTRY", reg, "LANES_ETCD_PREFIX", "/lanesenv-test/")))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if e.Source != reg {
		t.Errorf("Source = %q", e.Source)
	}
	if _, err := e.Policy.Put(ctx, []byte("lanes:\n  bob:\n    fallback: [alice]\n  solo:\n    strict: true\n")); err != nil {
		t.Fatal(err)
	}
	for _, in := range []registry.Instance{
		{Service: "orders", ID: "o-1", Addr: "127.0.0.1:1"},
		{Service: "orders", ID: "o-alice", Addr: "127.0.0.1:2", Lane: "alice"},
	} {
		l, err := e.Registry.Register(ctx, in, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
	}
	svc := e.Engine.Service("orders")
	waitFor(t, "bob falls back to alice, solo is strict", func() bool {
		r, err := svc.Pick(routing.Request{Lane: "bob"})
		if err != nil || r.Instance.ID != "o-alice" {
			return false
		}
		_, err = svc.Pick(routing.Request{Lane: "solo"})
		var re *routing.Error
		return errors.As(err, &re) && re.Code == routing.CodeLaneUnavailable
	})
}

// TestOpenKafka: LANES_KAFKA gives the service a ready laneskafka client,
// on kfake; brokers that do not answer are an error naming the variable.
func TestOpenKafka(t *testing.T) {
	srv := etcdtest.Embedded(t)
	reg := strings.Replace(srv.Endpoints()[0], "http://", "etcd://", 1)
	kc, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	e, err := lanesenv.Open(ctx, lanesenv.WithLogger(quiet), lanesenv.WithGetenv(env("LANES_REGISTRY", reg, "LANES_KAFKA", strings.Join(kc.ListenAddrs(), ","))))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if e.Kafka == nil || e.AMQP != nil {
		t.Fatalf("Kafka %v, AMQP %v: want a Kafka client only", e.Kafka, e.AMQP)
	}
	pub, err := e.Kafka.Publisher("orders")
	if err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish(ctx, nil, []byte("42")); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := l.Addr().String()
	l.Close()
	sctx, scancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer scancel()
	_, err = lanesenv.Open(sctx, lanesenv.WithLogger(quiet), lanesenv.WithGetenv(env("LANES_REGISTRY", reg, "LANES_KAFKA", dead)))
	var le *lanesenv.Error
	if !errors.As(err, &le) || le.Var != "LANES_KAFKA" {
		t.Fatalf("Open with a dead broker: %v, want an error naming LANES_KAFKA", err)
	}
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	timing.Until(t, what, 30*time.Second, ok)
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{"", "etcd://a:1", "etcd://a:1,b:2", "http://x:1", "https://x", "etcd://", "etcd://:1", "etcd://[::1]:2379", "http://", "x://y"} {
		f.Add(s, "tok")
	}
	f.Fuzz(func(t *testing.T, reg, tok string) {
		s, err := lanesenv.Parse(env("LANES_REGISTRY", reg, "LANES_TOKEN", tok))
		if err != nil {
			var le *lanesenv.Error
			if !errors.As(err, &le) || le.Var == "" {
				t.Fatalf("%q: %v", reg, err)
			}
			return
		}
		if (len(s.Etcd) == 0) == (s.Admin == "") {
			t.Fatalf("%q: %+v", reg, s)
		}
	})
}

// TestKubernetesNotLinked: without the blank import of kubestore, k8s://
// and a pod without LANES_REGISTRY are refused with an error that names
// the import (and, in a pod, the admin API).
func TestKubernetesNotLinked(t *testing.T) {
	for _, getenv := range []func(string) string{
		env(lanesenv.EnvRegistry, "k8s://?namespace=a"),
		env("KUBERNETES_SERVICE_HOST", "10.0.0.1"),
	} {
		_, err := lanesenv.Parse(getenv)
		var e *lanesenv.Error
		if !errors.As(err, &e) || e.Var != lanesenv.EnvRegistry || !strings.Contains(e.Msg, `import _ "github.com/lanesdev/lanes/kubestore"`) {
			t.Fatalf("Parse = %v, want an error on %s naming the import", err, lanesenv.EnvRegistry)
		}
	}
}
