package routing

import (
	"context"
	"math/rand/v2"
	"time"
)

const retryDelay = 500 * time.Millisecond

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// randBucket is the canary bucket of a request without a key.
func randBucket() uint64 { return rand.Uint64N(buckets) }
