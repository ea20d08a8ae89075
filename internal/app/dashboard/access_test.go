package dashboard_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/lanesdev/lanes/adminapi"
	"github.com/lanesdev/lanes/internal/app/dashboard"
	"github.com/lanesdev/lanes/registry"
)

// browserless is a cookie-keeping HTTP client that does not follow
// redirects, so the tests see them.
func browserless(t *testing.T) *http.Client {
	jar, _ := cookiejar.New(nil)
	hc := &http.Client{Jar: jar, Timeout: 20 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	t.Cleanup(hc.CloseIdleConnections)
	return hc
}

func post(t *testing.T, hc *http.Client, u string, form url.Values, origin string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, u, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if origin != "" {
		req.Header.Set("Origin", origin)
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func getPage(t *testing.T, hc *http.Client, u string) (*http.Response, string) {
	t.Helper()
	resp, err := hc.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

var csrfRE = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// TestAccess: the login form, the session cookie, and the guards on
// changes; a lane token sees the pages but the API refuses it the policy.
func TestAccess(t *testing.T) {
	w := startWorld(t)
	ui := w.admin + dashboard.Prefix
	hc := browserless(t)

	resp, _ := getPage(t, hc, ui+"policy")
	if resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(resp.Header.Get("Location"), "/ui/login") {
		t.Fatalf("without a session: %d %q, want a redirect to the login form", resp.StatusCode, resp.Header.Get("Location"))
	}
	resp, body := post(t, hc, ui+"login", url.Values{"token": {"not-a-token-at-all"}}, w.admin)
	if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(body, "refused the token") {
		t.Errorf("wrong token: %d, want 401 and the refusal", resp.StatusCode)
	}
	resp, _ = post(t, hc, ui+"login", url.Values{"token": {w.token}}, "http://evil.example")
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("login from another origin: %d, want 403", resp.StatusCode)
	}
	resp, _ = post(t, hc, ui+"login", url.Values{"token": {w.token}, "next": {"//evil.example/"}}, w.admin)
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/ui/" {
		t.Fatalf("login: %d to %q, want 303 to /ui/", resp.StatusCode, resp.Header.Get("Location"))
	}
	c := resp.Cookies()
	if len(c) != 1 || c[0].Name != dashboard.CookieName || !c[0].HttpOnly || c[0].SameSite != http.SameSiteStrictMode || strings.Contains(c[0].Value, w.token) {
		t.Fatalf("session cookie %+v: want one HttpOnly, SameSite=Strict cookie without the token", c)
	}
	if strings.Contains(resp.Header.Get("Location"), w.token) {
		t.Fatal("the token is in a URL")
	}
	resp, body = getPage(t, hc, ui+"policy")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("policy page: %d", resp.StatusCode)
	}
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") {
		t.Errorf("Content-Security-Policy %q", csp)
	}
	m := csrfRE.FindStringSubmatch(body)
	if m == nil {
		t.Fatal("no CSRF token in the policy form")
	}
	doc := "lanes:\n  alice:\n    strict: true\n"
	for _, tc := range []struct {
		name   string
		form   url.Values
		origin string
	}{
		{"no CSRF token", url.Values{"action": {"apply"}, "document": {doc}}, w.admin},
		{"wrong CSRF token", url.Values{"action": {"apply"}, "document": {doc}, "csrf": {"x" + m[1]}}, w.admin},
		{"another origin", url.Values{"action": {"apply"}, "document": {doc}, "csrf": {m[1]}}, "http://evil.example"},
	} {
		resp, _ := post(t, hc, ui+"policy", tc.form, tc.origin)
		if resp.StatusCode != http.StatusForbidden {
			t.Errorf("%s: %d, want 403", tc.name, resp.StatusCode)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if p, err := w.api.Policy(ctx); err != nil || strings.Contains(p.Raw, "strict: true") {
		t.Fatalf("a refused change was applied: %q %v", p.Raw, err)
	}
	resp, _ = post(t, hc, ui+"policy", url.Values{"action": {"apply"}, "document": {doc}, "csrf": {m[1]}}, w.admin)
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("apply: %d, want 303", resp.StatusCode)
	}
	hist, err := w.api.PolicyHistory(ctx)
	if err != nil || len(hist) == 0 || hist[0].Raw != doc || hist[0].By != "the admin token" {
		t.Fatalf("policy history after apply: %+v %v", hist, err)
	}

	// A lane token sees every page; the API refuses it the policy.
	tok, err := w.api.CreateToken(ctx, adminapi.TokenRequest{Lane: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	// The admin sees the lane's owner: its token.
	if _, body := getPage(t, hc, ui); !regexp.MustCompile(`(?s)<tr data-lane="alice">.*?` + regexp.QuoteMeta(tok.ID)).MatchString(body) {
		t.Errorf("the overview does not name token %s as the owner of lane alice", tok.ID)
	}
	lc := browserless(t)
	if resp, _ := post(t, lc, ui+"login", url.Values{"token": {tok.Secret}}, w.admin); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("lane token login: %d", resp.StatusCode)
	}
	for _, p := range []string{"", "services/orders", "policy", "explain?service=web&lane=alice", "traces", "graph"} {
		if resp, _ := getPage(t, lc, ui+p); resp.StatusCode != http.StatusOK {
			t.Errorf("lane token, /ui/%s: %d", p, resp.StatusCode)
		}
	}
	_, body = getPage(t, lc, ui+"policy")
	m = csrfRE.FindStringSubmatch(body)
	resp, body = post(t, lc, ui+"policy", url.Values{"action": {"apply"}, "document": {"lanes: {}\n"}, "csrf": {m[1]}}, w.admin)
	if resp.StatusCode != http.StatusForbidden || !strings.Contains(body, "admin token") {
		t.Errorf("lane token applies a policy: %d, want 403 naming the admin token", resp.StatusCode)
	}
	// Log out ends the session.
	_, body = getPage(t, hc, ui)
	m = csrfRE.FindStringSubmatch(body)
	post(t, hc, ui+"logout", url.Values{"csrf": {m[1]}}, w.admin)
	if resp, _ := getPage(t, hc, ui); resp.StatusCode != http.StatusSeeOther {
		t.Errorf("after log out: %d, want a redirect to the login form", resp.StatusCode)
	}
}

// TestEvents: the event stream opens once it follows the current state, so
// a change made as soon as it opens is sent, never taken for the state the
// page already shows.
func TestEvents(t *testing.T) {
	w := startWorld(t)
	ui := w.admin + dashboard.Prefix
	hc := browserless(t)
	if resp, _ := post(t, hc, ui+"login", url.Values{"token": {w.token}}, w.admin); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("login: %d", resp.StatusCode)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for i := range 3 {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, ui+"events", nil)
		stream := &http.Client{Jar: hc.Jar} // no timeout: the stream stays open
		resp, err := stream.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("events: %d", resp.StatusCode)
		}
		if _, err := w.api.PutPolicy(ctx, []byte(fmt.Sprintf("lanes:\n  alice:\n    strict: %v\n", i%2 == 0))); err != nil {
			t.Fatal(err)
		}
		if _, err := w.api.Register(ctx, adminapi.RegisterRequest{Instance: registry.Instance{Service: "inventory", ID: fmt.Sprint("inventory-", i), Addr: fmt.Sprint("127.0.0.1:", i+1)}, TTL: adminapi.Duration(time.Minute)}); err != nil {
			t.Fatal(err)
		}
		seen := map[string]bool{}
		sc := bufio.NewScanner(resp.Body)
		for !seen["policy"] || !seen["instances"] {
			if !sc.Scan() {
				t.Fatalf("stream %d ended (%v) having sent %v; want the policy and instances events", i, sc.Err(), seen)
			}
			if kind, ok := strings.CutPrefix(sc.Text(), "event: "); ok {
				seen[kind] = true
			}
		}
		resp.Body.Close()
	}
}
