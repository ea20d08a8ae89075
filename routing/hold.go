package routing

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/lanesdev/lanes/registry"
)

// A mass expiry. When the registry itself stalls (its process is
// suspended, its cluster loses its quorum), the leases of every instance
// run out together, and once it serves again it deletes them all at once:
// the instances are alive and register again within moments, but an engine
// that applied the deletions would have nothing to route to meanwhile.
// So, as Eureka's self-preservation does, an engine takes the instances it
// loses shortly after the registry could not be reached for victims of the
// registry rather than dead: it holds them, keeps routing to them for a
// grace (WithExpiryGrace, DefaultExpiryGrace) or until each registers
// again, whichever comes first. "Shortly after" is within suspectWindow of
// the registry's last outage (a registry.Outages reports it: the etcd
// store's member checks and lease renewals, the admin API client's
// heartbeats and watch streams) or of a stall of the engine's own process
// (its ticker, stallTick, found late by stallGap or more: the process was
// suspended, as with the embedded etcd of `lanes up`). The instances it
// lost in the recentKeep before it noticed an outage or a stall are held
// too.
//
// In every other case a deletion applies at once: a deregistration, a
// crashed instance's lease running out. An instance that really died
// while the registry stalled is held as well; the routed call finds it
// unreachable (a refused connection ejects it at once) and moves on, so it
// costs no failed call where another instance can serve.
const (
	suspectWindow = registry.DefaultTTL
	stallTick     = 500 * time.Millisecond
	stallGap      = 3 * time.Second
	recentKeep    = 2 * time.Second
)

// DefaultExpiryGrace is how long an engine holds the instances it lost in a
// mass expiry (see WithExpiryGrace): twice registry.DefaultTTL, time for
// every instance to notice that its lease is gone and register again.
const DefaultExpiryGrace = 2 * registry.DefaultTTL

// WithExpiryGrace sets how long the engine holds the instances deleted
// shortly after the registry could not be reached (its leases expired
// together): it keeps routing to them for d, or until each registers
// again. 0 means DefaultExpiryGrace; a negative d turns holding off (every
// deletion applies at once).
func WithExpiryGrace(d time.Duration) Option { return func(e *Engine) { e.expiry.grace = d } }

// expiryGuard tells, for an engine, whether an instance lost now is held:
// whether the registry was unreachable, or the process stalled, shortly
// before. The zero value is ready; grace is the option's.
type expiryGuard struct {
	grace time.Duration

	once    sync.Once
	mu      sync.Mutex
	reg     registry.Outages // nil when the registry cannot tell
	watches map[*serviceWatch]struct{}
	ticked  time.Time // the stall ticker's last tick; zero before it runs
	stall   time.Time // when the process was last found stalled
	acted   time.Time // the outage or stall the watches last held for
}

// holdFor returns how long a lost instance is held (0: not at all).
func (g *expiryGuard) holdFor() time.Duration {
	switch {
	case g.grace < 0:
		return 0
	case g.grace == 0:
		return DefaultExpiryGrace
	}
	return g.grace
}

// join adds w to the watches, and starts the stall ticker with the first.
func (g *expiryGuard) join(e *Engine, w *serviceWatch) {
	g.mu.Lock()
	if g.watches == nil {
		g.watches = map[*serviceWatch]struct{}{}
		g.reg, _ = e.reg.(registry.Outages)
	}
	g.watches[w] = struct{}{}
	g.mu.Unlock()
	if g.holdFor() > 0 {
		g.once.Do(func() { e.g.Go(func() { g.tick(e.g.Context()) }) })
	}
}

// troubleLocked returns the last outage of the registry or stall of the
// process, as of now. g.mu must be held.
func (g *expiryGuard) troubleLocked(now time.Time) time.Time {
	if !g.ticked.IsZero() && now.Sub(g.ticked) >= stallGap {
		g.stall = now // the ticker has not run for that long: it will say so
	}
	t := g.stall
	if g.reg != nil {
		if o := g.reg.LastOutage(); o.After(t) {
			t = o
		}
	}
	return t
}

