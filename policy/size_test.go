package policy

import (
	"strings"
	"testing"
)

// A document over MaxSize is refused before it is decoded; one of MaxSize
// bytes is accepted.
func TestMaxSize(t *testing.T) {
	head := "canary: []\n"
	ok := head + "#" + strings.Repeat("x", MaxSize-len(head)-2) + "\n"
	if _, err := Parse("p.yaml", []byte(ok)); err != nil {
		t.Fatalf("document of %d bytes: %v", len(ok), err)
	}
	_, err := Parse("p.yaml", []byte(ok+"\n"))
	if err == nil || !strings.Contains(err.Error(), "1 MiB") || !strings.Contains(err.Error(), "p.yaml") {
		t.Fatalf("document of %d bytes: %v", len(ok)+1, err)
	}
}
