package laneshttp_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/laneshttp"
	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

// An HTTP service joins lanes: two instances of orders, one in the baseline
// and one in lane alice, each run by Serve; a client made by NewClient calls
// http://orders/hello in each lane. Here the registry is in memory and
// everything runs over loopback; a fleet uses the etcd registry instead.
func Example() {
	reg := registry.NewMemory()
	defer reg.Close()
	engine := routing.New(routing.WithRegistry(reg))
	defer engine.Close()

	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, name := range []string{"", "alice"} {
		hello := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "hello from the %q instance, in lane %q", name, lane.FromContext(r.Context()))
		})
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			panic(err)
		}
		wg.Go(func() {
			err := laneshttp.Serve(ctx, &http.Server{Handler: hello}, lis, reg,
				registry.Instance{Service: "orders", Lane: name},
				laneshttp.WithGuard(laneshttp.NewGuard(engine)),
				laneshttp.WithLogger(slog.New(slog.DiscardHandler)))
			if err != nil {
				fmt.Println(err)
			}
		})
	}
	// Serve registers each instance once it serves; wait for the engine to see both.
	for len(engine.Service("orders").Instances()) < 2 {
		time.Sleep(time.Millisecond)
	}

	client := laneshttp.NewClient(engine)
	for _, l := range []string{"alice", "", "bob"} {
		req, _ := http.NewRequestWithContext(lane.WithLane(ctx, l), "GET", "http://orders/hello", nil)
		res, err := client.Do(req)
		if err != nil {
			fmt.Println(err)
			continue
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		fmt.Printf("lane %q: %s\n", l, body)
	}

	client.CloseIdleConnections()
	stop() // each instance deregisters, then shuts down
	wg.Wait()
	// Output:
	// lane "alice": hello from the "alice" instance, in lane "alice"
	// lane "": hello from the "" instance, in lane ""
	// lane "bob": hello from the "" instance, in lane "bob"
}
