package localip

import (
	"net"
	"testing"

	"go.uber.org/goleak"

	"github.com/lanesdev/lanes/internal/testkit/leaktest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, leaktest.Options()...) }

func TestToward(t *testing.T) {
	for _, target := range []string{"127.0.0.1:7701", "etcd://127.0.0.1:2379", "http://127.0.0.1", "https://127.0.0.1:7700/v1"} {
		if ip := Toward(target); !ip.Equal(net.IPv4(127, 0, 0, 1)) {
			t.Errorf("Toward(%q) = %v, want 127.0.0.1", target, ip)
		}
	}
	if ip := Toward("[::1]:7701"); ip != nil && !ip.Equal(net.IPv6loopback) {
		t.Errorf("Toward([::1]:7701) = %v, want ::1", ip)
	}
	for _, target := range []string{"", "no-port", "http://%zz"} {
		if ip := Toward(target); ip != nil {
			t.Errorf("Toward(%q) = %v, want nil", target, ip)
		}
	}
}
