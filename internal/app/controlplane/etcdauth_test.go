package controlplane

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lanesdev/lanes/etcdstore"
	"github.com/lanesdev/lanes/lanesenv"
)

// TestEmbeddedEtcdAuth: the embedded etcd takes no request without
// credentials; the root password is in the data directory (0600), and the
// environment the control plane prints for services carries the user and
// the file, with which lanesenv connects. etcd.no_auth turns it off.
func TestEmbeddedEtcdAuth(t *testing.T) {
	cfg := minimalConfig(t)
	for _, noAuth := range []bool{false, true} {
		cfg.Etcd.NoAuth = noAuth
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		s, err := Start(ctx, cfg, WithLogger(NewLogger(io.Discard, "error")))
		if err != nil {
			t.Fatal(err)
		}
		etcd, _ := Value(s, EtcdKey)
		st, err := etcdstore.Open(ctx, etcdstore.Config{Endpoints: etcd.Endpoints})
		if err == nil {
			_, err = st.Policy().Get(ctx)
			st.Close()
		}
		if noAuth != (err == nil) {
			t.Errorf("no_auth %v: a client without credentials: %v", noAuth, err)
		}
		env := map[string]string{}
		for _, kv := range s.ServiceEnv() {
			k, v, _ := strings.Cut(kv, "=")
			env[k] = v
		}
		if noAuth {
			if env["LANES_ETCD_PASSWORD_FILE"] != "" {
				t.Errorf("no_auth: the service environment %v names a password file", s.ServiceEnv())
			}
		} else {
			pw := filepath.Join(cfg.DataDir, EtcdPasswordFile)
			if fi, err := os.Stat(pw); err != nil || fi.Mode().Perm() != 0o600 {
				t.Errorf("%s: %v %v, want mode 0600", pw, fi, err)
			}
			if env["LANES_ETCD_USERNAME"] != "root" || !strings.HasSuffix(env["LANES_ETCD_PASSWORD_FILE"], EtcdPasswordFile) {
				t.Errorf("the service environment %v lacks the credentials", s.ServiceEnv())
			}
			le, err := lanesenv.Open(ctx, lanesenv.WithGetenv(func(k string) string { return env[k] }))
			if err != nil {
				t.Errorf("lanesenv with the printed environment: %v", err)
			} else {
				le.Close()
			}
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if !noAuth {
			// Without its password file, the data directory's etcd cannot
			// be opened, and the error says what to restore; no other
			// password takes the file's place.
			pw := filepath.Join(cfg.DataDir, EtcdPasswordFile)
			if err := os.Rename(pw, pw+".saved"); err != nil {
				t.Fatal(err)
			}
			if s, err := Start(ctx, cfg, WithLogger(NewLogger(io.Discard, "error"))); err == nil || !strings.Contains(err.Error(), "is missing: restore it") {
				if s != nil {
					s.Close()
				}
				t.Fatalf("a start without the password file: %v, want an error naming the missing file", err)
			}
			if _, err := os.Stat(pw); !os.IsNotExist(err) {
				t.Errorf("after the failed start, %s: %v; want none", pw, err)
			}
			if err := os.Rename(pw+".saved", pw); err != nil {
				t.Fatal(err)
			}
		}
	}
}
