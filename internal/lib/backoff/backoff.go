// Package backoff is the retry delay of lanes' loops that keep something
// alive (leases, watches, streams): capped, exponential, with jitter.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Backoff is a capped exponential delay with jitter. Call Reset before the
// first Wait. It is not safe for concurrent use.
type Backoff struct {
	Min, Max time.Duration
	next     time.Duration
}

// New returns a Backoff from min to max, reset.
func New(min, max time.Duration) *Backoff { return &Backoff{Min: min, Max: max, next: min} }

// Reset starts the delays over from Min.
func (b *Backoff) Reset() { b.next = b.Min }

// Wait sleeps for the next delay (between half and all of it, at random),
// doubling it up to Max, or until ctx is done (then it returns false).
func (b *Backoff) Wait(ctx context.Context) bool {
	if b.next <= 0 {
		b.next = b.Min
	}
	d := b.next/2 + rand.N(b.next/2+1)
	b.next = min(2*b.next, b.Max)
	return Sleep(ctx, d)
}

// Sleep waits for d, or until ctx is done (then it returns false). A d of
// zero or less does not wait.
func Sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
