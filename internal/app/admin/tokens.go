package admin

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"sort"
	"strconv"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lanesdev/lanes/adminapi"
	"github.com/lanesdev/lanes/etcdstore"
	"github.com/lanesdev/lanes/internal/lib/addrpolicy"
	"github.com/lanesdev/lanes/lane"
)

// A registration token reads "lanes_<id>_<secret>": id is 12 hex digits,
// public (it names the token in listings and revocations), and secret 64 hex
// digits. etcd keeps, at <prefix>tokens/<id>, the token's scope and the
// SHA-256 of the whole token, never the token itself. The admin token reads
// "lanes_admin_<secret>" and is not stored in etcd at all.
const (
	tokenPrefix      = "lanes_"
	AdminTokenPrefix = "lanes_admin_"
	idLen            = 12
)

// storedToken is the value at <prefix>tokens/<id>.
type storedToken struct {
	adminapi.Token
	Hash string `json:"sha256"`
}

// NewAdminToken returns a fresh admin token.
func NewAdminToken() string { return AdminTokenPrefix + NewSecret() }

// NewSecret returns 32 random bytes in hex, for a credential.
func NewSecret() string { return randomHex(32) }

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func (s *Server) tokenKey(id string) string { return s.prefix + "tokens/" + id }

// tokenID returns the id part of a registration token, or "".
func tokenID(tok string) string {
	rest, ok := strings.CutPrefix(tok, tokenPrefix)
	if !ok || len(rest) < idLen+2 || rest[idLen] != '_' {
		return ""
	}
	id := rest[:idLen]
	if _, err := hex.DecodeString(id); err != nil {
		return ""
	}
	return id
}

// Tokens checks credentials: the admin token, and the registration tokens kept in etcd. The admin
// API checks its callers with it, and lanes up the senders of spans to its trace collector.
type Tokens struct {
	cli       *clientv3.Client
	prefix    string
	adminHash [32]byte
	hasAdmin  bool
	log       *slog.Logger
}

// NewTokens returns the checker of adminToken ("" accepts no admin token) and of the
// registration tokens of st.
func NewTokens(st *etcdstore.Store, adminToken string, log *slog.Logger) *Tokens {
	if log == nil {
		log = slog.Default()
	}
	return &Tokens{cli: st.Client(), prefix: st.Prefix(), adminHash: sha256.Sum256([]byte(adminToken)), hasAdmin: adminToken != "", log: log}
}

// Check says who holds tok: the admin (admin is true), or the holder of a registration token,
// whose record it returns. A token it refuses gives an error for which IsUnauthorized is true;
// any other error is etcd's.
func (ts *Tokens) Check(ctx context.Context, tok string) (admin bool, t adminapi.Token, err error) {
	sum := sha256.Sum256([]byte(tok))
	if ts.hasAdmin && subtle.ConstantTimeCompare(sum[:], ts.adminHash[:]) == 1 {
		return true, adminapi.Token{}, nil
	}
	t, err = ts.checkToken(ctx, tok)
	return false, t, err
}

// IsUnauthorized reports whether err is Check's refusal of a token.
func IsUnauthorized(err error) bool {
	var ae *apiError
	return errors.As(err, &ae) && ae.status == http.StatusUnauthorized
}

// checkToken looks a registration token up in etcd.
func (ts *Tokens) checkToken(ctx context.Context, tok string) (adminapi.Token, error) {
	id := tokenID(tok)
	if id == "" {
		return adminapi.Token{}, unauthorized("unknown token: it is neither the admin token nor a registration token")
	}
	resp, err := ts.cli.Get(ctx, ts.prefix+"tokens/"+id)
	if err != nil {
		return adminapi.Token{}, etcdError("read token", err)
	}
	if len(resp.Kvs) == 0 {
		return adminapi.Token{}, unauthorized("unknown token " + id + " (revoked, or never created)")
	}
	var st storedToken
	if err := json.Unmarshal(resp.Kvs[0].Value, &st); err != nil {
		ts.log.Error("unreadable token record", "key", string(resp.Kvs[0].Key), "err", err)
		return adminapi.Token{}, unauthorized("unknown token " + id)
	}
	sum := sha256.Sum256([]byte(tok))
	if subtle.ConstantTimeCompare([]byte(hex.EncodeToString(sum[:])), []byte(st.Hash)) != 1 {
		return adminapi.Token{}, unauthorized("wrong secret for token " + id)
	}
	return st.Token, nil
}

func (s *Server) listTokens(w http.ResponseWriter, r *http.Request, _ *principal) error {
	resp, err := s.cli.Get(r.Context(), s.prefix+"tokens/", clientv3.WithPrefix())
	if err != nil {
		return etcdError("list tokens", err)
	}
	out := []adminapi.Token{}
	for _, kv := range resp.Kvs {
		var st storedToken
		if err := json.Unmarshal(kv.Value, &st); err != nil {
			s.log.Error("unreadable token record", "key", string(kv.Key), "err", err)
			continue
		}
		out = append(out, st.Token)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Created.Before(out[j].Created) })
	writeJSON(w, http.StatusOK, map[string]any{"tokens": out})
	return nil
}

