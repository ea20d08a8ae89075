package registry

import (
	"net"
	"strings"
	"testing"
)

func TestApplyEnv(t *testing.T) {
	env := map[string]string{EnvLane: " Alice ", EnvZone: "az1", EnvWeight: "50", EnvLabels: "track=beta, team = a", EnvHost: "box 1"}
	in, err := ApplyEnv(Instance{Service: "orders", Addr: "127.0.0.1:8080", Zone: "az9", Labels: map[string]string{"team": "code"}}, func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	if in.Lane != "Alice" || in.Zone != "az9" || in.Weight != 50 || in.Labels["track"] != "beta" || in.Labels["team"] != "code" {
		t.Fatalf("got %+v", in)
	}
	if !strings.HasPrefix(in.ID, "box-1-8080-") {
		t.Fatalf("id %q", in.ID)
	}
	n, err := Normalize(in)
	if err != nil || n.Lane != "alice" {
		t.Fatalf("normalised %+v, %v", n, err)
	}
	drain, _ := ApplyEnv(Instance{}, func(k string) string { return map[string]string{EnvWeight: "0"}[k] })
	if !drain.Drain || drain.EffectiveWeight() != 0 {
		t.Fatalf("LANES_WEIGHT=0 should drain: %+v", drain)
	}
	for k, v := range map[string]string{EnvWeight: "heavy", EnvLabels: "novalue"} {
		_, err := ApplyEnv(Instance{}, func(key string) string {
			if key == k {
				return v
			}
			return ""
		})
		if err == nil || !strings.Contains(err.Error(), k) || !strings.Contains(err.Error(), v) {
			t.Fatalf("%s=%s: error %v does not name the variable and value", k, v, err)
		}
	}
}

func TestPlace(t *testing.T) {
	lis := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 9000}
	env := map[string]string{EnvZone: "az-env", EnvLane: "env-lane"}
	in, err := Place(Instance{Service: "orders"}, "Alice", "", func(k string) string { return env[k] }, lis)
	if err != nil {
		t.Fatal(err)
	}
	if in.Lane != "alice" || in.Zone != "az-env" || in.Addr != "127.0.0.1:9000" || in.Weight != DefaultWeight {
		t.Fatalf("placed %+v", in)
	}
	in, err = Place(Instance{Service: "orders", Zone: "az-code"}, "", "az-opt", nil, &net.TCPAddr{IP: net.IPv4zero, Port: 9001})
	if err != nil {
		t.Fatal(err)
	}
	if in.Zone != "az-code" || strings.HasPrefix(in.Addr, "0.0.0.0") || !strings.HasSuffix(in.Addr, ":9001") {
		t.Fatalf("placed %+v", in)
	}
	if _, err := Place(Instance{}, "", "", nil, lis); err == nil || !strings.Contains(err.Error(), "service") {
		t.Fatalf("an instance without a service was placed: %v", err)
	}
}
