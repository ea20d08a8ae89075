#!/usr/bin/env bash
# bench/smuggling.sh: the request-smuggling table (internal/testkit/smuggletest)
# against the lanes gateway and nginx, side by side (bench/smuggle). Installs
# nginx-light from Debian if it is missing. Everything listens on 127.0.0.1 on
# free ports and is stopped on exit.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
if ! command -v nginx >/dev/null 2>&1 && [ ! -x /usr/sbin/nginx ]; then
	sudo=""
	[ "$(id -u)" -eq 0 ] || sudo="sudo"
	$sudo apt-get update -qq >/dev/null
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq nginx-light >/dev/null
fi
exec go run ./bench/smuggle "$@"
