package vet

import (
	"go/ast"
	"go/constant"
	"go/types"
	"strconv"
	"strings"

	"golang.org/x/tools/go/analysis"
)

// Bypass reports clients that bypass lanes:
//
//   - a gRPC connection (grpc.NewClient, grpc.Dial, grpc.DialContext) whose target is a constant
//     that does not use the lanes scheme ("lanes:///service");
//   - an http.Client literal whose Transport is missing (http.DefaultTransport) or built without
//     laneshttp, and a request sent through http.DefaultClient (http.DefaultClient.Do(req), .Get,
//     .Post, ...);
//   - a NATS publish or request made on a *nats.Conn or a jetstream.JetStream directly rather than
//     through lanesnats, so the message carries no lane.
//
// Calls that must stay outside lanes (the registry itself, a third-party API) are allowed with
// -lanebypass.allow: a comma-separated list of entries, each a package path prefix of the calling
// code, a gRPC target prefix, or a function (path.Func or path.Type.Method) that makes the call.
// lanes' own transport packages are always allowed, and test files are not checked: a test
// reaches the server under test directly on purpose.
var Bypass = &analysis.Analyzer{
	Name:     "lanebypass",
	Doc:      "report gRPC targets, HTTP clients and NATS publishes that bypass lanes",
	URL:      "https://github.com/lanesdev/lanes/blob/main/docs/vet.md#lanebypass",
	Requires: requires,
	Run:      runBypass,
}

// allowList is the value of -lanebypass.allow.
type allowList []string

func (a *allowList) String() string { return strings.Join(*a, ",") }

func (a *allowList) Set(v string) error {
	*a = nil
	for _, e := range strings.Split(v, ",") {
		if e = strings.TrimSpace(e); e != "" {
			*a = append(*a, e)
		}
	}
	return nil
}

var bypassAllow allowList

func init() {
	Bypass.Flags.Var(&bypassAllow, "allow", "comma-separated package path prefixes, gRPC target prefixes or functions (path.Func) whose calls may bypass lanes")
}

// builtinAllow lists lanes' own transports, which make the raw calls on their users' behalf.
var builtinAllow = []string{lanesHTTPPkg, lanesGRPCPkg, lanesNATSPkg}

var natsPublish = []string{"Publish", "PublishMsg", "PublishRequest", "Request", "RequestMsg", "RequestWithContext", "RequestMsgWithContext"}
var jetstreamPublish = []string{"Publish", "PublishMsg", "PublishAsync", "PublishMsgAsync"}

func runBypass(pass *analysis.Pass) (any, error) {
	pkg := pass.Pkg.Path()
	for _, e := range builtinAllow {
		if pkg == e || strings.HasPrefix(pkg, e+"/") {
			return nil, nil
		}
	}
	for _, e := range bypassAllow {
		if strings.HasPrefix(pkg, e) {
			return nil, nil
		}
	}
	insp := inspectorOf(pass)
	insp.WithStack([]ast.Node{(*ast.CallExpr)(nil), (*ast.CompositeLit)(nil)}, func(n ast.Node, push bool, stack []ast.Node) bool {
		if !push || inTestFile(pass, n) || allowedCaller(pass, stack) {
			return true
		}
		switch n := n.(type) {
		case *ast.CallExpr:
			checkCall(pass, n)
		case *ast.CompositeLit:
			checkHTTPClient(pass, n)
		}
		return true
	})
	return nil, nil
}

func inTestFile(pass *analysis.Pass, n ast.Node) bool {
	return strings.HasSuffix(pass.Fset.File(n.Pos()).Name(), "_test.go")
}

// allowedCaller reports whether the function declaration enclosing the node is allowed by name.
func allowedCaller(pass *analysis.Pass, stack []ast.Node) bool {
	if len(bypassAllow) == 0 {
		return false
	}
	for i := len(stack) - 1; i >= 0; i-- {
		fd, ok := stack[i].(*ast.FuncDecl)
		if !ok {
			continue
		}
		fn, _ := pass.TypesInfo.Defs[fd.Name].(*types.Func)
		if fn == nil {
			return false
		}
		name := fn.FullName() // path.Func or (path.Type).Method
		plain := strings.NewReplacer("(", "", ")", "", "*", "").Replace(name)
		for _, e := range bypassAllow {
			if e == name || e == plain {
				return true
			}
		}
		return false
	}
	return false
}

