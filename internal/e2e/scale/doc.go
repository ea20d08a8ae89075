// Package scale measures the registry at scale on etcd: how fast one instance
// change reaches many watching engines, and what an engine following a large
// service under churn costs. Both run on an embedded etcd and on an etcd
// server process (skipped when there is no etcd binary). The figures are in
// docs/performance.md. It has no code outside its tests.
//
//	go test ./internal/e2e/scale -run '^$' -bench . -benchtime 10x
package scale
