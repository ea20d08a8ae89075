package vet

import (
	"go/ast"
	"go/token"
	"go/types"
	"strings"

	"golang.org/x/tools/go/analysis"
	"golang.org/x/tools/go/analysis/passes/inspect"
	"golang.org/x/tools/go/ast/inspector"
)

// Package paths the analyzers recognise.
const (
	lanePkg      = "github.com/lanesdev/lanes/lane"
	lanesHTTPPkg = "github.com/lanesdev/lanes/laneshttp"
	lanesGRPCPkg = "github.com/lanesdev/lanes/lanesgrpc"
	lanesNATSPkg = "github.com/lanesdev/lanes/lanesnats"
	grpcPkg      = "google.golang.org/grpc"
	natsPkg      = "github.com/nats-io/nats.go"
	jetstreamPkg = "github.com/nats-io/nats.go/jetstream"
)

// ignoreDirective is the comment that silences one finding.
const ignoreDirective = "//lanes:ignore"

// Analyzers returns every analyzer of lanes vet, in the order of docs/vet.md.
func Analyzers() []*analysis.Analyzer {
	return []*analysis.Analyzer{ContextDropped, GoroutineOutlives, HTTPWithoutContext, Bypass}
}

var requires = []*analysis.Analyzer{inspect.Analyzer}

// report reports d unless a //lanes:ignore comment with a reason stands on its line or alone on
// the line above. An ignore without a reason does not silence the finding; the message says so.
func report(pass *analysis.Pass, d analysis.Diagnostic) {
	switch reason, found := ignored(pass, d.Pos); {
	case found && reason != "":
		return
	case found:
		d.Message += " (" + ignoreDirective + " needs a reason)"
	}
	pass.Report(d)
}

// ignored looks for the ignore directive on pos's line or alone on the line before it.
func ignored(pass *analysis.Pass, pos token.Pos) (reason string, found bool) {
	file := fileOf(pass, pos)
	if file == nil {
		return "", false
	}
	tf := pass.Fset.File(pos)
	line := tf.Line(pos)
	for _, cg := range file.Comments {
		for _, c := range cg.List {
			cl := tf.Line(c.Slash)
			if cl != line && cl != line-1 {
				continue
			}
			text, ok := strings.CutPrefix(c.Text, ignoreDirective)
			if !ok || (text != "" && text[0] != ' ' && text[0] != '\t') {
				continue
			}
			if cl == line-1 && !aloneOnLine(tf, file, c) {
				continue
			}
			return strings.TrimSpace(text), true
		}
	}
	return "", false
}

// aloneOnLine reports whether comment c is the only thing on its line (no code before it).
func aloneOnLine(tf *token.File, file *ast.File, c *ast.Comment) bool {
	line := tf.Line(c.Slash)
	alone := true
	ast.Inspect(file, func(n ast.Node) bool {
		if n == nil || !alone {
			return false
		}
		if _, ok := n.(*ast.File); ok {
			return true
		}
		if n.Pos() <= c.Slash && n.End() >= c.Slash {
			return true // encloses the comment
		}
		if tf.Line(n.End()) == line && n.End() <= c.Slash {
			alone = false
		}
		return n.Pos() < c.Slash
	})
	return alone
}

func fileOf(pass *analysis.Pass, pos token.Pos) *ast.File {
	for _, f := range pass.Files {
		if f.FileStart <= pos && pos <= f.FileEnd {
			return f
		}
	}
	return nil
}

// funcOf returns the function called by call (a package-level function or a method), or nil.
func funcOf(info *types.Info, call *ast.CallExpr) *types.Func {
	var id *ast.Ident
	switch fun := ast.Unparen(call.Fun).(type) {
	case *ast.Ident:
		id = fun
	case *ast.SelectorExpr:
		id = fun.Sel
	case *ast.IndexExpr:
		if sel, ok := fun.X.(*ast.SelectorExpr); ok {
			id = sel.Sel
		}
	default:
		return nil
	}
	fn, _ := info.Uses[id].(*types.Func)
	return fn
}

