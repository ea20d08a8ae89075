// Package addrpolicy is the one rule of what an instance address may be, for
// the control plane that stores instances and for every dialer that
// connects to them.
//
// An address that a client registers is an authority claim: whoever
// registers one points the gateway and the transports at it. So an
// instance address is refused when it reaches:
//
//   - a listener of the control plane itself (etcd's client and peer ports,
//     the admin API, the gateway, the collector, NATS: what Reserved holds),
//     on any form of the address that reaches it: the listener's own IP, and,
//     for a listener on this machine, every address of this machine
//     (127.0.0.0/8, ::1, 0.0.0.0, ::, the IPv4-mapped forms, the addresses
//     of its interfaces) with the same port;
//   - a link-local address (169.254.0.0/16, fe80::/10) or a cloud metadata
//     address (169.254.169.254, fd00:ec2::254, 100.100.100.200), unless the
//     rules allow link-local addresses;
//   - a multicast or broadcast address, which no instance is;
//   - an address outside the rules' scope (CIDRs and ports), when they
//     have one.
//
// The registry checks an address with Check when it is registered
// (resolving a host name, within a timeout, to every address it has); the
// dialers check the IP that they actually dial, after resolution, with
// Control (net.Dialer.ControlContext), so that a name that resolves
// elsewhere later, or an instance written into etcd around the admin API,
// is refused too.
package addrpolicy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// DefaultResolveTimeout bounds the resolution of a host name by Check.
const DefaultResolveTimeout = 2 * time.Second

// metadata are the cloud metadata addresses that are not link-local:
// AWS's IPv6 one and Alibaba Cloud's (169.254.169.254, the others', is).
var metadata = []netip.Addr{
	netip.MustParseAddr("fd00:ec2::254"),
	netip.MustParseAddr("100.100.100.200"),
}

// thisNet is 0.0.0.0/8, "this network": a connection to any of it reaches
// this machine, or fails.
var thisNet = netip.MustParsePrefix("0.0.0.0/8")

// A Listener is one address that the control plane listens on.
type Listener struct {
	Name string // "etcd client", "admin", ...
	Addr netip.AddrPort
}

func (l Listener) String() string { return l.Name + " (" + l.Addr.String() + ")" }

// Reserved is the set of the control plane's listeners, which no instance
// address may reach. It grows as listeners open; it is safe for concurrent
// use, and its zero value is empty and ready.
type Reserved struct {
	mu   sync.RWMutex
	list []Listener
}

