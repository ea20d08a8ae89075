package routing

// Decision is the eligible set for one request, as lanes simulate and the
// admin API show it.
type Decision struct {
	Service string
	// RequestLane is the lane that travels downstream ("" for baseline).
	RequestLane string
	// Lane is the serving lane ("" for the baseline).
	Lane   string
	Reason Reason
	// Eligible lists the ids of the instances that may serve the request:
	// one id when the request is a probe.
	Eligible []string
}

// Resolve answers which instances may serve req, without choosing one. Like
// a pick, it sends the probe of a half-open instance, which then stays in
// flight until ReportID reports on it.
//
// Unlike Pick, Resolve first brings the snapshot up to date (a time-driven
// transition that is due, a probe claimed by a pick), and publishes the
// snapshot that its own probe claim makes, so that its answers follow the
// engine's clock exactly: lanes simulate replays scenarios through it.
func (s *Service) Resolve(req Request) (Decision, error) {
	sn := s.current()
	r, l := sn.route(req, &s.e.invalidLanes)
	r, g, probe, l, err := s.eligible(req, r, l, true, false, nil)
	d := Decision{Service: s.name, RequestLane: l}
	switch {
	case err != nil:
		return d, err
	case probe != nil:
		d.Lane, d.Reason, d.Eligible = r.lane, ReasonProbe, []string{probe.inst.ID}
		return d, nil
	}
	d.Lane, d.Reason = r.lane, r.reason
	d.Eligible = g.ids()
	return d, nil
}
