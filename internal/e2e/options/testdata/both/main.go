// The options that mean the same on both sides go to either, and each role
// takes its own: this compiles.
package main

import (
	"context"
	"net/http"
	"time"

	"github.com/lanesdev/lanes/lanesgrpc"
	"github.com/lanesdev/lanes/laneshttp"
	"github.com/lanesdev/lanes/registry"
)

func main() {
	_ = laneshttp.NewClient(nil, laneshttp.WithZone("az1"), laneshttp.WithRetries(2))
	_ = laneshttp.Serve(context.Background(), &http.Server{}, nil, nil, registry.Instance{}, laneshttp.WithZone("az1"), laneshttp.WithTTL(time.Second))
	_, _ = lanesgrpc.NewClient(nil, "orders", lanesgrpc.WithZone("az1"), lanesgrpc.WithIdempotent("/a.B/C"))
	_ = lanesgrpc.Serve(context.Background(), nil, nil, nil, registry.Instance{}, lanesgrpc.WithZone("az1"), lanesgrpc.WithGuard(nil))
}
