package vet

import (
	"context"
	"errors"
	"fmt"
	"go/token"
	"io"
	"sort"
	"strings"

	"golang.org/x/tools/go/analysis"
	"golang.org/x/tools/go/analysis/checker"
	"golang.org/x/tools/go/packages"
)

// Options configure Run.
type Options struct {
	Dir   string   // the folder to load packages from (a module's folder); "" is the current one
	Tests bool     // analyse test files too (as go vet does)
	Allow []string // -lanebypass.allow entries
	Env   []string // the environment of the go command; nil is the process's
}

// Finding is one diagnostic of one analyzer.
type Finding struct {
	Analyzer string         `json:"analyzer"`
	Posn     string         `json:"posn"` // file:line:col
	Message  string         `json:"message"`
	Pos      token.Position `json:"-"`
}

// String formats f as go vet does, with the analyzer's name: file:line:col: message (analyzer).
func (f Finding) String() string { return fmt.Sprintf("%s: %s (%s)", f.Posn, f.Message, f.Analyzer) }

// Result is what Run found.
type Result struct {
	Findings []Finding
	graph    *checker.Graph
}

// PrintJSON writes the diagnostics in go vet's -json form: an object keyed by package, then by
// analyzer, each a list of {posn, message, suggested_fixes}.
func (r *Result) PrintJSON(w io.Writer) error {
	if r.graph == nil {
		_, err := io.WriteString(w, "{}\n")
		return err
	}
	return r.graph.PrintJSON(w)
}

// LoadError is returned by Run when the packages could not be loaded or do not type-check.
type LoadError struct{ Problems []string }

func (e *LoadError) Error() string {
	return "cannot load the packages:\n\t" + strings.Join(e.Problems, "\n\t")
}

// Run loads the packages that patterns name (as go vet's patterns: ./..., import paths, folders)
// and runs every analyzer on them. It returns the findings sorted by position; a *LoadError
// when the packages do not load or type-check. ctx bounds the go command that lists the packages.
func Run(ctx context.Context, patterns []string, opts Options) (*Result, error) {
	if len(patterns) == 0 {
		patterns = []string{"."}
	}
	if err := Bypass.Flags.Set("allow", strings.Join(opts.Allow, ",")); err != nil {
		return nil, err
	}
	cfg := &packages.Config{
		Context: ctx,
		Mode:    loadMode(Analyzers()),
		Dir:     opts.Dir,
		Tests:   opts.Tests,
		Env:     opts.Env,
	}
	pkgs, err := packages.Load(cfg, patterns...)
	if err != nil {
		return nil, &LoadError{Problems: []string{err.Error()}}
	}
	var problems []string
	packages.Visit(pkgs, nil, func(p *packages.Package) {
		for _, e := range p.Errors {
			problems = append(problems, e.Error())
		}
	})
	if len(problems) > 0 {
		return nil, &LoadError{Problems: problems}
	}
	if len(pkgs) == 0 {
		return nil, &LoadError{Problems: []string{"no packages match " + strings.Join(patterns, " ")}}
	}
	graph, err := checker.Analyze(Analyzers(), pkgs, nil)
	if err != nil {
		return nil, err
	}
	res := &Result{graph: graph}
	seen := map[string]bool{}
	var errs []error
	for act := range graph.All() {
		if !act.IsRoot {
			continue
		}
		if act.Err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", act, act.Err))
			continue
		}
		for _, d := range act.Diagnostics {
			f := finding(act.Package.Fset, act.Analyzer, d)
			key := f.String()
			if seen[key] { // a package and its test variant share files
				continue
			}
			seen[key] = true
			res.Findings = append(res.Findings, f)
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	sort.Slice(res.Findings, func(i, j int) bool {
		a, b := res.Findings[i].Pos, res.Findings[j].Pos
		if a.Filename != b.Filename {
			return a.Filename < b.Filename
		}
		if a.Line != b.Line {
			return a.Line < b.Line
		}
		return a.Column < b.Column
	})
	return res, nil
}

// loadMode is how Run loads the packages for analyzers. Analyzers without
// facts look at the packages named only: those are parsed and type-checked
// from source, their dependencies from export data, which the go command
// builds once into its cache. Type-checking every dependency from source
// (LoadAllSyntax), which analyzers with facts need, took some 15 s for a
// package that imports net/http.
func loadMode(analyzers []*analysis.Analyzer) packages.LoadMode {
	for _, a := range analyzers {
		if len(a.FactTypes) > 0 || loadMode(a.Requires)&packages.NeedDeps != 0 {
			return packages.LoadAllSyntax | packages.NeedModule
		}
	}
	return packages.LoadSyntax | packages.NeedModule
}

func finding(fset *token.FileSet, a *analysis.Analyzer, d analysis.Diagnostic) Finding {
	pos := fset.Position(d.Pos)
	return Finding{Analyzer: a.Name, Posn: pos.String(), Message: d.Message, Pos: pos}
}
