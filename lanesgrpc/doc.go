// Package lanesgrpc is the gRPC transport of lanes: a gRPC service joins
// lanes with it, as a provider (Serve, the server interceptors, a Guard) and
// as a caller (NewClient, or the resolver, the balancer and the client
// interceptors on their own).
//
// A provider:
//
//	engine := routing.New(routing.WithRegistry(reg), routing.WithPolicyStore(store))
//	srv := lanesgrpc.NewServer(lanesgrpc.WithGuard(lanesgrpc.NewGuard(engine)))
//	pb.RegisterOrdersServer(srv, &orders{})
//	lis, _ := net.Listen("tcp", "10.0.0.7:7001")
//	err := lanesgrpc.Serve(ctx, srv, lis, reg, registry.Instance{Service: "orders"})
//
// The instance registers in the lane of LANES_LANE (or WithLane), and
// deregisters before the server stops. The server interceptors put the lane
// of each request in its context, and the guard refuses the requests that
// may not reach this instance.
//
// Options are typed by role, as grpc-go's DialOption and ServerOption:
// ClientOption for the caller's side, ServerOption for the provider's, and
// Option for the few that mean the same on both.
//
// A caller:
//
//	cc, err := lanesgrpc.NewClient(engine, "orders", lanesgrpc.WithZone("az1"),
//		lanesgrpc.WithDialOptions(grpc.WithTransportCredentials(creds)))
//	client := pb.NewOrdersClient(cc)
//	resp, err := client.Get(ctx, req) // ctx carries the lane of the request being served
//
// # How the parts fit
//
// The resolver (scheme "lanes", see NewBuilder) lists the instances of the
// service as the routing engine sees them: one endpoint per instance,
// carrying its registry.Instance as an attribute, and the engine's handle
// of the service in the state's attributes. The balancer
// ("lanes", registered by this package) keeps one pick_first connection per
// endpoint, as grpc-go's round_robin does, and its picker asks the engine
// for every call (routing.Service.Pick, with the lane and the request key of
// the call's context and the caller's zone), then returns the ready
// connection to the chosen instance. The outcome of each call is reported to
// the engine's outlier detection through balancer.PickResult.Done.
//
// The client interceptors write the lane of the context to the outgoing
// metadata; a canary split, decided at the pick, adds its lane through
// balancer.PickResult.Metadata, so that the metadata always matches the
// instance the call went to, retries included. The server interceptors read
// the lane back into the context on the other side.
//
// See docs/grpc.md for the outcome classification, retries and the guard.
package lanesgrpc
