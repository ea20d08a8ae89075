package admin_test

import (
	"bufio"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/lanesdev/lanes/adminapi"
	"github.com/lanesdev/lanes/adminclient"
	"github.com/lanesdev/lanes/internal/app/admin"
	"github.com/lanesdev/lanes/internal/testkit/etcdtest"
	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

// TestPolicyWatch: a process that registers with a lane token follows the
// policy through the admin API (GET /v1/watch/policy): fallback chains,
// strict lanes, and every change, across keep-alives.
func TestPolicyWatch(t *testing.T) {
	// Restored after the server has closed (cleanups run last first), not
	// while its streams still read it.
	t.Cleanup(admin.SetKeepAliveEvery(50 * time.Millisecond))
	srv := etcdtest.Embedded(t)
	e := newEnv(t, srv)
	adm := e.client(t, adminToken)
	tok, err := adm.CreateToken(ctx(t), adminapi.TokenRequest{Lane: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	reg := adminclient.NewRegistry(e.client(t, tok.Secret), adminclient.WithLogger(quiet))
	defer reg.Close()
	eng := routing.New(routing.WithRegistry(reg), routing.WithPolicyStore(reg.Policy()), routing.WithLogger(quiet))
	defer eng.Close()

	if _, err := adm.PutPolicy(ctx(t), []byte("lanes:\n  bob:\n    fallback: [alice]\n  solo:\n    strict: true\n")); err != nil {
		t.Fatal(err)
	}
	base, err := adminclient.NewRegistry(adm, adminclient.WithLogger(quiet)).Register(ctx(t), registry.Instance{Service: "orders", ID: "o-1", Addr: "127.0.0.1:1"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer base.Close()
	l, err := reg.Register(ctx(t), registry.Instance{Service: "orders", ID: "o-alice", Addr: "127.0.0.1:2", Lane: "alice"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()

	svc := eng.Service("orders")
	pick := func(ln string) string {
		r, err := svc.Pick(routing.Request{Lane: ln})
		var re *routing.Error
		if errors.As(err, &re) {
			return string(re.Code)
		}
		if err != nil {
			return err.Error()
		}
		return r.Instance.ID
	}
	waitUntil(t, "bob falls back to alice; solo is strict", func() bool { return pick("bob") == "o-alice" && pick("solo") == "lane_unavailable" })
	// An idle stream repeats its revision as a keep-alive, which the
	// client skips.
	req, _ := http.NewRequestWithContext(ctx(t), "GET", e.url+"/v1/watch/policy", nil)
	req.Header.Set("Authorization", "Bearer "+tok.Secret)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 8<<20)
	var lines []string
	for len(lines) < 2 && sc.Scan() {
		lines = append(lines, sc.Text())
	}
	resp.Body.Close()
	if len(lines) != 2 || !strings.Contains(lines[0], `"raw":"lanes:`) || !strings.HasSuffix(lines[1], `,"keepalive":true}`) {
		t.Fatalf("stream: %q", lines)
	}
	if _, err := adm.PutPolicy(ctx(t), []byte("lanes:\n  solo:\n    fallback: [alice]\n")); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the change reaches the engine", func() bool { return pick("solo") == "o-alice" && pick("bob") == "o-1" })

	// The store itself: Get parses the document again; a lane token may
	// not Put.
	doc, err := reg.Policy().Get(ctx(t))
	if err != nil || doc.Policy == nil || len(doc.Policy.Lanes) != 1 {
		t.Errorf("Get: %+v %v", doc, err)
	}
	if _, err := reg.Policy().Put(ctx(t), []byte("lanes: {}\n")); !adminapi.IsCode(err, adminapi.CodeForbidden) {
		t.Errorf("Put with a lane token: %v", err)
	}
}

func waitUntil(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 30s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
