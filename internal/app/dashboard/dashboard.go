// Package dashboard is the lanes dashboard: HTML pages, served by `lanes up`
// under /ui/ on the admin address, that show which lanes exist, what runs in
// them, where a request will go (route explain) and where requests went
// (traces, the service graph, integrity findings), and that edit the policy.
//
// Every page reads through the admin API with the token the user logged in
// with: an adminclient whose transport serves each call on the API's handler
// in the process. So the API's access rules apply as they are — a lane token
// sees everything but changes only what the API lets it change.
//
// The login form keeps the token in the server's memory, behind a random
// session id in an HttpOnly, SameSite=Strict cookie; no token appears in a
// URL. Every change is a POST that carries the session's CSRF token and an
// Origin (or Sec-Fetch-Site) of the dashboard itself. Pages update live over
// server-sent events (/ui/events) when instances or the policy change or a
// finding arrives. Every asset is embedded: no CDN, no build step.
package dashboard

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"embed"
	"encoding/base64"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/lanesdev/lanes/adminclient"
)

// Prefix is the path the dashboard is served under.
const Prefix = "/ui/"

// CookieName is the session cookie.
const CookieName = "lanes_session"

// sessionTTL bounds a session; maxSessions bounds how many are kept, and
// maxTokenSessions how many of one token: a token's new session evicts
// that token's oldest, never another token's.
const (
	sessionTTL       = 12 * time.Hour
	maxSessions      = 1000
	maxTokenSessions = 16
)

//go:embed assets templates
var files embed.FS

// Config configures a Server.
type Config struct {
	// API is the admin API's handler. Required.
	API http.Handler
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Now defaults to time.Now.
	Now func() time.Time
	// FindingsPoll is how often the live stream looks for new findings
	// (default 5s).
	FindingsPoll time.Duration
	// TrustedProxies are the peers whose X-Forwarded-Proto the dashboard
	// believes: a TLS-terminating proxy among them that says https gets
	// the session cookie marked Secure, as a TLS connection does.
	TrustedProxies []netip.Prefix
}

// Server is the dashboard, an http.Handler for the paths under Prefix.
type Server struct {
	cfg    Config
	log    *slog.Logger
	now    func() time.Time
	pages  map[string]*template.Template
	mux    *http.ServeMux
	assets http.Handler

	mu       sync.Mutex
	sessions map[string]*session
	failures failedLogins
	closed   bool
	wg       sync.WaitGroup // event streams
	streams  context.Context
	stop     context.CancelFunc
}

type session struct {
	token   string
	csrf    string
	admin   bool
	scope   string // "admin", "lane:x", "baseline"
	expires time.Time
}

// New returns the dashboard.
func New(cfg Config) (*Server, error) {
	if cfg.API == nil {
		return nil, errors.New("dashboard: Config.API is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.FindingsPoll <= 0 {
		cfg.FindingsPoll = 5 * time.Second
	}
	pages, err := parsePages()
	if err != nil {
		return nil, err
	}
	sub, err := fs.Sub(files, "assets")
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, log: cfg.Logger.With("component", "dashboard"), now: cfg.Now, pages: pages,
		mux: http.NewServeMux(), sessions: map[string]*session{},
		assets: http.StripPrefix(Prefix+"assets/", http.FileServerFS(sub))}
	s.streams, s.stop = context.WithCancel(context.Background())
	s.routes()
	return s, nil
}

// Close ends the live streams in progress and waits for them.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.stop()
	s.wg.Wait()
	return nil
}

// Mount returns a handler that serves the dashboard under Prefix (and
// redirects "/" there) and everything else with api.
func Mount(api http.Handler, d *Server) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/" && r.Method == http.MethodGet:
			http.Redirect(w, r, Prefix, http.StatusFound)
		case r.URL.Path == strings.TrimSuffix(Prefix, "/") || strings.HasPrefix(r.URL.Path, Prefix):
			d.ServeHTTP(w, r)
		default:
			api.ServeHTTP(w, r)
		}
	})
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("X-Frame-Options", "DENY")
	s.mux.ServeHTTP(w, r)
}

type pageFunc func(w http.ResponseWriter, r *http.Request, v *view) error

