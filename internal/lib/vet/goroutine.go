package vet

import (
	"go/ast"
	"go/token"
	"go/types"

	"golang.org/x/tools/go/analysis"
)

// GoroutineOutlives reports a go statement in a request handler that captures, or is passed, the
// request's context (or a context derived from it), where the goroutine may run past the
// handler's return: nothing after the go statement waits (a Wait call, a channel receive, a
// select). When the handler returns, that context is cancelled and the goroutine's downstream
// calls fail; lane.Detach keeps the lane without the cancellation.
//
// A request handler is a function with an *http.Request parameter, a gRPC unary method
// (ctx context.Context, *Request) (*Response, error), or a function with a gRPC server stream
// parameter. A context produced by lane.Detach or context.WithoutCancel is not the request's.
var GoroutineOutlives = &analysis.Analyzer{
	Name:     "lanego",
	Doc:      "report goroutines that use the request's context and may outlive the request without lane.Detach",
	URL:      "https://github.com/lanesdev/lanes/blob/main/docs/vet.md#lanego",
	Requires: requires,
	Run:      runGoroutineOutlives,
}

func runGoroutineOutlives(pass *analysis.Pass) (any, error) {
	inspectorOf(pass).WithStack([]ast.Node{(*ast.GoStmt)(nil)}, func(n ast.Node, push bool, stack []ast.Node) bool {
		if !push {
			return true
		}
		stmt := n.(*ast.GoStmt)
		for _, s := range enclosing(stack) {
			if !isHandler(pass.TypesInfo, s) {
				continue
			}
			bound := requestBound(pass.TypesInfo, s)
			use := firstUse(pass.TypesInfo, stmt.Call, bound)
			if use == nil || waitsAfter(pass.TypesInfo, s.body, stmt) {
				return true
			}
			d := analysis.Diagnostic{
				Pos: stmt.Pos(), End: stmt.Call.Lparen,
				Message: "goroutine uses the request's context " + use.Name +
					" and may outlive the request: it is cancelled when the handler returns; pass lane.Detach(" + use.Name + ") to keep the lane",
			}
			if fix, ok := detachFix(pass, stmt, use); ok {
				d.SuggestedFixes = []analysis.SuggestedFix{fix}
			}
			report(pass, d)
			return true
		}
		return true
	})
	return nil, nil
}

// isHandler reports whether s has the shape of a request handler.
func isHandler(info *types.Info, s scope) bool {
	if s.typ.Params == nil {
		return false
	}
	var params []*types.Var
	for _, f := range s.typ.Params.List {
		for _, name := range f.Names {
			if v, ok := info.Defs[name].(*types.Var); ok {
				params = append(params, v)
			}
		}
		if len(f.Names) == 0 {
			params = append(params, nil)
		}
	}
	for _, p := range params {
		if p != nil && (isHTTPRequestPtr(p.Type()) || isServerStream(p.Type())) {
			return true
		}
	}
	// A gRPC unary method: a method (ctx, *Req) (*Resp, error).
	fd, ok := s.node.(*ast.FuncDecl)
	if !ok || fd.Recv == nil || len(params) != 2 || params[0] == nil || !isContext(params[0].Type()) {
		return false
	}
	if _, ok := params[1].Type().(*types.Pointer); !ok {
		return false
	}
	res := s.typ.Results
	if res == nil || res.NumFields() != 2 {
		return false
	}
	last := info.TypeOf(res.List[len(res.List)-1].Type)
	return last != nil && types.Identical(last, types.Universe.Lookup("error").Type())
}

// isServerStream reports whether t has the methods of a gRPC server stream.
func isServerStream(t types.Type) bool {
	ms := types.NewMethodSet(t)
	has := func(name string) bool {
		for i := 0; i < ms.Len(); i++ {
			if ms.At(i).Obj().Name() == name {
				return true
			}
		}
		return false
	}
	return has("Context") && has("SendMsg") && has("RecvMsg") && has("SetHeader")
}