func checkCall(pass *analysis.Pass, call *ast.CallExpr) {
	fn := funcOf(pass.TypesInfo, call)
	switch {
	case isPkgFunc(fn, grpcPkg, "NewClient", "Dial", "DialContext"):
		i := 0
		if fn.Name() == "DialContext" {
			i = 1
		}
		if len(call.Args) <= i {
			return
		}
		tv, ok := pass.TypesInfo.Types[call.Args[i]]
		if !ok || tv.Value == nil || tv.Value.Kind() != constant.String {
			return // not a constant: cannot tell
		}
		target := constant.StringVal(tv.Value)
		if strings.HasPrefix(target, "lanes:") {
			return
		}
		for _, e := range bypassAllow {
			if strings.HasPrefix(target, e) {
				return
			}
		}
		report(pass, analysis.Diagnostic{
			Pos: call.Pos(), End: call.End(),
			Message: "grpc." + fn.Name() + " target " + strconv.Quote(target) + " is not resolved through lanes, so calls on it ignore the lane; use \"lanes:///<service>\" or lanesgrpc.NewClient (or allow it with -lanebypass.allow)",
		})
	case isMethodOf(fn, "net/http", defaultClientSend...) && isClientMethod(fn) && onDefaultClient(pass.TypesInfo, call):
		report(pass, analysis.Diagnostic{
			Pos: call.Pos(), End: call.End(),
			Message: "http.DefaultClient." + fn.Name() + " sends with http.DefaultTransport, so the request ignores the lane; send it with a client of laneshttp.NewClient (or allow it with -lanebypass.allow)",
		})
	case isMethodOf(fn, natsPkg, natsPublish...) && isRecv(fn, natsPkg, "Conn"):
		report(pass, analysis.Diagnostic{
			Pos: call.Pos(), End: call.End(),
			Message: "(*nats.Conn)." + fn.Name() + " publishes without the lane; publish through a lanesnats.Publisher (or allow it with -lanebypass.allow)",
		})
	case isMethodOf(fn, jetstreamPkg, jetstreamPublish...):
		report(pass, analysis.Diagnostic{
			Pos: call.Pos(), End: call.End(),
			Message: "jetstream " + fn.Name() + " publishes without the lane; publish through a lanesnats.Publisher (or allow it with -lanebypass.allow)",
		})
	}
}

// defaultClientSend lists the methods of *http.Client that send a request.
var defaultClientSend = []string{"Do", "Get", "Head", "Post", "PostForm"}

// onDefaultClient reports whether call is a method call on net/http's DefaultClient itself.
func onDefaultClient(info *types.Info, call *ast.CallExpr) bool {
	sel, ok := ast.Unparen(call.Fun).(*ast.SelectorExpr)
	if !ok {
		return false
	}
	var id *ast.Ident
	switch x := ast.Unparen(sel.X).(type) {
	case *ast.Ident:
		id = x
	case *ast.SelectorExpr:
		id = x.Sel
	default:
		return false
	}
	v, ok := info.Uses[id].(*types.Var)
	return ok && v.Pkg() != nil && v.Pkg().Path() == "net/http" && v.Name() == "DefaultClient"
}

func isRecv(fn *types.Func, pkg, name string) bool {
	recv := fn.Type().(*types.Signature).Recv()
	return recv != nil && isNamed(recv.Type(), pkg, name)
}

// checkHTTPClient reports an http.Client literal whose transport is not lanes'.
func checkHTTPClient(pass *analysis.Pass, lit *ast.CompositeLit) {
	t := pass.TypesInfo.TypeOf(lit)
	if t == nil || !isNamed(t, "net/http", "Client") {
		return
	}
	for _, elt := range lit.Elts {
		kv, ok := elt.(*ast.KeyValueExpr)
		if !ok {
			return // positional fields: cannot tell
		}
		if k, ok := kv.Key.(*ast.Ident); ok && k.Name == "Transport" {
			if mentionsLanesHTTP(pass.TypesInfo, kv.Value) {
				return
			}
			report(pass, analysis.Diagnostic{
				Pos: lit.Pos(), End: lit.End(),
				Message: "http.Client's Transport is not built with laneshttp, so its requests ignore the lane; wrap it with laneshttp.NewTransport (or allow it with -lanebypass.allow)",
			})
			return
		}
	}
	report(pass, analysis.Diagnostic{
		Pos: lit.Pos(), End: lit.End(),
		Message: "http.Client without a Transport uses http.DefaultTransport, so its requests ignore the lane; use laneshttp.NewClient or laneshttp.NewTransport (or allow it with -lanebypass.allow)",
	})
}

// mentionsLanesHTTP reports whether e refers to anything of the laneshttp package, or has a type
// declared there.
func mentionsLanesHTTP(info *types.Info, e ast.Expr) bool {
	found := false
	ast.Inspect(e, func(n ast.Node) bool {
		if found {
			return false
		}
		switch n := n.(type) {
		case *ast.Ident:
			if obj := info.Uses[n]; obj != nil && obj.Pkg() != nil && obj.Pkg().Path() == lanesHTTPPkg {
				found = true
			}
		case ast.Expr:
			if t := info.TypeOf(n); t != nil {
				if p, ok := t.(*types.Pointer); ok {
					t = p.Elem()
				}
				if nt, ok := types.Unalias(t).(*types.Named); ok && nt.Obj().Pkg() != nil && nt.Obj().Pkg().Path() == lanesHTTPPkg {
					found = true
				}
			}
		}
		return !found
	})
	return found
}
