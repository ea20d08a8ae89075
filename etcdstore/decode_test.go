package etcdstore

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/lanesdev/lanes/registry"
)

// decodeSeeds are instance values: as this package writes them, and others.
func decodeSeeds() [][]byte {
	var seeds [][]byte
	for _, in := range []registry.Instance{
		{ID: "a", Service: "orders", Addr: "10.0.0.1:8080", Weight: 100},
		{ID: "i00001", Service: "orders", Addr: "10.0.0.1:8080", Lane: "feature-x", Zone: "az1", Weight: 7, Drain: true,
			Labels: map[string]string{"version": "v2", "team": "checkout"}, Version: "1.2.3", Host: "h1"},
	} {
		b, _ := json.Marshal(in)
		seeds = append(seeds, b)
	}
	for _, s := range []string{
		`{}`, ` { "id" : "a" , "weight" : 0 } `, `{"labels":{}}`, `{"ID":"a"}`, `{"id":"a","id":"b"}`,
		`{"weight":-1}`, `{"weight":1.5}`, `{"weight":01}`, `{"weight":1e3}`, `{"weight":99999999999999999999}`,
		`{"id":"a\u0062"}`, `{"id":"\u00e9"}`, "{\"id\":\"\xff\"}", `{"drain":true}`, `{"drain":truex}`,
		`{"labels":null}`, `{"labels":{"a":"1","a":"2"}}`, `{"id":"a",}`, `{"id":"a"} x`, `{"other":1}`,
		`{"id":null}`, `[]`, ``, `{"id":"a"`,
	} {
		seeds = append(seeds, []byte(s))
	}
	return seeds
}

// unmarshalInstance gives json.Unmarshal's answer, fast path or not.
func FuzzUnmarshalInstance(f *testing.F) {
	for _, s := range decodeSeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var got, want registry.Instance
		err := unmarshalInstance(data, &got)
		werr := json.Unmarshal(data, &want)
		if (err == nil) != (werr == nil) {
			t.Fatalf("%q: error %v, json.Unmarshal's %v", data, err, werr)
		}
		if err == nil && !reflect.DeepEqual(got, want) {
			t.Fatalf("%q: %+v, json.Unmarshal gives %+v", data, got, want)
		}
	})
}

// What this package writes takes the fast path.
func TestUnmarshalInstanceFastPath(t *testing.T) {
	for _, s := range decodeSeeds()[:2] {
		var in registry.Instance
		if !fastInstance(s, &in) {
			t.Errorf("%s: not on the fast path", s)
		}
	}
	b := decodeSeeds()[0]
	var in registry.Instance
	if n := testing.AllocsPerRun(100, func() { fastInstance(b, &in) }); n != 1 {
		t.Errorf("fast path: %.0f allocations, want 1", n)
	}
}

func BenchmarkUnmarshalInstance(b *testing.B) {
	data := decodeSeeds()[1]
	b.Run("fast", func(b *testing.B) {
		b.ReportAllocs()
		var in registry.Instance
		for b.Loop() {
			unmarshalInstance(data, &in)
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		var in registry.Instance
		for b.Loop() {
			in = registry.Instance{}
			json.Unmarshal(data, &in)
		}
	})
}
