// Package strictyaml decodes YAML (and so JSON) documents into Go structs
// strictly: an unknown field, a value of the wrong kind or a duplicate key is
// an error that names the line and the dotted path of the field. It also
// records the line of every path it decoded, so that later validation can
// point at the line of the value it refuses.
//
// Struct fields are matched by their `yaml` tag (the name before any comma);
// fields without one are not decodable. A type that implements
// encoding.TextUnmarshaler decodes itself from a scalar. Supported kinds are string, bool,
// signed and unsigned integers, floats, time.Duration (as a Go duration
// string such as "30s"), pointers, slices, string-keyed maps and structs. A
// field of type yaml.Node receives the raw node, undecoded, so that a nested
// document (such as a policy inside a scenario) can be decoded later by its
// own parser; see Document.
package strictyaml

import (
	"bytes"
	"encoding"
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Error is a decoding or validation failure at one place of a document.
type Error struct {
	File  string // may be empty
	Line  int    // 1-based; 0 when unknown
	Field string // dotted path such as "lanes.alice.fallback[0]"; empty for the document
	Msg   string
}

func (e *Error) Error() string {
	var b strings.Builder
	if e.File != "" {
		b.WriteString(e.File)
		b.WriteString(":")
	}
	if e.Line > 0 {
		b.WriteString(strconv.Itoa(e.Line))
		b.WriteString(":")
	}
	if b.Len() > 0 {
		b.WriteString(" ")
	}
	if e.Field != "" {
		b.WriteString("field ")
		b.WriteString(e.Field)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Lines maps a dotted field path to the line it was found on.
type Lines map[string]int

// At returns an *Error for path, with the line of path or of its nearest
// decoded parent.
func (l Lines) At(path, format string, args ...any) *Error {
	p := path
	for {
		if line, ok := l[p]; ok {
			return &Error{Line: line, Field: path, Msg: fmt.Sprintf(format, args...)}
		}
		i := strings.LastIndexAny(p, ".[")
		if i < 0 {
			break
		}
		p = p[:i]
	}
	return &Error{Line: l[""], Field: path, Msg: fmt.Sprintf(format, args...)}
}

// MaxSize is the largest document Decode accepts.
const MaxSize = 4 << 20

// Decode parses exactly one YAML document from data into out, which must be
// a non-nil pointer to a struct. An empty document leaves out unchanged.
func Decode(data []byte, out any) (Lines, error) {
	if len(data) > MaxSize {
		return nil, &Error{Msg: fmt.Sprintf("document is %d bytes, more than the %d allowed", len(data), MaxSize)}
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	lines := Lines{}
	if err := decodeNode(dec, &doc); err != nil {
		if errors.Is(err, io.EOF) {
			return lines, nil
		}
		return nil, err
	}
	var extra yaml.Node
	if err := decodeNode(dec, &extra); err == nil {
		return nil, &Error{Line: extra.Line, Msg: "more than one YAML document"}
	} else if !errors.Is(err, io.EOF) {
		return nil, err
	}
	root := &doc
	if root.Kind == yaml.DocumentNode {
		if len(root.Content) == 0 {
			return lines, nil
		}
		root = root.Content[0]
	}
	if root.Kind == yaml.ScalarNode && root.Tag == "!!null" {
		return lines, nil
	}
	d := &decoder{lines: lines}
	if err := d.value(root, reflect.ValueOf(out).Elem(), ""); err != nil {
		return nil, err
	}
	return lines, nil
}

func decodeNode(dec *yaml.Decoder, n *yaml.Node) (err error) {
	defer func() {
		// The YAML library has panicked on hostile input before; a parser
		// of untrusted documents must turn that into an error.
		if r := recover(); r != nil {
			err = &Error{Msg: fmt.Sprintf("malformed YAML: %v", r)}
		}
	}()
	if err := dec.Decode(n); err != nil {
		if errors.Is(err, io.EOF) {
			return err
		}
		return syntaxError(err)
	}
	return nil
}

// syntaxError turns the YAML library's "yaml: line N: msg" into an *Error.
func syntaxError(err error) error {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	line := 0
	if rest, ok := strings.CutPrefix(msg, "line "); ok {
		if i := strings.Index(rest, ":"); i > 0 {
			if n, convErr := strconv.Atoi(rest[:i]); convErr == nil {
				line = n
				msg = strings.TrimSpace(rest[i+1:])
			}
		}
	}
	return &Error{Line: line, Msg: "malformed YAML: " + msg}
}

type decoder struct {
	lines Lines
	depth int
}

var (
	durationType = reflect.TypeOf(time.Duration(0))
	nodeType     = reflect.TypeOf(yaml.Node{})
)

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	}
	if n.Tag == "!!null" {
		return "null"
	}
	return strconv.Quote(n.Value)
}

func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

func (d *decoder) value(n *yaml.Node, v reflect.Value, path string) error {
	d.lines[path] = n.Line
	if n.Kind == yaml.AliasNode {
		return &Error{Line: n.Line, Field: path, Msg: "YAML aliases are not supported"}
	}
	d.depth++
	defer func() { d.depth-- }()
	if d.depth > 64 {
		return &Error{Line: n.Line, Field: path, Msg: "nested too deeply"}
	}
	if v.CanAddr() && n.Kind == yaml.ScalarNode && n.Tag != "!!null" {
		if u, ok := v.Addr().Interface().(encoding.TextUnmarshaler); ok {
			if err := u.UnmarshalText([]byte(n.Value)); err != nil {
				return &Error{Line: n.Line, Field: path, Msg: err.Error()}
			}
			return nil
		}
	}
	if v.Type() == nodeType {
		// Raw passthrough: the caller decodes the node itself.
		v.Set(reflect.ValueOf(*n))
		return nil
	}
	if v.Type() == durationType {
		if n.Kind != yaml.ScalarNode {
			return &Error{Line: n.Line, Field: path, Msg: "want a duration such as \"30s\", got " + kindName(n)}
		}
		dur, err := time.ParseDuration(n.Value)
		if err != nil {
			return &Error{Line: n.Line, Field: path, Msg: fmt.Sprintf("bad duration %q: want a number with a unit, such as \"30s\" or \"1m30s\"", n.Value)}
		}
		v.SetInt(int64(dur))
		return nil
	}
	switch v.Kind() {
	case reflect.Pointer:
		if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
			v.SetZero()
			return nil
		}
		p := reflect.New(v.Type().Elem())
		if err := d.value(n, p.Elem(), path); err != nil {
			return err
		}
		v.Set(p)
		return nil
	case reflect.Struct:
		return d.structValue(n, v, path)
	case reflect.Map:
		if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
			return nil
		}
		if n.Kind != yaml.MappingNode {
			return &Error{Line: n.Line, Field: path, Msg: "want a mapping, got " + kindName(n)}
		}
		m := reflect.MakeMapWithSize(v.Type(), len(n.Content)/2)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, val := n.Content[i], n.Content[i+1]
			if k.Kind != yaml.ScalarNode {
				return &Error{Line: k.Line, Field: path, Msg: "a key must be a string, got " + kindName(k)}
			}
			kp := join(path, k.Value)
			if m.MapIndex(reflect.ValueOf(k.Value)).IsValid() {
				return &Error{Line: k.Line, Field: kp, Msg: "duplicate key"}
			}
			ev := reflect.New(v.Type().Elem()).Elem()
			if err := d.value(val, ev, kp); err != nil {
				return err
			}
			d.lines[kp] = k.Line
			m.SetMapIndex(reflect.ValueOf(k.Value), ev)
		}
		v.Set(m)
		return nil
	case reflect.Slice:
		if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
			return nil
		}
		if n.Kind != yaml.SequenceNode {
			return &Error{Line: n.Line, Field: path, Msg: "want a list, got " + kindName(n)}
		}
		s := reflect.MakeSlice(v.Type(), len(n.Content), len(n.Content))
		for i, item := range n.Content {
			if err := d.value(item, s.Index(i), fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
		v.Set(s)
		return nil
	}
	if n.Kind != yaml.ScalarNode {
		return &Error{Line: n.Line, Field: path, Msg: "want a " + scalarName(v.Kind()) + ", got " + kindName(n)}
	}
	return d.scalar(n, v, path)
}

