// Package adminclient is the Go client of the lanes admin API, the JSON API
// that `lanes up` serves (docs/api.md).
//
// Client wraps every endpoint. Registry adapts the registration endpoints to
// registry.Registry, so that a service can register itself in a lane with
// nothing but the admin address and a registration token — no etcd address
// or credentials:
//
//	c, _ := adminclient.New("http://lanes.internal:7700", os.Getenv("LANES_TOKEN"))
//	reg := adminclient.NewRegistry(c)
//	defer reg.Close()
//	lease, err := reg.Register(ctx, registry.Instance{Service: "orders", ID: "orders-alice", Addr: "10.1.2.3:8080", Lane: "alice"}, 0)
//	...
//	defer lease.Close() // deregisters
//
// A token is scoped to one lane or to the baseline; the control plane refuses
// a registration whose lane is not exactly the token's.
package adminclient

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/lanesdev/lanes/adminapi"
	"github.com/lanesdev/lanes/internal/lib/tlsfiles"
)

// EnvAdmin and EnvToken are the environment variables that tools read the
// admin address and the token from.
const (
	EnvAdmin = "LANES_ADMIN"
	EnvToken = "LANES_TOKEN"
	// EnvCAFile is the PEM file of the CA that an https:// admin API is
	// verified with (WithCAFile); lanes up prints it when it serves TLS.
	EnvCAFile = tlsfiles.EnvCAFile
)

// DefaultAddr is the admin address of `lanes up` by default.
const DefaultAddr = "http://127.0.0.1:7700"

// Client calls the admin API. It is safe for concurrent use.
type Client struct {
	base   *url.URL
	token  string
	hc     *http.Client
	owned  bool   // hc was created here; Close closes its idle connections
	caFile string // WithCAFile
}

// Option configures a Client.
type Option func(*Client)

// WithHTTPClient makes the Client send its requests with hc.
func WithHTTPClient(hc *http.Client) Option { return func(c *Client) { c.hc, c.owned = hc, false } }

// WithCAFile makes the Client verify an https:// admin API with the CA
// certificates in the PEM file path only, instead of the system's roots
// (the value of LANES_CA_FILE). "" changes nothing. New fails, naming the
// file, when it cannot be read. It applies to the Client's own HTTP client,
// not to one given with WithHTTPClient.
func WithCAFile(path string) Option { return func(c *Client) { c.caFile = strings.TrimSpace(path) } }

// New returns a client of the admin API at addr ("host:port" or an http(s)
// URL) that authenticates with token (which may be empty for the endpoints
// that need none).
func New(addr, token string, opts ...Option) (*Client, error) {
	if addr == "" {
		addr = DefaultAddr
	}
	if !strings.Contains(addr, "://") {
		addr = "http://" + addr
	}
	u, err := url.Parse(addr)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return nil, fmt.Errorf("adminclient: admin address %q: want host:port or an http(s) URL", addr)
	}
	u.Path = strings.TrimSuffix(u.Path, "/")
	c := &Client{base: u, token: strings.TrimSpace(token), owned: true,
		hc: &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}} //lanes:ignore the admin API is the control plane, not a service in a lane
	for _, o := range opts {
		o(c)
	}
	if c.caFile != "" && c.owned {
		tc, err := tlsfiles.Client(c.caFile)
		if err != nil {
			return nil, fmt.Errorf("adminclient: %w", err)
		}
		c.hc.Transport.(*http.Transport).TLSClientConfig = tc
	}
	return c, nil
}

// URL returns the base URL of the admin API.
func (c *Client) URL() string { return c.base.String() }

// Close releases the idle connections of the Client's own HTTP client.
func (c *Client) Close() {
	if c.owned {
		c.hc.CloseIdleConnections()
	}
}

