package admin

import "time"

// SetKeepAliveEvery sets how often idle watch streams send a keep-alive,
// and returns a function that restores it.
func SetKeepAliveEvery(d time.Duration) (restore func()) {
	old := keepAliveEvery.Swap(int64(d))
	return func() { keepAliveEvery.Store(old) }
}
