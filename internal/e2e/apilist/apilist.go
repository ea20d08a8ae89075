// Package apilist lists the exported API of lanes' public packages, one identifier a line, read
// from the source with go/doc in the test's own process (no go command, no type checking), and
// checks it against a golden file per package under testdata: a new export is a decision, made by
// rewriting the golden file (go test ./internal/e2e/apilist -update) and reviewing its diff.
package apilist

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/build"
	"go/doc"
	"go/parser"
	"go/printer"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Module is the module whose public packages are listed.
const Module = "github.com/lanesdev/lanes"

// notPublic are the top folders of the module that hold no public packages: internal code,
// commands, the benchmark tools and the examples.
var notPublic = map[string]bool{"internal": true, "cmd": true, "bench": true, "examples": true, "docs": true}

// platform is the build context the API is listed for, whatever machine runs the test: the files
// a package has only on another system would otherwise change the listing with the machine.
var platform = func() build.Context {
	c := build.Default
	c.GOOS, c.GOARCH, c.CgoEnabled = "linux", "amd64", false
	return c
}()

// Packages returns the folders, relative to root and slash-separated, of the module's public
// packages: every folder with a non-test Go file outside internal/, cmd/, bench/, examples/,
// testdata and hidden folders.
func Packages(root string) ([]string, error) {
	var dirs []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if rel == "." {
			return nil
		}
		name := d.Name()
		top, _, _ := strings.Cut(rel, "/")
		if notPublic[top] || name == "testdata" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") {
			return filepath.SkipDir
		}
		pkg, err := platform.ImportDir(path, 0)
		if err != nil {
			if _, ok := err.(*build.NoGoError); ok {
				return nil
			}
			return fmt.Errorf("%s: %w", rel, err)
		}
		if pkg.Name != "main" && len(pkg.GoFiles) > 0 {
			dirs = append(dirs, rel)
		}
		return nil
	})
	sort.Strings(dirs)
	return dirs, err
}

// Count is the number of exported identifiers of a package, by kind.
type Count struct {
	TopLevel int // constants, variables, functions and types
	Methods  int // methods of exported types, and of exported interfaces
	Fields   int // exported fields of exported struct types
}

// Total is the sum of the three kinds.
func (c Count) Total() int { return c.TopLevel + c.Methods + c.Fields }

// List returns the exported API of the package in dir (relative to root, slash-separated), as it
// builds on linux/amd64: one identifier a line, sorted, and their count. A line names the kind
// and the identifier, then its type or signature without parameter names, as Go's own api files
// do:
//
//	const MaxLen = 63
//	field Instance.Addr string
//	func Parse(string) (string, error)
//	method (*Engine) Close() error
//	method Registry.Close() error
//	type Instance struct
func List(root, dir string) ([]string, Count, error) {
	bp, err := platform.ImportDir(filepath.Join(root, filepath.FromSlash(dir)), 0)
	if err != nil {
		return nil, Count{}, err
	}
	fset := token.NewFileSet()
	var files []*ast.File
	for _, name := range bp.GoFiles {
		f, err := parser.ParseFile(fset, filepath.Join(bp.Dir, name), nil, parser.ParseComments)
		if err != nil {
			return nil, Count{}, err
		}
		files = append(files, f)
	}
	p, err := doc.NewFromFiles(fset, files, Module+"/"+dir)
	if err != nil {
		return nil, Count{}, err
	}
	l := lister{fset: fset}
	l.values(p.Consts, "const")
	l.values(p.Vars, "var")
	l.funcs(p.Funcs, "")
	for _, t := range p.Types {
		l.typ(t)
		l.values(t.Consts, "const")
		l.values(t.Vars, "var")
		l.funcs(t.Funcs, "")
		l.funcs(t.Methods, t.Name)
	}
	sort.Strings(l.lines)
	return l.lines, l.count, nil
}

type lister struct {
	fset  *token.FileSet
	lines []string
	count Count
}

func (l *lister) add(kind *int, format string, args ...any) {
	*kind++
	l.lines = append(l.lines, fmt.Sprintf(format, args...))
}

// src prints a node on one line.
func (l *lister) src(n any) string {
	var buf bytes.Buffer
	cfg := printer.Config{Mode: printer.RawFormat}
	if err := cfg.Fprint(&buf, l.fset, n); err != nil {
		return fmt.Sprintf("<%v>", err)
	}
	return strings.Join(strings.Fields(buf.String()), " ")
}