func (s *Server) routes() {
	s.mux.Handle("GET "+Prefix+"assets/", s.assets)
	s.mux.HandleFunc("GET "+strings.TrimSuffix(Prefix, "/"), func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, Prefix, http.StatusFound)
	})
	s.mux.HandleFunc("GET "+Prefix+"login", s.loginForm)
	s.mux.HandleFunc("POST "+Prefix+"login", s.login)
	page := func(pattern string, f pageFunc) {
		s.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
			sess, ok := s.session(r)
			if !ok {
				if r.Method == http.MethodGet {
					http.Redirect(w, r, Prefix+"login?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
					return
				}
				http.Error(w, "log in first", http.StatusUnauthorized)
				return
			}
			if r.Method == http.MethodPost {
				if err := s.checkPost(r, sess); err != nil {
					http.Error(w, err.Error(), http.StatusForbidden)
					return
				}
			}
			v := s.newView(r, sess)
			if err := f(w, r, v); err != nil {
				v.Err = err.Error()
				s.render(w, http.StatusBadGateway, "error", v)
			}
		})
	}
	page("GET "+Prefix+"{$}", s.overview)
	page("GET "+Prefix+"services/{name}", s.service)
	page("GET "+Prefix+"policy", s.policyPage)
	page("POST "+Prefix+"policy", s.policyPost)
	page("GET "+Prefix+"explain", s.explain)
	page("GET "+Prefix+"traces", s.traces)
	page("GET "+Prefix+"traces/{id}", s.trace)
	page("GET "+Prefix+"graph", s.graph)
	page("POST "+Prefix+"logout", s.logout)
	s.mux.HandleFunc("GET "+Prefix+"events", s.events)
	s.mux.HandleFunc(Prefix, func(w http.ResponseWriter, r *http.Request) { http.NotFound(w, r) })
}

func randomID() string {
	b := make([]byte, 32)
	rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

// session returns the session of the request's cookie.
func (s *Server) session(r *http.Request) (*session, bool) {
	c, err := r.Cookie(CookieName)
	if err != nil || c.Value == "" {
		return nil, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	sess, ok := s.sessions[c.Value]
	if !ok {
		return nil, false
	}
	if s.now().After(sess.expires) {
		delete(s.sessions, c.Value)
		return nil, false
	}
	return sess, true
}

// errTooManySessions refuses a login when maxSessions sessions of other
// tokens are kept.
var errTooManySessions = errors.New("too many sessions are open; log out of one, or try again when one expires")

// newSession keeps a session and returns its id. A token keeps at most
// maxTokenSessions: its oldest goes. When maxSessions are kept, of other
// tokens, the login is refused: a token never evicts another's session.
func (s *Server) newSession(sess *session) (string, error) {
	id := randomID()
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	var oldest string
	n := 0
	for k, v := range s.sessions {
		switch {
		case now.After(v.expires):
			delete(s.sessions, k)
		case v.token == sess.token:
			n++
			if oldest == "" || v.expires.Before(s.sessions[oldest].expires) {
				oldest = k
			}
		}
	}
	if n >= maxTokenSessions {
		delete(s.sessions, oldest)
	}
	if len(s.sessions) >= maxSessions {
		return "", errTooManySessions
	}
	s.sessions[id] = sess
	return id, nil
}

// Failed logins are slowed per client address: after freeFailures, each
// failure makes the address wait before its next login, from 250ms,
// doubling up to maxLoginWait; a success clears it. At most maxFailing
// addresses are remembered: the one that failed longest ago goes first.
const (
	freeFailures = 5
	maxLoginWait = 30 * time.Second
	maxFailing   = 4096
)

// failedLogins are the failed logins per client address; the Server's mu
// guards them.
type failedLogins struct {
	m       map[netip.Addr]*failing
	dropped int // addresses forgotten for room
}

type failing struct {
	n     int
	last  time.Time
	until time.Time // no login before then
}

// wait returns how long addr must wait before it may try to log in.
func (f *failedLogins) wait(addr netip.Addr, now time.Time) time.Duration {
	if e, ok := f.m[addr]; ok && now.Before(e.until) {
		return e.until.Sub(now)
	}
	return 0
}

// fail records a failed login of addr, and returns whether an address was
// forgotten for room.
func (f *failedLogins) fail(addr netip.Addr, now time.Time) (dropped bool) {
	if f.m == nil {
		f.m = map[netip.Addr]*failing{}
	}
	e, ok := f.m[addr]
	if !ok {
		if len(f.m) >= maxFailing {
			var oldest netip.Addr
			for a, v := range f.m {
				if !oldest.IsValid() || v.last.Before(f.m[oldest].last) {
					oldest = a
				}
			}
			delete(f.m, oldest)
			f.dropped++
			dropped = true
		}
		e = &failing{}
		f.m[addr] = e
	}
	e.n++
	e.last = now
	if over := e.n - freeFailures; over > 0 {
		e.until = now.Add(min(250*time.Millisecond<<min(over-1, 20), maxLoginWait))
	}
	return dropped
}

// clientAddr is the address a request comes from.
func clientAddr(r *http.Request) netip.Addr {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return netip.Addr{}
	}
	return ap.Addr().Unmap()
}

// checkOrigin refuses a request sent from another site: its Origin must be
// the dashboard's own, or, without one, Sec-Fetch-Site must not say
// cross-site.
func checkOrigin(r *http.Request) error {
	if o := r.Header.Get("Origin"); o != "" && o != "null" {
		u, err := url.Parse(o)
		if err != nil || !strings.EqualFold(u.Host, r.Host) {
			return errors.New("refused: the request comes from another site (Origin " + o + ")")
		}
		return nil
	}
	switch r.Header.Get("Sec-Fetch-Site") {
	case "cross-site", "same-site":
		return errors.New("refused: the request comes from another site")
	}
	return nil
}

// checkPost guards a change: same origin, and the session's CSRF token.
func (s *Server) checkPost(r *http.Request, sess *session) error {
	if err := checkOrigin(r); err != nil {
		return err
	}
	if subtle.ConstantTimeCompare([]byte(r.PostFormValue("csrf")), []byte(sess.csrf)) != 1 {
		return errors.New("refused: the form's CSRF token is missing or stale; reload the page")
	}
	return nil
}

func (s *Server) loginForm(w http.ResponseWriter, r *http.Request) {
	v := &view{Title: "Log in", Next: safeNext(r.URL.Query().Get("next"))}
	s.render(w, http.StatusOK, "login", v)
}

// safeNext keeps a redirect target inside the dashboard.
func safeNext(next string) string {
	if !strings.HasPrefix(next, Prefix) || strings.HasPrefix(next, "//") || strings.Contains(next, "\\") {
		return Prefix
	}
	return next
}

func (s *Server) login(w http.ResponseWriter, r *http.Request) {
	v := &view{Title: "Log in", Next: safeNext(r.PostFormValue("next"))}
	if err := checkOrigin(r); err != nil {
		v.Err = err.Error()
		s.render(w, http.StatusForbidden, "login", v)
		return
	}
	token := strings.TrimSpace(r.PostFormValue("token"))
	if token == "" {
		v.Err = "Enter the admin token or a lane token."
		s.render(w, http.StatusUnauthorized, "login", v)
		return
	}
	addr := clientAddr(r)
	s.mu.Lock()
	wait := s.failures.wait(addr, s.now())
	s.mu.Unlock()
	if wait > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int((wait+time.Second-1)/time.Second)))
		v.Err = fmt.Sprintf("Too many failed logins from %s: try again in %s.", addr, wait.Round(10*time.Millisecond))
		s.render(w, http.StatusTooManyRequests, "login", v)
		return
	}
	c := s.client(token)
	ctx := withRemoteAddr(r.Context(), r.RemoteAddr)
	if _, err := c.Info(ctx); err != nil {
		s.mu.Lock()
		dropped := s.failures.fail(addr, s.now())
		n := s.failures.dropped
		s.mu.Unlock()
		if dropped && (n == 1 || n%1000 == 0) {
			s.log.Warn("too many addresses with failed logins; forgetting the one that failed longest ago", "limit", maxFailing, "forgotten", n)
		}
		v.Err = "The control plane refused the token: " + err.Error()
		s.render(w, http.StatusUnauthorized, "login", v)
		return
	}
	s.mu.Lock()
	delete(s.failures.m, addr)
	s.mu.Unlock()
	sess := &session{token: token, csrf: randomID(), expires: s.now().Add(sessionTTL)}
	if _, err := c.Tokens(ctx); err == nil {
		sess.admin, sess.scope = true, "admin"
	} else {
		sess.scope = "token"
	}
	id, err := s.newSession(sess)
	if err != nil {
		v.Err = err.Error()
		s.render(w, http.StatusServiceUnavailable, "login", v)
		return
	}
	http.SetCookie(w, &http.Cookie{Name: CookieName, Value: id, Path: Prefix, HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: s.overTLS(r), MaxAge: int(sessionTTL / time.Second)})
	http.Redirect(w, r, v.Next, http.StatusSeeOther)
}

