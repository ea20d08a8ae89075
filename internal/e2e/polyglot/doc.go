// Package polyglot holds the end-to-end test of one request crossing services in three
// languages, each joined to lanes its own way: web (Node, OpenTelemetry auto-instrumentation,
// behind `lanes sidecar`), orders (Python's standard library, behind `lanes sidecar`, calling
// over proxyless xDS), payments (Node gRPC, proxyless xDS, `lanes sidecar --direct`) and ledger
// (Go, the lanes SDK): the programs of examples/polyglot, run as docs/languages.md says. It has
// no code outside its tests.
//
// The test skips, saying why, where node, the npm packages of examples/polyglot/package.json or
// Debian's python3-grpcio (for /usr/bin/python3) are missing. It installs nothing unless
// LANES_POLYGLOT_INSTALL=1: then it runs `npm ci` into the cache that .ci/run fills,
// ${LANES_CI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lanes-ci}/polyglot.
package polyglot
