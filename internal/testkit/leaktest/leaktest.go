// Package leaktest holds the goleak options of lanes' tests: every package
// whose tests start goroutines checks in its TestMain that none is left
// behind, with these options, so that what may outlive a test is written
// down once, with its reason.
package leaktest

import "go.uber.org/goleak"

// Options returns the goleak options for a package's TestMain, plus extra
// (a package's own exceptions, each with its reason where it is passed).
//
// The list holds only goroutines that a library starts once per process and
// never stops:
//   - fasthttp's date updater, started by the first connection a fasthttp
//     server serves (the gateway's HTTP/1.1 path), which sleeps in a loop
//     for the life of the process.
//
// The etcd client, the embedded etcd and NATS servers, grpc-go and the
// OpenTelemetry SDK stop all of their goroutines on Close.
func Options(extra ...goleak.Option) []goleak.Option {
	return append([]goleak.Option{
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"),
	}, extra...)
}