func (s *Server) logout(w http.ResponseWriter, r *http.Request, v *view) error {
	if c, err := r.Cookie(CookieName); err == nil {
		s.mu.Lock()
		delete(s.sessions, c.Value)
		s.mu.Unlock()
	}
	http.SetCookie(w, &http.Cookie{Name: CookieName, Value: "", Path: Prefix, HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: s.overTLS(r), MaxAge: -1})
	http.Redirect(w, r, Prefix+"login", http.StatusSeeOther)
	return nil
}

// overTLS reports whether the browser reached the dashboard over TLS: the
// connection is TLS, or its peer is a trusted proxy whose
// X-Forwarded-Proto (the last value, the one that proxy set) says https.
func (s *Server) overTLS(r *http.Request) bool {
	if r.TLS != nil {
		return true
	}
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil || !trusted(s.cfg.TrustedProxies, ap.Addr().Unmap()) {
		return false
	}
	vals := r.Header.Values("X-Forwarded-Proto")
	if len(vals) == 0 {
		return false
	}
	last := vals[len(vals)-1]
	if i := strings.LastIndexByte(last, ','); i >= 0 {
		last = last[i+1:]
	}
	return strings.EqualFold(strings.TrimSpace(last), "https")
}

func trusted(ps []netip.Prefix, a netip.Addr) bool {
	for _, p := range ps {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// client returns an admin API client that authenticates with token and
// serves its calls on the API's handler.
func (s *Server) client(token string) *adminclient.Client {
	c, err := adminclient.New("http://admin.invalid", token,
		adminclient.WithHTTPClient(&http.Client{Transport: handlerTransport{s.cfg.API}})) //lanes:ignore the admin API is the control plane, served in the process
	if err != nil {
		panic(err) // the address is a constant
	}
	return c
}
