package cli

import (
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// A client command takes its token from a file (--token-file, or
// LANES_TOKEN_FILE), so that it shows in no process list; a missing or
// empty file is a usage error that names the flag or variable.
func TestTokenFromFile(t *testing.T) {
	var mu sync.Mutex
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Header.Get("Authorization"))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"services":[],"instances":[]}`))
	}))
	defer srv.Close()
	dir := t.TempDir()
	file := write(t, dir, "token", "  lanes_secret_from_file\n")

	run(t, "ls", "--admin", srv.URL, "--data-dir", dir, "--token-file", file)
	t.Setenv(EnvTokenFile, file)
	run(t, "ls", "--admin", srv.URL, "--data-dir", dir)
	mu.Lock()
	if len(got) < 2 || got[0] != "Bearer lanes_secret_from_file" || got[len(got)-1] != "Bearer lanes_secret_from_file" {
		t.Errorf("the admin API saw %q, want the token of the file from --token-file and from %s", got, EnvTokenFile)
	}
	mu.Unlock()

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--token-file", filepath.Join(dir, "missing")}, "--token-file"},
		{[]string{"--token-file", write(t, dir, "empty", "\n")}, "the file is empty"},
	} {
		code, _, errOut := run(t, append([]string{"ls", "--admin", srv.URL, "--data-dir", dir}, c.args...)...)
		if code != ExitUsage || !strings.Contains(errOut, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want %d naming %q", c.args, code, errOut, ExitUsage, c.want)
		}
	}
}
