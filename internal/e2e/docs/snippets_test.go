// Package docs tests the documentation: every Go code block of README.md and
// docs/*.md compiles, and the complete programs at the top of README.md,
// docs/http.md and docs/grpc.md run as written against `lanes up`.
//
// A Go block is one of:
//
//   - a file: it starts with a package clause. Programs (package main) are
//     built each on its own, as a user builds them in an empty folder;
//   - a fragment, marked ```go fragment: statements (or declarations) shown
//     out of their program. It is wrapped in a function, with the imports
//     its package names need and the usual variables of the docs declared
//     (ctx, engine, env, err, w, r, ...; see given). An HTML comment just
//     before the block that starts with "<!-- fragment context" adds Go
//     declarations of its own (types and variables the fragment assumes).
//
// Any other ```go block fails the test: docs never again show code that does
// not compile.
package docs

import (
	"bufio"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/scanner"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// root is the repository root.
const root = "../../.."

// block is one Go code block of a Markdown file.
type block struct {
	file     string // relative to root
	line     int    // of the opening fence
	info     string // the words after ```go
	code     string
	context_ string // declarations of a preceding <!-- fragment context --> comment
}

func (b block) where() string { return fmt.Sprintf("%s:%d", b.file, b.line) }

func (b block) fragment() bool { return strings.Contains(" "+b.info+" ", " fragment ") }

// pkgName returns the package clause of a file block ("" for none).
func (b block) pkgName() string {
	f, err := parser.ParseFile(token.NewFileSet(), "", b.code, parser.PackageClauseOnly)
	if err != nil {
		return ""
	}
	return f.Name.Name
}

var fence = regexp.MustCompile("^(\\s*)```+\\s*(\\S*)\\s*(.*)$")

// readBlocks returns the Go blocks of the Markdown files.
func readBlocks(t *testing.T) []block {
	t.Helper()
	files := []string{"README.md"}
	docs, _ := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	sort.Strings(docs)
	for _, d := range docs {
		rel, _ := filepath.Rel(root, d)
		files = append(files, rel)
	}
	var out []block
	for _, f := range files {
		data, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		var cur *block
		var body []string
		var ctxLines []string // of the last <!-- fragment context --> comment
		inCtx, ctxEnd := false, -1
		sc := bufio.NewScanner(strings.NewReader(string(data)))
		sc.Buffer(nil, 1<<20)
		for n := 1; sc.Scan(); n++ {
			line := sc.Text()
			if cur == nil && !inCtx && strings.HasPrefix(strings.TrimSpace(line), "<!-- fragment context") {
				inCtx, ctxLines = true, nil
				continue
			}
			if inCtx {
				if strings.TrimSpace(line) == "-->" {
					inCtx, ctxEnd = false, n
				} else {
					ctxLines = append(ctxLines, line)
				}
				continue
			}
			m := fence.FindStringSubmatch(line)
			switch {
			case cur == nil && m != nil:
				lang := m[2]
				if lang == "go" {
					cur = &block{file: f, line: n, info: m[3]}
					if ctxEnd == n-1 {
						cur.context_ = strings.Join(ctxLines, "\n")
					}
				} else {
					cur = &block{line: -1} // another language: skip to its end
				}
				body = nil
			case cur != nil && m != nil && m[2] == "" && m[3] == "":
				if cur.line > 0 {
					cur.code = strings.Join(body, "\n") + "\n"
					out = append(out, *cur)
				}
				cur = nil
			case cur != nil:
				body = append(body, line)
			}
		}
	}
	return out
}

// packages names the import path of each package name the docs use.
var packages = map[string]string{
	"context": "context", "errors": "errors", "fmt": "fmt", "io": "io", "log": "log", "slog": "log/slog",
	"net": "net", "http": "net/http", "httputil": "net/http/httputil", "url": "net/url", "os": "os",
	"signal": "os/signal", "syscall": "syscall", "time": "time", "tls": "crypto/tls", "json": "encoding/json",
	"strings": "strings", "sync": "sync",

	"lane": "github.com/lanesdev/lanes/lane", "registry": "github.com/lanesdev/lanes/registry",
	"policy": "github.com/lanesdev/lanes/policy", "routing": "github.com/lanesdev/lanes/routing",
	"etcdstore": "github.com/lanesdev/lanes/etcdstore", "laneshttp": "github.com/lanesdev/lanes/laneshttp",
	"lanesgrpc": "github.com/lanesdev/lanes/lanesgrpc", "lanesnats": "github.com/lanesdev/lanes/lanesnats",
	"adminclient": "github.com/lanesdev/lanes/adminclient", "adminapi": "github.com/lanesdev/lanes/adminapi",
	"lanesenv": "github.com/lanesdev/lanes/lanesenv", "lanestrace": "github.com/lanesdev/lanes/lanestrace",
	"lanesmetrics": "github.com/lanesdev/lanes/lanesmetrics", "laneskafka": "github.com/lanesdev/lanes/laneskafka",
	"lanesamqp": "github.com/lanesdev/lanes/lanesamqp",

	"grpc": "google.golang.org/grpc", "insecure": "google.golang.org/grpc/credentials/insecure",
	"metadata": "google.golang.org/grpc/metadata", "codes": "google.golang.org/grpc/codes",
	"status": "google.golang.org/grpc/status", "healthpb": "google.golang.org/grpc/health/grpc_health_v1",
	"otelhttp": "go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp",
	"otelgrpc": "go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc",
	"nats":     "github.com/nats-io/nats.go", "jetstream": "github.com/nats-io/nats.go/jetstream",
	"kgo": "github.com/twmb/franz-go/pkg/kgo", "amqp": "github.com/rabbitmq/amqp091-go",
}

// given are the variables a fragment may use without declaring them: what
// the surrounding program of the docs has.
var given = map[string]string{
	"ctx":       "context.Context",
	"engine":    "*routing.Engine",
	"env":       "*lanesenv.Env",
	"err":       "error",
	"callErr":   "error",
	"tlsConfig": "*tls.Config",
	"w":         "http.ResponseWriter",
	"r":         "*http.Request",
	"data":      "[]byte",
}

// idents returns the identifiers of src, and the X of every X.Y selector.
func idents(src string) (all, selected map[string]bool) {
	all, selected = map[string]bool{}, map[string]bool{}
	var s scanner.Scanner
	fs := token.NewFileSet()
	s.Init(fs.AddFile("", fs.Base(), len(src)), []byte(src), nil, 0)
	var prev string
	prevTok := token.ILLEGAL
	for {
		_, tok, lit := s.Scan()
		if tok == token.EOF {
			break
		}
		if tok == token.IDENT {
			all[lit] = true
		}
		if tok == token.PERIOD && prevTok == token.IDENT {
			selected[prev] = true
		}
		prev, prevTok = lit, tok
	}
	return all, selected
}

// wrap turns fragment b (number i) into a Go file of package snippets.
func wrap(i int, b block) string {
	src := b.context_ + "\n" + b.code
	all, selected := idents(src)
	uses := map[string]bool{}
	var decls []string
	var names []string
	for name := range given {
		if all[name] {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	for _, name := range names {
		decls = append(decls, fmt.Sprintf("\tvar %s %s\n\t_ = %s\n", name, given[name], name))
		_, sel := idents(given[name])
		for p := range sel {
			uses[p] = true
		}
	}
	for p := range selected {
		if _, isGiven := given[p]; isGiven {
			continue
		}
		if _, ok := packages[p]; ok {
			uses[p] = true
		}
	}
	var imports []string
	for p := range uses {
		if path, ok := packages[p]; ok {
			imports = append(imports, fmt.Sprintf("\t%s %q\n", p, path))
		}
	}
	sort.Strings(imports)
	var sb strings.Builder
	fmt.Fprintf(&sb, "// %s\n\npackage snippets\n\nimport (\n%s)\n\n", b.where(), strings.Join(imports, ""))
	sb.WriteString(b.context_ + "\n")
	// Top-level declarations stay at the top level; statements go into a
	// function.
	if _, err := parser.ParseFile(token.NewFileSet(), "", "package p\n"+b.code, 0); err == nil {
		fmt.Fprintf(&sb, "%s\nfunc _() {\n%s}\n", b.code, strings.Join(decls, ""))
	} else {
		fmt.Fprintf(&sb, "func _() error {\n%s\t{\n%s\n%s\t}\n\treturn nil\n}\n", strings.Join(decls, ""), b.code, useDeclared(b.code))
	}
	return sb.String()
}

// useDeclared returns statements that use every variable the statements of a
// fragment declare at their top level: a fragment shows code out of its
// program, where what it declares is used further on.
func useDeclared(code string) string {
	f, err := parser.ParseFile(token.NewFileSet(), "", "package p\nfunc _() {\n"+code+"\n}", 0)
	if err != nil || len(f.Decls) != 1 {
		return ""
	}
	var names []string
	add := func(id *ast.Ident) {
		if id.Name != "_" {
			names = append(names, id.Name)
		}
	}
	for _, st := range f.Decls[0].(*ast.FuncDecl).Body.List {
		switch st := st.(type) {
		case *ast.AssignStmt:
			if st.Tok == token.DEFINE {
				for _, l := range st.Lhs {
					if id, ok := l.(*ast.Ident); ok {
						add(id)
					}
				}
			}
		case *ast.DeclStmt:
			if gd, ok := st.Decl.(*ast.GenDecl); ok && gd.Tok == token.VAR {
				for _, sp := range gd.Specs {
					for _, id := range sp.(*ast.ValueSpec).Names {
						add(id)
					}
				}
			}
		}
	}
	var sb strings.Builder
	for _, n := range names {
		fmt.Fprintf(&sb, "\t_ = %s\n", n)
	}
	return sb.String()
}

func init() {
	// A name that is both a given variable and a package (none today)
	// would be declared twice.
	for name := range given {
		if _, ok := packages[name]; ok {
			panic("docs: " + name + " is a given variable and a package")
		}
	}
}

// goCmd runs the go command in the repository root with args; it returns
// the combined output.
func goCmd(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command("go", args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=readonly")
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// source returns the Go file a block stands for: the block itself, or the
// fragment wrapped.
func source(i int, b block) (string, error) {
	switch {
	case b.fragment():
		return wrap(i, b), nil
	case b.pkgName() != "":
		return b.code, nil
	}
	return "", fmt.Errorf("%s: a ```go block that is neither a Go file (with a package clause) nor marked ```go fragment", b.where())
}

// imports returns the import paths of a Go file.
func imports(src string) []string {
	f, err := parser.ParseFile(token.NewFileSet(), "", src, parser.ImportsOnly)
	if err != nil {
		return nil
	}
	var out []string
	for _, im := range f.Imports {
		out = append(out, strings.Trim(im.Path.Value, `"`))
	}
	return out
}

// unresolved returns the import paths that the lanes module cannot build:
// packages of modules it does not require.
func unresolved(t *testing.T, paths []string) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	if len(paths) == 0 {
		return out
	}
	res, _ := goCmd(t, append([]string{"list", "-e", "-f", "{{.ImportPath}} {{if .Error}}unresolved{{end}}"}, paths...)...)
	for _, l := range strings.Split(res, "\n") {
		if p, ok := strings.CutSuffix(strings.TrimSpace(l), " unresolved"); ok {
			out[p] = true
		}
	}
	return out
}

// TestSnippetsCompile builds every Go block of README.md and docs/*.md: all
// at once, each as a package of its own (laid over the module with
// -overlay, so nothing is written into the tree), except programs that need
// a module the lanes module does not require, which are built in a module
// of their own as a user would.
func TestSnippetsCompile(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command")
	}
	blocks := readBlocks(t)
	if len(blocks) < 5 {
		t.Fatalf("only %d Go blocks found", len(blocks))
	}
	abs, err := filepath.Abs(root)
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	srcs := map[int]string{}
	var all []string
	for i, b := range blocks {
		src, err := source(i, b)
		if err != nil {
			t.Error(err)
			continue
		}
		srcs[i] = src
		all = append(all, imports(src)...)
	}
	missing := unresolved(t, all)

	overlay := map[string]string{}
	var pkgs []string
	files := map[string]block{} // temp file -> block
	for i, b := range blocks {
		src, ok := srcs[i]
		if !ok {
			continue
		}
		f := filepath.Join(tmp, fmt.Sprintf("b%02d.go", i))
		if err := os.WriteFile(f, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		files[f] = b
		ext := false
		for _, p := range imports(src) {
			ext = ext || missing[p]
		}
		if ext && !b.fragment() && b.pkgName() == "main" {
			t.Run(strings.ReplaceAll(b.where(), "/", "_"), func(t *testing.T) {
				dir := filepath.Join(tmp, fmt.Sprintf("m%02d", i))
				os.MkdirAll(dir, 0o755)
				os.WriteFile(filepath.Join(dir, "main.go"), []byte(src), 0o644)
				out, err := buildOwnModule(t, dir, src)
				if err == errOffline {
					t.Skipf("%s needs modules from the Go module proxy, which cannot be reached: %s", b.where(), out)
				}
				if err != nil {
					t.Errorf("%s: the program does not compile in a module of its own:\n%s", b.where(), rewrite(out, filepath.Join(dir, "main.go"), b))
				}
			})
			continue
		}
		pkg := fmt.Sprintf("internal/e2e/docs/zz_snippet%02d", i)
		overlay[filepath.Join(abs, pkg, "snippet.go")] = f
		pkgs = append(pkgs, "./"+pkg)
	}
	if len(pkgs) == 0 {
		return
	}
	ov, _ := json.Marshal(map[string]any{"Replace": overlay})
	ovFile := filepath.Join(tmp, "overlay.json")
	os.WriteFile(ovFile, ov, 0o644)
	out, err := goCmd(t, append([]string{"build", "-overlay", ovFile, "-gcflags=-e"}, pkgs...)...)
	if err == nil {
		return
	}
	// A fragment shows part of a program: a variable it declares for the
	// lines that would follow is not an error.
	var bad []string
	for _, l := range strings.Split(out, "\n") {
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		shown := l
		for f, b := range files {
			if strings.HasPrefix(l, f+":") {
				if b.fragment() && strings.Contains(l, "declared and not used") {
					shown = ""
				} else if b.fragment() {
					shown = b.where() + " (fragment, as wrapped): " + strings.TrimPrefix(l, f+":")
				} else {
					shown = rewrite(l, f, b)
				}
				break
			}
		}
		if shown != "" {
			bad = append(bad, shown)
		}
	}
	if len(bad) > 0 {
		t.Errorf("Go blocks that do not compile:\n%s", strings.Join(bad, "\n"))
	}
}

// rewrite points compiler messages at the Markdown lines.
func rewrite(out, file string, b block) string {
	re := regexp.MustCompile(regexp.QuoteMeta(file) + `:(\d+)`)
	return re.ReplaceAllStringFunc(out, func(m string) string {
		var n int
		fmt.Sscanf(m[len(file)+1:], "%d", &n)
		return fmt.Sprintf("%s:%d", b.file, b.line+n)
	})
}
