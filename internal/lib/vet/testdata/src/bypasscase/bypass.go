package bypasscase

import (
	"context"
	"net/http"

	"github.com/lanesdev/lanes/laneshttp"
	nats "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/grpc"
)

const ordersAddr = "dns:///orders:9000"

func clients(ctx context.Context, nc *nats.Conn, js jetstream.JetStream, target string) {
	_, _ = grpc.NewClient("orders:9000")               // want `grpc.NewClient target "orders:9000" is not resolved through lanes`
	_, _ = grpc.NewClient(ordersAddr)                  // want `grpc.NewClient target "dns:///orders:9000" is not resolved`
	_, _ = grpc.Dial("127.0.0.1:9000")                 // want `grpc.Dial target`
	_, _ = grpc.DialContext(ctx, "passthrough:///x:1") // want `grpc.DialContext target "passthrough:///x:1"`
	_, _ = grpc.NewClient("lanes:///orders")
	_, _ = grpc.NewClient(target) // not a constant: cannot tell

	_ = &http.Client{}                                 // want `http.Client without a Transport uses http.DefaultTransport`
	_ = &http.Client{Transport: http.DefaultTransport} // want `http.Client's Transport is not built with laneshttp`
	req, _ := http.NewRequestWithContext(ctx, "GET", "http://orders/", nil)
	_, _ = http.DefaultClient.Do(req)                           // want `http.DefaultClient.Do sends with http.DefaultTransport`
	_, _ = http.DefaultClient.Get("http://orders/")             // want `http.DefaultClient.Get sends with http.DefaultTransport`
	_, _ = (http.DefaultClient).Post("http://orders/", "", nil) // want `http.DefaultClient.Post sends`
	http.DefaultClient.CloseIdleConnections()                   // sends nothing
	_ = &http.Client{Transport: laneshttp.NewTransport()}
	_ = &http.Client{Transport: &laneshttp.Transport{Base: http.DefaultTransport}}
	_ = laneshttp.NewClient()

	_ = nc.Publish("orders.created", nil)           // want `\(\*nats.Conn\).Publish publishes without the lane`
	_ = nc.PublishMsg(&nats.Msg{Subject: "orders"}) // want `\(\*nats.Conn\).PublishMsg publishes without the lane`
	_, _ = js.Publish(ctx, "orders.created", nil)   // want `jetstream Publish publishes without the lane`
	_, _ = js.PublishMsg(ctx, &nats.Msg{})          // want `jetstream PublishMsg publishes`
	_ = nc.Subscribe("orders.created", nil)
}

// Allowed by -lanebypass.allow=bypasscase.registry.
func registry() {
	_, _ = grpc.NewClient("127.0.0.1:2379")
}

// Allowed by -lanebypass.allow=unix:.
func local() {
	_, _ = grpc.NewClient("unix:///run/agent.sock")
}
