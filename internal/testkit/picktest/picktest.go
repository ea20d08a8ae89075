// Package picktest picks from a routing engine at a steady rate, as a
// service calling another does, and counts what failed: the measure of the
// tests of a registry that stalls (a suspended lanes up, a paused etcd).
package picktest

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/lanesdev/lanes/routing"
)

// Picker picks an instance of Service for Lane every Every, until the
// context of Run ends, and counts the picks, the failures and the picks
// served by another instance than Want (a fallback).
type Picker struct {
	Name    string
	Service *routing.Service
	Lane    string
	Want    string // the id of the instance that must serve
	Every   time.Duration

	mu       sync.Mutex
	picks    int
	failed   []string
	fallback int
}

// Run picks until ctx is done.
func (p *Picker) Run(ctx context.Context) {
	tick := time.NewTicker(p.Every)
	defer tick.Stop()
	for {
		r, err := p.Service.Pick(routing.Request{Lane: p.Lane})
		p.mu.Lock()
		p.picks++
		switch {
		case err != nil:
			p.failed = append(p.failed, time.Now().Format("15:04:05.000")+" "+err.Error())
		case r.Instance.ID != p.Want:
			p.fallback++
		}
		p.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// Counts returns the picks so far, the failures (when and why) and the
// picks served by a fallback.
func (p *Picker) Counts() (picks int, failed []string, fallback int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.picks, slices.Clone(p.failed), p.fallback
}