// do sends a request and decodes a JSON answer into out (when not nil). A
// non-2xx answer is returned as an *adminapi.Error.
func (c *Client) do(ctx context.Context, method, path string, query url.Values, body any, out any) error {
	resp, err := c.send(ctx, method, path, query, body, "")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		io.Copy(io.Discard, resp.Body)
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("adminclient: %s %s: decode answer: %w", method, path, err)
	}
	return nil
}

// send sends a request and returns a 2xx response; other statuses become
// an *adminapi.Error. body is JSON-encoded unless it is a []byte, sent as is with
// contentType.
func (c *Client) send(ctx context.Context, method, path string, query url.Values, body any, contentType string) (*http.Response, error) {
	u := *c.base
	u.Path += path
	u.RawQuery = query.Encode()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case []byte:
		rd = bytes.NewReader(b)
	default:
		data, err := json.Marshal(b)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(data)
		contentType = "application/json"
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), rd)
	if err != nil {
		return nil, err
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	req.Header.Set("Accept", "application/json")
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("adminclient: %s %s: %w", method, u.Redacted(), err)
	}
	if resp.StatusCode/100 == 2 {
		return resp, nil
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	var eb adminapi.ErrorBody
	if json.Unmarshal(data, &eb) == nil && eb.Error != nil {
		eb.Error.Status = resp.StatusCode
		return nil, eb.Error
	}
	msg := strings.TrimSpace(string(data))
	if msg == "" {
		msg = http.StatusText(resp.StatusCode)
	}
	return nil, &adminapi.Error{Status: resp.StatusCode, Code: codeOf(resp.StatusCode), Message: fmt.Sprintf("%s %s: %s", method, path, msg)}
}

func codeOf(status int) string {
	switch status {
	case http.StatusBadRequest:
		return adminapi.CodeBadRequest
	case http.StatusUnauthorized:
		return adminapi.CodeUnauthorized
	case http.StatusForbidden:
		return adminapi.CodeForbidden
	case http.StatusNotFound:
		return adminapi.CodeNotFound
	case http.StatusConflict:
		return adminapi.CodeConflict
	case http.StatusServiceUnavailable:
		return adminapi.CodeUnavailable
	}
	return adminapi.CodeInternal
}

// Health calls GET /healthz.
func (c *Client) Health(ctx context.Context) error {
	return c.do(ctx, http.MethodGet, "/healthz", nil, nil, nil)
}

// Info returns what the control plane runs and where.
func (c *Client) Info(ctx context.Context) (adminapi.Info, error) {
	var out adminapi.Info
	err := c.do(ctx, http.MethodGet, "/v1/info", nil, nil, &out)
	return out, err
}

// Services lists the services that have instances.
func (c *Client) Services(ctx context.Context) ([]adminapi.Service, error) {
	var out struct {
		Services []adminapi.Service `json:"services"`
	}
	err := c.do(ctx, http.MethodGet, "/v1/services", nil, nil, &out)
	return out.Services, err
}

// Instances lists the instances of service (of every service when "").
func (c *Client) Instances(ctx context.Context, service string) ([]adminapi.Instance, error) {
	var out struct {
		Instances []adminapi.Instance `json:"instances"`
	}
	q := url.Values{}
	if service != "" {
		q.Set("service", service)
	}
	err := c.do(ctx, http.MethodGet, "/v1/instances", q, nil, &out)
	return out.Instances, err
}

// Lanes lists the lanes that have instances, settings in the policy, or
// claims.
func (c *Client) Lanes(ctx context.Context) ([]adminapi.Lane, error) {
	var out struct {
		Lanes []adminapi.Lane `json:"lanes"`
	}
	err := c.do(ctx, http.MethodGet, "/v1/lanes", nil, nil, &out)
	return out.Lanes, err
}

// Lane describes one lane.
func (c *Client) Lane(ctx context.Context, name string) (adminapi.Lane, error) {
	var out adminapi.Lane
	err := c.do(ctx, http.MethodGet, "/v1/lanes/"+url.PathEscape(name), nil, nil, &out)
	return out, err
}

