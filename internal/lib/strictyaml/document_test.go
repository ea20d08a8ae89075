package strictyaml

import (
	"errors"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// sameTree checks that b decodes like a and that every node kept its line.
func sameTree(t *testing.T, a, b *yaml.Node) {
	t.Helper()
	if a.Kind != b.Kind || a.Tag != b.Tag || a.Line != b.Line || len(a.Content) != len(b.Content) ||
		a.Tag != "!!null" && a.Value != b.Value {
		t.Errorf("node differs: kind %v tag %s %q line %d, re-encoded kind %v tag %s %q line %d",
			a.Kind, a.Tag, a.Value, a.Line, b.Kind, b.Tag, b.Value, b.Line)
		return
	}
	for i := range a.Content {
		sameTree(t, a.Content[i], b.Content[i])
	}
}

func TestDocumentKeepsLines(t *testing.T) {
	src := `name: x
policy:
  lanes:
    alice:
      fallback:
        - team-a
        # a comment

        - "b c"
    bob: {strict: true,
      fallback: [x]}
  outlier:
    errors: !!int "3"
    window: 30s
  tags:
  - service: orders
    lane: gray
    addrs: ["10.0.0.3:8080"]
    labels: {"k\u00e9": "v\t"}
    enabled: yes
  canary:
    - {service: orders, lane: canary, percent: 20.5, x: ~, y: , z: 0x10, w: -.inf}
  text: |
    multi
    line
  after: 1
instances: []
`
	var doc yaml.Node
	if err := yaml.Unmarshal([]byte(src), &doc); err != nil {
		t.Fatal(err)
	}
	pn := doc.Content[0].Content[3]
	out, err := Document(pn)
	if err != nil {
		t.Fatal(err)
	}
	var back yaml.Node
	if err := yaml.Unmarshal(out, &back); err != nil {
		t.Fatalf("re-encoded document does not parse: %v\n%s", err, out)
	}
	sameTree(t, pn, back.Content[0])
}

func TestDocumentScalarsAndErrors(t *testing.T) {
	for _, src := range []string{"p: 5\n", "p: 'text'\n", "p: null\n", "p:\n  - 1\n  - [a, {b: c}]\n"} {
		var doc yaml.Node
		if err := yaml.Unmarshal([]byte(src), &doc); err != nil {
			t.Fatal(err)
		}
		pn := doc.Content[0].Content[1]
		out, err := Document(pn)
		if err != nil {
			t.Fatalf("%q: %v", src, err)
		}
		var back yaml.Node
		if err := yaml.Unmarshal(out, &back); err != nil {
			t.Fatalf("%q: re-encoded %q does not parse: %v", src, out, err)
		}
		sameTree(t, pn, back.Content[0])
	}
	for _, c := range []struct{ src, want string }{
		{"a: &x {b: 1}\np:\n  c: *x\n", "3: field c: YAML aliases are not supported"},
		{"p:\n  k:\n    ? [a]\n    : b\n", "3: field k: a key must be a string"},
	} {
		var doc yaml.Node
		if err := yaml.Unmarshal([]byte(c.src), &doc); err != nil {
			t.Fatal(err)
		}
		root := doc.Content[0]
		_, err := Document(root.Content[len(root.Content)-1])
		if err == nil || !strings.HasPrefix(err.Error(), c.want) {
			t.Errorf("%q: got error %v, want %q", c.src, err, c.want)
		}
	}
}

func TestDecodeNodeField(t *testing.T) {
	var out struct {
		Name string     `yaml:"name"`
		Raw  yaml.Node  `yaml:"raw"`
		Ptr  *yaml.Node `yaml:"ptr"`
	}
	lines, err := Decode([]byte("name: n\nraw:\n  anything: [goes, 1]\nptr: x\n"), &out)
	if err != nil {
		t.Fatal(err)
	}
	if out.Raw.Kind != yaml.MappingNode || out.Raw.Line != 3 || out.Ptr == nil || out.Ptr.Value != "x" {
		t.Errorf("raw node not passed through: %+v %+v", out.Raw, out.Ptr)
	}
	if lines["raw"] != 2 || lines["ptr"] != 4 {
		t.Errorf("lines = %v", lines)
	}
	if _, err := Decode([]byte("raw: &a 1\nptr: *a\n"), &out); err == nil {
		t.Error("an alias into a node field was accepted")
	}
}

// FuzzDocument checks that Document's output parses back to the same tree,
// every node on its line, for any document the YAML library accepts.
func FuzzDocument(f *testing.F) {
	f.Add([]byte("a: 1\nb:\n  - x\n  - {y: 'z', n: ~}\n"))
	f.Add([]byte("lanes:\n  alice: {fallback: [b]}\n\ntext: |\n  two\n  lines\nafter: !!str 3\n"))
	f.Add([]byte("- [1, 2.5, true, null, .inf, 0x1F, \"q\\\"\"]\n- ? k\n  : v\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		var doc yaml.Node
		if err := decodeNode(yaml.NewDecoder(strings.NewReader(string(data))), &doc); err != nil || len(doc.Content) == 0 {
			return
		}
		out, err := Document(&doc)
		if err != nil {
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("error %T %v", err, err)
			}
			return
		}
		var back yaml.Node
		if err := decodeNode(yaml.NewDecoder(strings.NewReader(string(out))), &back); err != nil {
			t.Fatalf("re-encoded document does not parse: %v\n%q\nfrom\n%q", err, out, data)
		}
		if len(back.Content) == 0 {
			t.Fatalf("re-encoded document is empty: %q from %q", out, data)
		}
		sameTree(t, doc.Content[0], back.Content[0])
	})
}
