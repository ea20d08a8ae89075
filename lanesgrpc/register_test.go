package lanesgrpc_test

import (
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	testpb "google.golang.org/grpc/interop/grpc_testing"

	"github.com/lanesdev/lanes/lanesgrpc"
)

// TestRegister: with lanesgrpc.Register, a plain grpc.NewClient of
// "lanes:///service" routes through the registered resolver and balancer:
// a lane call reaches the lane instance, a baseline call does not.
func TestRegister(t *testing.T) {
	m := newMesh(t)
	m.start("svc", "svc-1", "")
	m.start("svc", "svc-alice", "alice")
	waitFor(t, "both listed", func() bool { return m.listed("svc", "svc-1") && m.listed("svc", "svc-alice") })

	lanesgrpc.Register(m.engine)
	t.Cleanup(func() { lanesgrpc.Register(nil) })
	cc, err := grpc.NewClient("lanes:///svc",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithChainUnaryInterceptor(lanesgrpc.UnaryClientInterceptor()),
		grpc.WithChainStreamInterceptor(lanesgrpc.StreamClientInterceptor()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	c := testpb.NewTestServiceClient(cc)
	for i := 0; i < 10; i++ {
		if got := mustServe(t, c, "alice"); got != "svc-alice" {
			t.Fatalf("lane call served by %q", got)
		}
		if got := mustServe(t, c, ""); got != "svc-1" {
			t.Fatalf("baseline call served by %q", got)
		}
	}
}

// TestTargetForm: a target in the wrong form is refused with the form
// expected, by CheckTarget at once and by the resolver at the first call;
// without Register the call says what to do.
func TestTargetForm(t *testing.T) {
	const form = "want lanes:///<service>"
	for _, bad := range []string{"lanes://orders", "lanes:orders", "lanes:///orders:8080", "lanes:///a/b", "lanes:///", "lanes:///a b", "dns:///orders", "orders"} {
		if err := lanesgrpc.CheckTarget(bad); err == nil || !strings.Contains(err.Error(), form) || !strings.Contains(err.Error(), bad) {
			t.Errorf("CheckTarget(%q) = %v", bad, err)
		}
	}
	if err := lanesgrpc.CheckTarget("lanes:///orders"); err != nil {
		t.Errorf("CheckTarget(lanes:///orders) = %v", err)
	}

	m := newMesh(t)
	lanesgrpc.Register(m.engine)
	t.Cleanup(func() { lanesgrpc.Register(nil) })
	call := func(target string) error {
		cc, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return err
		}
		defer cc.Close()
		_, err = testpb.NewTestServiceClient(cc).EmptyCall(callCtx(t, ""), &testpb.Empty{})
		return err
	}
	for _, bad := range []string{"lanes://orders", "lanes:///orders:8080"} {
		if err := call(bad); err == nil || !strings.Contains(err.Error(), form) {
			t.Errorf("call to %q: %v", bad, err)
		}
	}
	lanesgrpc.Register(nil)
	if err := call("lanes:///orders"); err == nil || !strings.Contains(err.Error(), "call lanesgrpc.Register(engine)") {
		t.Errorf("without Register: %v", err)
	}
}
