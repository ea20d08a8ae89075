package httpcase

import (
	"context"
	"net/http"
	"strings"
)

func get(ctx context.Context, c *http.Client) {
	_, _ = http.Get("http://orders/")                     // want `http.Get sends a request without the context ctx`
	_, _ = http.Post("http://orders/", "text/plain", nil) // want `http.Post sends a request without the context ctx`
	_, _ = c.Get("http://orders/")                        // want `\(\*http.Client\).Get sends a request without the context ctx`
	_, _ = http.PostForm("http://orders/", nil)           // want `http.PostForm sends`
	_, _ = c.Head("http://orders/")                       // want `\(\*http.Client\).Head sends`
}

func newRequest(w http.ResponseWriter, r *http.Request) {
	req, _ := http.NewRequest("GET", "http://orders/", strings.NewReader("")) // want `http.NewRequest builds a request without the context r.Context\(\)`
	_ = req
}

// Requests built with the context are fine.
func withContext(ctx context.Context, c *http.Client) {
	req, _ := http.NewRequestWithContext(ctx, "GET", "http://orders/", nil)
	_, _ = c.Do(req)
}

// No context in scope: not reported.
func startup() {
	_, _ = http.Get("http://config/")
	_, _ = http.NewRequest("GET", "http://config/", nil)
}
