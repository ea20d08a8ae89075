package mqlane_test

import (
	"strings"
	"testing"

	"github.com/lanesdev/lanes/internal/lib/mqlane"
)

func TestCheckName(t *testing.T) {
	for _, tc := range []struct {
		s          string
		underscore bool
		err        string // "" for none
	}{
		{"orders", false, ""},
		{"Orders-2", false, ""},
		{"order_events", true, ""},
		{"order_events", false, `character '_' at 5: only A-Z a-z 0-9 -`},
		{"a.b", true, `character '.' at 1: only A-Z a-z 0-9 - _`},
		{"", true, "must be 1 to 64 characters"},
		{strings.Repeat("a", 65), true, "must be 1 to 64 characters"},
		{strings.Repeat("a", 64), false, ""},
	} {
		got := ""
		if err := mqlane.CheckName(tc.s, tc.underscore); err != nil {
			got = err.Error()
		}
		if got != tc.err {
			t.Errorf("CheckName(%q, %v) = %q, want %q", tc.s, tc.underscore, got, tc.err)
		}
	}
}
