package adminclient_test

import (
	"context"
	"log"
	"os"

	"github.com/lanesdev/lanes/adminclient"
	"github.com/lanesdev/lanes/registry"
)

// A service registers itself in its lane through the admin API, with a
// token scoped to that lane: no etcd address or credentials needed.
func ExampleRegistry() {
	c, err := adminclient.New(os.Getenv(adminclient.EnvAdmin), os.Getenv(adminclient.EnvToken))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	reg := adminclient.NewRegistry(c)
	defer reg.Close()

	ctx := context.Background()
	lease, err := reg.Register(ctx, registry.Instance{
		Service: "payments", ID: "payments-alice", Addr: "10.1.2.3:9000", Lane: "alice",
	}, 0)
	if err != nil {
		log.Fatal(err) // *adminapi.Error: forbidden, lane_expired, conflict...
	}
	defer lease.Close() // deregisters

	// ... serve until told to stop; lease.Done() is closed if the control
	// plane ends the registration (its lane expired, its token was revoked).
	<-lease.Done()
}
