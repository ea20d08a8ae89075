package lanesenv_test

import (
	"context"
	"log"
	"log/slog"

	"github.com/lanesdev/lanes/lanesenv"
)

// A service reads LANES_REGISTRY (and LANES_TOKEN or LANES_ETCD_*) and gets
// an engine and a registry; a missing or wrong variable is an error naming
// it.
func ExampleOpen() {
	ctx := context.Background()
	env, err := lanesenv.Open(ctx)
	if err != nil {
		log.Fatal(err) // lanes: LANES_REGISTRY is not set: set it to etcd://host:port ...
	}
	defer env.Close()
	slog.SetDefault(env.Logger) // the Serve helpers then log as the control plane does

	_ = env.Engine   // laneshttp.NewClient(env.Engine), lanesgrpc.NewClient(env.Engine, ...)
	_ = env.Registry // laneshttp.Serve(ctx, srv, lis, env.Registry, inst, ...)
}
