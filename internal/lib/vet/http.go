package vet

import (
	"go/ast"
	"go/types"

	"golang.org/x/tools/go/analysis"
)

// HTTPWithoutContext reports outgoing HTTP requests built without a context in a function that
// has a request's context in scope: http.Get, http.Head, http.Post, http.PostForm, the same methods
// of *http.Client, and http.NewRequest. Such a request carries no lane. The suggested fix turns
// http.NewRequest(...) into http.NewRequestWithContext(ctx, ...).
var HTTPWithoutContext = &analysis.Analyzer{
	Name:     "lanehttp",
	Doc:      "report HTTP requests built without a context where a request's context is in scope, since they carry no lane",
	URL:      "https://github.com/lanesdev/lanes/blob/main/docs/vet.md#lanehttp",
	Requires: requires,
	Run:      runHTTPWithoutContext,
}

var contextlessHTTP = []string{"Get", "Head", "Post", "PostForm"}

func runHTTPWithoutContext(pass *analysis.Pass) (any, error) {
	inspectorOf(pass).WithStack([]ast.Node{(*ast.CallExpr)(nil)}, func(n ast.Node, push bool, stack []ast.Node) bool {
		if !push {
			return true
		}
		call := n.(*ast.CallExpr)
		fn := funcOf(pass.TypesInfo, call)
		var what string
		switch {
		case isPkgFunc(fn, "net/http", "NewRequest"):
			what = "http.NewRequest"
		case isPkgFunc(fn, "net/http", contextlessHTTP...):
			what = "http." + fn.Name()
		case isMethodOf(fn, "net/http", contextlessHTTP...) && isClientMethod(fn):
			what = "(*http.Client)." + fn.Name()
		default:
			return true
		}
		rc, ok := contextInScope(pass.TypesInfo, stack)
		if !ok {
			return true
		}
		d := analysis.Diagnostic{Pos: call.Pos(), End: call.End()}
		if what == "http.NewRequest" {
			d.Message = "http.NewRequest builds a request without the context " + rc.expr + ", so it carries no lane; use http.NewRequestWithContext(" + rc.expr + ", ...)"
			sel, isSel := ast.Unparen(call.Fun).(*ast.SelectorExpr)
			if isSel && len(call.Args) > 0 {
				d.SuggestedFixes = []analysis.SuggestedFix{{
					Message: "use http.NewRequestWithContext",
					TextEdits: []analysis.TextEdit{
						{Pos: sel.Sel.Pos(), End: sel.Sel.End(), NewText: []byte("NewRequestWithContext")},
						{Pos: call.Args[0].Pos(), End: call.Args[0].Pos(), NewText: []byte(rc.expr + ", ")},
					},
				}}
			}
		} else {
			d.Message = what + " sends a request without the context " + rc.expr + ", so it carries no lane; build it with http.NewRequestWithContext(" + rc.expr + ", ...) and send it with a lanes client"
		}
		report(pass, d)
		return true
	})
	return nil, nil
}

func isClientMethod(fn *types.Func) bool {
	recv := fn.Type().(*types.Signature).Recv()
	return recv != nil && isNamed(recv.Type(), "net/http", "Client")
}
