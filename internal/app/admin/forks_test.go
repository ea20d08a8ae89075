package admin_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/lanesdev/lanes/adminapi"
	"github.com/lanesdev/lanes/internal/app/admin"
	"github.com/lanesdev/lanes/internal/testkit/etcdtest"
)

// TestForks: a lane token forks only into its lane (403 naming the lane),
// the admin token into any; a baseline token into none; the bounds on
// forks per lane and replicas per fork hold; forks are listed by scope and
// deleted; a control plane without Kubernetes takes none.
func TestForks(t *testing.T) {
	srv := etcdtest.Embedded(t)
	e := newEnvWith(t, srv, func(c *admin.Config) {
		c.ForkNamespaces = []string{"shop", "other"}
		c.ForkLimits = admin.ForkLimits{PerLane: 2, Replicas: 2}
		c.ForkImages = []string{"orders:", "registry.example.com/team/"}
	})
	adm := e.client(t, adminToken)
	alice, err := adm.CreateToken(ctx(t), adminapi.TokenRequest{Lane: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	base, err := adm.CreateToken(ctx(t), adminapi.TokenRequest{Baseline: true})
	if err != nil {
		t.Fatal(err)
	}
	ac, bc := e.client(t, alice.Secret), e.client(t, base.Secret)

	f, err := ac.Fork(ctx(t), adminapi.ForkRequest{Lane: "Alice", Deployment: "orders", Image: "orders:alice", TTL: adminapi.Duration(4 * time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	if f.Lane != "alice" || f.Namespace != "shop" || f.Name != "orders-alice" || f.Replicas != 1 || f.Expires == nil || f.By != alice.ID {
		t.Errorf("fork: %+v", f)
	}
	wantErr := func(what string, err error, status int, field, value string) {
		t.Helper()
		ae, ok := err.(*adminapi.Error)
		if !ok || ae.Status != status || ae.Field != field || ae.Value != value {
			t.Errorf("%s: %v (want HTTP %d naming %s=%s)", what, err, status, field, value)
		}
	}
	_, err = ac.Fork(ctx(t), adminapi.ForkRequest{Lane: "bob", Deployment: "orders"})
	wantErr("alice's token into bob", err, http.StatusForbidden, "lane", "bob")
	if err != nil && !strings.Contains(err.Error(), "lane bob") {
		t.Errorf("the refusal does not name the lane: %v", err)
	}
	_, err = bc.Fork(ctx(t), adminapi.ForkRequest{Lane: "alice", Deployment: "orders"})
	wantErr("baseline token", err, http.StatusForbidden, "lane", "alice")
	if _, err := adm.Fork(ctx(t), adminapi.ForkRequest{Lane: "bob", Namespace: "other", Deployment: "orders"}); err != nil {
		t.Errorf("admin into bob: %v", err)
	}
	_, err = ac.Fork(ctx(t), adminapi.ForkRequest{Lane: "alice", Namespace: "kube-system", Deployment: "orders"})
	wantErr("namespace not served", err, http.StatusForbidden, "namespace", "kube-system")
	_, err = ac.Fork(ctx(t), adminapi.ForkRequest{Lane: "alice", Deployment: "Orders!"})
	wantErr("bad name", err, http.StatusBadRequest, "deployment", "Orders!")
	_, err = ac.Fork(ctx(t), adminapi.ForkRequest{Lane: "alice", Deployment: "web", Replicas: 3})
	wantErr("replicas", err, http.StatusForbidden, "replicas", "3")
	_, err = ac.Fork(ctx(t), adminapi.ForkRequest{Lane: "alice", Deployment: "web", Image: "evil.example.com/miner"})
	wantErr("an image from elsewhere", err, http.StatusForbidden, "image", "evil.example.com/miner")
	if _, err := adm.Fork(ctx(t), adminapi.ForkRequest{Lane: "carol", Deployment: "web", Image: "evil.example.com/debug"}); err != nil {
		t.Errorf("the admin's fork of any image: %v", err)
	}
	_, err = ac.Fork(ctx(t), adminapi.ForkRequest{Lane: "alice", Deployment: "web", Env: map[string]string{"1X": "y"}})
	wantErr("env", err, http.StatusBadRequest, "env", "1X")

	// The bound: two forks a lane; forking the same Deployment again
	// replaces it and counts once.
	if _, err := ac.Fork(ctx(t), adminapi.ForkRequest{Lane: "alice", Deployment: "web", Replicas: 2}); err != nil {
		t.Fatal(err)
	}
	if _, err := ac.Fork(ctx(t), adminapi.ForkRequest{Lane: "alice", Deployment: "orders", Image: "orders:alice-2"}); err != nil {
		t.Errorf("replace: %v", err)
	}
	_, err = ac.Fork(ctx(t), adminapi.ForkRequest{Lane: "alice", Deployment: "payments"})
	if !adminapi.IsCode(err, adminapi.CodeLimit) {
		t.Errorf("third fork of a lane: %v", err)
	}

	mine, err := ac.Forks(ctx(t))
	if err != nil || len(mine) != 2 || mine[0].Image != "orders:alice-2" {
		t.Errorf("alice's forks: %+v, %v", mine, err)
	}
	all, err := adm.Forks(ctx(t))
	if err != nil || len(all) != 4 {
		t.Errorf("every fork: %+v, %v", all, err)
	}
	wantErr("alice deletes bob's", ac.DeleteFork(ctx(t), "bob", "other", "orders"), http.StatusForbidden, "lane", "bob")
	if err := ac.DeleteFork(ctx(t), "alice", "shop", "web"); err != nil {
		t.Fatal(err)
	}
	wantErr("deleted twice", ac.DeleteFork(ctx(t), "alice", "shop", "web"), http.StatusNotFound, "deployment", "web")

	// The lane's guard key (which makes the count and the write one
	// transaction) lasts while the lane has a fork, and goes with its last.
	guard := func() bool {
		t.Helper()
		resp, err := e.store.Client().Get(ctx(t), e.store.Prefix()+"forklanes/alice")
		if err != nil {
			t.Fatal(err)
		}
		return resp.Count == 1
	}
	if !guard() {
		t.Error("alice's guard went while alice has a fork")
	}
	if err := ac.DeleteFork(ctx(t), "alice", "shop", "orders"); err != nil {
		t.Fatal(err)
	}
	if guard() {
		t.Error("alice's guard outlives alice's last fork")
	}
	if _, err := ac.Fork(ctx(t), adminapi.ForkRequest{Lane: "alice", Deployment: "web"}); err != nil || !guard() {
		t.Errorf("a fork after the guard went: %v (guard: %v)", err, guard())
	}

	// An expired lane takes no fork.
	past := time.Now().Add(-time.Minute)
	if _, err := adm.UpdateLane(ctx(t), "alice", adminapi.LaneUpdate{Expires: &past}); err != nil {
		t.Fatal(err)
	}
	_, err = ac.Fork(ctx(t), adminapi.ForkRequest{Lane: "alice", Deployment: "web"})
	if !adminapi.IsCode(err, adminapi.CodeLaneExpired) {
		t.Errorf("fork into an expired lane: %v", err)
	}

	// Without Kubernetes, none.
	off := newEnv(t, srv).client(t, adminToken)
	_, err = off.Fork(ctx(t), adminapi.ForkRequest{Lane: "alice", Deployment: "web"})
	if !adminapi.IsCode(err, adminapi.CodeNotFound) || !strings.Contains(err.Error(), "--kube") {
		t.Errorf("fork without Kubernetes: %v", err)
	}
}
