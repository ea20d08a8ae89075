// A client option given to a server: does not compile.
package main

import (
	"context"

	"github.com/lanesdev/lanes/lanesgrpc"
	"github.com/lanesdev/lanes/registry"
)

func main() {
	_ = lanesgrpc.Serve(context.Background(), nil, nil, nil, registry.Instance{}, lanesgrpc.WithIdempotent("/a.B/C"))
}
