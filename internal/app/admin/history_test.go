package admin_test

import (
	"fmt"
	"testing"

	"github.com/lanesdev/lanes/adminapi"
	"github.com/lanesdev/lanes/internal/app/admin"
	"github.com/lanesdev/lanes/internal/testkit/etcdtest"
)

// TestPolicyHistory: each applied document is kept, newest first, the last
// HistorySize; a refused one is not; a lane token may read the history.
func TestPolicyHistory(t *testing.T) {
	e := newEnv(t, etcdtest.Embedded(t))
	c := e.client(t, adminToken)
	if h, err := c.PolicyHistory(ctx(t)); err != nil || len(h) != 0 {
		t.Fatalf("history before any apply: %v %v", h, err)
	}
	var revs []int64
	for i := range admin.HistorySize + 3 {
		d, err := c.PutPolicy(ctx(t), fmt.Appendf(nil, "lanes:\n  l%d:\n    strict: true\n", i))
		if err != nil {
			t.Fatal(err)
		}
		revs = append(revs, d.Revision)
	}
	if _, err := c.PutPolicy(ctx(t), []byte("lanes:\n  alice:\n    fallback: [-no]\n")); !adminapi.IsCode(err, adminapi.CodeInvalidPolicy) {
		t.Fatalf("invalid document: %v", err)
	}
	tok, err := c.CreateToken(ctx(t), adminapi.TokenRequest{Lane: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	h, err := e.client(t, tok.Secret).PolicyHistory(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(h) != admin.HistorySize {
		t.Fatalf("%d revisions kept, want %d", len(h), admin.HistorySize)
	}
	for i, r := range h {
		n := admin.HistorySize + 2 - i
		if r.Revision != revs[n] || r.Raw != fmt.Sprintf("lanes:\n  l%d:\n    strict: true\n", n) || r.By != "the admin token" || r.Applied.IsZero() {
			t.Errorf("history[%d] = %+v, want revision %d of document l%d", i, r, revs[n], n)
		}
	}
}
