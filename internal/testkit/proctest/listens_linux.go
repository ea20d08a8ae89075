package proctest

import (
	"bufio"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
)

// Listens reports whether the process pid holds a listening TCP socket on
// addr (an IPv4 host:port), from /proc. A child's health check that
// answers on its port is not proof that the child serves it: when another
// process took the port between FreeAddr and the child's bind, the other
// one answers while the child exits.
func Listens(pid int, addr string) (bool, error) {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil || !ap.Addr().Is4() {
		return false, fmt.Errorf("proctest: listens: %q is not an IPv4 host:port", addr)
	}
	ip := ap.Addr().As4()
	// /proc/net/tcp prints an IPv4 address as the 32-bit word in host
	// order (little-endian here), then the port in hex.
	want := fmt.Sprintf("%02X%02X%02X%02X:%04X", ip[3], ip[2], ip[1], ip[0], ap.Port())
	f, err := os.Open(fmt.Sprintf("/proc/%d/net/tcp", pid))
	if err != nil {
		return false, err
	}
	defer f.Close()
	inodes := map[string]bool{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
		fs := strings.Fields(sc.Text())
		if len(fs) >= 10 && fs[1] == want && fs[3] == "0A" { // 0A: LISTEN
			inodes["socket:["+fs[9]+"]"] = true
		}
	}
	if err := sc.Err(); err != nil {
		return false, err
	}
	if len(inodes) == 0 {
		return false, nil
	}
	fds, err := filepath.Glob(fmt.Sprintf("/proc/%d/fd/*", pid))
	if err != nil {
		return false, err
	}
	for _, fd := range fds {
		if link, err := os.Readlink(fd); err == nil && inodes[link] {
			return true, nil
		}
	}
	return false, nil
}
