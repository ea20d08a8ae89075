package controlplane

import (
	"bufio"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lanesdev/lanes/internal/lib/addrpolicy"
)

// listening returns the TCP sockets that this process listens on, from
// /proc: the sockets among its file descriptors in the LISTEN state.
func listening(t *testing.T) map[netip.AddrPort]bool {
	t.Helper()
	inodes := map[string]bool{}
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	for _, fd := range fds {
		if l, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name())); err == nil {
			if in, ok := strings.CutPrefix(l, "socket:["); ok {
				inodes[strings.TrimSuffix(in, "]")] = true
			}
		}
	}
	out := map[netip.AddrPort]bool{}
	for _, file := range []string{"/proc/self/net/tcp", "/proc/self/net/tcp6"} {
		f, err := os.Open(file)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		sc.Scan() // the header
		for sc.Scan() {
			fs := strings.Fields(sc.Text())
			if len(fs) < 10 || fs[3] != "0A" || !inodes[fs[9]] {
				continue
			}
			out[procAddr(t, fs[1])] = true
		}
		f.Close()
	}
	return out
}

// procAddr reads an address of /proc/net/tcp: the IP in hex, as 32-bit
// words in host order (little-endian here), then the port in hex.
func procAddr(t *testing.T, s string) netip.AddrPort {
	ipHex, portHex, _ := strings.Cut(s, ":")
	b, err := hex.DecodeString(ipHex)
	if err != nil {
		t.Fatalf("%q: %v", s, err)
	}
	for i := 0; i+4 <= len(b); i += 4 {
		b[i], b[i+1], b[i+2], b[i+3] = b[i+3], b[i+2], b[i+1], b[i]
	}
	ip, _ := netip.AddrFromSlice(b)
	port, _ := strconv.ParseUint(portHex, 16, 16)
	return netip.AddrPortFrom(ip, uint16(port))
}

// TestEveryListenerReserved checks that every TCP port the control plane
// listens on is among its reserved listeners (a component that listens
// records it with Runtime.Listen or Runtime.Listening), so that no instance
// address reaches one: a new listener that does not is caught here.
func TestEveryListenerReserved(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc")
	}
	before := listening(t)
	cfg := Defaults()
	cfg.DataDir = t.TempDir()
	cfg.AdminAddr, cfg.GatewayAddr, cfg.Etcd.ClientAddr, cfg.Etcd.PeerAddr = "127.0.0.1:0", "0.0.0.0:0", "127.0.0.1:0", "127.0.0.1:0"
	cfg.Nats.Addr = "127.0.0.1:0"
	cfg.Traces.GRPCAddr, cfg.Traces.HTTPAddr = "127.0.0.1:0", "127.0.0.1:0"
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	s, err := Start(ctx, cfg, WithLogger(NewLogger(io.Discard, "error")))
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var res addrpolicy.Reserved
	for _, l := range s.Listeners() {
		if err := res.Add(context.Background(), l.Name, l.Addr.String()); err != nil {
			t.Fatal(err)
		}
	}
	rules := &addrpolicy.Rules{Reserved: &res}
	var names []string
	for _, l := range s.Listeners() {
		names = append(names, l.Name)
	}
	n := 0
	for ap := range listening(t) {
		if before[ap] {
			continue
		}
		n++
		if err := rules.CheckIP(ap.String(), ap); err == nil {
			t.Errorf("the control plane listens on %s, which is not among its reserved listeners %v", ap, s.Listeners())
		}
		// Any loopback form of it is refused too.
		lo := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.9"), ap.Port())
		if err := rules.CheckIP(lo.String(), lo); err == nil {
			t.Errorf("%s reaches the listener %s and is not refused", lo, ap)
		}
	}
	if n < 7 {
		t.Errorf("found %d new listeners (%v reserved); want at least etcd client and peer, nats, the collector's two, gateway, admin", n, names)
	}
	t.Log(fmt.Sprint(len(names), " reserved: ", names))
}
