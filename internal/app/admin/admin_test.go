package admin_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/lanesdev/lanes/adminapi"
	"github.com/lanesdev/lanes/adminclient"
	"github.com/lanesdev/lanes/etcdstore"
	"github.com/lanesdev/lanes/internal/app/admin"
	"github.com/lanesdev/lanes/internal/lib/addrpolicy"
	"github.com/lanesdev/lanes/internal/lib/regid"
	"github.com/lanesdev/lanes/internal/testkit/etcdtest"
	"github.com/lanesdev/lanes/internal/testkit/leaktest"
	"github.com/lanesdev/lanes/internal/testkit/registrytest"
	"github.com/lanesdev/lanes/internal/testkit/timing"
	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(leaktest.Options()...); err != nil {
			os.Stderr.WriteString("goleak: " + err.Error() + "\n")
			code = 1
		}
	}
	os.Exit(code)
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

const adminToken = "lanes_admin_0123456789abcdef0123456789abcdef"

// env is an admin API on an embedded etcd, served by httptest.
type env struct {
	url    string
	store  *etcdstore.Store
	engine *routing.Engine
	claims *admin.ClaimTable
	// reserved are the listeners no instance address may reach: etcd's.
	reserved *addrpolicy.Reserved
}

// newEnv returns an admin API with a fresh key prefix on the etcd srv.
func newEnv(t *testing.T, srv etcdtest.Server) *env {
	t.Helper()
	return newEnvWith(t, srv, nil)
}

// newEnvWith is newEnv with the admin API's Config changed by edit.
func newEnvWith(t *testing.T, srv etcdtest.Server, edit func(*admin.Config)) *env {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	prefix := "/" + strings.NewReplacer("/", "-", " ", "-").Replace(t.Name()) + "/"
	st, err := etcdstore.Open(ctx, etcdstore.Config{Endpoints: srv.Endpoints(), Options: etcdstore.Options{Prefix: prefix, Logger: quiet}})
	if err != nil {
		t.Fatal(err)
	}
	e := &env{store: st}
	e.engine = routing.New(routing.WithRegistry(st), routing.WithPolicyStore(st.Policy()), routing.WithLogger(quiet))
	e.claims = admin.WatchClaims(st, quiet)
	// The API reserves its etcd's listeners, as the control plane does.
	e.reserved = new(addrpolicy.Reserved)
	for _, ep := range srv.Endpoints() {
		if err := e.reserved.Add(ctx, "etcd client", strings.TrimPrefix(strings.TrimPrefix(ep, "http://"), "https://")); err != nil {
			t.Fatal(err)
		}
	}
	cfg := admin.Config{Store: st, Engine: e.engine, AdminToken: adminToken, Claims: e.claims, Logger: quiet, Reserved: e.reserved}
	if edit != nil {
		edit(&cfg)
	}
	api, err := admin.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(api)
	e.url = hs.URL
	t.Cleanup(func() {
		api.Close()
		hs.Close()
		e.claims.Close()
		e.engine.Close()
		st.Close()
	})
	return e
}

