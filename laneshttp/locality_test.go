package laneshttp_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/lanesdev/lanes/laneshttp"
	"github.com/lanesdev/lanes/registry"
)

// TestSameHost runs two instances on each of two hosts (distinct host
// values in one process), and a client on each host, whose host comes from
// LANES_HOST as a deploy platform would set it. With the policy's
// locality.host on, every call stays on the caller's host; off (the
// default), calls spread over both hosts.
func TestSameHost(t *testing.T) {
	f := newFleet(t, "")
	host := map[string]string{"a1": "h1", "a2": "h1", "b1": "h2", "b2": "h2"}
	for _, id := range []string{"a1", "a2", "b1", "b2"} {
		f.start(id + " orders host=" + host[id])
	}
	f.await("orders", 4)
	clients := map[string]*http.Client{}
	for _, h := range []string{"h1", "h2"} {
		clients[h] = f.client(laneshttp.WithEnv(func(k string) string {
			if k == registry.EnvHost {
				return h
			}
			return ""
		}))
	}
	served := func(h string) (map[string]int, string) {
		got, seen := map[string]int{}, map[string]bool{}
		for range 40 {
			code, id := get(t, context.Background(), clients[h], "http://orders/")
			if code != 200 {
				t.Fatalf("call from %s: status %d, %s", h, code, id)
			}
			got[id]++
			seen[host[id]] = true
		}
		var hs []string
		for _, h := range []string{"h1", "h2"} {
			if seen[h] {
				hs = append(hs, h)
			}
		}
		return got, strings.Join(hs, ",")
	}

	for _, h := range []string{"h1", "h2"} {
		if got, hosts := served(h); hosts != "h1,h2" {
			t.Fatalf("locality.host off: calls from %s went to %v; want both hosts", h, got)
		}
	}
	if _, err := f.pol.Put(context.Background(), []byte("locality: {host: true}\n")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the policy in force", func() bool { return f.e.Policy().Locality.Host })
	for _, h := range []string{"h1", "h2"} {
		if got, hosts := served(h); hosts != h || len(got) != 2 {
			t.Fatalf("locality.host on: calls from %s went to %v; want both instances of %s, and only those", h, got, h)
		}
	}
}