func scalarName(k reflect.Kind) string {
	switch k {
	case reflect.Bool:
		return "boolean"
	case reflect.String:
		return "string"
	case reflect.Float32, reflect.Float64:
		return "number"
	}
	return "whole number"
}

func (d *decoder) scalar(n *yaml.Node, v reflect.Value, path string) error {
	bad := func() error {
		return &Error{Line: n.Line, Field: path, Msg: fmt.Sprintf("want a %s, got %s", scalarName(v.Kind()), kindName(n))}
	}
	switch v.Kind() {
	case reflect.String:
		if n.Tag == "!!null" {
			return bad()
		}
		v.SetString(n.Value)
	case reflect.Bool:
		if n.Tag != "!!bool" {
			return bad()
		}
		b, err := strconv.ParseBool(strings.ToLower(n.Value))
		if err != nil {
			return bad()
		}
		v.SetBool(b)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		if n.Tag != "!!int" {
			return bad()
		}
		i, err := strconv.ParseInt(strings.ReplaceAll(n.Value, "_", ""), 0, 64)
		if err != nil || v.OverflowInt(i) {
			return &Error{Line: n.Line, Field: path, Msg: fmt.Sprintf("%q is out of range", n.Value)}
		}
		v.SetInt(i)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		if n.Tag != "!!int" {
			return bad()
		}
		i, err := strconv.ParseUint(strings.ReplaceAll(n.Value, "_", ""), 0, 64)
		if err != nil || v.OverflowUint(i) {
			return &Error{Line: n.Line, Field: path, Msg: fmt.Sprintf("%q is out of range", n.Value)}
		}
		v.SetUint(i)
	case reflect.Float32, reflect.Float64:
		if n.Tag != "!!int" && n.Tag != "!!float" {
			return bad()
		}
		f, err := strconv.ParseFloat(strings.ReplaceAll(n.Value, "_", ""), 64)
		if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
			return &Error{Line: n.Line, Field: path, Msg: fmt.Sprintf("%q is not a finite number", n.Value)}
		}
		v.SetFloat(f)
	default:
		return &Error{Line: n.Line, Field: path, Msg: "unsupported field type " + v.Type().String()}
	}
	return nil
}

func (d *decoder) structValue(n *yaml.Node, v reflect.Value, path string) error {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil
	}
	if n.Kind != yaml.MappingNode {
		return &Error{Line: n.Line, Field: path, Msg: "want a mapping, got " + kindName(n)}
	}
	t := v.Type()
	fields := map[string]int{}
	var names []string
	for i := 0; i < t.NumField(); i++ {
		tag := t.Field(i).Tag.Get("yaml")
		name, _, _ := strings.Cut(tag, ",")
		if name == "" || name == "-" {
			continue
		}
		fields[name] = i
		names = append(names, name)
	}
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			return &Error{Line: k.Line, Field: path, Msg: "a key must be a string, got " + kindName(k)}
		}
		kp := join(path, k.Value)
		idx, ok := fields[k.Value]
		if !ok {
			return &Error{Line: k.Line, Field: kp, Msg: "unknown field; known fields here: " + strings.Join(names, ", ")}
		}
		if seen[k.Value] {
			return &Error{Line: k.Line, Field: kp, Msg: "duplicate key"}
		}
		seen[k.Value] = true
		if err := d.value(val, v.Field(idx), kp); err != nil {
			return err
		}
		d.lines[kp] = k.Line
	}
	return nil
}
