package controlplane

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/lanesdev/lanes/adminclient"
	"github.com/lanesdev/lanes/internal/app/dashboard"
	"github.com/lanesdev/lanes/internal/lib/tlsfiles"
	"github.com/lanesdev/lanes/internal/lib/traceexport"
	"github.com/lanesdev/lanes/internal/testkit/tlstest"
	"github.com/lanesdev/lanes/lanesenv"
	"github.com/lanesdev/lanes/lanestrace"
)

// tlsConfig is a control plane on free ports that serves TLS with one
// certificate for 127.0.0.1, localhost and the lane hosts.
func tlsConfig(t *testing.T) (Config, *tlstest.Files) {
	t.Helper()
	dir := t.TempDir()
	files, err := tlstest.Write(filepath.Join(dir, "tls"), "127.0.0.1", "localhost", "*.lanes.localhost")
	if err != nil {
		t.Fatal(err)
	}
	cfg := Defaults()
	cfg.DataDir = dir
	cfg.AdminAddr, cfg.GatewayAddr, cfg.Etcd.ClientAddr, cfg.Etcd.PeerAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	cfg.Nats.Addr = NatsOff
	cfg.Traces.GRPCAddr, cfg.Traces.HTTPAddr = "127.0.0.1:0", "127.0.0.1:0"
	cfg.TLS.Cert, cfg.TLS.Key = files.ServerCert, files.ServerKey
	return cfg, files
}

