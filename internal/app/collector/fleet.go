package collector

import (
	"time"

	"github.com/lanesdev/lanes/routing"
)

// EngineFleet answers the integrity checks from a routing engine: the instances it sees and the
// policy it follows. entry tells the services whose spans start traces legitimately (the gateway).
func EngineFleet(e *routing.Engine, entry func(service string) bool) Fleet {
	return engineFleet{e: e, entry: entry}
}

type engineFleet struct {
	e     *routing.Engine
	entry func(string) bool
}

func (f engineFleet) LiveInLane(service, lane string) bool {
	if f.e.Policy().Expired(lane, time.Now()) {
		return false
	}
	for _, in := range f.e.Service(service).Instances() {
		if !in.Drain && f.e.LaneOf(in) == lane {
			return true
		}
	}
	return false
}

// Reaches asks the engine's guard rule (Engine.Admits, the chain as routing computes it) for a
// lane instance; the baseline is reached by every lane that is not strict.
func (f engineFleet) Reaches(lane, served string) bool {
	switch {
	case served == lane:
		return true
	case served == "":
		return !f.e.Policy().Lanes[lane].Strict
	}
	return f.e.Admits(served, lane)
}

func (f engineFleet) Entry(service string) bool { return f.entry != nil && f.entry(service) }
