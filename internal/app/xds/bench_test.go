package xds_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/lanesdev/lanes/internal/app/xds"
	"github.com/lanesdev/lanes/registry"
)

// BenchmarkPushToClients: one instance change reaching 1,000 subscribed
// clients (each an ADS stream on a connection of its own, watching the
// service's baseline endpoints): the time from the registration to each
// client's receipt of the new version, as p50 and p99 (ms), per change.
//
//	go test ./internal/app/xds -run '^$' -bench PushToClients -benchtime 5x
func BenchmarkPushToClients(b *testing.B) {
	const clients = 1000
	f := start(b, xds.Config{Debounce: time.Millisecond})
	f.register(b, registry.Instance{ID: "b0", Service: "orders", Addr: "127.0.0.1:1000"})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	type client struct {
		st  discoverygrpc.AggregatedDiscoveryService_StreamAggregatedResourcesClient
		req *discoverygrpc.DiscoveryRequest
	}
	cs := make([]*client, clients)
	for i := range cs {
		cc, err := grpc.NewClient(f.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { cc.Close() })
		st, err := discoverygrpc.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(ctx)
		if err != nil {
			b.Fatal(err)
		}
		c := &client{st: st, req: &discoverygrpc.DiscoveryRequest{Node: &corev3.Node{Id: fmt.Sprintf("c%d", i)},
			TypeUrl: resource.EndpointType, ResourceNames: []string{"orders/baseline"}}}
		// Subscribed, and holding the endpoints with b0.
		for {
			if err := st.Send(c.req); err != nil {
				b.Fatal(err)
			}
			resp, err := st.Recv()
			if err != nil {
				b.Fatal(err)
			}
			c.req.VersionInfo, c.req.ResponseNonce = resp.VersionInfo, resp.Nonce
			if len(resp.Resources) == 1 && len(resp.Resources[0].Value) > 0 && endpointCount(b, resp) == 1 {
				break
			}
		}
		if err := st.Send(c.req); err != nil { // the ACK
			b.Fatal(err)
		}
		cs[i] = c
	}
	b.ResetTimer()
	var p50, p99 time.Duration
	for n := range b.N {
		var wg sync.WaitGroup
		lat := make([]time.Duration, clients)
		begin := time.Now()
		for i, c := range cs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				resp, err := c.st.Recv()
				if err != nil {
					b.Error(err)
					return
				}
				lat[i] = time.Since(begin)
				c.req.VersionInfo, c.req.ResponseNonce = resp.VersionInfo, resp.Nonce
				c.st.Send(c.req)
			}()
		}
		l := f.register(b, registry.Instance{ID: fmt.Sprintf("b%d", n+1), Service: "orders", Addr: fmt.Sprintf("127.0.0.1:%d", 1001+n%50000)})
		wg.Wait()
		b.StopTimer()
		l.Close() // a change too: taken in before the next round
		for _, c := range cs {
			resp, err := c.st.Recv()
			if err != nil {
				b.Fatal(err)
			}
			c.req.VersionInfo, c.req.ResponseNonce = resp.VersionInfo, resp.Nonce
			c.st.Send(c.req)
		}
		b.StartTimer()
		slices.Sort(lat)
		p50 += lat[clients/2]
		p99 += lat[clients*99/100]
	}
	b.ReportMetric(float64(p50.Microseconds())/1000/float64(b.N), "p50-ms")
	b.ReportMetric(float64(p99.Microseconds())/1000/float64(b.N), "p99-ms")
}
