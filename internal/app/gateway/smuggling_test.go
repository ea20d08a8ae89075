package gateway

import (
	"context"
	"testing"

	"github.com/lanesdev/lanes/internal/testkit/smuggletest"
)

// TestSmuggling sends the classic request-smuggling and header-injection
// bytes to the gateway over TCP: each is refused, or read as RFC 9112 says
// and forwarded once with the body the RFC gives it; no smuggled request
// reaches the backend.
func TestSmuggling(t *testing.T) {
	w := newWorld(t, "", Config{})
	rec, err := smuggletest.NewRecorder()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rec.Close() })
	w.register(t, "orders", "rec", rec.Addr, "")
	for _, c := range smuggletest.Cases {
		t.Run(c.Name, func(t *testing.T) {
			rec.Reset()
			ctx, cancel := context.WithTimeout(context.Background(), waitFor)
			defer cancel()
			res := smuggletest.Send(ctx, w.addr, c)
			if err := smuggletest.Check(c, res, rec.Requests()); err != nil {
				t.Errorf("%s (RFC %s): %v\nupstream bytes: %q", c.Name, c.RFC, err, trim(rec.Raw()))
			}
		})
	}
}

func trim(b []byte) []byte {
	if len(b) > 400 {
		return b[:400]
	}
	return b
}
