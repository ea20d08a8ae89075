package bearer_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/lanesdev/lanes/internal/lib/bearer"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestToken(t *testing.T) {
	for h, want := range map[string]string{
		"Bearer abc":      "abc",
		"bearer abc":      "abc",
		"BEARER  abc ":    "abc",
		" bEaReR\tabc":    "",
		"Basic abc":       "",
		"Bearer":          "",
		"Bearer   ":       "",
		"":                "",
		"Bearerabc":       "",
		"Bearer a b":      "a b",
		"Token Bearer ab": "",
	} {
		got, ok := bearer.Token(h)
		if got != want || ok != (want != "") {
			t.Errorf("Token(%q) = %q, %v; want %q", h, got, ok, want)
		}
	}
}
