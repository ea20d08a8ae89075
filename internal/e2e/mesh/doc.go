// Package meshtest holds the end-to-end test of lanes across a chain of real
// services: HTTP and gRPC hops (one of them a server stream), a goroutine hop,
// registration with leases in etcd, and a lane instance killed with SIGKILL.
// It has no code outside its tests.
package mesh
