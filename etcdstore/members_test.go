package etcdstore

import (
	"context"
	"errors"
	"testing"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
)

// TestDialAddr: the member checks name a member by the address the etcd
// client's balancer dials for its endpoint.
func TestDialAddr(t *testing.T) {
	for ep, want := range map[string]string{
		"http://10.0.0.1:2379":      "10.0.0.1:2379",
		"https://etcd-1.local:2379": "etcd-1.local:2379",
		"https://[::1]:2379/":       "[::1]:2379",
		"10.0.0.1:2379":             "10.0.0.1:2379",
		"unix:///run/etcd.sock":     "unix:///run/etcd.sock",
		"unixs:///run/etcd.sock":    "unix:///run/etcd.sock",
		"unix://etcd.sock":          "unix:etcd.sock",
		"unix:etcd.sock":            "unix:etcd.sock",
	} {
		if got := dialAddr(ep); got != want {
			t.Errorf("dialAddr(%q) = %q, want %q", ep, got, want)
		}
	}
}

// TestMemberState: an answer of any kind but "no leader" means the member
// runs and has a leader; no answer means down.
func TestMemberState(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{nil, MemberUp},
		{rpctypes.ErrNoLeader, MemberNoLeader},
		{rpctypes.Error(rpctypes.ErrGRPCNoLeader), MemberNoLeader},
		{rpctypes.ErrPermissionDenied, MemberUp},
		{rpctypes.ErrUserEmpty, MemberUp},
		{context.DeadlineExceeded, MemberDown},
		{errors.New("connection refused"), MemberDown},
	} {
		if got := memberState(tc.err); got != tc.want {
			t.Errorf("memberState(%v) = %s, want %s", tc.err, got, tc.want)
		}
	}
}
