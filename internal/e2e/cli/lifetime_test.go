package cli

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/lanesdev/lanes/registry"
)

// TestApplyKeepsLaneLifetimes: a lane lifetime set with `lanes lane expire`
// survives a `policy apply` of a document that does not set it, and the dry
// run (the command's and the dashboard's), the apply and the history say so;
// a document that sets it moves it, and the dry run shows the move.
func TestApplyKeepsLaneLifetimes(t *testing.T) {
	u := startUp(t, "up")
	u.register(t, u.token, registry.Instance{Service: "orders", ID: "orders-1", Addr: "127.0.0.1:1"})
	u.register(t, u.token, registry.Instance{Service: "orders", ID: "orders-carol", Addr: "127.0.0.1:2", Lane: "carol"})

	code, out, errOut := u.cli(t, "lane", "expire", "carol", "--at", "2099-01-02T03:04:05Z")
	expect(t, "lane expire carol", code, out, errOut, 0, "lane carol expires at")

	work := t.TempDir()
	pol := filepath.Join(work, "policy.yaml")
	os.WriteFile(pol, []byte("# kept in git\nlanes:\n  bob:\n    fallback: [carol]\n"), 0o644)
	code, out, errOut = u.cli(t, "policy", "apply", "--dry-run", pol)
	expect(t, "dry run of a document without carol", code, out, errOut, 0,
		"no lane lifetime changes", "kept: lane carol expires 2099-01-02T03:04:05Z", "lanes lane expire carol --never")

	// The dashboard's dry run says the same.
	page := dashboardValidate(t, u, "lanes:\n  bob:\n    fallback: [carol]\n")
	if !strings.Contains(page, `data-kept="carol"`) || !strings.Contains(page, "No lane lifetime changes.") {
		t.Errorf("the dashboard's dry run does not say carol's lifetime is kept:\n%s", page)
	}

	code, out, errOut = u.cli(t, "policy", "apply", pol)
	expect(t, "apply a document without carol", code, out, errOut, 0, "policy applied", "kept: lane carol expires 2099-01-02T03:04:05Z")
	code, out, errOut = u.cli(t, "ls", "-o", "json")
	expect(t, "ls after the apply", code, out, errOut, 0)
	if !regexp.MustCompile(`"name": "carol",[^}]*"expires": "2099-01-02T03:04:05Z"`).MatchString(out) {
		t.Errorf("ls after the apply: carol lost its lifetime:\n%s", out)
	}
	code, out, errOut = u.cli(t, "policy", "get")
	expect(t, "policy get", code, out, errOut, 0, "# kept in git", "fallback: [carol]", "carol:", "expires: 2099-01-02T03:04:05Z")
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	hist, err := u.client(t, u.token).PolicyHistory(ctx)
	if err != nil || len(hist) < 2 || !strings.Contains(hist[0].Raw, "bob") || !strings.Contains(hist[0].Raw, "expires: 2099-01-02T03:04:05Z") {
		t.Errorf("the history does not hold the document as stored, lifetime included: %+v %v", hist, err)
	}

	// A document that sets the lifetime moves it; the dry run shows it.
	moved := filepath.Join(work, "moved.yaml")
	os.WriteFile(moved, []byte("lanes:\n  carol:\n    expires: 2098-01-01T00:00:00Z\n"), 0o644)
	code, out, errOut = u.cli(t, "policy", "apply", "--dry-run", moved)
	expect(t, "dry run of a document that moves carol's lifetime", code, out, errOut, 0, "1 lane lifetime(s) would change")
	if !regexp.MustCompile(`(?m)^carol\s+2099-01-02T03:04:05Z\s+2098-01-01T00:00:00Z$`).MatchString(out) || strings.Contains(out, "kept:") {
		t.Errorf("dry run does not show carol's lifetime moving:\n%s", out)
	}
	page = dashboardValidate(t, u, "lanes:\n  carol:\n    expires: 2098-01-01T00:00:00Z\n")
	if !strings.Contains(page, `data-lifetime="carol"`) || !strings.Contains(page, "2098-01-01T00:00:00Z") {
		t.Errorf("the dashboard's dry run does not show carol's lifetime moving:\n%s", page)
	}

	// Lifted with --never, the next apply has nothing to keep.
	code, out, errOut = u.cli(t, "lane", "expire", "carol", "--never")
	expect(t, "lane expire carol --never", code, out, errOut, 0)
	code, out, errOut = u.cli(t, "policy", "apply", pol)
	expect(t, "apply after --never", code, out, errOut, 0, "policy applied")
	if strings.Contains(out, "kept:") {
		t.Errorf("apply after --never keeps a lifetime:\n%s", out)
	}
}

// dashboardValidate logs in to u's dashboard with the admin token and
// returns the policy page's answer to validating doc.
func dashboardValidate(t *testing.T, u *up, doc string) string {
	t.Helper()
	admin := u.admin
	if !strings.Contains(admin, "://") {
		admin = "http://" + admin
	}
	jar, _ := cookiejar.New(nil)
	hc := &http.Client{Jar: jar, Timeout: wait}
	t.Cleanup(hc.CloseIdleConnections)
	send := func(path string, form url.Values) string {
		t.Helper()
		var resp *http.Response
		var err error
		if form == nil {
			resp, err = hc.Get(admin + path)
		} else {
			req, _ := http.NewRequest(http.MethodPost, admin+path, strings.NewReader(form.Encode()))
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			req.Header.Set("Origin", admin)
			resp, err = hc.Do(req)
		}
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d\n%s", path, resp.StatusCode, b)
		}
		return string(b)
	}
	send("/ui/login", url.Values{"token": {u.token}})
	m := regexp.MustCompile(`name="csrf" value="([^"]+)"`).FindStringSubmatch(send("/ui/policy", nil))
	if m == nil {
		t.Fatal("no CSRF token in the dashboard's policy form")
	}
	return send("/ui/policy", url.Values{"action": {"validate"}, "document": {doc}, "csrf": {m[1]}})
}

// TestUnreachableEtcd: an external etcd that nothing answers at is reported
// as unreachable, naming the endpoints, not as a lost quorum.
func TestUnreachableEtcd(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close() // nothing listens there now
	code, out, errOut := run(t, "", "up", "--data-dir", t.TempDir(), "--external-etcd", closed,
		"--admin-addr", "127.0.0.1:0", "--gateway-addr", "127.0.0.1:0", "--nats-addr", "off",
		"--otlp-grpc-addr", "off", "--otlp-http-addr", "off")
	expect(t, "lanes up with an unreachable etcd", code, out, errOut, 1, "etcd cannot be reached at "+closed, "connection refused")
	if strings.Contains(out+errOut, "quorum") {
		t.Errorf("an unreachable etcd is reported as a lost quorum:\n%s%s", out, errOut)
	}
}