// requestBound returns the variables of s that hold the request's context or a request: its
// context.Context and *http.Request parameters, and variables assigned from expressions that use
// them, unless through lane.Detach or context.WithoutCancel.
func requestBound(info *types.Info, s scope) map[types.Object]bool {
	bound := map[types.Object]bool{}
	for _, f := range s.typ.Params.List {
		for _, name := range f.Names {
			if v, ok := info.Defs[name].(*types.Var); ok && (isContext(v.Type()) || isHTTPRequestPtr(v.Type()) || isServerStream(v.Type())) {
				bound[v] = true
			}
		}
	}
	// Two passes reach variables assigned from variables assigned later in the text (loops).
	for range 2 {
		ast.Inspect(s.body, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.FuncLit:
				return false
			case *ast.AssignStmt:
				for i, rhs := range n.Rhs {
					if firstUse(info, rhs, bound) == nil {
						continue
					}
					for j, lhs := range n.Lhs {
						if len(n.Rhs) > 1 && j != i {
							continue
						}
						if id, ok := lhs.(*ast.Ident); ok {
							if obj := objOf(info, id); obj != nil && isContext(obj.Type()) {
								bound[obj] = true
							}
						}
					}
				}
			}
			return true
		})
	}
	return bound
}

func objOf(info *types.Info, id *ast.Ident) types.Object {
	if obj := info.Defs[id]; obj != nil {
		return obj
	}
	return info.Uses[id]
}

func detaches(fn *types.Func) bool {
	return isPkgFunc(fn, lanePkg, "Detach") || isPkgFunc(fn, "context", "WithoutCancel")
}

// firstUse returns the first identifier in n that refers to a bound variable, outside detaching
// calls, or nil.
func firstUse(info *types.Info, n ast.Node, bound map[types.Object]bool) *ast.Ident {
	var use *ast.Ident
	ast.Inspect(n, func(n ast.Node) bool {
		if use != nil {
			return false
		}
		switch n := n.(type) {
		case *ast.CallExpr:
			if detaches(funcOf(info, n)) {
				return false
			}
		case *ast.Ident:
			if bound[info.Uses[n]] {
				use = n
			}
		}
		return true
	})
	return use
}

// waitsAfter reports whether body, after stmt, waits for something: a call of a method named
// Wait, a channel receive, a select statement or a range over a channel.
func waitsAfter(info *types.Info, body *ast.BlockStmt, stmt *ast.GoStmt) bool {
	waits := false
	ast.Inspect(body, func(n ast.Node) bool {
		if waits || n == nil || n.End() <= stmt.End() {
			return false // before the go statement, or the statement itself
		}
		if n.Pos() < stmt.End() {
			return true // encloses the go statement: look inside, but it does not wait for it
		}
		switch n := n.(type) {
		case *ast.FuncLit:
			return false
		case *ast.SelectStmt:
			waits = true
		case *ast.UnaryExpr:
			waits = n.Op == token.ARROW
		case *ast.RangeStmt:
			if t := info.TypeOf(n.X); t != nil {
				_, waits = t.Underlying().(*types.Chan)
			}
		case *ast.CallExpr:
			if sel, ok := ast.Unparen(n.Fun).(*ast.SelectorExpr); ok && sel.Sel.Name == "Wait" {
				waits = true
			}
		}
		return !waits
	})
	return waits
}

// detachFix wraps the use in lane.Detach when it is a direct argument of the go call and the
// file already imports the lane package.
func detachFix(pass *analysis.Pass, stmt *ast.GoStmt, use *ast.Ident) (analysis.SuggestedFix, bool) {
	file := fileOf(pass, stmt.Pos())
	name := ""
	if file != nil {
		name = importName(file, lanePkg)
	}
	if name == "" || !isContext(pass.TypesInfo.TypeOf(use)) {
		return analysis.SuggestedFix{}, false
	}
	for _, arg := range stmt.Call.Args {
		if id, ok := ast.Unparen(arg).(*ast.Ident); ok && id == use {
			return analysis.SuggestedFix{
				Message: "pass " + name + ".Detach(" + use.Name + ")",
				TextEdits: []analysis.TextEdit{{
					Pos: arg.Pos(), End: arg.End(), NewText: []byte(name + ".Detach(" + use.Name + ")"),
				}},
			}, true
		}
	}
	return analysis.SuggestedFix{}, false
}
