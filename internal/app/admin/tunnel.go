package admin

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lanesdev/lanes/adminapi"
	"github.com/lanesdev/lanes/etcdstore"
	"github.com/lanesdev/lanes/internal/lib/regid"
	"github.com/lanesdev/lanes/internal/lib/tunnel"
	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/registry"
)

// DefaultMaxTunnels bounds the tunnels open at once per token, when
// Config.MaxTunnels is zero.
const DefaultMaxTunnels = 4

// tunnelTTL is the lease of a tunnel's registration: the control plane
// renews it while the tunnel lives and ends it when the tunnel ends, so it
// only matters when the control plane itself stops without ending it.
const tunnelTTL = registry.DefaultTTL

// tunnels counts the tunnels open per owner.
type tunnels struct {
	open map[string]int // owner → tunnels
}

// takeTunnel reserves one of owner's tunnels; false at the limit.
func (s *Server) takeTunnel(owner string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tunnels.open == nil {
		s.tunnels.open = map[string]int{}
	}
	if s.tunnels.open[owner] >= s.cfg.MaxTunnels {
		return false
	}
	s.tunnels.open[owner]++
	return true
}

func (s *Server) releaseTunnel(owner string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tunnels.open[owner]--; s.tunnels.open[owner] <= 0 {
		delete(s.tunnels.open, owner)
	}
}

// Tunnels returns the number of tunnels open.
func (s *Server) Tunnels() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, c := range s.tunnels.open {
		n += c
	}
	return n
}

// openTunnel serves GET /v1/tunnel: a lane token (or the admin token) opens
// a tunnel from a developer's machine (`lanes dev --tunnel`, docs/dev.md).
// The control plane listens on a relay address of its own, registers the
// instance there in the token's lane, relays each connection to the relay
// through the tunnel, and dials registered instances (and
// NATS) for the machine. The registration lives as long as the tunnel.
func (s *Server) openTunnel(w http.ResponseWriter, r *http.Request) {
	p, err := s.authenticate(r)
	if err == nil {
		err = s.tunnel(w, r, p)
	}
	if err != nil {
		s.writeError(w, r, err)
	}
}

func (s *Server) tunnel(w http.ResponseWriter, r *http.Request, p *principal) error {
	q := r.URL.Query()
	inst := registry.Instance{Service: q.Get("service"), ID: q.Get("id"), Lane: q.Get("lane"), Zone: q.Get("zone"),
		Host: q.Get("host"), Version: q.Get("version"), Addr: "127.0.0.1:1", Labels: map[string]string{}}
	for _, kv := range q["label"] {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return badRequest("label", kv, "label %q: want key=value", kv)
		}
		inst.Labels[k] = v
	}
	if inst.Lane == "" {
		return badRequest("lane", "", "a tunnel carries an instance of a lane: name the lane (a tunnel never serves the baseline)")
	}
	inst.Scope = p.scope()
	inst.Labels[registry.LabelPath] = registry.PathTunnel
	inst.Labels[registry.LabelTunnelFrom] = remoteIP(r).String()
	inst.Labels[registry.LabelTunnelSince] = s.now().UTC().Format(time.RFC3339)
	inst, err := registry.Normalize(inst)
	if err != nil {
		return fieldError("", err)
	}
	if !p.allows(inst.Lane) {
		return forbidden("lane", inst.Lane, "%s cannot open a tunnel for %s: a token opens tunnels only for its own lane", p, laneName(inst.Lane))
	}
	if err := s.refuseExpired(r.Context(), "lane", inst.Lane); err != nil {
		return err
	}
	if err := s.checkLimits(p, inst); err != nil {
		return err
	}
	host := s.cfg.TunnelHost
	if host == "" {
		// The address the machine reached the admin API at: an address of
		// this host that the environment reaches too.
		if la, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok {
			host, _, _ = net.SplitHostPort(la.String())
		}
	}
	if !s.takeTunnel(p.owner()) {
		return errorf(http.StatusForbidden, adminapi.CodeLimit, "", "", "%s already has %d tunnels open, as many as it may; end one first", p, s.cfg.MaxTunnels)
	}
	defer s.releaseTunnel(p.owner())
	if !s.beginStream() {
		return errorf(http.StatusServiceUnavailable, adminapi.CodeUnavailable, "", "", "the control plane is shutting down")
	}
	defer s.wg.Done()
	rl, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return errorf(http.StatusServiceUnavailable, adminapi.CodeUnavailable, "tunnel_host", host, "the tunnel's relay cannot listen on %s: %v", host, err)
	}
	inst.Addr = rl.Addr().String()

	ts, err := tunnel.Upgrade(w, r)
	if err != nil {
		rl.Close()
		s.log.Warn("tunnel refused", "from", remoteIP(r), "by", p.String(), "err", err)
		return nil // answered by the upgrade
	}
	defer ts.Close()
	ctx, cancel := context.WithCancel(s.streams)
	defer cancel()

	hello := tunnel.Hello{Service: inst.Service, ID: inst.ID, Lane: inst.Lane, Addr: inst.Addr, From: inst.Labels[registry.LabelTunnelFrom], NATS: s.cfg.TunnelNATS != ""}
	cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
	reg, err := s.regs.Create(cctx, inst, tunnelTTL, etcdstore.CreateOptions{
		Owner: p.owner(), SameLane: true, SameOwner: !p.admin, MaxPerOwner: s.limits(p).Instances})
	ccancel()
	if err != nil {
		rl.Close()
		s.metrics.registrations.WithLabelValues("refused").Inc()
		hello.Error = fmt.Sprintf("register %s/%s in lane %s: %v", inst.Service, inst.ID, inst.Lane, err)
		ts.SendHello(hello)
		ts.Goodbye()
		return nil
	}
	s.metrics.registrations.WithLabelValues("created").Inc()
	hello.Registration = regid.Format(reg.Lease)
	ts.Relay(rl, tunnel.RelayOptions{Name: "tunnel relay " + inst.Service + "/" + inst.ID, Logger: s.log})
	ts.Serve(s.tunnelDial())
	s.log.Info("tunnel opened", "service", inst.Service, "id", inst.ID, "lane", inst.Lane, "relay", inst.Addr,
		"from", hello.From, "registration", hello.Registration, "by", p.String())
	ended := ts.Ended()
	reason := "the machine ended it"
	if err := ts.SendHello(hello); err != nil {
		reason = "the machine did not hear its registration"
	} else {
		reason = s.holdTunnel(ctx, ts, ended, reg.Lease)
	}
	rl.Close() // refused from now on: callers move on at once
	ectx, ecancel := context.WithTimeout(lane.Detach(r.Context()), 5*time.Second)
	err = s.regs.End(ectx, reg.Lease)
	ecancel()
	if err != nil {
		s.log.Warn("tunnel's registration not ended; it expires with its lease", "service", inst.Service, "id", inst.ID, "err", err, "ttl", tunnelTTL)
	}
	ts.Goodbye()
	s.log.Info("tunnel closed; instance deregistered", "service", inst.Service, "id", inst.ID, "lane", inst.Lane, "reason", reason)
	return nil
}

