package routing

import (
	"sort"
	"time"
)

// Outlier is the outlier-detection state of one instance of a service, as
// the callers that share this engine have seen it.
type Outlier struct {
	ID string
	// State is "ejected" (out of every eligible set until Until),
	// "half-open" (the next request that could reach it probes it) or
	// "probing" (a probe is in flight, given up at Until).
	State string
	Until time.Time // zero when half-open
}

// Outliers lists the instances of the service that outlier detection holds
// out of the eligible sets or is probing back in, in id order; healthy
// instances are left out. It is a read for tools (the admin API, the
// dashboard): it takes the service's lock and is not for the pick path.
func (s *Service) Outliers() []Outlier {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Outlier
	for id, h := range s.det.healths {
		st := h.state.Load()
		if st == stateHealthy {
			continue
		}
		o := Outlier{ID: id, State: stateNames[st]}
		h.mu.Lock()
		until := h.until
		h.mu.Unlock()
		if st == stateEjected && until != 0 && s.now() >= until {
			o.State = stateNames[stateHalfOpen] // due: the next pick moves it
		} else if st == stateEjected || st == stateProbing {
			o.Until = time.Unix(0, until)
		}
		out = append(out, o)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}
