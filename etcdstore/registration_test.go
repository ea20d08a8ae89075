package etcdstore_test

import (
	"errors"
	"testing"
	"time"

	"github.com/lanesdev/lanes/etcdstore"
	"github.com/lanesdev/lanes/internal/testkit/etcdtest"
)

// TestRegistrationConditions: the conditions of Registrations.Create that
// the admin API relies on, and the owner records.
func TestRegistrationConditions(t *testing.T) {
	s := open(t, etcdtest.Embedded(t))
	ctx := testCtx(t)
	regs := s.Registrations()
	const ttl = 30 * time.Second

	a, err := regs.Create(ctx, inst("web", "a", 1), ttl, etcdstore.CreateOptions{Owner: "tok1"})
	if err != nil {
		t.Fatal(err)
	}
	if own, err := regs.Owns(ctx, "tok1", a.Lease); err != nil || !own {
		t.Fatalf("Owns(tok1) = %v %v", own, err)
	}
	if own, _ := regs.Owns(ctx, "tok2", a.Lease); own {
		t.Fatal("tok2 owns tok1's registration")
	}
	// IfAbsent, SameLane, SameOwner refuse; the holder stays.
	inLane := inst("web", "a", 2)
	inLane.Lane = "alice"
	for name, c := range map[string]struct {
		o    etcdstore.CreateOptions
		want error
	}{
		"if absent":  {o: etcdstore.CreateOptions{Owner: "tok1", IfAbsent: true}, want: etcdstore.ErrHeld},
		"same lane":  {o: etcdstore.CreateOptions{Owner: "tok1", SameLane: true}, want: etcdstore.ErrOtherLane},
		"same owner": {o: etcdstore.CreateOptions{Owner: "tok2", SameOwner: true}, want: etcdstore.ErrOtherOwner},
	} {
		in := inst("web", "a", 2)
		if name == "same lane" {
			in = inLane
		}
		if _, err := regs.Create(ctx, in, ttl, c.o); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", name, err, c.want)
		}
	}
	if h, ok, err := regs.Holder(ctx, "web", "a"); err != nil || !ok || h.Lease != a.Lease || h.Instance.Addr != "10.1.0.1:1" {
		t.Fatalf("holder %+v %v %v", h, ok, err)
	}
	// The owner replaces its own; the limit does not count the replaced.
	b, err := regs.Create(ctx, inst("web", "a", 3), ttl, etcdstore.CreateOptions{Owner: "tok1", SameOwner: true, MaxPerOwner: 1})
	if err != nil {
		t.Fatalf("owner replacing its own at its limit: %v", err)
	}
	if _, err := regs.Create(ctx, inst("web", "b", 1), ttl, etcdstore.CreateOptions{Owner: "tok2", MaxPerOwner: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := regs.Create(ctx, inst("web", "c", 1), ttl, etcdstore.CreateOptions{Owner: "tok2", MaxPerOwner: 1}); !errors.Is(err, etcdstore.ErrLimit) {
		t.Errorf("over the limit: %v", err)
	}
	if _, ok, _ := regs.Holder(ctx, "web", "c"); ok {
		t.Error("the registration over the limit was left in place")
	}
	// Update only while held; End removes instance and owner record.
	upd := inst("web", "a", 4)
	if held, err := regs.Update(ctx, a.Lease, upd); err != nil || held {
		t.Errorf("update by the replaced registration: held %v %v", held, err)
	}
	if held, err := regs.Update(ctx, b.Lease, upd); err != nil || !held {
		t.Errorf("update by the holder: held %v %v", held, err)
	}
	owned, err := regs.Owned(ctx, "tok1")
	if err != nil || !owned[a.Lease] || !owned[b.Lease] || len(owned) != 2 {
		t.Fatalf("Owned(tok1) = %v %v", owned, err)
	}
	if err := regs.End(ctx, b.Lease); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := regs.Holder(ctx, "web", "a"); ok {
		t.Error("instance still there after End")
	}
	if _, err := regs.Renew(ctx, b.Lease); !errors.Is(err, etcdstore.ErrNoRegistration) {
		t.Errorf("Renew after End: %v", err)
	}
	if own, _ := regs.Owns(ctx, "tok1", b.Lease); own {
		t.Error("owner record outlives its registration")
	}
}
