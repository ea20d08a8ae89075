package lanesgrpc_test

import (
	"strings"
	"testing"

	testpb "google.golang.org/grpc/interop/grpc_testing"

	"github.com/lanesdev/lanes/lanesgrpc"
	"github.com/lanesdev/lanes/registry"
)

// onHost is an environment that puts a process on host h (LANES_HOST), as
// a deploy platform would: two hosts are simulated in one test process.
func onHost(h string) lanesgrpc.Option {
	return lanesgrpc.WithEnv(func(k string) string {
		if k == registry.EnvHost {
			return h
		}
		return ""
	})
}

// TestSameHost runs two instances on each of two hosts, and a client on each
// host. With the policy's locality.host on, every call stays on the
// caller's host; off (the default), calls spread over both hosts.
func TestSameHost(t *testing.T) {
	m := newMesh(t)
	host := map[string]string{"a1": "h1", "a2": "h1", "b1": "h2", "b2": "h2"}
	for _, id := range []string{"a1", "a2", "b1", "b2"} {
		m.start("orders", id, "", withServeOptions(onHost(host[id])))
	}
	for _, in := range m.engine.Service("orders").Instances() {
		if in.Host != host[in.ID] {
			t.Fatalf("instance %s registered on host %q, want %q", in.ID, in.Host, host[in.ID])
		}
	}
	clients := map[string]testpb.TestServiceClient{"h1": m.client("orders", onHost("h1")), "h2": m.client("orders", onHost("h2"))}
	served := func(h string) map[string]int {
		got := map[string]int{}
		for range 40 {
			got[mustServe(t, clients[h], "")]++
		}
		return got
	}
	hostsOf := func(got map[string]int) string {
		seen := map[string]bool{}
		for id := range got {
			seen[host[id]] = true
		}
		var hs []string
		for _, h := range []string{"h1", "h2"} {
			if seen[h] {
				hs = append(hs, h)
			}
		}
		return strings.Join(hs, ",")
	}

	// The picker skips connections that are not ready yet, so a client's
	// first calls may all reach the one instance it connected to first.
	// Each client first reaches all four, which locality.host off allows.
	for _, h := range []string{"h1", "h2"} {
		seen := map[string]bool{}
		waitFor(t, "the client on "+h+" to reach all four instances", func() bool {
			seen[mustServe(t, clients[h], "")] = true
			return len(seen) == len(host)
		})
	}
	for _, h := range []string{"h1", "h2"} {
		if got := served(h); hostsOf(got) != "h1,h2" {
			t.Fatalf("locality.host off: calls from %s went to %v; want both hosts", h, got)
		}
	}
	m.setPolicy("locality: {host: true}\n")
	for _, h := range []string{"h1", "h2"} {
		got := served(h)
		if hostsOf(got) != h || len(got) != 2 {
			t.Fatalf("locality.host on: calls from %s went to %v; want both instances of %s, and only those", h, got, h)
		}
	}
	m.setPolicy("locality: {host: false}\n")
	if got := served("h1"); hostsOf(got) != "h1,h2" {
		t.Fatalf("locality.host off again: calls from h1 went to %v; want both hosts", got)
	}
}
