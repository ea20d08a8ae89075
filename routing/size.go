package routing

// LaneSize reports, from the snapshot in force, how many instances of the service in lane (the
// effective lane, after tag rules; "" for the baseline) may take ordinary requests (ready), and
// how many the lane has that are not drained, ejected and probing ones included (members). It
// reads the snapshot without waiting on a rebuild and allocates nothing: tracing calls it for
// every traced call, to tell an ejected lane from an empty one.
func (s *Service) LaneSize(lane string) (ready, members int) {
	sn := s.snap.Load()
	if sn == nil {
		return 0, 0
	}
	g := sn.group(lane)
	if g == nil {
		return 0, 0
	}
	return len(g.ready), len(g.ready) + len(g.halfOpen) + len(g.waiting)
}
