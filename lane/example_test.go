package lane_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/lanesdev/lanes/lane"
)

func ExampleParse() {
	for _, raw := range []string{" Alice ", "feature-42", "alice;drop", "-alice"} {
		name, err := lane.Parse(raw)
		if err != nil {
			var ne *lane.NameError
			errors.As(err, &ne)
			fmt.Printf("%q: rule %s\n", raw, ne.Rule)
			continue
		}
		fmt.Printf("%q: %s\n", raw, name)
	}
	// Output:
	// " Alice ": alice
	// "feature-42": feature-42
	// "alice;drop": rule characters
	// "-alice": rule starts-or-ends
}

func ExampleWithLane() {
	ctx := lane.WithLane(context.Background(), "alice")
	fmt.Printf("%q\n", lane.FromContext(ctx))

	// A hop that serves the request as baseline clears the lane.
	ctx = lane.WithLane(ctx, "")
	fmt.Printf("%q\n", lane.FromContext(ctx))
	// Output:
	// "alice"
	// ""
}

func ExampleDetach() {
	ctx, cancel := context.WithCancel(lane.WithLane(context.Background(), "alice"))
	bg := lane.Detach(ctx)
	cancel() // the request is over; the background work goes on

	fmt.Println(ctx.Err(), bg.Err(), lane.FromContext(bg))
	// Output:
	// context canceled <nil> alice
}

func ExamplePropagator() {
	p := lane.Propagator{Aliases: []string{"dubbo.tag"}}

	// Server side: read the lane of the incoming request.
	in := http.Header{}
	in.Set("Baggage", "tenant=acme, lane=Alice")
	name, source, err := p.Extract(lane.HTTPHeader(in))
	fmt.Printf("lane %q from %s, err %v\n", name, source, err)
	ctx := lane.WithLane(context.Background(), name)

	// Client side: carry it on to the next hop.
	out := http.Header{}
	p.Inject(ctx, lane.HTTPHeader(out))
	fmt.Println(out.Get("X-Lane"), out.Get("Baggage"))

	// A baseline request removes stale lane headers.
	out.Set("Baggage", "lane=alice,tenant=acme")
	out.Set("Dubbo.tag", "alice")
	p.Inject(context.Background(), lane.HTTPHeader(out))
	fmt.Println(out)
	// Output:
	// lane "alice" from baggage, err <nil>
	// alice lane=alice
	// map[Baggage:[tenant=acme]]
}

func ExamplePropagator_Extract_invalid() {
	in := http.Header{}
	in.Set("X-Lane", "alice;drop")
	name, _, err := lane.Propagator{}.Extract(lane.HTTPHeader(in))
	fmt.Printf("lane %q\n%v\n", name, err)

	// At the edge, refuse it; inside the mesh, route it as baseline and count.
	var ne *lane.NameError
	if errors.As(err, &ne) {
		fmt.Println("400:", ne.Header, ne.Rule)
	}
	// Output:
	// lane ""
	// invalid lane "alice;drop" in header "x-lane": only a-z, 0-9 and '-' are allowed
	// 400: x-lane characters
}
