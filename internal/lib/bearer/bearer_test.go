package bearer_test

import (
	"encoding/base64"
	"errors"
	"strings"
	"testing"
	"time"

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

func TestEnvelope(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	env := bearer.Envelope("lt_abc.def", now.Add(time.Hour))
	if got, is, err := bearer.Unwrap(env, now); got != "lt_abc.def" || !is || err != nil {
		t.Fatalf("Unwrap(Envelope) = %q, %v, %v", got, is, err)
	}
	if _, is, err := bearer.Unwrap(env, now.Add(time.Hour)); !is || !errors.Is(err, bearer.ErrEnvelope) {
		t.Errorf("an expired envelope: %v, %v", is, err)
	}
	for _, s := range []string{"lt_abc", "a.b.", "", "eyJhbGciOiJSUzI1NiJ9.e30.sig"} {
		if got, is, err := bearer.Unwrap(s, now); is || err != nil || got != "" {
			t.Errorf("Unwrap(%q) = %q, %v, %v: not an envelope", s, got, is, err)
		}
	}
	head := strings.SplitN(env, ".", 2)[0]
	for name, s := range map[string]string{
		"signed":     env + "sig",
		"bad claims": head + ".!!.",
		"no token":   head + "." + base64.RawURLEncoding.EncodeToString([]byte(`{"exp":1900000000}`)) + ".",
		"no exp":     head + "." + base64.RawURLEncoding.EncodeToString([]byte(`{"lanes_token":"x"}`)) + ".",
		"huge":       head + "." + strings.Repeat("A", bearer.MaxEnvelopeBytes) + ".",
	} {
		if _, is, err := bearer.Unwrap(s, now); !is || !errors.Is(err, bearer.ErrEnvelope) {
			t.Errorf("%s: %v, %v; want an envelope error", name, is, err)
		}
	}
}

func FuzzUnwrap(f *testing.F) {
	f.Add(bearer.Envelope("t", time.Unix(2_000_000_000, 0)))
	f.Add("a.b.c")
	f.Fuzz(func(t *testing.T, s string) {
		tok, is, err := bearer.Unwrap(s, time.Unix(1_800_000_000, 0))
		if !is && (tok != "" || err != nil) || err != nil && tok != "" {
			t.Fatalf("Unwrap(%q) = %q, %v, %v", s, tok, is, err)
		}
	})
}
