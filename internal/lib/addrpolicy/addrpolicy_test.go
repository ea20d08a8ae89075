package addrpolicy

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strconv"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// listen opens a loopback listener that the test's reserved set holds.
func reservedListener(t *testing.T, host string) (*Reserved, net.Listener) {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Skipf("listen on %s: %v", host, err)
	}
	t.Cleanup(func() { ln.Close() })
	var r Reserved
	if err := r.Add(context.Background(), "etcd client", ln.Addr()); err != nil {
		t.Fatal(err)
	}
	return &r, ln
}

func TestCheckReserved(t *testing.T) {
	for _, host := range []string{"127.0.0.1", "0.0.0.0"} {
		res, ln := reservedListener(t, host)
		port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
		rules := &Rules{Reserved: res, LinkLocal: true}
		for _, addr := range []string{
			"127.0.0.1:" + port, "127.0.0.2:" + port, "127.255.255.254:" + port,
			"[::1]:" + port, "[::ffff:127.0.0.1]:" + port, "0.0.0.0:" + port, "[::]:" + port,
			"localhost:" + port, "0.1.2.3:" + port,
		} {
			err := rules.Check(context.Background(), addr)
			var ref *Refusal
			if !errors.As(err, &ref) || ref.Rule != "control plane" || !errors.Is(err, ErrRefused) {
				t.Errorf("listener on %s: Check(%s) = %v, want a refusal naming the control plane", host, addr, err)
			}
		}
		other := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port ^ 1)
		for _, addr := range []string{"127.0.0.1:" + other, "10.1.2.3:" + port, "localhost:" + other} {
			if err := rules.Check(context.Background(), addr); err != nil {
				t.Errorf("listener on %s: Check(%s) = %v, want nil", host, addr, err)
			}
		}
	}
}

func TestCheckLinkLocalAndScope(t *testing.T) {
	var zero *Rules
	for _, addr := range []string{"169.254.169.254:80", "[fd00:ec2::254]:80", "100.100.100.200:80", "[fe80::1]:80", "[fe80::1%lo]:80", "[::ffff:169.254.1.1]:80", "224.0.0.1:80", "255.255.255.255:80"} {
		if err := zero.Check(context.Background(), addr); err == nil {
			t.Errorf("Check(%s) = nil by default, want a refusal", addr)
		}
	}
	if err := (&Rules{LinkLocal: true}).Check(context.Background(), "169.254.169.254:80"); err != nil {
		t.Errorf("with LinkLocal: %v", err)
	}
	pr, err := ParsePorts("8000-8999")
	if err != nil {
		t.Fatal(err)
	}
	scoped := &Rules{CIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, Ports: []PortRange{pr}}
	for addr, rule := range map[string]string{"10.1.2.3:8080": "", "11.1.2.3:8080": "addresses.cidrs", "10.1.2.3:80": "addresses.ports", "[::ffff:10.0.0.1]:8000": "", "nonexistent.invalid:8080": "resolve"} {
		err := scoped.Check(context.Background(), addr)
		var ref *Refusal
		got := ""
		if errors.As(err, &ref) {
			got = ref.Rule
		}
		if got != rule {
			t.Errorf("scoped Check(%s) = %v, want rule %q", addr, err, rule)
		}
	}
	for _, bad := range []string{"0", "9-8", "x", "70000", ""} {
		if _, err := ParsePorts(bad); err == nil {
			t.Errorf("ParsePorts(%q) = nil error", bad)
		}
	}
}

// TestDialerRefuses checks that a dialer with the rules never connects to
// a reserved listener, on any form of its address: the listener sees no
// connection, and the error is ErrRefused.
func TestDialerRefuses(t *testing.T) {
	res, ln := reservedListener(t, "127.0.0.1")
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	d := (&Rules{Reserved: res}).Dialer(&net.Dialer{})
	for _, addr := range []string{"127.0.0.1:" + port, "127.0.0.2:" + port, "localhost:" + port, "0.0.0.0:" + port} {
		c, err := d.DialContext(context.Background(), "tcp", addr)
		if err == nil {
			c.Close()
			t.Fatalf("dial %s: connected, want a refusal", addr)
		}
		if !errors.Is(err, ErrRefused) {
			t.Errorf("dial %s: %v, want ErrRefused", addr, err)
		}
	}
	// Nothing reached the listener: its backlog is empty (a completed
	// connection would be accepted at once, deadline or not).
	tl := ln.(*net.TCPListener)
	tl.SetDeadline(time.Now())
	if c, err := tl.Accept(); err == nil {
		c.Close()
		t.Fatal("a refused dial reached the listener")
	}
	// Another port is dialled.
	other, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	c2, err := d.Dial("tcp", other.Addr().String())
	if err != nil {
		t.Fatalf("dial an allowed address: %v", err)
	}
	c2.Close()
}

// BenchmarkControl is the cost of the check on each new connection to an
// instance: an address that is not reserved, with seven listeners known.
func BenchmarkControl(b *testing.B) {
	var res Reserved
	for i := range 7 {
		res.Add(context.Background(), "l", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 7700 + i})
	}
	r := &Rules{Reserved: &res}
	b.ReportAllocs()
	for b.Loop() {
		if err := r.Control(context.Background(), "tcp4", "10.0.3.7:8080", nil); err != nil {
			b.Fatal(err)
		}
	}
}
