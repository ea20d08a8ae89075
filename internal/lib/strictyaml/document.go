package strictyaml

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Document re-encodes n, a node taken from a larger document (through a
// yaml.Node field), as a document of its own in which every node stays on
// the line it had in the source. A parser given the result, such as
// policy.Parse, therefore reports the lines of the enclosing file.
//
// The result is in flow style; comments are dropped. Scalars keep their tags
// (an explicit tag is written out, a quoted scalar stays a string), so the
// result decodes to the same values as n. An alias, or a key that is not a
// scalar, is an *Error at its line whose Field is relative to n.
func Document(n *yaml.Node) ([]byte, error) {
	w := &docWriter{line: 1}
	if err := w.node(n, ""); err != nil {
		return nil, err
	}
	w.buf.WriteByte('\n')
	return w.buf.Bytes(), nil
}

type docWriter struct {
	buf   bytes.Buffer
	line  int
	depth int
}

// to moves the output to the given line.
func (w *docWriter) to(line int) {
	for w.line < line {
		w.buf.WriteByte('\n')
		w.line++
	}
}

func (w *docWriter) node(n *yaml.Node, path string) error {
	w.depth++
	defer func() { w.depth-- }()
	if w.depth > 10000 {
		return &Error{Line: n.Line, Field: path, Msg: "nested too deeply"}
	}
	switch n.Kind {
	case yaml.DocumentNode:
		if len(n.Content) == 0 {
			w.buf.WriteString("null")
			return nil
		}
		return w.node(n.Content[0], path)
	case yaml.AliasNode:
		return &Error{Line: n.Line, Field: path, Msg: "YAML aliases are not supported"}
	case yaml.MappingNode:
		w.to(n.Line)
		w.tag(n)
		w.buf.WriteByte('{')
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if k.Kind != yaml.ScalarNode {
				return &Error{Line: k.Line, Field: path, Msg: "a key must be a string, got " + kindName(k)}
			}
			if i > 0 {
				w.buf.WriteString(", ")
			}
			w.scalar(k)
			w.buf.WriteString(": ")
			if err := w.node(v, join(path, k.Value)); err != nil {
				return err
			}
		}
		w.buf.WriteByte('}')
	case yaml.SequenceNode:
		w.to(n.Line)
		w.tag(n)
		w.buf.WriteByte('[')
		for i, item := range n.Content {
			if i > 0 {
				w.buf.WriteString(", ")
			}
			if err := w.node(item, path+"["+strconv.Itoa(i)+"]"); err != nil {
				return err
			}
		}
		w.buf.WriteByte(']')
	default:
		w.scalar(n)
	}
	return nil
}

// tag writes an explicit tag, as written in the source.
func (w *docWriter) tag(n *yaml.Node) {
	if n.Style&yaml.TaggedStyle != 0 && n.Tag != "" {
		w.buf.WriteString(tagText(n.Tag))
		w.buf.WriteByte(' ')
	}
}

// tagText writes a tag so that it reads back the same: as it is when it is a
// plain "!name" or "!!name", else in the verbatim form "!<...>" with every
// byte outside a small safe set %-escaped.
func tagText(tag string) string {
	simple := len(tag) > 1
	for i, c := range []byte(tag) {
		if !(c == '!' && i < 2 || c == '-' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			simple = false
		}
	}
	if simple {
		return tag
	}
	long := tag
	if rest, ok := strings.CutPrefix(tag, "!!"); ok {
		long = "tag:yaml.org,2002:" + rest
	}
	var b strings.Builder
	b.WriteString("!<")
	for _, c := range []byte(long) {
		if c == '-' || c == '.' || c == '_' || c == '~' || c == ':' || c == '/' || c == '!' ||
			c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	b.WriteByte('>')
	return b.String()
}

func (w *docWriter) scalar(n *yaml.Node) {
	w.to(n.Line)
	if n.Style&yaml.TaggedStyle != 0 && n.Tag != "" {
		w.tag(n)
		w.buf.WriteString(strconv.QuoteToASCII(n.Value))
		return
	}
	switch n.Tag {
	case "!!str", "":
		w.buf.WriteString(strconv.QuoteToASCII(n.Value))
	case "!!null":
		w.buf.WriteString("null")
	default:
		// A plain scalar that resolved to something else than a string
		// (a number, a boolean, a timestamp, the merge key): written as
		// it was, it resolves the same way again.
		w.buf.WriteString(n.Value)
	}
}