func (e *env) client(t *testing.T, token string) *adminclient.Client {
	c, err := adminclient.New(e.url, token)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

// TestAdmin runs the registry conformance suite on adminclient.Registry
// through the admin API, then the API's own tests, on one embedded etcd
// (each subtest under its own key prefix).
func TestAdmin(t *testing.T) {
	srv := etcdtest.Embedded(t)
	t.Run("registrytest", func(t *testing.T) {
		registrytest.Run(t, func(t *testing.T) registry.Registry {
			e := newEnv(t, srv)
			return adminclient.NewRegistry(e.client(t, adminToken), adminclient.WithLogger(quiet))
		})
	})
	t.Run("tokens", func(t *testing.T) { testTokens(t, newEnv(t, srv)) })
	t.Run("claims", func(t *testing.T) { testClaims(t, newEnv(t, srv)) })
	t.Run("claim-nets", func(t *testing.T) {
		testClaimNets(t, newEnvWith(t, srv, func(c *admin.Config) { c.ClaimNets = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")} }))
	})
	t.Run("lane-expiry", func(t *testing.T) { testLaneExpiry(t, newEnv(t, srv)) })
	t.Run("reregister", func(t *testing.T) { testReregister(t, newEnv(t, srv)) })
	t.Run("errors", func(t *testing.T) { testErrors(t, newEnv(t, srv)) })
	t.Run("explain-host", func(t *testing.T) { testExplainHost(t, newEnv(t, srv)) })
	t.Run("ownership", func(t *testing.T) { testOwnership(t, newEnv(t, srv)) })
	t.Run("limits", func(t *testing.T) { testLimits(t, newEnv(t, srv)) })
	t.Run("bearer-case", func(t *testing.T) { testBearerCase(t, newEnv(t, srv)) })
	t.Run("policy-size", func(t *testing.T) { testPolicySize(t, newEnv(t, srv)) })
	t.Run("claim-ids", func(t *testing.T) { testClaimIDs(t, newEnv(t, srv)) })
	t.Run("tag-scope", func(t *testing.T) { testTagScope(t, newEnv(t, srv)) })
	t.Run("addresses", func(t *testing.T) { testAddresses(t, newEnv(t, srv)) })
	t.Run("link-local", func(t *testing.T) {
		testLinkLocal(t, newEnvWith(t, srv, func(c *admin.Config) { c.AllowLinkLocal = true }))
	})
	t.Run("fleet", func(t *testing.T) {
		pods := registry.NewMemory()
		t.Cleanup(func() { pods.Close() })
		testFleet(t, pods, newEnvWith(t, srv, func(c *admin.Config) { c.Registry = registry.Union(c.Store, pods) }))
	})
}

// testFleet: where the control plane follows more than its etcd (the pods
// of a cluster), the instances listed and watched through the API are the
// registrations and the rest of the fleet, the registration first where
// both have one address.
func testFleet(t *testing.T, pods registry.Registry, e *env) {
	adm := e.client(t, adminToken)
	pod := func(id, lane, addr string) {
		l, err := pods.Register(ctx(t), registry.Instance{Service: "orders", ID: id, Lane: lane, Addr: addr}, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
	}
	pod("orders-1.default", "alice", "10.1.0.1:80")
	pod("orders-2.default", "", "127.0.0.1:5") // the registration's address below
	reg, err := adm.Register(ctx(t), adminapi.RegisterRequest{Instance: registry.Instance{Service: "orders", ID: "self", Lane: "bob", Addr: "127.0.0.1:5"}, TTL: adminapi.Duration(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	insts, err := adm.Instances(ctx(t), "orders")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, in := range insts {
		got[in.ID] = in.EffectiveLane + "/" + in.Registration
	}
	if len(got) != 2 || got["orders-1.default"] != "alice/" || got["self"] != "bob/"+reg.Registration {
		t.Errorf("instances %v: want the pod of alice and the registration of bob, not the pod at its address", got)
	}
	bs, err := adm.WatchInstances(ctx(t), "orders")
	if err != nil {
		t.Fatal(err)
	}
	defer bs.Close()
	b, err := bs.Next()
	if err != nil {
		t.Fatal(err)
	}
	ids := []string{}
	for _, ev := range b.Events {
		ids = append(ids, ev.Instance.ID)
	}
	slices.Sort(ids)
	if !b.Reset || strings.Join(ids, ",") != "orders-1.default,self" {
		t.Errorf("watch: %+v, want a reset of orders-1.default and self", b)
	}
}

// A tag rule moves an instance only into a lane the token that registered
// it may register in: alice's token chooses its instance's labels, so a
// rule on them must not give it lane gray. The instance's scope is the
// token's, whatever the client sent, and the API says why a rule does not
// apply.
func testTagScope(t *testing.T, e *env) {
	adm := e.client(t, adminToken)
	if _, err := adm.PutPolicy(ctx(t), []byte("tags:\n  - {service: web, lane: gray, labels: {version: v2}}\n")); err != nil {
		t.Fatal(err)
	}
	tok, err := adm.CreateToken(ctx(t), adminapi.TokenRequest{Lane: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	base, err := adm.CreateToken(ctx(t), adminapi.TokenRequest{Baseline: true})
	if err != nil {
		t.Fatal(err)
	}
	v2 := map[string]string{"version": "v2"}
	for _, r := range []struct {
		token string
		in    registry.Instance
	}{
		{tok.Secret, registry.Instance{Service: "web", ID: "a1", Addr: "127.0.0.1:1", Lane: "alice", Labels: v2, Scope: ""}}, // an unrestricted scope, claimed
		{base.Secret, registry.Instance{Service: "web", ID: "b1", Addr: "127.0.0.1:2", Labels: v2}},
		{adminToken, registry.Instance{Service: "web", ID: "o1", Addr: "127.0.0.1:3", Labels: v2}},
	} {
		reg, err := e.client(t, r.token).Register(ctx(t), adminapi.RegisterRequest{Instance: r.in, TTL: adminapi.Duration(time.Minute)})
		if err != nil {
			t.Fatalf("register %s: %v", r.in.ID, err)
		}
		defer e.client(t, r.token).Deregister(context.Background(), "web", r.in.ID, reg.Registration)
	}
	// The engine routes by the same rule: gray has the admin's instance
	// alone, and alice keeps hers.
	waitFor(t, "the engine following the policy and the instances", func() bool {
		d, err := e.engine.Service("web").Resolve(routing.Request{Lane: "gray"})
		return err == nil && d.Lane == "gray"
	})
	var insts []adminapi.Instance
	waitFor(t, "the instances listed", func() bool {
		insts, err = adm.Instances(ctx(t), "web")
		return err == nil && len(insts) == 3
	})
	want := map[string]struct{ scope, lane, why string }{
		"a1": {"alice", "alice", `registered by a lane token of lane "alice", which may not register in lane "gray"`},
		"b1": {registry.ScopeBaseline, "", `registered by a baseline token, which may not register in lane "gray"`},
		"o1": {"", "gray", ""},
	}
	for _, in := range insts {
		w := want[in.ID]
		why := strings.Join(in.TagsRefused, "; ")
		if in.Scope != w.scope || in.EffectiveLane != w.lane || w.why == "" && why != "" || !strings.Contains(why, w.why) {
			t.Errorf("%s: scope %q, effective lane %q, tags refused %q; want %q, %q, %q", in.ID, in.Scope, in.EffectiveLane, why, w.scope, w.lane, w.why)
		}
	}
	for l, wantIDs := range map[string]string{"gray": "o1", "alice": "a1", "": "b1"} {
		d, err := e.engine.Service("web").Resolve(routing.Request{Lane: l})
		if err != nil || strings.Join(d.Eligible, ",") != wantIDs || d.Lane != l {
			t.Errorf("lane %q: %+v %v, want %s from lane %q", l, d, err, wantIDs, l)
		}
	}
}

// A registration token claims only addresses the operator allows
// (loopback by default): a claim of a shared address (a NAT's) would move
// every client behind it into the lane. The admin token claims any.
func testClaimNets(t *testing.T, e *env) {
	adm := e.client(t, adminToken)
	c, l := aliceRegistration(t, e)
	defer l.Close()
	rid := regid.Of(l)
	_, err := c.Claim(ctx(t), adminapi.ClaimRequest{Lane: "alice", Registration: rid})
	if !adminapi.IsCode(err, adminapi.CodeForbidden) || !strings.Contains(err.Error(), "10.0.0.0/8") {
		t.Errorf("lane token's claim of 127.0.0.1 outside 10.0.0.0/8: %v", err)
	}
	if cl, err := adm.Claim(ctx(t), adminapi.ClaimRequest{Lane: "alice", Registration: rid, IP: "192.0.2.7"}); err != nil || cl.IP != "192.0.2.7" {
		t.Errorf("the admin's claim: %+v %v", cl, err)
	}
}

// Explain shows the host step of the policy's locality.host: instances on
// other hosts are marked, and the decision is the engine's.
func testExplainHost(t *testing.T, e *env) {
	adm := e.client(t, adminToken)
	reg := adminclient.NewRegistry(adm, adminclient.WithLogger(quiet))
	defer reg.Close()
	for _, in := range []registry.Instance{
		{Service: "web", ID: "b1", Addr: "127.0.0.1:1", Zone: "az1", Host: "h1"},
		{Service: "web", ID: "b2", Addr: "127.0.0.1:2", Zone: "az1", Host: "h2"},
		{Service: "web", ID: "b3", Addr: "127.0.0.1:3", Zone: "az2", Host: "h3"},
	} {
		l, err := reg.Register(ctx(t), in, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
	}
	explain := func(host, zone string) adminapi.Explanation {
		t.Helper()
		ex, err := adm.Explain(ctx(t), adminapi.ExplainRequest{Service: "web", Zone: zone, Host: host})
		if err != nil || ex.Decision == nil || len(ex.Steps) != 1 {
			t.Fatalf("explain: %+v %v", ex, err)
		}
		return ex
	}
	waitFor(t, "the instances listed", func() bool { return len(explain("", "").Decision.Eligible) == 3 })
	// Off by default: the host changes nothing, the zone decides.
	if ex := explain("h1", "az1"); ex.HostFirst || strings.Join(ex.Decision.Eligible, ",") != "b1,b2" || ex.Steps[0].Instances[2].State != "other-zone" {
		t.Fatalf("locality.host off: %+v", ex)
	}
	if _, err := adm.PutPolicy(ctx(t), []byte("locality: {host: true}\n")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the policy in force", func() bool { return explain("h1", "").HostFirst })
	ex := explain("h1", "az1")
	st := ex.Steps[0]
	if strings.Join(ex.Decision.Eligible, ",") != "b1" || strings.Join(st.Eligible, ",") != "b1" ||
		st.Instances[1].State != "other-host" || st.Instances[2].State != "other-host" || !strings.Contains(st.Note, "on host h1") {
		t.Fatalf("locality.host on, from h1: %+v", ex)
	}
	ex = explain("h9", "az1")
	if strings.Join(ex.Decision.Eligible, ",") != "b1,b2" || ex.Steps[0].Instances[2].State != "other-zone" || !strings.Contains(ex.Steps[0].Note, "no eligible instance on host h9") {
		t.Fatalf("locality.host on, from h9: %+v", ex)
	}
}

func testTokens(t *testing.T, e *env) {
	adm := e.client(t, adminToken)
	tok, err := adm.CreateToken(ctx(t), adminapi.TokenRequest{Lane: "Alice", Name: "laptop"})
	if err != nil || tok.Lane != "alice" || !strings.HasPrefix(tok.Secret, "lanes_"+tok.ID+"_") {
		t.Fatalf("create: %+v %v", tok, err)
	}
	// etcd holds a hash, never the token.
	resp, err := e.store.Client().Get(ctx(t), e.store.Prefix()+"tokens/"+tok.ID)
	if err != nil || len(resp.Kvs) != 1 || strings.Contains(string(resp.Kvs[0].Value), tok.Secret) {
		t.Fatalf("stored token: %v %v", resp, err)
	}
	list, err := adm.Tokens(ctx(t))
	if err != nil || len(list) != 1 || list[0].Secret != "" || list[0].Scope() != "lane:alice" {
		t.Fatalf("list: %+v %v", list, err)
	}
	// A lane token may read but not administer.
	c := e.client(t, tok.Secret)
	if _, err := c.Services(ctx(t)); err != nil {
		t.Errorf("lane token reading services: %v", err)
	}
	if _, err := c.Tokens(ctx(t)); !adminapi.IsCode(err, adminapi.CodeForbidden) {
		t.Errorf("lane token listing tokens: %v", err)
	}
	// Wrong secret, unknown token, no token.
	for _, bad := range []string{tok.Secret[:len(tok.Secret)-1] + "x", "lanes_000000000000_abc", "nonsense", ""} {
		if _, err := e.client(t, bad).Services(ctx(t)); !adminapi.IsCode(err, adminapi.CodeUnauthorized) {
			t.Errorf("token %q: %v, want unauthorized", bad, err)
		}
	}
	if err := adm.RevokeToken(ctx(t), tok.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Services(ctx(t)); !adminapi.IsCode(err, adminapi.CodeUnauthorized) {
		t.Errorf("revoked token: %v", err)
	}
	if _, err := adm.CreateToken(ctx(t), adminapi.TokenRequest{Lane: "a", Baseline: true}); !adminapi.IsCode(err, adminapi.CodeBadRequest) {
		t.Errorf("both scopes: %v", err)
	}
}

// aliceRegistration registers web/a in lane alice with a new token of the
// lane, and returns that token's client and the lease.
func aliceRegistration(t *testing.T, e *env) (*adminclient.Client, registry.Lease) {
	t.Helper()
	tok, err := e.client(t, adminToken).CreateToken(ctx(t), adminapi.TokenRequest{Lane: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	c := e.client(t, tok.Secret)
	reg := adminclient.NewRegistry(c, adminclient.WithLogger(quiet))
	t.Cleanup(func() { reg.Close() })
	l, err := reg.Register(ctx(t), registry.Instance{Service: "web", ID: "a", Addr: "127.0.0.1:1", Lane: "alice"}, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return c, l
}

func testClaims(t *testing.T, e *env) {
	c, l := aliceRegistration(t, e)
	rid := regid.Of(l)
	// A lane token claims only the address it comes from.
	if _, err := c.Claim(ctx(t), adminapi.ClaimRequest{Lane: "alice", IP: "10.1.2.3", Registration: rid}); !adminapi.IsCode(err, adminapi.CodeForbidden) {
		t.Errorf("claim of another address: %v", err)
	}
	if _, err := c.Claim(ctx(t), adminapi.ClaimRequest{Lane: "bob", Registration: rid}); !adminapi.IsCode(err, adminapi.CodeForbidden) {
		t.Errorf("claim for another lane: %v", err)
	}
	cl, err := c.Claim(ctx(t), adminapi.ClaimRequest{Lane: "alice", Registration: rid})
	if err != nil || cl.IP != "127.0.0.1" {
		t.Fatalf("claim: %+v %v", cl, err)
	}
	waitFor(t, "claim in the table", func() bool { l, ok := e.claims.Lookup(netip.MustParseAddr("127.0.0.1")); return ok && l == "alice" })
	lanes, _ := c.Lanes(ctx(t))
	if len(lanes) != 1 || lanes[0].Name != "alice" || len(lanes[0].Claims) != 1 {
		t.Errorf("lanes: %+v", lanes)
	}
	// The claim ends with the registration.
	l.Close()
	waitFor(t, "claim gone", func() bool { _, ok := e.claims.Lookup(netip.MustParseAddr("127.0.0.1")); return !ok })
}

func testLaneExpiry(t *testing.T, e *env) {
	adm := e.client(t, adminToken)
	doc := "# our lanes\nlanes:\n  alice:\n    fallback: [team-a] # first\ncanary: []\n"
	if _, err := adm.PutPolicy(ctx(t), []byte(doc)); err != nil {
		t.Fatal(err)
	}
	when := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	l, err := adm.UpdateLane(ctx(t), "Alice", adminapi.LaneUpdate{Expires: &when})
	if err != nil || l.Expires == nil || !l.Expires.Equal(when) || l.Expired {
		t.Fatalf("update: %+v %v", l, err)
	}
	got, _ := adm.Policy(ctx(t))
	for _, want := range []string{"# our lanes", "fallback: [team-a] # first", "expires: " + when.Format(time.RFC3339)} {
		if !strings.Contains(got.Raw, want) {
			t.Errorf("edited document lacks %q:\n%s", want, got.Raw)
		}
	}
	// A new lane, then no expiry: the document comes back as it was.
	if _, err := adm.UpdateLane(ctx(t), "bob", adminapi.LaneUpdate{ExpiresIn: adminapi.Duration(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"alice", "bob"} {
		if _, err := adm.UpdateLane(ctx(t), n, adminapi.LaneUpdate{NoExpiry: true}); err != nil {
			t.Fatal(err)
		}
	}
	got, _ = adm.Policy(ctx(t))
	if strings.Contains(got.Raw, "expires") || strings.Contains(got.Raw, "bob") || !strings.Contains(got.Raw, "fallback: [team-a] # first") {
		t.Errorf("after removing the expiries:\n%s", got.Raw)
	}
	if _, err := adm.UpdateLane(ctx(t), "alice", adminapi.LaneUpdate{}); !adminapi.IsCode(err, adminapi.CodeBadRequest) {
		t.Errorf("empty update: %v", err)
	}
	// An expired lane refuses registrations.
	past := time.Now().Add(-time.Minute)
	if _, err := adm.UpdateLane(ctx(t), "alice", adminapi.LaneUpdate{Expires: &past}); err != nil {
		t.Fatal(err)
	}
	reg := adminclient.NewRegistry(adm, adminclient.WithLogger(quiet))
	defer reg.Close()
	if _, err := reg.Register(ctx(t), registry.Instance{Service: "web", ID: "a", Addr: "127.0.0.1:1", Lane: "alice"}, 5*time.Second); !adminapi.IsCode(err, adminapi.CodeLaneExpired) {
		t.Errorf("register in an expired lane: %v", err)
	}
}

// A registration whose lease vanished (a process suspended for longer than
// its TTL) is made again by the next heartbeat.
func testReregister(t *testing.T, e *env) {
	reg := adminclient.NewRegistry(e.client(t, adminToken), adminclient.WithLogger(quiet))
	defer reg.Close()
	l, err := reg.Register(ctx(t), registry.Instance{Service: "web", ID: "a", Addr: "127.0.0.1:1"}, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	first := regid.Of(l)
	id, _ := strconv.ParseInt(first, 16, 64)
	if _, err := e.store.Client().Revoke(ctx(t), clientv3.LeaseID(id)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "registered again", func() bool {
		insts, err := e.client(t, adminToken).Instances(ctx(t), "web")
		return err == nil && len(insts) == 1 && regid.Of(l) != first && insts[0].Registration == regid.Of(l)
	})
	select {
	case <-l.Done():
		t.Fatalf("lease ended: %v", l.Err())
	default:
	}
}

func testErrors(t *testing.T, e *env) {
	adm := e.client(t, adminToken)
	_, err := adm.PutPolicy(ctx(t), []byte("lanes:\n  a:\n    strict: maybe\n"))
	var ae *adminapi.Error
	if !errors.As(err, &ae) || ae.Status != http.StatusUnprocessableEntity || ae.Line != 3 || ae.Field != "lanes.a.strict" {
		t.Errorf("invalid policy: %v %+v", err, ae)
	}
	_, err = adm.Register(ctx(t), adminapi.RegisterRequest{Instance: registry.Instance{Service: "web", ID: "a", Addr: "nope"}})
	if !errors.As(err, &ae) || ae.Status != http.StatusBadRequest || ae.Field != "instance.addr" || ae.Value != "nope" {
		t.Errorf("bad instance: %v %+v", err, ae)
	}
	resp, err := http.Post(e.url+"/v1/instances", "application/json", strings.NewReader(`{"instance":{},"bogus":1}`))
	if err == nil {
		resp.Body.Close()
	}
	if err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("no token: %v %v", resp, err)
	}
	req, _ := http.NewRequest(http.MethodPost, e.url+"/v1/instances", strings.NewReader(`{"instance":{},"bogus":1}`))
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err = http.DefaultClient.Do(req)
	if err == nil {
		var body adminapi.ErrorBody
		json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || body.Error == nil || body.Error.Field != "bogus" {
			t.Errorf("unknown field: %d %+v", resp.StatusCode, body.Error)
		}
	}
	http.DefaultClient.CloseIdleConnections()
	ex, err := adm.Explain(ctx(t), adminapi.ExplainRequest{Service: "web", Lane: "alice", Zone: "az1"})
	if err != nil || ex.Error == nil || ex.Error.Code != "no_instance" || len(ex.Steps) != 2 {
		t.Errorf("explain with no instance: %+v %v", ex, err)
	}
}

func waitFor(t *testing.T, what string, f func() bool) {
	t.Helper()
	timing.Until(t, what, 30*time.Second, f)
}
