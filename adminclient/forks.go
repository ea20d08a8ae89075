package adminclient

import (
	"context"
	"net/http"
	"net/url"

	"github.com/lanesdev/lanes/adminapi"
)

// Fork asks for a lane's copy of a Kubernetes Deployment, or replaces the
// lane's fork of it; the control plane's Kubernetes controller makes the
// copy. A lane token forks only into its own lane.
func (c *Client) Fork(ctx context.Context, req adminapi.ForkRequest) (adminapi.Fork, error) {
	var out adminapi.Fork
	err := c.do(ctx, http.MethodPost, "/v1/forks", nil, req, &out)
	return out, err
}

// Forks lists the forks the token may see: all of them for the admin
// token, its lane's for a lane token.
func (c *Client) Forks(ctx context.Context) ([]adminapi.Fork, error) {
	var out struct {
		Forks []adminapi.Fork `json:"forks"`
	}
	err := c.do(ctx, http.MethodGet, "/v1/forks", nil, nil, &out)
	return out.Forks, err
}

// DeleteFork ends lane's fork of the Deployment namespace/deployment; the
// controller deletes the copy.
func (c *Client) DeleteFork(ctx context.Context, lane, namespace, deployment string) error {
	return c.do(ctx, http.MethodDelete, "/v1/forks/"+url.PathEscape(lane)+"/"+url.PathEscape(namespace)+"/"+url.PathEscape(deployment), nil, nil, nil)
}