// Every listener that credentials travel to serves TLS, and the clients
// verify it with the CA file.
func TestTLSListeners(t *testing.T) {
	cfg, files := tlsConfig(t)
	s := startQuiet(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	adm, _ := Value(s, AdminKey)
	gw, _ := Value(s, GatewayKey)
	tr, _ := Value(s, TracesKey)
	for name, u := range map[string]string{"admin": adm.URL, "gateway": gw.URL, "traces": tr.GRPCAddr} {
		if !strings.HasPrefix(u, "https://") {
			t.Errorf("%s URL %q: want https://", name, u)
		}
	}
	var out strings.Builder
	PrintServiceEnv(&out, s)
	if !strings.Contains(out.String(), "LANES_REGISTRY="+adm.URL) || !strings.Contains(out.String(), tlsfiles.EnvCAFile+"=") {
		t.Errorf("the export lines name no https admin URL or CA variable:\n%s", out.String())
	}
	pool, err := tlsfiles.Client(files.CA)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("admin", func(t *testing.T) {
		c, err := adminclient.New(adm.URL, adm.Token, adminclient.WithCAFile(files.CA))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := c.Info(ctx); err != nil {
			t.Fatalf("admin API over TLS with the CA file: %v", err)
		}
	})

	t.Run("lanesenv", func(t *testing.T) {
		vars := map[string]string{"LANES_REGISTRY": adm.URL, "LANES_TOKEN": adm.Token, "LANES_TRACES": tr.GRPCAddr, "LANES_CA_FILE": files.CA}
		e, err := lanesenv.Open(ctx, lanesenv.WithGetenv(env(vars)), lanesenv.WithLogger(NewLogger(io.Discard, "error")))
		if err != nil {
			t.Fatalf("lanesenv over TLS with the CA file: %v", err)
		}
		if err := e.Close(); err != nil {
			t.Error(err)
		}
		vars["LANES_CA_FILE"] = filepath.Join(t.TempDir(), "none.pem")
		_, err = lanesenv.Open(ctx, lanesenv.WithGetenv(env(vars)), lanesenv.WithLogger(NewLogger(io.Discard, "error")))
		var le *lanesenv.Error
		if !errors.As(err, &le) || le.Var != "LANES_CA_FILE" || !strings.Contains(err.Error(), "none.pem") {
			t.Errorf("a missing CA file: got %v, want an error naming LANES_CA_FILE and the file", err)
		}
	})

	t.Run("wrong CA", func(t *testing.T) {
		other, err := tlstest.Write(filepath.Join(t.TempDir(), "other"))
		if err != nil {
			t.Fatal(err)
		}
		c, err := adminclient.New(adm.URL, adm.Token, adminclient.WithCAFile(other.CA))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_, err = c.Info(ctx)
		if err == nil || !strings.Contains(err.Error(), "certificate signed by unknown authority") || !strings.Contains(err.Error(), adm.URL) {
			t.Errorf("a server outside the CA file: got %v, want an unknown-authority error naming the URL", err)
		}
		if _, err := adminclient.New(adm.URL, adm.Token, adminclient.WithCAFile(filepath.Join(t.TempDir(), "none.pem"))); err == nil || !strings.Contains(err.Error(), "none.pem") {
			t.Errorf("a missing CA file: got %v, want an error naming it", err)
		}
	})

	t.Run("dashboard cookie", func(t *testing.T) {
		if ck := sessionCookie(t, &http.Transport{TLSClientConfig: pool}, adm, ""); !ck.Secure {
			t.Errorf("the session cookie over TLS is not Secure: %s", ck)
		}
	})

	t.Run("gateway", func(t *testing.T) {
		host := strings.TrimPrefix(gw.URL, "https://")
		for _, tc := range []struct {
			proto, url string
		}{
			{"HTTP/1.1", gw.URL + "/"},
			{"HTTP/2.0", gw.URL + "/"},
			// A lane host, on the wildcard certificate.
			{"HTTP/2.0", "https://alice.lanes.localhost/"},
		} {
			var p http.Protocols
			if tc.proto == "HTTP/2.0" {
				p.SetHTTP2(true)
			} else {
				p.SetHTTP1(true)
			}
			d := &net.Dialer{Timeout: 5 * time.Second}
			hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: pool.Clone(), Protocols: &p,
				DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
					return d.DialContext(ctx, network, host)
				}}}
			resp, err := hc.Get(tc.url)
			if err != nil {
				t.Errorf("%s %s: %v", tc.proto, tc.url, err)
				continue
			}
			resp.Body.Close()
			hc.CloseIdleConnections()
			// No routes: the gateway itself answers 404, over TLS.
			if resp.Proto != tc.proto || resp.StatusCode != http.StatusNotFound || resp.TLS == nil {
				t.Errorf("%s %s: got %s %d (TLS %v)", tc.proto, tc.url, resp.Proto, resp.StatusCode, resp.TLS != nil)
			}
		}
	})

	t.Run("collector", func(t *testing.T) {
		tp, err := traceexport.NewProvider(ctx, "orders", tr.GRPCAddr, lanestrace.Sampler(1), tr.Token, pool)
		if err != nil {
			t.Fatal(err)
		}
		_, span := tp.Tracer("test").Start(ctx, "GET /", trace.WithSpanKind(trace.SpanKindServer))
		span.End()
		if err := tp.ForceFlush(ctx); err != nil {
			t.Fatalf("export over TLS: %v", err)
		}
		if err := tp.Shutdown(ctx); err != nil {
			t.Fatal(err)
		}
		if _, ok := tr.Collector.Trace(span.SpanContext().TraceID().String()); !ok {
			t.Errorf("the span exported over TLS is not in the collector")
		}
		// The control plane's own spans (the gateway's) reach it too, on the pinned certificate.
		self, ok := tr.Provider.(*sdktrace.TracerProvider)
		if !ok {
			t.Fatalf("the control plane's tracer provider is a %T", tr.Provider)
		}
		_, span = self.Tracer("test").Start(ctx, "self")
		span.End()
		if err := self.ForceFlush(ctx); err != nil {
			t.Fatalf("the control plane's export over TLS: %v", err)
		}
		if _, ok := tr.Collector.Trace(span.SpanContext().TraceID().String()); !ok {
			t.Errorf("the control plane's span is not in the collector")
		}
		// OTLP/HTTP too.
		hc := &http.Client{Transport: &http.Transport{TLSClientConfig: pool.Clone()}, Timeout: 10 * time.Second}
		defer hc.CloseIdleConnections()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "https://"+tr.Collector.HTTPAddr().String()+"/v1/traces", strings.NewReader(""))
		req.Header.Set("Content-Type", "application/x-protobuf")
		req.Header.Set("Authorization", "Bearer "+tr.Token)
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("OTLP/HTTP over TLS: %v", err)
		}
		resp.Body.Close()
		if resp.TLS == nil || resp.StatusCode != http.StatusOK {
			t.Errorf("OTLP/HTTP over TLS: status %d (TLS %v)", resp.StatusCode, resp.TLS != nil)
		}
		// Plain gRPC to the TLS receiver does not get in.
		plain, err := traceexport.NewProvider(ctx, "orders", strings.Replace(tr.GRPCAddr, "https://", "http://", 1), lanestrace.Sampler(1), tr.Token, nil)
		if err != nil {
			t.Fatal(err)
		}
		_, span = plain.Tracer("test").Start(ctx, "GET /")
		span.End()
		if err := plain.ForceFlush(ctx); err == nil {
			t.Errorf("a plain export to the TLS receiver succeeded")
		}
		plain.Shutdown(ctx)
	})
}

