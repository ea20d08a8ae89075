package lanesgrpc_test

import (
	"context"
	"fmt"
	"log"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	testpb "google.golang.org/grpc/interop/grpc_testing"

	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/lanesgrpc"
	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

// whoami answers with the id of the instance that served the call.
type whoami struct {
	testpb.UnimplementedTestServiceServer
	id string
}

func (w *whoami) UnaryCall(context.Context, *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
	return &testpb.SimpleResponse{ServerId: w.id}, nil
}

// A gRPC service joins lanes: two instances of "orders", one in the
// baseline and one in lane alice, serve and register with Serve; a client
// made by NewClient sends each call to the instance of its lane.
func Example() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	reg := registry.NewMemory() // an etcdstore registry in a fleet
	defer reg.Close()
	engine := routing.New(routing.WithRegistry(reg))
	defer engine.Close()

	// The providers.
	var wg sync.WaitGroup
	for _, inst := range []registry.Instance{
		{ID: "orders-1", Service: "orders"},
		{ID: "orders-alice", Service: "orders", Lane: "alice"}, // or LANES_LANE=alice
	} {
		guard := lanesgrpc.NewGuard(engine)
		srv := grpc.NewServer(lanesgrpc.ServerOptions(lanesgrpc.WithGuard(guard))...)
		testpb.RegisterTestServiceServer(srv, &whoami{id: inst.ID})
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			log.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := lanesgrpc.Serve(ctx, srv, lis, reg, inst, lanesgrpc.WithGuard(guard),
				lanesgrpc.WithEnv(func(string) string { return "" })) // this example ignores LANES_*
			if err != nil {
				log.Print(err)
			}
		}()
	}
	for len(engine.Service("orders").Instances()) < 2 {
		time.Sleep(10 * time.Millisecond) // only so that the output below is fixed
	}

	// A caller.
	cc, err := lanesgrpc.NewClient(engine, "orders",
		lanesgrpc.WithDialOptions(grpc.WithTransportCredentials(insecure.NewCredentials())))
	if err != nil {
		log.Fatal(err)
	}
	orders := testpb.NewTestServiceClient(cc)
	for _, l := range []string{"", "alice", "bob"} {
		resp, err := orders.UnaryCall(lane.WithLane(ctx, l), &testpb.SimpleRequest{})
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("lane %q: served by %s\n", l, resp.ServerId)
	}

	cc.Close()
	cancel() // each Serve deregisters, then stops its server
	wg.Wait()
	// Output:
	// lane "": served by orders-1
	// lane "alice": served by orders-alice
	// lane "bob": served by orders-1
}
