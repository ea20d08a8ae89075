package vet

import (
	"go/ast"
	"go/types"

	"golang.org/x/tools/go/analysis"
)

// ContextDropped reports context.Background() and context.TODO() in a function that has a
// request's context in scope (a context.Context parameter, or an *http.Request parameter, its own
// or an enclosing function's). Whatever the new context is used for, a call, a request or a
// goroutine, it carries no lane. Passing the new context straight to the lane package
// (lane.WithLane(context.Background(), lane.FromContext(ctx))) is how lane.Detach is written by
// hand, and is not reported. Outside a request handler (see GoroutineOutlives), a new root made
// with context.WithCancel, WithTimeout, WithDeadline or WithCancelCause of context.Background()
// is taken for a lifetime of its own (a server's, a background loop's) and is not reported either;
// inside a handler it is, since that is how a downstream call loses its lane. The suggested fix
// uses the context in scope instead.
var ContextDropped = &analysis.Analyzer{
	Name:     "lanectx",
	Doc:      "report context.Background() and context.TODO() where a request's context is in scope, since the new context carries no lane",
	URL:      "https://github.com/lanesdev/lanes/blob/main/docs/vet.md#lanectx",
	Requires: requires,
	Run:      runContextDropped,
}

func runContextDropped(pass *analysis.Pass) (any, error) {
	inspectorOf(pass).WithStack([]ast.Node{(*ast.CallExpr)(nil)}, func(n ast.Node, push bool, stack []ast.Node) bool {
		if !push {
			return true
		}
		call := n.(*ast.CallExpr)
		fn := funcOf(pass.TypesInfo, call)
		if !isPkgFunc(fn, "context", "Background", "TODO") {
			return true
		}
		var outer *types.Func
		if len(stack) >= 2 {
			if oc, ok := stack[len(stack)-2].(*ast.CallExpr); ok {
				outer = funcOf(pass.TypesInfo, oc)
			}
		}
		if outer != nil && outer.Pkg() != nil && outer.Pkg().Path() == lanePkg {
			return true
		}
		rc, ok := contextInScope(pass.TypesInfo, stack)
		if !ok {
			return true
		}
		if isPkgFunc(outer, "context", "WithCancel", "WithTimeout", "WithDeadline", "WithCancelCause") && !inHandler(pass.TypesInfo, stack) {
			return true
		}
		report(pass, analysis.Diagnostic{
			Pos: call.Pos(), End: call.End(),
			Message: "context." + fn.Name() + "() drops the lane of the request's context " + rc.expr +
				"; use " + rc.expr + " (or lane.Detach(" + rc.expr + ") for work that outlives the request)",
			SuggestedFixes: []analysis.SuggestedFix{{
				Message:   "use " + rc.expr,
				TextEdits: []analysis.TextEdit{{Pos: call.Pos(), End: call.End(), NewText: []byte(rc.expr)}},
			}},
		})
		return true
	})
	return nil, nil
}

// inHandler reports whether any function enclosing the top of stack is a request handler.
func inHandler(info *types.Info, stack []ast.Node) bool {
	for _, s := range enclosing(stack) {
		if isHandler(info, s) {
			return true
		}
	}
	return false
}