// holdTunnel renews the tunnel's registration until the tunnel ends, and
// says why it ended.
func (s *Server) holdTunnel(ctx context.Context, ts *tunnel.Server, ended <-chan struct{}, lease clientv3.LeaseID) string {
	tick := time.NewTicker(tunnelTTL / 4)
	defer tick.Stop()
	for {
		select {
		case <-ended:
			return "the machine ended it"
		case <-ts.Done():
			return "the tunnel's connection ended (or its keep-alive went unanswered)"
		case <-ctx.Done():
			return "the control plane is shutting down"
		case <-tick.C:
			rctx, cancel := context.WithTimeout(ctx, tunnelTTL/4)
			_, err := s.regs.Renew(rctx, lease)
			cancel()
			if errors.Is(err, etcdstore.ErrNoRegistration) {
				return "its registration was ended or replaced"
			}
		}
	}
}

// tunnelDial answers the streams that a tunnel's machine opens: "dial
// host:port" to a registered instance (tunnel.Dialable), through the address
// rules, which keep the control plane's own listeners out of reach; "nats"
// to the environment's NATS server.
func (s *Server) tunnelDial() func(ctx context.Context, req string) (net.Conn, error) {
	rules, _ := s.addressRules(nil)
	d := rules.Dialer(&net.Dialer{KeepAlive: 30 * time.Second})
	return func(ctx context.Context, req string) (net.Conn, error) {
		if req == "nats" {
			if s.cfg.TunnelNATS == "" {
				return nil, errors.New("this control plane has no NATS server to forward to")
			}
			return (&net.Dialer{}).DialContext(ctx, "tcp", s.cfg.TunnelNATS)
		}
		addr, ok := strings.CutPrefix(req, "dial ")
		if !ok {
			return nil, fmt.Errorf("unknown request %q", req)
		}
		regs, err := s.regs.List(ctx, "")
		if err != nil {
			return nil, fmt.Errorf("list instances: %v", err)
		}
		insts := make([]registry.Instance, len(regs))
		for i, r := range regs {
			insts[i] = r.Instance
		}
		if !tunnel.Dialable(addr, insts) {
			return nil, fmt.Errorf("%s is no registered instance's address", strconv.Quote(addr))
		}
		return d.DialContext(ctx, "tcp", addr)
	}
}