// Bad certificate settings are refused before anything starts, naming the
// setting and the file.
func TestTLSSettingErrors(t *testing.T) {
	dir := t.TempDir()
	files, err := tlstest.Write(dir)
	if err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing.pem")
	for _, tc := range []struct {
		env  map[string]string
		want []string
	}{
		{map[string]string{"LANES_TLS_CERT": files.ServerCert}, []string{"default tls.key", "tls.cert is set: set the key too"}},
		{map[string]string{"LANES_ADMIN_TLS_KEY": files.ServerKey}, []string{"default tls.admin_cert", "tls.admin_key is set"}},
		{map[string]string{"LANES_TLS_CERT": missing, "LANES_TLS_KEY": files.ServerKey}, []string{"LANES_TLS_CERT", missing, "no such file"}},
		{map[string]string{"LANES_GATEWAY_TLS_CERT": files.ServerCert, "LANES_GATEWAY_TLS_KEY": files.ClientKey}, []string{"LANES_GATEWAY_TLS_CERT", files.ClientKey, "private key does not match"}},
		{map[string]string{"LANES_TRACES_TLS_CERT": files.ServerKey, "LANES_TRACES_TLS_KEY": files.ServerKey}, []string{"LANES_TRACES_TLS_CERT", "certificate"}},
	} {
		c := Defaults()
		if err := c.ApplyEnv(env(tc.env)); err != nil {
			t.Fatal(err)
		}
		err := c.Validate()
		for _, w := range tc.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%v: got %v, want %q in it", tc.env, err, w)
			}
		}
	}
	// A listener's own pair serves it alone.
	c := Defaults()
	c.TLS.AdminCert, c.TLS.AdminKey = files.ServerCert, files.ServerKey
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	for l, want := range map[string]bool{tlsAdmin: true, tlsGateway: false, tlsTraces: false} {
		tc, err := c.ServerTLS(l)
		if err != nil || (tc != nil) != want {
			t.Errorf("%s: TLS %v, err %v; want TLS %v", l, tc != nil, err, want)
		}
	}
}

// Behind a TLS-terminating proxy the session cookie is Secure when a
// trusted proxy says https, and not when an untrusted peer claims it.
func TestDashboardCookieBehindProxy(t *testing.T) {
	cfg, _ := tlsConfig(t)
	cfg.TLS = TLSSettings{} // plain HTTP, as behind a proxy that terminates TLS
	cfg.TrustedProxies = []string{"127.0.0.2"}
	adm, _ := Value(startQuiet(t, cfg), AdminKey)
	login := func(from, proto string) *http.Cookie {
		t.Helper()
		d := &net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
		return sessionCookie(t, &http.Transport{DialContext: d.DialContext}, adm, proto)
	}
	for _, tc := range []struct {
		from, proto string
		secure      bool
	}{
		{"127.0.0.2", "https", true},        // the trusted proxy terminated TLS
		{"127.0.0.2", "", false},            // the trusted proxy says nothing
		{"127.0.0.2", "http", false},        // the trusted proxy served plain HTTP
		{"127.0.0.2", "https, http", false}, // the last value is the proxy's own
		{"127.0.0.1", "https", false},       // an untrusted peer's claim
	} {
		if ck := login(tc.from, tc.proto); ck.Secure != tc.secure {
			t.Errorf("from %s with X-Forwarded-Proto %q: Secure %v, want %v", tc.from, tc.proto, ck.Secure, tc.secure)
		}
	}
}

// startQuiet starts a control plane with cfg, closed when t ends.
func startQuiet(t *testing.T, cfg Config) *Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s, err := Start(ctx, cfg, WithLogger(NewLogger(io.Discard, "error")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// sessionCookie logs in to the dashboard with the admin token through tr,
// with X-Forwarded-Proto proto unless it is "", and returns the session
// cookie.
func sessionCookie(t *testing.T, tr *http.Transport, adm AdminInfo, proto string) *http.Cookie {
	t.Helper()
	hc := &http.Client{Transport: tr, Timeout: 10 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	defer tr.CloseIdleConnections()
	req, _ := http.NewRequest(http.MethodPost, adm.URL+dashboard.Prefix+"login", strings.NewReader(url.Values{"token": {adm.Token}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if proto != "" {
		req.Header.Set("X-Forwarded-Proto", proto)
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	for _, ck := range resp.Cookies() {
		if ck.Name == dashboard.CookieName {
			return ck
		}
	}
	t.Fatalf("login through %s: status %d, no session cookie", adm.URL, resp.StatusCode)
	return nil
}
