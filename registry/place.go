package registry

import (
	"net"
	"strconv"
	"strings"
)

// Place prepares the instance that a server listening on listener registers.
// Fields set in inst win; then lane and zone, as the caller's options give
// them; then the LANES_* variables read through getenv (see ApplyEnv). The
// address defaults to AdvertiseAddr(listener). The result is normalised (see
// Normalize). Every transport's Serve helper places its instance this way.
func Place(inst Instance, lane, zone string, getenv func(string) string, listener net.Addr) (Instance, error) {
	if inst.Lane == "" {
		inst.Lane = lane
	}
	if inst.Zone == "" {
		inst.Zone = zone
	}
	if getenv == nil {
		getenv = func(string) string { return "" }
	}
	inst, err := ApplyEnv(inst, func(k string) string {
		v := getenv(k)
		if k == EnvAddr && strings.TrimSpace(v) == "" && listener != nil {
			return AdvertiseAddr(listener)
		}
		return v
	})
	if err != nil {
		return inst, err
	}
	return Normalize(inst)
}

// Reacher is implemented by a Registry that reaches its store over the
// network (etcdstore.Store, adminclient.Registry). The Serve helpers
// advertise an instance that listens on an unspecified address (":8080") at
// LocalIP: the address the control plane's side of the network reaches the
// process back at, which the host's first interface need not be (a VPN, a
// container bridge).
type Reacher interface {
	// LocalIP returns the local IP address of this process's route to the
	// store, or nil when there is none.
	LocalIP() net.IP
}

// AdvertiseAddr returns the address to register for a listener's address:
// an unspecified IP (0.0.0.0 or ::) is replaced by this host's first
// non-loopback unicast address, IPv4 first, or by 127.0.0.1 when it has none.
// The Serve helpers prefer a Reacher's LocalIP to the first address.
func AdvertiseAddr(a net.Addr) string {
	tcp, ok := a.(*net.TCPAddr)
	if !ok {
		return a.String()
	}
	ip := tcp.IP
	if ip == nil || ip.IsUnspecified() {
		ip = hostIP()
	}
	return net.JoinHostPort(ip.String(), strconv.Itoa(tcp.Port))
}

func hostIP() net.IP {
	addrs, _ := net.InterfaceAddrs()
	var v6 net.IP
	for _, a := range addrs {
		n, ok := a.(*net.IPNet)
		if !ok || !n.IP.IsGlobalUnicast() {
			continue
		}
		if v4 := n.IP.To4(); v4 != nil {
			return v4
		}
		if v6 == nil {
			v6 = n.IP
		}
	}
	if v6 != nil {
		return v6
	}
	return net.IPv4(127, 0, 0, 1)
}
