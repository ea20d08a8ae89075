package sidecar

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"
)

// readiness checks whether the app answers: a TCP connection to it, or a
// GET of its readiness path answered 2xx or 3xx, each within
// DefaultReadyTimeout.
type readiness struct {
	app, path string
	client    *http.Client
}

func newReadiness(app, path string) readiness {
	r := readiness{app: app, path: path}
	if path != "" {
		//lanes:ignore the readiness check calls the app beside the sidecar, not a lanes service
		r.client = &http.Client{
			Timeout: DefaultReadyTimeout,
			Transport: &http.Transport{
				Proxy:               nil, // straight to the app, whatever HTTP_PROXY says
				DialContext:         (&net.Dialer{Timeout: DefaultReadyTimeout}).DialContext,
				MaxIdleConnsPerHost: 1,
				IdleConnTimeout:     time.Minute,
			},
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}
	}
	return r
}

func (r readiness) check(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, DefaultReadyTimeout)
	defer cancel()
	if r.client == nil {
		c, err := (&net.Dialer{}).DialContext(ctx, "tcp", r.app)
		if err != nil {
			return err
		}
		return c.Close()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+r.app+r.path, nil)
	if err != nil {
		return err
	}
	res, err := r.client.Do(req)
	if err != nil {
		return err
	}
	io.CopyN(io.Discard, res.Body, 4<<10)
	res.Body.Close()
	if res.StatusCode >= 400 {
		return fmt.Errorf("GET %s answered %s", r.path, res.Status)
	}
	return nil
}
