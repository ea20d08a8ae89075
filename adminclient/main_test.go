package adminclient_test

import (
	"testing"

	"go.uber.org/goleak"
)

// The client's streams and the registry's leases start goroutines; the admin API's tests
// (internal/app/admin) exercise them against a real server. Here, the examples leave none behind.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
