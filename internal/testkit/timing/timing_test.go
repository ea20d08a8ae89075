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

// Eventually returns once f says "" (the third look, here), without waiting past it.
func TestEventually(t *testing.T) {
	n := 0
	Eventually(t, "the third look", time.Minute, func() string {
		if n++; n < 3 {
			return "not yet"
		}
		return ""
	})
	if n != 3 {
		t.Errorf("f called %d times, want 3", n)
	}
}