// Add records that the control plane listens on addr (a *net.TCPAddr, or
// "host:port" where host is an IP or a name, which Add resolves), under
// name.
func (r *Reserved) Add(ctx context.Context, name string, addr any) error {
	var aps []netip.AddrPort
	switch a := addr.(type) {
	case *net.TCPAddr:
		aps = append(aps, a.AddrPort())
	case string:
		host, port, err := net.SplitHostPort(a)
		if err != nil {
			return fmt.Errorf("addrpolicy: listener %s: %w", name, err)
		}
		p, err := strconv.ParseUint(port, 10, 16)
		if err != nil {
			return fmt.Errorf("addrpolicy: listener %s: port %q: %w", name, port, err)
		}
		ips, err := resolve(ctx, nil, host)
		if err != nil {
			return fmt.Errorf("addrpolicy: listener %s: %w", name, err)
		}
		for _, ip := range ips {
			aps = append(aps, netip.AddrPortFrom(ip, uint16(p)))
		}
	default:
		return fmt.Errorf("addrpolicy: listener %s: address of type %T", name, addr)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, ap := range aps {
		r.list = append(r.list, Listener{Name: name, Addr: netip.AddrPortFrom(plain(ap.Addr()), ap.Port())})
	}
	return nil
}

// List returns the listeners recorded so far.
func (r *Reserved) List() []Listener {
	if r == nil {
		return nil
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	return slices.Clone(r.list)
}

// reaches returns the listener that a connection to ap would reach, if any.
func (r *Reserved) reaches(ap netip.AddrPort) (Listener, bool) {
	if r == nil {
		return Listener{}, false
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	ip := plain(ap.Addr())
	var local func(netip.Addr) bool
	for _, l := range r.list {
		if l.Addr.Port() != ap.Port() {
			continue
		}
		if l.Addr.Addr() == ip {
			return l, true
		}
		if local == nil {
			local = localAddrs()
		}
		if local(l.Addr.Addr()) && local(ip) {
			return l, true
		}
	}
	return Listener{}, false
}

// plain is a without an IPv6 zone, and IPv4 for an IPv4-mapped address.
func plain(a netip.Addr) netip.Addr { return a.Unmap().WithZone("") }

// localAddrs returns a test of whether an address is this machine's: a
// loopback or unspecified address, 0.0.0.0/8, or an address of one of its
// interfaces (read now: they change).
func localAddrs() func(netip.Addr) bool {
	var own []netip.Addr
	if as, err := net.InterfaceAddrs(); err == nil {
		for _, a := range as {
			if n, ok := a.(*net.IPNet); ok {
				if ip, ok := netip.AddrFromSlice(n.IP); ok {
					own = append(own, plain(ip))
				}
			}
		}
	}
	return func(a netip.Addr) bool {
		return a.IsLoopback() || a.IsUnspecified() || a.Is4() && thisNet.Contains(a) || slices.Contains(own, a)
	}
}

// A PortRange is the ports Lo to Hi, both included.
type PortRange struct{ Lo, Hi uint16 }

// ParsePorts reads "8080" or "8000-8999".
func ParsePorts(s string) (PortRange, error) {
	lo, hi, isRange := strings.Cut(s, "-")
	if !isRange {
		hi = lo
	}
	a, err1 := strconv.ParseUint(strings.TrimSpace(lo), 10, 16)
	b, err2 := strconv.ParseUint(strings.TrimSpace(hi), 10, 16)
	if err1 != nil || err2 != nil || a == 0 || b < a {
		return PortRange{}, fmt.Errorf("want a port (1 to 65535) or a range lo-hi with lo <= hi")
	}
	return PortRange{uint16(a), uint16(b)}, nil
}

func (p PortRange) String() string {
	if p.Lo == p.Hi {
		return strconv.Itoa(int(p.Lo))
	}
	return fmt.Sprintf("%d-%d", p.Lo, p.Hi)
}

// Rules are what an instance address may be. The zero value refuses
// link-local, metadata, multicast and broadcast addresses and allows every
// other.
type Rules struct {
	// Reserved are the control plane's listeners; nil for none known.
	Reserved *Reserved
	// CIDRs, when not empty, are the networks that an address must be in.
	CIDRs []netip.Prefix
	// Ports, when not empty, are the ports that an address may have.
	Ports []PortRange
	// LinkLocal allows link-local and cloud metadata addresses.
	LinkLocal bool
	// Resolver resolves host names for Check (net.DefaultResolver when
	// nil), within ResolveTimeout (DefaultResolveTimeout when zero).
	Resolver       *net.Resolver
	ResolveTimeout time.Duration
}

// A Refusal is an address that the rules refuse.
type Refusal struct {
	// Addr is the address as it was given; IP the one refused, when it is
	// another (the resolved address of a name, a dialled one).
	Addr string
	IP   netip.AddrPort
	// Rule names the rule: "control plane", "link-local", "multicast",
	// "addresses.cidrs", "addresses.ports", "resolve".
	Rule string
	Msg  string
}

func (e *Refusal) Error() string {
	at := ""
	if e.IP.IsValid() && e.IP.String() != e.Addr {
		at = " (" + e.IP.String() + ")"
	}
	return fmt.Sprintf("address %s%s %s", e.Addr, at, e.Msg)
}

// ErrRefused is what every Refusal is (errors.Is).
var ErrRefused = errors.New("addrpolicy: address refused")

// Is makes a Refusal ErrRefused.
func (e *Refusal) Is(target error) bool { return target == ErrRefused }

// CheckIP refuses ap if the rules do; addr is how the caller wrote it.
func (r *Rules) CheckIP(addr string, ap netip.AddrPort) error {
	ip := plain(ap.Addr())
	refuse := func(rule, format string, args ...any) error {
		return &Refusal{Addr: addr, IP: ap, Rule: rule, Msg: fmt.Sprintf(format, args...)}
	}
	var reserved *Reserved
	if r != nil {
		reserved = r.Reserved
	}
	if l, ok := reserved.reaches(ap); ok {
		return refuse("control plane", "reaches the control plane's own %s listener (%s): no instance may have it", l.Name, l.Addr)
	}
	if ip.IsMulticast() || ip == netip.AddrFrom4([4]byte{255, 255, 255, 255}) {
		return refuse("multicast", "is a multicast or broadcast address: no instance may have it")
	}
	if (r == nil || !r.LinkLocal) && (ip.IsLinkLocalUnicast() || slices.Contains(metadata, ip)) {
		return refuse("link-local", "is a link-local or cloud metadata address, refused unless allowed (addresses.link_local)")
	}
	if r == nil {
		return nil
	}
	if len(r.CIDRs) > 0 && !slices.ContainsFunc(r.CIDRs, func(p netip.Prefix) bool { return p.Contains(ip) }) {
		return refuse("addresses.cidrs", "is outside addresses.cidrs %s", prefixes(r.CIDRs))
	}
	if len(r.Ports) > 0 && !slices.ContainsFunc(r.Ports, func(p PortRange) bool { return p.Lo <= ap.Port() && ap.Port() <= p.Hi }) {
		return refuse("addresses.ports", "has a port outside addresses.ports %s", portList(r.Ports))
	}
	return nil
}

func prefixes(ps []netip.Prefix) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return "[" + strings.Join(s, " ") + "]"
}

func portList(ps []PortRange) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return "[" + strings.Join(s, " ") + "]"
}

// Scoped reports whether the rules have a scope (CIDRs or ports).
func (r *Rules) Scoped() bool { return r != nil && (len(r.CIDRs) > 0 || len(r.Ports) > 0) }

// Check refuses addr ("host:port") if the rules refuse it or, for a host
// name, any address the name resolves to. A name that does not resolve
// within the timeout is refused when the rules have a scope (it could not
// be checked against it); otherwise it is accepted, and every dial checks
// the address it reaches (Control).
func (r *Rules) Check(ctx context.Context, addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return &Refusal{Addr: addr, Rule: "resolve", Msg: "is not host:port"}
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return &Refusal{Addr: addr, Rule: "resolve", Msg: "has no port number"}
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		return r.CheckIP(addr, netip.AddrPortFrom(ip, uint16(p)))
	}
	var res *net.Resolver
	d := DefaultResolveTimeout
	if r != nil {
		res = r.Resolver
		if r.ResolveTimeout > 0 {
			d = r.ResolveTimeout
		}
	}
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	ips, err := resolve(ctx, res, host)
	if err != nil {
		if r.Scoped() {
			return &Refusal{Addr: addr, Rule: "resolve", Msg: fmt.Sprintf("could not be checked against the address scope: %v", err)}
		}
		return nil
	}
	for _, ip := range ips {
		if err := r.CheckIP(addr, netip.AddrPortFrom(ip, uint16(p))); err != nil {
			return err
		}
	}
	return nil
}

