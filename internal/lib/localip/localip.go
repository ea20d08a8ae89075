// Package localip finds the local IP address that this host's routes choose
// to reach a peer: the source address of the connections a process opens to
// it, and so the address at which that peer, or any host on its side, can
// reach the process back. A host's first interface need not be it: a laptop
// with a VPN, a host with container bridges.
package localip

import (
	"net"
	"net/url"
	"strings"
	"time"
)

// timeout bounds the name lookup of Toward.
const timeout = 2 * time.Second

// Toward returns the local IP address of this host's route to target: a
// host:port, or a URL (scheme://host[:port]/...). It asks the kernel by
// connecting a UDP socket, which sends nothing. It returns nil when target
// cannot be parsed or resolved, or no route leads there.
func Toward(target string) net.IP {
	hostport := target
	if scheme, _, ok := strings.Cut(target, "://"); ok {
		u, err := url.Parse(target)
		if err != nil {
			return nil
		}
		hostport = u.Host
		if u.Port() == "" {
			port := "80"
			if strings.EqualFold(scheme, "https") {
				port = "443"
			}
			hostport = net.JoinHostPort(u.Hostname(), port)
		}
	}
	d := net.Dialer{Timeout: timeout}
	c, err := d.Dial("udp", hostport)
	if err != nil {
		return nil
	}
	defer c.Close()
	a, ok := c.LocalAddr().(*net.UDPAddr)
	if !ok || a.IP.IsUnspecified() {
		return nil
	}
	return a.IP
}
