package regid_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/lanesdev/lanes/internal/lib/regid"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type leaseID int64

func TestFormatParse(t *testing.T) {
	for _, id := range []leaseID{1, 0x694d9a3c1f2b7e05, 1<<63 - 1} {
		v := regid.Format(id)
		got, ok := regid.Parse[leaseID](v)
		if !ok || got != id {
			t.Errorf("Parse(Format(%d)) = %q: %d, %v", id, v, got, ok)
		}
	}
	for _, v := range []string{"", "0", "-1", "xyz", "8000000000000000", "1 "} {
		if id, ok := regid.Parse[leaseID](v); ok {
			t.Errorf("Parse(%q) = %d, want refused", v, id)
		}
	}
}