// UpdateLane sets or clears the lane's expiry in the policy document.
func (c *Client) UpdateLane(ctx context.Context, name string, u adminapi.LaneUpdate) (adminapi.Lane, error) {
	var out adminapi.Lane
	err := c.do(ctx, http.MethodPut, "/v1/lanes/"+url.PathEscape(name), nil, u, &out)
	return out, err
}

// Policy returns the policy document in force.
func (c *Client) Policy(ctx context.Context) (adminapi.PolicyDocument, error) {
	var out adminapi.PolicyDocument
	err := c.do(ctx, http.MethodGet, "/v1/policy", nil, nil, &out)
	return out, err
}

// PutPolicy validates the document (YAML or JSON) and puts it in force. An
// invalid document is refused with an *adminapi.Error of code adminapi.CodeInvalidPolicy
// naming the line and field; the previous document stays in force.
func (c *Client) PutPolicy(ctx context.Context, raw []byte) (adminapi.PolicyDocument, error) {
	return c.policyCall(ctx, http.MethodPut, "/v1/policy", raw)
}

// ValidatePolicy validates the document without storing it.
func (c *Client) ValidatePolicy(ctx context.Context, raw []byte) (adminapi.PolicyDocument, error) {
	return c.policyCall(ctx, http.MethodPost, "/v1/policy/validate", raw)
}

func (c *Client) policyCall(ctx context.Context, method, path string, raw []byte) (adminapi.PolicyDocument, error) {
	var out adminapi.PolicyDocument
	resp, err := c.send(ctx, method, path, nil, raw, "application/yaml")
	if err != nil {
		return out, err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return out, fmt.Errorf("adminclient: %s %s: decode answer: %w", method, path, err)
	}
	return out, nil
}

// Explain walks the lane chain of the request r and returns the engine's
// decision.
func (c *Client) Explain(ctx context.Context, r adminapi.ExplainRequest) (adminapi.Explanation, error) {
	q := url.Values{"service": {r.Service}}
	for k, v := range map[string]string{"lane": r.Lane, "zone": r.Zone, "host": r.Host, "key": r.Key} {
		if v != "" {
			q.Set(k, v)
		}
	}
	var out adminapi.Explanation
	err := c.do(ctx, http.MethodGet, "/v1/explain", q, nil, &out)
	return out, err
}

// Tokens lists the registration tokens (admin only). Secrets are not shown.
func (c *Client) Tokens(ctx context.Context) ([]adminapi.Token, error) {
	var out struct {
		Tokens []adminapi.Token `json:"tokens"`
	}
	err := c.do(ctx, http.MethodGet, "/v1/tokens", nil, nil, &out)
	return out.Tokens, err
}

// CreateToken creates a registration token (admin only). The answer's
// Secret is the token; it is shown this once.
func (c *Client) CreateToken(ctx context.Context, req adminapi.TokenRequest) (adminapi.Token, error) {
	var out adminapi.Token
	err := c.do(ctx, http.MethodPost, "/v1/tokens", nil, req, &out)
	return out, err
}

// RevokeToken deletes a registration token (admin only).
func (c *Client) RevokeToken(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodDelete, "/v1/tokens/"+url.PathEscape(id), nil, nil, nil)
}

// Claims lists the client-IP claims of dev sessions.
func (c *Client) Claims(ctx context.Context) ([]adminapi.Claim, error) {
	var out struct {
		Claims []adminapi.Claim `json:"claims"`
	}
	err := c.do(ctx, http.MethodGet, "/v1/claims", nil, nil, &out)
	return out.Claims, err
}

// Claim puts a client IP in a lane for as long as the registration lives.
func (c *Client) Claim(ctx context.Context, req adminapi.ClaimRequest) (adminapi.Claim, error) {
	var out adminapi.Claim
	err := c.do(ctx, http.MethodPost, "/v1/claims", nil, req, &out)
	return out, err
}

