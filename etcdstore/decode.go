package etcdstore

import (
	"encoding/json"
	"strconv"

	"github.com/lanesdev/lanes/registry"
)

// unmarshalInstance decodes the JSON of an instance as json.Unmarshal
// does. Every watcher decodes every change, so the values that this package
// writes (json.Marshal of a registry.Instance: known keys, plain strings,
// an integer weight) take a fast path, in one allocation for all the
// strings; any other value, valid or not, goes to json.Unmarshal, which has
// the last word.
func unmarshalInstance(data []byte, in *registry.Instance) error {
	if fastInstance(data, in) {
		return nil
	}
	// Into an instance of its own, so that in, which json.Unmarshal
	// would make escape, can stay on the caller's stack.
	var slow registry.Instance
	err := json.Unmarshal(data, &slow)
	*in = slow
	return err
}

// fastInstance decodes data into in when it is an object whose keys are
// exactly the JSON names of Instance's fields, each at most once, whose
// strings are printable ASCII without escapes, whose weight is a plain
// integer, whose drain is a boolean and whose labels are an object of such
// strings. It reports false, leaving in in any state, for anything else.
func fastInstance(data []byte, in *registry.Instance) bool {
	*in = registry.Instance{}
	text := string(data) // the one allocation: the strings below share it
	d := scanner{s: text}
	if !d.consume('{') {
		return false
	}
	var seen uint16
	for first := true; ; first = false {
		d.space()
		if d.peek() == '}' && first {
			d.i++
			break
		}
		key, ok := d.str()
		if !ok || !d.consume(':') {
			return false
		}
		bit, ok := fieldBits[key]
		if !ok || seen&bit != 0 {
			return false
		}
		seen |= bit
		d.space()
		switch key {
		case "id":
			in.ID, ok = d.str()
		case "service":
			in.Service, ok = d.str()
		case "addr":
			in.Addr, ok = d.str()
		case "lane":
			in.Lane, ok = d.str()
		case "zone":
			in.Zone, ok = d.str()
		case "version":
			in.Version, ok = d.str()
		case "host":
			in.Host, ok = d.str()
		case "scope":
			in.Scope, ok = d.str()
		case "weight":
			in.Weight, ok = d.integer()
		case "drain":
			in.Drain, ok = d.boolean()
		case "labels":
			in.Labels, ok = d.labels()
		}
		if !ok {
			return false
		}
		d.space()
		if d.consume('}') {
			break
		}
		if !d.consume(',') {
			return false
		}
	}
	d.space()
	return d.i == len(d.s)
}

// fieldBits gives each JSON key of Instance a bit, to refuse repeats.
var fieldBits = map[string]uint16{
	"id": 1 << 0, "service": 1 << 1, "addr": 1 << 2, "lane": 1 << 3, "zone": 1 << 4,
	"weight": 1 << 5, "drain": 1 << 6, "labels": 1 << 7, "version": 1 << 8, "host": 1 << 9,
	"scope": 1 << 10,
}

// scanner reads the JSON subset of fastInstance from s.
type scanner struct {
	s string
	i int
}

func (d *scanner) peek() byte {
	if d.i < len(d.s) {
		return d.s[d.i]
	}
	return 0
}

func (d *scanner) space() {
	for d.i < len(d.s) {
		switch d.s[d.i] {
		case ' ', '\t', '\n', '\r':
			d.i++
		default:
			return
		}
	}
}

// consume skips white space and then c, and reports whether c was there.
func (d *scanner) consume(c byte) bool {
	d.space()
	if d.peek() != c {
		return false
	}
	d.i++
	return true
}

// str reads a string of printable ASCII without escapes.
func (d *scanner) str() (string, bool) {
	d.space()
	if d.peek() != '"' {
		return "", false
	}
	start := d.i + 1
	for j := start; j < len(d.s); j++ {
		switch c := d.s[j]; {
		case c == '"':
			d.i = j + 1
			return d.s[start:j], true
		case c == '\\' || c < 0x20 || c >= 0x7f:
			return "", false
		}
	}
	return "", false
}

// integer reads an integer without sign, exponent or fraction, that fits
// an int.
func (d *scanner) integer() (int, bool) {
	start := d.i
	for d.i < len(d.s) && d.s[d.i] >= '0' && d.s[d.i] <= '9' {
		d.i++
	}
	digits := d.s[start:d.i]
	if digits == "" || len(digits) > 1 && digits[0] == '0' {
		return 0, false
	}
	n, err := strconv.Atoi(digits)
	return n, err == nil
}

func (d *scanner) boolean() (bool, bool) {
	for _, w := range [...]string{"true", "false"} {
		if len(d.s)-d.i >= len(w) && d.s[d.i:d.i+len(w)] == w {
			d.i += len(w)
			return w == "true", true
		}
	}
	return false, false
}

// labels reads an object of strings, each key at most once.
func (d *scanner) labels() (map[string]string, bool) {
	if !d.consume('{') {
		return nil, false
	}
	m := map[string]string{}
	if d.consume('}') {
		return m, true
	}
	for {
		k, ok := d.str()
		if !ok || !d.consume(':') {
			return nil, false
		}
		if _, dup := m[k]; dup {
			return nil, false
		}
		v, ok := d.str()
		if !ok {
			return nil, false
		}
		m[k] = v
		if d.consume('}') {
			return m, true
		}
		if !d.consume(',') {
			return nil, false
		}
	}
}
