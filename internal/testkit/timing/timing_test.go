package timing

import (
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/lanesdev/lanes/internal/testkit/leaktest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, leaktest.Options()...) }

func TestBound(t *testing.T) {
	want := time.Second
	if Race {
		want = 3 * time.Second
	}
	if got := Bound(time.Second); got != want {
		t.Errorf("Bound(1s) = %s, want %s (race %v)", got, want, Race)
	}
}