// isPkgFunc reports whether fn is the package-level function pkg.name (one of names).
func isPkgFunc(fn *types.Func, pkg string, names ...string) bool {
	if fn == nil || fn.Pkg() == nil || fn.Pkg().Path() != pkg {
		return false
	}
	if sig, ok := fn.Type().(*types.Signature); !ok || sig.Recv() != nil {
		return false
	}
	for _, n := range names {
		if fn.Name() == n {
			return true
		}
	}
	return false
}

// isMethodOf reports whether fn is a method (one of names) whose receiver's type is declared in
// pkg, as a named type or an interface.
func isMethodOf(fn *types.Func, pkg string, names ...string) bool {
	if fn == nil || fn.Pkg() == nil || fn.Pkg().Path() != pkg {
		return false
	}
	sig, ok := fn.Type().(*types.Signature)
	if !ok || sig.Recv() == nil {
		return false
	}
	for _, n := range names {
		if fn.Name() == n {
			return true
		}
	}
	return false
}

// isNamed reports whether t (or what it points to) is the named type pkg.name.
func isNamed(t types.Type, pkg, name string) bool {
	if p, ok := t.(*types.Pointer); ok {
		t = p.Elem()
	}
	n, ok := types.Unalias(t).(*types.Named)
	if !ok {
		return false
	}
	obj := n.Obj()
	return obj.Pkg() != nil && obj.Pkg().Path() == pkg && obj.Name() == name
}

func isContext(t types.Type) bool { return isNamed(t, "context", "Context") }

func isHTTPRequestPtr(t types.Type) bool {
	p, ok := t.(*types.Pointer)
	return ok && isNamed(p.Elem(), "net/http", "Request")
}

// scope is a function (declaration or literal) in the enclosing chain of a node.
type scope struct {
	node ast.Node // *ast.FuncDecl or *ast.FuncLit
	typ  *ast.FuncType
	body *ast.BlockStmt
}

// enclosing returns the functions enclosing the node at the top of stack, innermost first.
func enclosing(stack []ast.Node) []scope {
	var out []scope
	for i := len(stack) - 1; i >= 0; i-- {
		switch f := stack[i].(type) {
		case *ast.FuncDecl:
			out = append(out, scope{f, f.Type, f.Body})
		case *ast.FuncLit:
			out = append(out, scope{f, f.Type, f.Body})
		}
	}
	return out
}

// requestContext is the context of a request in scope: a context.Context parameter, or an
// *http.Request parameter whose Context() carries it.
type requestContext struct {
	obj  *types.Var // the parameter
	expr string     // how code in scope writes it: "ctx" or "r.Context()"
}

// contextInScope returns the innermost request context visible from the node at the top of
// stack: a parameter of the innermost function that has one (closures see their parents').
func contextInScope(info *types.Info, stack []ast.Node) (requestContext, bool) {
	for _, s := range enclosing(stack) {
		if rc, ok := paramContext(info, s.typ); ok {
			return rc, true
		}
	}
	return requestContext{}, false
}

// paramContext returns the first context.Context parameter of ft, else its first *http.Request
// parameter.
func paramContext(info *types.Info, ft *ast.FuncType) (requestContext, bool) {
	if ft == nil || ft.Params == nil {
		return requestContext{}, false
	}
	var req requestContext
	for _, field := range ft.Params.List {
		for _, name := range field.Names {
			v, _ := info.Defs[name].(*types.Var)
			if v == nil || name.Name == "_" {
				continue
			}
			switch {
			case isContext(v.Type()):
				return requestContext{v, name.Name}, true
			case req.obj == nil && isHTTPRequestPtr(v.Type()):
				req = requestContext{v, name.Name + ".Context()"}
			}
		}
	}
	return req, req.obj != nil
}

// importName returns the name by which file imports path, or "" when it does not.
func importName(file *ast.File, path string) string {
	for _, imp := range file.Imports {
		if strings.Trim(imp.Path.Value, `"`) != path {
			continue
		}
		if imp.Name != nil {
			return imp.Name.Name
		}
		return path[strings.LastIndex(path, "/")+1:]
	}
	return ""
}

func inspectorOf(pass *analysis.Pass) *inspector.Inspector {
	return pass.ResultOf[inspect.Analyzer].(*inspector.Inspector)
}