func (s *Server) createToken(w http.ResponseWriter, r *http.Request, _ *principal) error {
	var req adminapi.TokenRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	t := adminapi.Token{Name: strings.TrimSpace(req.Name), Baseline: req.Baseline, Created: s.now().UTC()}
	switch {
	case req.Baseline && req.Lane != "":
		return badRequest("lane", req.Lane, "set either lane or baseline, not both")
	case req.Baseline:
	case req.Lane == "":
		return badRequest("lane", "", "a token is scoped to one lane (set lane) or to the baseline (set baseline: true)")
	default:
		l, err := lane.Parse(req.Lane)
		if err != nil {
			return badRequest("lane", req.Lane, "%v", err)
		}
		t.Lane = l
	}
	if lim := req.Limits; lim != nil {
		for field, v := range map[string]int{"limits.instances": lim.Instances, "limits.labels": lim.Labels, "limits.instance_bytes": lim.InstanceBytes} {
			if v < 0 {
				return badRequest(field, strconv.Itoa(v), "a limit must not be negative (0 takes the default)")
			}
		}
		if *lim != (adminapi.Limits{}) {
			l := *lim
			t.Limits = &l
		}
	}
	if sc := req.Addresses; sc != nil {
		if _, err := s.addressRules(sc); err != nil {
			return err
		}
		if sc.LinkLocal && !s.cfg.AllowLinkLocal {
			return badRequest("addresses.link_local", "true", "the control plane refuses link-local and metadata addresses (allow_link_local is off): the gateway would not dial them")
		}
		if len(sc.CIDRs) > 0 || len(sc.Ports) > 0 || sc.LinkLocal {
			a := *sc
			t.Addresses = &a
		}
	}
	if len(t.Name) > 200 {
		return badRequest("name", t.Name, "at most 200 characters")
	}
	for range 5 {
		t.ID = randomHex(idLen / 2)
		secret := tokenPrefix + t.ID + "_" + randomHex(32)
		sum := sha256.Sum256([]byte(secret))
		val, _ := json.Marshal(storedToken{Token: t, Hash: hex.EncodeToString(sum[:])})
		key := s.tokenKey(t.ID)
		resp, err := s.cli.Txn(r.Context()).
			If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
			Then(clientv3.OpPut(key, string(val))).
			Commit()
		if err != nil {
			return etcdError("create token", err)
		}
		if resp.Succeeded {
			s.log.Info("token created", "id", t.ID, "scope", t.Scope(), "name", t.Name)
			t.Secret = secret
			writeJSON(w, http.StatusCreated, t)
			return nil
		}
	}
	return errorf(http.StatusInternalServerError, adminapi.CodeInternal, "", "", "could not pick an unused token id")
}

func (s *Server) revokeToken(w http.ResponseWriter, r *http.Request, _ *principal) error {
	id := r.PathValue("id")
	if _, err := hex.DecodeString(id); err != nil || len(id) != idLen {
		return notFound("id", id, "no token %q: a token id is %d hex digits", id, idLen)
	}
	resp, err := s.cli.Delete(r.Context(), s.tokenKey(id))
	if err != nil {
		return etcdError("revoke token", err)
	}
	if resp.Deleted == 0 {
		return notFound("id", id, "no token %q", id)
	}
	s.log.Info("token revoked", "id", id)
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// maxScope bounds the CIDRs and the port ranges of a token's addresses.
const maxScope = 64

// addressRules returns the address rules of a token's scope (nil: none),
// with the control plane's listeners reserved; an invalid scope is a
// bad request naming the field and the value.
func (s *Server) addressRules(sc *adminapi.AddressScope) (*addrpolicy.Rules, error) {
	r := &addrpolicy.Rules{Reserved: s.cfg.Reserved}
	if sc == nil {
		return r, nil
	}
	if len(sc.CIDRs) > maxScope || len(sc.Ports) > maxScope {
		return nil, badRequest("addresses", "", "at most %d CIDRs and %d port ranges", maxScope, maxScope)
	}
	for i, c := range sc.CIDRs {
		p, err := netip.ParsePrefix(strings.TrimSpace(c))
		if err != nil {
			return nil, badRequest(fmt.Sprintf("addresses.cidrs[%d]", i), c, "not a CIDR such as 10.0.0.0/8 or 2001:db8::/32")
		}
		r.CIDRs = append(r.CIDRs, p.Masked())
	}
	for i, v := range sc.Ports {
		pr, err := addrpolicy.ParsePorts(v)
		if err != nil {
			return nil, badRequest(fmt.Sprintf("addresses.ports[%d]", i), v, "%v", err)
		}
		r.Ports = append(r.Ports, pr)
	}
	r.LinkLocal = sc.LinkLocal && s.cfg.AllowLinkLocal
	return r, nil
}
