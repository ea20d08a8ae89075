// A server option given to a client: does not compile.
package main

import (
	"github.com/lanesdev/lanes/lanesgrpc"
)

func main() {
	_, _ = lanesgrpc.NewClient(nil, "orders", lanesgrpc.WithGuard(nil))
}
