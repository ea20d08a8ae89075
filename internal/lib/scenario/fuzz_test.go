package scenario

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/lanesdev/lanes/internal/lib/strictyaml"
)

// FuzzParse checks that Parse never panics, that every refusal is a
// *strictyaml.Error naming the file, and that what it accepts runs (when the
// run is small enough to be quick) without panicking either. The seeds are
// the example scenarios and the malformed samples, plus testdata/fuzz.
func FuzzParse(f *testing.F) {
	for _, pat := range []string{"../../../examples/scenarios/*.yaml", "testdata/bad/*.yaml", "testdata/known-bugs/*.yaml"} {
		files, err := filepath.Glob(pat)
		if err != nil {
			f.Fatal(err)
		}
		for _, file := range files {
			data, err := os.ReadFile(file)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(data)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := Parse("fuzz.yaml", data)
		if err != nil {
			var e *strictyaml.Error
			if !errors.As(err, &e) || e.File != "fuzz.yaml" {
				t.Fatalf("error %T %v does not name the file", err, err)
			}
			if e.Line < 0 || e.Line > lineCount(data)+1 {
				t.Fatalf("error %v names line %d of a %d-line document", err, e.Line, lineCount(data))
			}
			return
		}
		if s.Name == "" || len(s.Instances) == 0 || len(s.Steps) == 0 {
			t.Fatalf("accepted an incomplete scenario: %+v", s)
		}
		sends := 0
		for _, st := range s.Steps {
			sends++
			if st.ExpectShare != nil {
				sends += st.ExpectShare.Samples
			}
			sends += st.ExpectSticky
		}
		if sends > 20000 {
			return
		}
		res := Run(s, Options{})
		if len(res.Steps) != len(s.Steps) {
			t.Fatalf("%d results for %d steps", len(res.Steps), len(s.Steps))
		}
	})
}

// lineCount counts lines as YAML does: \n, \r\n and a lone \r end one.
func lineCount(data []byte) int {
	n := bytes.Count(data, []byte("\n")) + 1
	n += bytes.Count(data, []byte("\r")) - bytes.Count(data, []byte("\r\n"))
	return n
}