// values lists a group of constants or variables; a constant without a type or value of its own
// takes the group's previous ones, as the language does.
func (l *lister) values(vs []*doc.Value, kind string) {
	for _, v := range vs {
		var typ, val ast.Expr
		for _, spec := range v.Decl.Specs {
			vs := spec.(*ast.ValueSpec)
			if kind == "const" && vs.Type == nil && len(vs.Values) == 0 {
				// repeats the previous type and expression (iota)
			} else {
				typ = vs.Type
				val = nil
				if len(vs.Values) == 1 && len(vs.Names) == 1 {
					val = vs.Values[0]
				}
			}
			for _, n := range vs.Names {
				if !n.IsExported() {
					continue
				}
				switch {
				case typ != nil:
					l.add(&l.count.TopLevel, "%s %s %s", kind, n.Name, l.src(typ))
				case val != nil && kind == "const":
					l.add(&l.count.TopLevel, "%s %s = %s", kind, n.Name, l.src(val))
				case val != nil:
					l.add(&l.count.TopLevel, "%s %s = %s", kind, n.Name, l.src(val))
				default:
					l.add(&l.count.TopLevel, "%s %s", kind, n.Name)
				}
			}
		}
	}
}

func (l *lister) funcs(fs []*doc.Func, recvType string) {
	for _, f := range fs {
		if recvType == "" || f.Decl.Recv == nil {
			l.add(&l.count.TopLevel, "func %s%s", f.Name, l.signature(f.Decl.Type))
			continue
		}
		recv := l.src(unnamed(f.Decl.Recv).List[0].Type)
		l.add(&l.count.Methods, "method (%s) %s%s", recv, f.Name, l.signature(f.Decl.Type))
	}
}

// signature prints a function type without the word func and without parameter names.
func (l *lister) signature(ft *ast.FuncType) string {
	c := &ast.FuncType{TypeParams: ft.TypeParams, Params: unnamed(ft.Params), Results: unnamed(ft.Results)}
	return strings.TrimPrefix(l.src(c), "func")
}

// unnamed returns a field list's types, one a field, without their names.
func unnamed(fl *ast.FieldList) *ast.FieldList {
	if fl == nil {
		return nil
	}
	out := &ast.FieldList{}
	for _, f := range fl.List {
		n := max(len(f.Names), 1)
		for range n {
			out.List = append(out.List, &ast.Field{Type: f.Type})
		}
	}
	return out
}

func (l *lister) typ(t *doc.Type) {
	for _, spec := range t.Decl.Specs {
		ts, ok := spec.(*ast.TypeSpec)
		if !ok || ts.Name.Name != t.Name {
			continue
		}
		tparams := ""
		if ts.TypeParams != nil {
			tparams = "[" + fieldListText(l, ts.TypeParams) + "]"
		}
		assign := ""
		if ts.Assign.IsValid() {
			assign = "= "
		}
		switch u := ts.Type.(type) {
		case *ast.StructType:
			l.add(&l.count.TopLevel, "type %s%s %sstruct", t.Name, tparams, assign)
			for _, f := range u.Fields.List {
				if len(f.Names) == 0 {
					name := embeddedName(f.Type)
					if ast.IsExported(name) {
						l.add(&l.count.Fields, "field %s.%s embedded %s", t.Name, name, l.src(f.Type))
					}
					continue
				}
				for _, n := range f.Names {
					if n.IsExported() {
						l.add(&l.count.Fields, "field %s.%s %s", t.Name, n.Name, l.src(f.Type))
					}
				}
			}
		case *ast.InterfaceType:
			l.add(&l.count.TopLevel, "type %s%s %sinterface", t.Name, tparams, assign)
			for _, m := range u.Methods.List {
				if len(m.Names) == 0 {
					l.add(&l.count.Methods, "method %s embeds %s", t.Name, l.src(m.Type))
					continue
				}
				for _, n := range m.Names {
					if !n.IsExported() {
						continue
					}
					if ft, ok := m.Type.(*ast.FuncType); ok {
						l.add(&l.count.Methods, "method %s.%s%s", t.Name, n.Name, l.signature(ft))
					}
				}
			}
		default:
			l.add(&l.count.TopLevel, "type %s%s %s%s", t.Name, tparams, assign, l.src(ts.Type))
		}
	}
}

// fieldListText prints type parameters as written: names and constraints.
func fieldListText(l *lister, fl *ast.FieldList) string {
	var parts []string
	for _, f := range fl.List {
		var names []string
		for _, n := range f.Names {
			names = append(names, n.Name)
		}
		parts = append(parts, strings.Join(names, ", ")+" "+l.src(f.Type))
	}
	return strings.Join(parts, ", ")
}

// embeddedName is the field name of an embedded type: T, *T, pkg.T or T[P].
func embeddedName(e ast.Expr) string {
	switch x := e.(type) {
	case *ast.StarExpr:
		return embeddedName(x.X)
	case *ast.SelectorExpr:
		return x.Sel.Name
	case *ast.IndexExpr:
		return embeddedName(x.X)
	case *ast.IndexListExpr:
		return embeddedName(x.X)
	case *ast.Ident:
		return x.Name
	}
	return ""
}

// Root finds the module's root folder from the working folder: the nearest folder up with a
// go.mod.
func Root() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		up := filepath.Dir(dir)
		if up == dir {
			return "", fmt.Errorf("no go.mod above %s", dir)
		}
		dir = up
	}
}
