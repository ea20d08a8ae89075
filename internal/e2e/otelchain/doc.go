// Package otelchain holds the end-to-end test of one request keeping one lane
// on every hop of a chain of services instrumented with OpenTelemetry
// (otelhttp and otelgrpc, set up as their documentation shows), with lanes'
// and OpenTelemetry's handlers and transports in each order. It has no code
// outside its tests.
package otelchain
