package dashboard

import (
	"strings"
	"testing"

	"github.com/lanesdev/lanes/policy"
)

// FuzzSafeNext: a redirect target after login never leaves the dashboard.
func FuzzSafeNext(f *testing.F) {
	for _, s := range []string{"", "/ui/", "/ui/policy?x=1", "//evil.example/", "/ui/\\evil", "https://evil.example/ui/", "/uix", "/ui//evil"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, next string) {
		got := safeNext(next)
		if !strings.HasPrefix(got, Prefix) || strings.HasPrefix(got, "//") || strings.Contains(got, "\\") {
			t.Fatalf("safeNext(%q) = %q", next, got)
		}
	})
}

// FuzzDiffLines: the diff of a and b gives back a (without the added
// lines) and b (without the removed ones).
func FuzzDiffLines(f *testing.F) {
	f.Add("lanes:\n  alice:\n    strict: true\n", "lanes:\n  alice:\n    fallback: [x]\n")
	f.Add("", "a\nb\n")
	f.Add("a\nb\nc", "")
	f.Fuzz(func(t *testing.T, a, b string) {
		if len(a) > 4096 || len(b) > 4096 {
			return
		}
		var ra, rb []string
		for _, l := range diffLines(a, b) {
			if l.Op != "+" {
				ra = append(ra, l.Text)
			}
			if l.Op != "-" {
				rb = append(rb, l.Text)
			}
		}
		if strings.Join(ra, "\n") != strings.Join(splitLines(a), "\n") || strings.Join(rb, "\n") != strings.Join(splitLines(b), "\n") {
			t.Fatalf("diff of %q and %q does not give them back", a, b)
		}
	})
}

// TestStarterPolicyValidates: the editor's starting document parses as it
// stands and with its settings uncommented, and the uncommented example sets
// what its comments say.
func TestStarterPolicyValidates(t *testing.T) {
	if _, err := policy.Parse("starter", []byte(StarterPolicy)); err != nil {
		t.Fatalf("the starter as offered: %v", err)
	}
	var lines []string
	for _, l := range strings.Split(StarterPolicy, "\n") {
		if !strings.HasPrefix(l, "##") {
			l = strings.TrimPrefix(l, "# ")
		}
		lines = append(lines, l)
	}
	uncommented := strings.Join(lines, "\n")
	p, err := policy.Parse("starter", []byte(uncommented))
	if err != nil {
		t.Fatalf("the starter uncommented: %v\n%s", err, uncommented)
	}
	if got := p.Lanes["alice"].Fallback; len(got) != 1 || got[0] != "team-a" {
		t.Errorf("uncommented, alice falls back to %v, want [team-a]:\n%s", got, uncommented)
	}
}