// Unclaim removes the claim of a client IP.
func (c *Client) Unclaim(ctx context.Context, ip string) error {
	return c.do(ctx, http.MethodDelete, "/v1/claims/"+url.PathEscape(ip), nil, nil, nil)
}

// Register registers (or, with req.Registration, updates) an instance. Most
// callers use Registry, which also sends the heartbeats.
func (c *Client) Register(ctx context.Context, req adminapi.RegisterRequest) (adminapi.Registration, error) {
	var out adminapi.Registration
	err := c.do(ctx, http.MethodPost, "/v1/instances", nil, req, &out)
	return out, err
}

// Heartbeat renews a registration. It fails with adminapi.CodeNotFound when the
// registration has expired, and adminapi.CodeLaneExpired when its lane has.
func (c *Client) Heartbeat(ctx context.Context, service, id, registration string) (adminapi.Registration, error) {
	var out adminapi.Registration
	err := c.do(ctx, http.MethodPost, instancePath(service, id)+"/heartbeat", nil, adminapi.HeartbeatRequest{Registration: registration}, &out)
	return out, err
}

// Deregister ends a registration: the instance (if the registration still
// holds it) and any claim attached to it disappear. With an empty
// registration and an admin token, it removes the instance whatever holds
// it.
func (c *Client) Deregister(ctx context.Context, service, id, registration string) error {
	q := url.Values{}
	if registration != "" {
		q.Set("registration", registration)
	}
	return c.do(ctx, http.MethodDelete, instancePath(service, id), q, nil, nil)
}

func instancePath(service, id string) string {
	return "/v1/instances/" + url.PathEscape(service) + "/" + url.PathEscape(id)
}

// WatchInstances opens the stream of instance changes of service (every
// service when ""): a reset batch listing the instances, then every change.
// Most callers use Registry.Watch, which reconnects.
func (c *Client) WatchInstances(ctx context.Context, service string) (*BatchStream, error) {
	q := url.Values{}
	if service != "" {
		q.Set("service", service)
	}
	resp, err := c.send(ctx, http.MethodGet, "/v1/watch/instances", q, nil, "")
	if err != nil {
		return nil, err
	}
	return &BatchStream{body: resp.Body, dec: json.NewDecoder(resp.Body)}, nil
}

// BatchStream reads the batches of a watch. Cancelling the context given to
// WatchInstances, or Close, ends it.
type BatchStream struct {
	body io.ReadCloser
	dec  *json.Decoder
	gap  time.Duration
}

// Next blocks until the next batch arrives. The server sends an empty
// non-reset batch now and then as a keep-alive; Next skips those.
func (s *BatchStream) Next() (adminapi.Batch, error) {
	s.gap = 0
	for {
		var b adminapi.Batch
		start := time.Now()
		err := s.dec.Decode(&b)
		s.gap = max(s.gap, time.Since(start))
		if err != nil {
			return adminapi.Batch{}, err
		}
		if b.Reset || len(b.Events) > 0 {
			return b, nil
		}
	}
}

// Gap returns the longest silence of the stream (between two lines,
// keep-alives included) while Next waited for the batch it returned last:
// a gap much longer than adminapi.WatchKeepAlive (the server's
// keep-alives) means that the control plane stalled.
func (s *BatchStream) Gap() time.Duration { return s.gap }

// Close ends the stream.
func (s *BatchStream) Close() error { return s.body.Close() }

// timeout bounds the calls the Registry makes on its own behalf.
const timeout = 10 * time.Second

// PolicyHistory lists the policy documents the admin API applied, newest
// first (the last 20).
func (c *Client) PolicyHistory(ctx context.Context) ([]adminapi.PolicyRevision, error) {
	var out adminapi.PolicyHistory
	err := c.do(ctx, http.MethodGet, "/v1/policy/history", nil, nil, &out)
	return out.Revisions, err
}
