package polyglot

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"
)

// shown is a code block of docs/languages.md that a comment names the file of.
var shown = regexp.MustCompile("(?s)<!-- (examples/polyglot/[^ ]+) -->\n```[a-z]*\n(.*?)```\n")

// TestDocsShowTheExample checks that docs/languages.md shows each service of the example as it is
// in examples/polyglot, the programs that TestChain runs.
func TestDocsShowTheExample(t *testing.T) {
	root := filepath.Join("..", "..", "..")
	doc, err := os.ReadFile(filepath.Join(root, "docs", "languages.md"))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, m := range shown.FindAllSubmatch(doc, -1) {
		file := string(m[1])
		seen[file] = true
		b, err := os.ReadFile(filepath.Join(root, file))
		if err != nil {
			t.Errorf("docs/languages.md shows %s: %v", file, err)
			continue
		}
		if string(b) != string(m[2]) {
			t.Errorf("docs/languages.md shows %s other than it is", file)
		}
	}
	for _, f := range []string{"otel.js", "web/web.js", "orders/orders.py", "payments/payments.js", "proto/polyglot.proto"} {
		if !seen["examples/polyglot/"+f] {
			t.Errorf("docs/languages.md does not show examples/polyglot/%s", f)
		}
	}
}
