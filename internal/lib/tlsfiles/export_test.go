package tlsfiles

import "time"

// SetReloadCheck sets how often servers look at their files, until the
// test ends.
func SetReloadCheck(t interface{ Cleanup(func()) }, d time.Duration) {
	old := reloadCheck
	reloadCheck = d
	t.Cleanup(func() { reloadCheck = old })
}
