// A client option given to a server: does not compile.
package main

import (
	"context"
	"net/http"

	"github.com/lanesdev/lanes/laneshttp"
	"github.com/lanesdev/lanes/registry"
)

func main() {
	_ = laneshttp.Serve(context.Background(), &http.Server{}, nil, nil, registry.Instance{}, laneshttp.WithRetries(2))
}
