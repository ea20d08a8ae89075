package admin_test

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/lanesdev/lanes/adminapi"
	"github.com/lanesdev/lanes/adminclient"
	"github.com/lanesdev/lanes/internal/app/admin"
	"github.com/lanesdev/lanes/policy"
	"github.com/lanesdev/lanes/registry"
)

// token creates a registration token and returns a client that uses it.
func (e *env) token(t *testing.T, req adminapi.TokenRequest) (*adminclient.Client, adminapi.Token) {
	t.Helper()
	tok, err := e.client(t, adminToken).CreateToken(ctx(t), req)
	if err != nil {
		t.Fatal(err)
	}
	return e.client(t, tok.Secret), tok
}

func wantCode(t *testing.T, what string, err error, status int, code string) {
	t.Helper()
	var ae *adminapi.Error
	if !errors.As(err, &ae) || ae.Status != status || ae.Code != code {
		t.Errorf("%s: %v, want %d %s", what, err, status, code)
	}
}

// instanceOf returns the instance service/id as the admin sees it.
func (e *env) instanceOf(t *testing.T, service, id string) (adminapi.Instance, bool) {
	t.Helper()
	insts, err := e.client(t, adminToken).Instances(ctx(t), service)
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range insts {
		if in.ID == id {
			return in, true
		}
	}
	return adminapi.Instance{}, false
}

