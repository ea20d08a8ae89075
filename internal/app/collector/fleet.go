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

func (f engineFleet) Reaches(lane, served string) bool {
	if served == lane {
		return true
	}
	ls := f.e.Policy().Lanes[lane]
	for _, l := range ls.Fallback {
		if l == served {
			return true
		}
	}
	return served == "" && !ls.Strict
}

func (f engineFleet) Entry(service string) bool { return f.entry != nil && f.entry(service) }
