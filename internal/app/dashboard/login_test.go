package dashboard

import (
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeAPI stands for the admin API's handler (the dashboard reaches it in
// the process): admin-secret is the admin token, lane-secret a lane token;
// anything else is refused.
func fakeAPI() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch auth := r.Header.Get("Authorization"); {
		case auth == "Bearer admin-secret", auth == "Bearer lane-secret" && r.URL.Path == "/v1/info":
			w.Write([]byte(`{}`))
		case auth == "Bearer lane-secret":
			w.WriteHeader(http.StatusForbidden)
			w.Write([]byte(`{"error":{"code":"forbidden","message":"not for a lane token"}}`))
		default:
			w.WriteHeader(http.StatusUnauthorized)
			w.Write([]byte(`{"error":{"code":"unauthorized","message":"unknown token"}}`))
		}
	})
}

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func newTestServer(t *testing.T) (*Server, *clock) {
	c := &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	s, err := New(Config{API: fakeAPI(), Now: c.now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, c
}

// logIn posts the login form with token from addr, and returns the status
// and the session cookie (empty when none).
func logIn(s *Server, token, addr string) (int, string, http.Header) {
	req := httptest.NewRequest(http.MethodPost, Prefix+"login", strings.NewReader(url.Values{"token": {token}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.RemoteAddr = addr
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, req)
	for _, c := range rec.Result().Cookies() {
		if c.Name == CookieName {
			return rec.Code, c.Value, rec.Header()
		}
	}
	return rec.Code, "", rec.Header()
}

func (s *Server) hasSession(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.sessions[id]
	return ok
}

// A thousand logins of a lane token evict that token's oldest sessions,
// never the admin's; sessions of many tokens beyond the bound are refused
// a new session rather than evicting another's.
func TestSessionsBoundPerToken(t *testing.T) {
	s, _ := newTestServer(t)
	code, admin, _ := logIn(s, "admin-secret", "10.0.0.1:1000")
	if code != http.StatusSeeOther || admin == "" {
		t.Fatalf("admin login: %d", code)
	}
	var first string
	for i := range 1000 {
		code, id, _ := logIn(s, "lane-secret", "10.0.0.2:1000")
		if code != http.StatusSeeOther {
			t.Fatalf("lane login %d: %d", i, code)
		}
		if i == 0 {
			first = id
		}
	}
	if !s.hasSession(admin) {
		t.Fatal("a lane token's logins evicted the admin's session")
	}
	if s.hasSession(first) {
		t.Error("the lane token's first session is still kept")
	}
	s.mu.Lock()
	n := len(s.sessions)
	s.mu.Unlock()
	if n != 1+maxTokenSessions {
		t.Errorf("%d sessions kept, want the admin's and %d of the lane token", n, maxTokenSessions)
	}
	// Full of other tokens' sessions: the lane token, at its bound, still
	// logs in (its own oldest goes); the admin, below its bound, is
	// refused rather than evict another token's session.
	s.mu.Lock()
	for i := range maxSessions - n {
		s.sessions[randomID()] = &session{token: "other-" + time.Duration(i).String(), expires: s.now().Add(sessionTTL)}
	}
	s.mu.Unlock()
	if code, _, _ := logIn(s, "lane-secret", "10.0.0.2:1000"); code != http.StatusSeeOther {
		t.Errorf("lane login at its bound when full: %d, want 303", code)
	}
	if code, _, _ := logIn(s, "admin-secret", "10.0.0.1:1000"); code != http.StatusServiceUnavailable {
		t.Errorf("admin login below its bound when full: %d, want 503", code)
	}
	if !s.hasSession(admin) || s.count("lane-secret") != maxTokenSessions {
		t.Errorf("when full: the admin's session kept %v, the lane token's %d", s.hasSession(admin), s.count("lane-secret"))
	}
}

func (s *Server) count(token string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, v := range s.sessions {
		if v.token == token {
			n++
		}
	}
	return n
}

// Failed logins are slowed per address: after a few, the next must wait,
// longer at each failure; another address is not slowed; a success clears
// the address.
func TestFailedLoginsSlowed(t *testing.T) {
	s, c := newTestServer(t)
	const bad = "10.0.0.9:5555"
	for i := range freeFailures + 1 {
		if code, _, _ := logIn(s, "wrong", bad); code != http.StatusUnauthorized {
			t.Fatalf("failure %d: %d", i+1, code)
		}
	}
	code, _, h := logIn(s, "wrong", bad)
	if code != http.StatusTooManyRequests || h.Get("Retry-After") == "" {
		t.Fatalf("login after %d failures: %d (Retry-After %q), want 429", freeFailures+1, code, h.Get("Retry-After"))
	}
	if code, _, _ := logIn(s, "admin-secret", bad); code != http.StatusTooManyRequests {
		t.Errorf("right token while slowed: %d, want 429", code)
	}
	if code, _, _ := logIn(s, "wrong", "10.0.0.8:5555"); code != http.StatusUnauthorized {
		t.Errorf("another address: %d, want 401", code)
	}
	// The wait doubles with each failure.
	c.add(250 * time.Millisecond)
	if code, _, _ := logIn(s, "wrong", bad); code != http.StatusUnauthorized {
		t.Fatalf("after the wait: %d", code)
	}
	c.add(250 * time.Millisecond)
	if code, _, _ := logIn(s, "wrong", bad); code != http.StatusTooManyRequests {
		t.Errorf("250ms after the next failure: %d, want 429 (the wait doubled)", code)
	}
	c.add(maxLoginWait)
	if code, _, _ := logIn(s, "admin-secret", bad); code != http.StatusSeeOther {
		t.Fatalf("right token after the wait: %d", code)
	}
	if code, _, _ := logIn(s, "wrong", bad); code != http.StatusUnauthorized {
		t.Errorf("a failure after a success: %d, want 401 (cleared)", code)
	}
	// The addresses remembered are bounded.
	s.mu.Lock()
	for i := range maxFailing + 10 {
		s.failures.fail(netipFrom(i), c.now())
	}
	n := len(s.failures.m)
	s.mu.Unlock()
	if n != maxFailing {
		t.Errorf("%d addresses remembered, want %d", n, maxFailing)
	}
}

func netipFrom(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)})
}