// A registration id is not an authority: only the token that made a
// registration (or the admin) may update, renew, end or replace it, and
// only that token sees its id.
func testOwnership(t *testing.T, e *env) {
	base, _ := e.token(t, adminapi.TokenRequest{Baseline: true, Name: "owner"})
	other, _ := e.token(t, adminapi.TokenRequest{Baseline: true, Name: "other"})
	alice, _ := e.token(t, adminapi.TokenRequest{Lane: "alice"})
	bob, _ := e.token(t, adminapi.TokenRequest{Lane: "bob"})

	web := registry.Instance{Service: "web", ID: "web-1", Addr: "10.0.0.1:80"}
	reg, err := base.Register(ctx(t), adminapi.RegisterRequest{Instance: web, TTL: adminapi.Duration(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	r := reg.Registration
	// The alice instance, for the other direction.
	aliceInst := registry.Instance{Service: "web", ID: "web-alice", Addr: "10.0.0.2:80", Lane: "alice"}
	areg, err := alice.Register(ctx(t), adminapi.RegisterRequest{Instance: aliceInst, TTL: adminapi.Duration(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}

	// Registration ids are shown to their owner and to the admin only.
	for name, c := range map[string]*adminclient.Client{"other": other, "alice": alice, "bob": bob} {
		insts, err := c.Instances(ctx(t), "web")
		if err != nil {
			t.Fatal(err)
		}
		for _, in := range insts {
			mine := name == "alice" && in.ID == "web-alice"
			if in.Registration != "" && !mine {
				t.Errorf("token %s sees registration %s of %s", name, in.Registration, in.ID)
			}
			if mine && in.Registration != areg.Registration {
				t.Errorf("alice does not see her own registration: %+v", in)
			}
		}
	}
	if in, _ := e.instanceOf(t, "web", "web-1"); in.Registration != r {
		t.Errorf("the admin sees registration %q, want %q", in.Registration, r)
	}

	// Moving the baseline instance into a lane, or pointing it elsewhere,
	// with its registration id is refused, for every other token.
	hijack := web.Clone()
	hijack.Addr = "10.6.6.6:80"
	for name, c := range map[string]*adminclient.Client{"other": other, "alice": alice} {
		in := hijack.Clone()
		if name == "alice" {
			in.Lane = "alice"
		}
		_, err := c.Register(ctx(t), adminapi.RegisterRequest{Instance: in, Registration: r})
		wantCode(t, name+" updating another's registration", err, http.StatusForbidden, adminapi.CodeForbidden)
		_, err = c.Heartbeat(ctx(t), "web", "web-1", r)
		wantCode(t, name+" renewing another's registration", err, http.StatusForbidden, adminapi.CodeForbidden)
		err = c.Deregister(ctx(t), "web", "web-1", r)
		wantCode(t, name+" ending another's registration", err, http.StatusForbidden, adminapi.CodeForbidden)
	}
	// Replacing it with a registration of its own is refused too.
	_, err = other.Register(ctx(t), adminapi.RegisterRequest{Instance: hijack})
	wantCode(t, "other replacing the instance", err, http.StatusConflict, adminapi.CodeConflict)
	if in, ok := e.instanceOf(t, "web", "web-1"); !ok || in.Addr != web.Addr || in.Lane != "" || in.Registration != r {
		t.Fatalf("the baseline instance changed: %+v %v", in, ok)
	}
	// Nor may a lane token touch another lane's instance, nor a baseline
	// token a lane instance.
	for name, c := range map[string]*adminclient.Client{"bob": bob, "base": base} {
		_, err := c.Heartbeat(ctx(t), "web", "web-alice", areg.Registration)
		wantCode(t, name+" renewing alice's registration", err, http.StatusForbidden, adminapi.CodeForbidden)
		err = c.Deregister(ctx(t), "web", "web-alice", areg.Registration)
		wantCode(t, name+" ending alice's registration", err, http.StatusForbidden, adminapi.CodeForbidden)
	}
	if _, ok := e.instanceOf(t, "web", "web-alice"); !ok {
		t.Fatal("alice's instance is gone")
	}

	// The owner renews, updates, replaces (a restarted process) and ends.
	if _, err := base.Heartbeat(ctx(t), "web", "web-1", r); err != nil {
		t.Errorf("owner heartbeat: %v", err)
	}
	moved := web.Clone()
	moved.Addr = "10.0.0.9:80"
	if got, err := base.Register(ctx(t), adminapi.RegisterRequest{Instance: moved, Registration: r}); err != nil || !got.Held {
		t.Errorf("owner update: %+v %v", got, err)
	}
	again, err := base.Register(ctx(t), adminapi.RegisterRequest{Instance: web})
	if err != nil {
		t.Fatalf("owner registering the id again: %v", err)
	}
	if err := base.Deregister(ctx(t), "web", "web-1", again.Registration); err != nil {
		t.Errorf("owner deregister: %v", err)
	}
	if _, ok := e.instanceOf(t, "web", "web-1"); ok {
		t.Error("instance still registered after its owner ended it")
	}
	// The admin acts on any registration.
	adm := e.client(t, adminToken)
	if _, err := adm.Heartbeat(ctx(t), "web", "web-alice", areg.Registration); err != nil {
		t.Errorf("admin heartbeat: %v", err)
	}
	if err := adm.Deregister(ctx(t), "web", "web-alice", areg.Registration); err != nil {
		t.Errorf("admin deregister: %v", err)
	}
}

// Each token registers a bounded number of instances, each of bounded
// labels and size.
func testLimits(t *testing.T, e *env) {
	c, _ := e.token(t, adminapi.TokenRequest{Lane: "alice", Limits: &adminapi.Limits{Instances: 2}})
	for i := range 2 {
		in := registry.Instance{Service: "web", ID: fmt.Sprintf("w%d", i), Addr: "10.0.0.1:80", Lane: "alice"}
		if _, err := c.Register(ctx(t), adminapi.RegisterRequest{Instance: in}); err != nil {
			t.Fatal(err)
		}
	}
	_, err := c.Register(ctx(t), adminapi.RegisterRequest{Instance: registry.Instance{Service: "web", ID: "w2", Addr: "10.0.0.1:80", Lane: "alice"}})
	wantCode(t, "third instance of a token limited to 2", err, http.StatusForbidden, adminapi.CodeLimit)
	// Replacing one of its own does not count twice.
	if _, err := c.Register(ctx(t), adminapi.RegisterRequest{Instance: registry.Instance{Service: "web", ID: "w1", Addr: "10.0.0.2:80", Lane: "alice"}}); err != nil {
		t.Errorf("replacing an own instance at the limit: %v", err)
	}

	d, _ := e.token(t, adminapi.TokenRequest{Lane: "alice"})
	labels := map[string]string{}
	for i := range admin.DefaultLimits.Labels + 1 {
		labels[fmt.Sprintf("k%d", i)] = "v"
	}
	_, err = d.Register(ctx(t), adminapi.RegisterRequest{Instance: registry.Instance{Service: "web", ID: "l", Addr: "10.0.0.1:80", Lane: "alice", Labels: labels}})
	wantCode(t, "too many labels", err, http.StatusRequestEntityTooLarge, adminapi.CodeLimit)
	var ae *adminapi.Error
	if errors.As(err, &ae) && ae.Field != "instance.labels" {
		t.Errorf("too many labels: field %q, want instance.labels", ae.Field)
	}
	big := map[string]string{}
	for i := range admin.DefaultLimits.InstanceBytes/1000 + 1 {
		big[fmt.Sprintf("k%d", i)] = strings.Repeat("v", 1000)
	}
	_, err = d.Register(ctx(t), adminapi.RegisterRequest{Instance: registry.Instance{Service: "web", ID: "b", Addr: "10.0.0.1:80", Lane: "alice", Labels: big}})
	wantCode(t, "instance too large", err, http.StatusRequestEntityTooLarge, adminapi.CodeLimit)
	if _, ok := e.instanceOf(t, "web", "l"); ok {
		t.Error("the instance with too many labels was stored")
	}
}

// The auth scheme is case-insensitive (RFC 9110, 11.1).
func testBearerCase(t *testing.T, e *env) {
	for _, scheme := range []string{"Bearer", "bearer", "BEARER", "bEaReR"} {
		req, _ := http.NewRequest(http.MethodGet, e.url+"/v1/services", nil)
		req.Header.Set("Authorization", scheme+" "+adminToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("scheme %q: %d", scheme, resp.StatusCode)
		}
	}
	http.DefaultClient.CloseIdleConnections()
}

// A policy document over the documented size is refused with 413 by
// validation and by apply alike; one just under it is accepted by both.
func testPolicySize(t *testing.T, e *env) {
	adm := e.client(t, adminToken)
	// doc returns a valid document of exactly size bytes.
	doc := func(size int) []byte {
		var b bytes.Buffer
		b.WriteString("lanes:\n  alice:\n    fallback: [bob]\n")
		for b.Len() < size {
			n := min(1000, size-b.Len()-3)
			b.WriteString("#" + strings.Repeat("x", max(n, 0)) + "\n")
		}
		return b.Bytes()[:size]
	}
	for _, size := range []int{policy.MaxSize + 1, 3 << 20} {
		_, err := adm.ValidatePolicy(ctx(t), doc(size))
		wantCode(t, fmt.Sprintf("validate %d bytes", size), err, http.StatusRequestEntityTooLarge, adminapi.CodeBadRequest)
		_, err = adm.PutPolicy(ctx(t), doc(size))
		wantCode(t, fmt.Sprintf("apply %d bytes", size), err, http.StatusRequestEntityTooLarge, adminapi.CodeBadRequest)
	}
	ok := doc(policy.MaxSize)
	if _, err := adm.ValidatePolicy(ctx(t), ok); err != nil {
		t.Errorf("validate %d bytes: %v", len(ok), err)
	}
	if _, err := adm.PutPolicy(ctx(t), ok); err != nil {
		t.Errorf("apply %d bytes: %v", len(ok), err)
	}
}

// A claim's registration id is shown only to the token that made the
// registration and to the admin.
func testClaimIDs(t *testing.T, e *env) {
	alice, _ := e.token(t, adminapi.TokenRequest{Lane: "alice"})
	other, _ := e.token(t, adminapi.TokenRequest{Lane: "alice", Name: "other"})
	reg, err := alice.Register(ctx(t), adminapi.RegisterRequest{Instance: registry.Instance{Service: "web", ID: "a", Addr: "127.0.0.1:1", Lane: "alice"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := alice.Claim(ctx(t), adminapi.ClaimRequest{Lane: "alice", Registration: reg.Registration}); err != nil {
		t.Fatal(err)
	}
	// Another token of the lane cannot hang a claim on it either.
	_, err = other.Claim(ctx(t), adminapi.ClaimRequest{Lane: "alice", Registration: reg.Registration})
	wantCode(t, "claim on another's registration", err, http.StatusForbidden, adminapi.CodeForbidden)
	for name, c := range map[string]*adminclient.Client{"alice": alice, "other": other, "admin": e.client(t, adminToken)} {
		claims, err := c.Claims(ctx(t))
		if err != nil || len(claims) != 1 {
			t.Fatalf("%s: claims %+v %v", name, claims, err)
		}
		if want := name != "other"; (claims[0].Registration != "") != want {
			t.Errorf("%s sees registration %q of the claim", name, claims[0].Registration)
		}
	}
	// Only the token whose registration holds the claim removes it.
	err = other.Unclaim(ctx(t), "127.0.0.1")
	wantCode(t, "removing another token's claim", err, http.StatusForbidden, adminapi.CodeForbidden)
	if err := alice.Unclaim(ctx(t), "127.0.0.1"); err != nil {
		t.Errorf("removing its own claim: %v", err)
	}
}