// lose reports whether the instances a watch lost at now are held.
func (g *expiryGuard) lose(now time.Time) bool {
	if g.holdFor() == 0 {
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	t := g.troubleLocked(now)
	return !t.IsZero() && now.Sub(t) <= suspectWindow
}

// tick is the stall ticker, an engine goroutine: it finds stalls of the
// process, and has the watches hold what they lost just before an outage
// or a stall was known.
func (g *expiryGuard) tick(ctx context.Context) {
	t := time.NewTicker(stallTick)
	defer t.Stop()
	for {
		now := time.Now()
		g.mu.Lock()
		tr := g.troubleLocked(now) // before the tick: it finds a late one
		g.ticked = now
		fresh := tr.After(g.acted) && now.Sub(tr) <= suspectWindow
		var ws []*serviceWatch
		if fresh {
			g.acted = tr
			for w := range g.watches {
				ws = append(ws, w)
			}
		}
		g.mu.Unlock()
		for _, w := range ws {
			w.holdSince(now.Add(-recentKeep))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// lostInstance is an instance a watch removed, kept for recentKeep in case
// an outage or a stall is known after it.
type lostInstance struct {
	in *registry.Instance
	at time.Time
}

// serviceWatch is the state of one service's watches, kept from one watch
// to the next: the instances, those held after a mass expiry, and the
// coalescing of publications (see calmFactor). mu guards it: the watch's
// goroutine applies batches, and another service's watch may hold this
// one's lost instances when it finds a mass expiry.
type serviceWatch struct {
	svc   *Service
	guard *expiryGuard

	mu sync.Mutex
	// insts are the service's instances, in id order: the watch's own
	// slice, of instances that are never changed once here (a change puts
	// a new one in), so that a publication copies the pointers only, and
	// the snapshots in force keep the instances they point at. Held
	// instances are among them.
	insts  []*registry.Instance
	held   map[string]time.Time // ids of held instances, and until when
	recent []lostInstance       // removed within recentKeep, oldest first
	dirty  bool                 // insts has changes that svc does not have yet
	calm   time.Time            // no publication before then
	cost   time.Duration        // d of the last rebuild (see calmFactor)

	kick chan struct{}      // capacity 1: something to publish, or a new deadline
	wake context.CancelFunc // ends the wait of a plain Watcher's Next; nil when none
}

func newServiceWatch(svc *Service) *serviceWatch {
	w := &serviceWatch{svc: svc, guard: &svc.e.expiry, held: map[string]time.Time{}, kick: make(chan struct{}, 1)}
	w.guard.join(svc.e, w)
	return w
}

// poke wakes the watch's goroutine, to publish or to wait for a new
// deadline. w.mu must be held.
func (w *serviceWatch) poke() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
	if w.wake != nil {
		w.wake()
	}
}

// find returns where the instance id is, or would be, in w.insts.
func (w *serviceWatch) find(id string) (int, bool) {
	return slices.BinarySearchFunc(w.insts, id, func(in *registry.Instance, id string) int { return strings.Compare(in.ID, id) })
}

// apply folds b into w.insts, keeping them in id order, so that a
// publication copies them rather than sorting them again (a tenth of the
// watcher's time under churn at 10,000 instances). The instances it
// removes shortly after an outage or a stall are held instead (see
// expiryGuard). w.mu must be held.
func (w *serviceWatch) apply(b registry.Batch, now time.Time) {
	var lost []*registry.Instance
	if b.Reset {
		n := 0
		for _, ev := range b.Events {
			if ev.Type == registry.EventPut && ev.Instance.Service == w.svc.name {
				n++
			}
		}
		all := make([]registry.Instance, 0, n) // one allocation for every instance
		next := make([]*registry.Instance, 0, n)
		for _, ev := range b.Events {
			if ev.Type == registry.EventPut && ev.Instance.Service == w.svc.name {
				all = append(all, ev.Instance)
				next = append(next, &all[len(all)-1])
			}
		}
		byID(next)
		// What the list lacks was lost, unless it is held already.
		for _, in := range w.insts {
			if _, found := slices.BinarySearchFunc(next, in.ID, func(in *registry.Instance, id string) int { return strings.Compare(in.ID, id) }); found {
				delete(w.held, in.ID)
				continue
			}
			if _, held := w.held[in.ID]; held {
				next = append(next, in)
				continue
			}
			lost = append(lost, in)
		}
		byID(next)
		w.insts = next
	} else {
		var fresh []registry.Instance // the batch's new instances, in one allocation
		for _, ev := range b.Events {
			if ev.Instance.Service != w.svc.name {
				continue
			}
			i, found := w.find(ev.Instance.ID)
			if ev.Type == registry.EventDelete {
				if found {
					if _, held := w.held[ev.Instance.ID]; held {
						delete(w.held, ev.Instance.ID)
					} else {
						lost = append(lost, w.insts[i])
					}
					w.insts = slices.Delete(w.insts, i, i+1)
				}
				continue
			}
			delete(w.held, ev.Instance.ID)
			lost = slices.DeleteFunc(lost, func(in *registry.Instance) bool { return in.ID == ev.Instance.ID })
			if fresh == nil {
				fresh = make([]registry.Instance, 0, len(b.Events))
			}
			fresh = append(fresh, ev.Instance)
			if in := &fresh[len(fresh)-1]; found {
				w.insts[i] = in
			} else {
				w.insts = slices.Insert(w.insts, i, in)
			}
		}
	}
	if len(lost) > 0 {
		w.forget(now)
		for _, in := range lost {
			w.recent = append(w.recent, lostInstance{in: in, at: now})
		}
		if w.guard.lose(now) {
			w.hold(now, now)
		}
	}
}

// forget drops the lost instances older than recentKeep. w.mu must be
// held.
func (w *serviceWatch) forget(now time.Time) {
	i := 0
	for i < len(w.recent) && now.Sub(w.recent[i].at) > recentKeep {
		i++
	}
	clear(w.recent[:i])
	w.recent = w.recent[i:]
}

// hold puts back the instances lost since since, unless registered again
// meanwhile, as held until the grace ends, and reports whether it held
// any. w.mu must be held.
func (w *serviceWatch) hold(since, now time.Time) bool {
	until := now.Add(w.guard.holdFor())
	n := 0
	for _, l := range w.recent {
		if l.at.Before(since) {
			continue
		}
		i, found := w.find(l.in.ID)
		if found {
			continue // registered again
		}
		w.insts = slices.Insert(w.insts, i, l.in)
		w.held[l.in.ID] = until
		n++
	}
	clear(w.recent)
	w.recent = w.recent[:0]
	if n > 0 {
		w.dirty = true
		w.poke() // a new deadline: the end of the grace
		w.svc.e.log.Warn(fmt.Sprintf("lanes: instances deleted just after the registry could not be reached; routing to them for up to %s while they register again", w.guard.holdFor()), "service", w.svc.name, "held", len(w.held))
	}
	return n > 0
}

// holdSince holds what w lost since since, for an outage or a stall known
// after the losses, and publishes it (no time to wait for the calm).
func (w *serviceWatch) holdSince(since time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.hold(since, time.Now()) {
		w.publish()
	}
}

// expire removes the held instances whose grace has ended, and returns
// when the next one ends (zero for none). w.mu must be held.
func (w *serviceWatch) expire(now time.Time) (next time.Time) {
	removed := 0
	for id, until := range w.held {
		if now.Before(until) {
			if next.IsZero() || until.Before(next) {
				next = until
			}
			continue
		}
		delete(w.held, id)
		if i, found := w.find(id); found {
			w.insts = slices.Delete(w.insts, i, i+1)
			w.dirty = true
			removed++
		}
	}
	if removed > 0 {
		w.svc.e.log.Info("lanes: held instances did not register again within the grace; removed them", "service", w.svc.name, "removed", removed)
	}
	return next
}

// deadline returns when the watch must wake up without a batch: the end of
// the calm when there is something to publish, or the end of a grace
// (zero: never). w.mu must be held.
func (w *serviceWatch) deadline(now time.Time) time.Time {
	next := w.expire(now)
	if w.dirty && (next.IsZero() || w.calm.Before(next)) {
		next = w.calm
	}
	return next
}

// publish gives the service a copy of w.insts, and sets the calm after
// it. w.mu must be held.
func (w *serviceWatch) publish() {
	start := time.Now()
	w.svc.replace(slices.Clone(w.insts))
	w.svc.markReady()
	w.dirty = false
	end := time.Now()
	w.cost = rebuildCost(end.Sub(start), w.cost)
	w.calm = end.Add(min(calmFactor*w.cost, maxCalm))
}

// Held returns the ids of the instances of service that the engine holds
// after a mass expiry (see WithExpiryGrace), in id order.
func (e *Engine) Held(service string) []string {
	g := &e.expiry
	g.mu.Lock()
	var w *serviceWatch
	for o := range g.watches {
		if o.svc.name == service {
			w = o
		}
	}
	g.mu.Unlock()
	if w == nil {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]string, 0, len(w.held))
	for id := range w.held {
		out = append(out, id)
	}
	slices.Sort(out)
	return out
}