func resolve(ctx context.Context, res *net.Resolver, host string) ([]netip.Addr, error) {
	if ip, err := netip.ParseAddr(host); err == nil {
		return []netip.Addr{ip}, nil
	}
	if host == "" {
		return []netip.Addr{netip.IPv4Unspecified(), netip.IPv6Unspecified()}, nil
	}
	if res == nil {
		res = net.DefaultResolver
	}
	return res.LookupNetIP(ctx, "ip", host)
}

// Control is a net.Dialer's ControlContext: it refuses to connect to an
// address that the rules refuse. It sees the IP and port actually dialled,
// after resolution.
func (r *Rules) Control(_ context.Context, _, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return &Refusal{Addr: address, Rule: "resolve", Msg: "is not an IP and port"}
	}
	return r.CheckIP(address, ap)
}

// Dialer returns a copy of d (a zero net.Dialer when nil) that refuses
// what the rules refuse, before connecting; a ControlContext or Control
// of d's runs after the rules'.
func (r *Rules) Dialer(d *net.Dialer) *net.Dialer {
	var nd net.Dialer
	if d != nil {
		nd = *d
	}
	prevCtx, prev := nd.ControlContext, nd.Control
	nd.Control = nil
	nd.ControlContext = func(ctx context.Context, network, address string, c syscall.RawConn) error {
		if err := r.Control(ctx, network, address, c); err != nil {
			return err
		}
		switch {
		case prevCtx != nil:
			return prevCtx(ctx, network, address, c)
		case prev != nil:
			return prev(network, address, c)
		}
		return nil
	}
	return &nd
}
