#!/usr/bin/env bash
# bench/gateway.sh: the lanes gateway against nginx, Caddy and HAProxy, side
# by side.
#
# What it does:
#   1. installs wrk, nginx (nginx-light), caddy, haproxy and curl from Debian
#      if they are missing (apt-get; needs root or sudo);
#   2. builds bench/backend and bench/gatewaybench, and starts two loopback
#      backends, one baseline and one in lane "alice"; each answers "ok" and
#      names its lane in the X-Backend-Lane response header;
#   3. starts the lanes gateway (bench/gatewaybench: internal/app/gateway on an
#      in-memory registry holding the two backends), nginx, Caddy and HAProxy,
#      each with a generated config that sends `x-lane: alice` requests to
#      the alice backend and the rest to the baseline one, keeping upstream
#      connections alive: nginx routes by `map $http_x_lane $backend` to two
#      upstreams (keepalive 64, proxy_http_version 1.1, Connection ""); Caddy
#      by `handle @alice` (header matcher) to two reverse_proxy blocks
#      (keepalive_idle_conns_per_host 64); HAProxy by `use_backend alice if
#      { req.hdr(x-lane) -m str alice }` (mode http, http-keep-alive,
#      nbthread = cores); lanes keeps 512 idle connections per instance;
#   4. runs wrk against each proxy, for baseline requests and for requests
#      with `x-lane: alice`, ROUNDS times, alternating the proxies; a wrk Lua
#      script counts every response that is not a 200 from the expected lane.
#      With GOPROXY_PLAIN=1 (the default), a plain httputil.ReverseProxy with
#      the gateway's transport settings ("goproxy", gatewaybench -plain) runs
#      the baseline case too, to show what Go's proxy costs without lanes;
#      with LOOP=1 (the default), bench/loopproxy ("loop"), a minimal proxy
#      on an event loop (gnet) with no rules, runs both cases, to show what
#      Go can do when it reads a socket only after epoll says it is readable;
#      with LOOP_HEADERS=1 (not the default), the same floor with -parse
#      ("loophdr"), which also parses and rewrites both heads as the
#      gateway does;
#   5. prints requests/s, latency percentiles and the proxy's CPU time per
#      request (user + system, from /proc, nginx workers included) per run,
#      and the median of each column per case, with each proxy's requests/s
#      and p99 as a ratio to nginx's (x nginx); exits 1 if any response came
#      from the wrong lane (or was not a 200), 0 otherwise.
#
# Usage: bench/gateway.sh            (from anywhere in the repository)
# Environment:
#   DURATION=10s    wrk duration of each run
#   THREADS=2       wrk threads
#   CONNS=64        wrk connections
#   ROUNDS=3        runs per proxy and case (the median is reported)
#   WARMUP=2s       a wrk run before measuring each proxy, not counted
#   CPUPROFILE=f    write a CPU profile of the lanes gateway to f
#   HTTP1=fast      the gateway's HTTP/1.1 stack (gateway.Config.HTTP1):
#                   fast (fasthttp, the default) or std (net/http)
#   GOPROXY_PLAIN=0 skip the plain Go reverse proxy
#   LOOP=0          skip the event-loop floor (bench/loopproxy)
#   LOOP_HEADERS=1  also run that floor with its header work (-parse)
#   CADDY=0         skip Caddy
#   HAPROXY=0       skip HAProxy
#   KEEP=1          keep the temporary directory (configs, logs)
#
# Everything listens on 127.0.0.1 on free ports; everything started is
# stopped on exit. The script is not part of `go test`.
set -euo pipefail

DURATION=${DURATION:-10s}
THREADS=${THREADS:-2}
CONNS=${CONNS:-64}
ROUNDS=${ROUNDS:-3}
WARMUP=${WARMUP:-2s}

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

# 1. Tools.
need=()
command -v wrk >/dev/null 2>&1 || need+=(wrk)
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || need+=(nginx-light)
command -v curl >/dev/null 2>&1 || need+=(curl)
[ "${CADDY:-1}" != 1 ] || command -v caddy >/dev/null 2>&1 || need+=(caddy)
[ "${HAPROXY:-1}" != 1 ] || command -v haproxy >/dev/null 2>&1 || [ -x /usr/sbin/haproxy ] || need+=(haproxy)
if [ ${#need[@]} -gt 0 ]; then
	echo "installing ${need[*]} from Debian" >&2
	sudo=""
	[ "$(id -u)" -eq 0 ] || sudo="sudo"
	$sudo apt-get update -qq >/dev/null
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
fi
NGINX=$(command -v nginx || echo /usr/sbin/nginx)

tmp=$(mktemp -d /tmp/lanes-bench.XXXXXX)
pids=()
cleanup() {
	for p in "${pids[@]}"; do
		kill "$p" 2>/dev/null || true
	done
	for p in "${pids[@]}"; do
		wait "$p" 2>/dev/null || true
	done
	if [ "${KEEP:-}" = 1 ]; then
		echo "kept $tmp" >&2
	else
		rm -rf "$tmp"
	fi
}
trap cleanup EXIT

# 2. Backends.
go build -o "$tmp/backend" ./bench/backend
go build -o "$tmp/gatewaybench" ./bench/gatewaybench
[ "${LOOP:-1}" != 1 ] && [ "${LOOP_HEADERS:-0}" != 1 ] || go build -o "$tmp/loopproxy" ./bench/loopproxy

# start NAME CMD...: runs CMD in the background, waits for the address it
# prints on its first line, and sets $addr.
start() {
	local name=$1
	shift
	"$@" >"$tmp/$name.out" 2>"$tmp/$name.err" &
	pids+=($!)
	for _ in $(seq 1 100); do
		if [ -s "$tmp/$name.out" ]; then
			addr=$(head -n1 "$tmp/$name.out")
			return
		fi
		sleep 0.1
	done
	echo "$name did not start:" >&2
	cat "$tmp/$name.err" >&2
	exit 2
}

start backend-baseline "$tmp/backend" -lane ""
base=$addr
start backend-alice "$tmp/backend" -lane alice
alice=$addr

# 3. The proxies.
gwargs=(-baseline "$base" -alice "$alice" -http1 "${HTTP1:-fast}")
[ -n "${CPUPROFILE:-}" ] && gwargs+=(-cpuprofile "$CPUPROFILE")
start lanes "$tmp/gatewaybench" "${gwargs[@]}"
lanes=$addr
lanes_pid=${pids[-1]}
goproxy=""
if [ "${GOPROXY_PLAIN:-1}" = 1 ]; then
	start goproxy "$tmp/gatewaybench" -plain -baseline "$base" -alice "$alice"
	goproxy=$addr
	goproxy_pid=${pids[-1]}
fi
loop="" loop_pid=""
if [ "${LOOP:-1}" = 1 ]; then
	start loop "$tmp/loopproxy" -baseline "$base" -alice "$alice"
	loop=$addr
	loop_pid=${pids[-1]}
fi
loophdr="" loophdr_pid=""
if [ "${LOOP_HEADERS:-0}" = 1 ]; then
	start loophdr "$tmp/loopproxy" -parse -baseline "$base" -alice "$alice"
	loophdr=$addr
	loophdr_pid=${pids[-1]}
fi

nport=$("$tmp/backend" -free-port)
mkdir -p "$tmp/nginx/logs"
cat >"$tmp/nginx/nginx.conf" <<EOF
worker_processes auto;
pid $tmp/nginx/nginx.pid;
error_log $tmp/nginx/logs/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path $tmp/nginx/body;
    proxy_temp_path $tmp/nginx/proxy;
    fastcgi_temp_path $tmp/nginx/fastcgi;
    uwsgi_temp_path $tmp/nginx/uwsgi;
    scgi_temp_path $tmp/nginx/scgi;
    upstream baseline_upstream { server $base; keepalive 64; }
    upstream alice_upstream { server $alice; keepalive 64; }
    map \$http_x_lane \$backend {
        default baseline_upstream;
        alice   alice_upstream;
    }
    server {
        listen 127.0.0.1:$nport;
        location / {
            proxy_pass http://\$backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }
    }
}
EOF
"$NGINX" -p "$tmp/nginx" -c "$tmp/nginx/nginx.conf" -g 'daemon off;' 2>"$tmp/nginx.err" &
pids+=($!)
nginx_pid=$!
for _ in $(seq 1 100); do
	curl -fsS -o /dev/null "http://127.0.0.1:$nport/" 2>/dev/null && break
	sleep 0.1
done
nginx=127.0.0.1:$nport

# waitup ADDR NAME: waits until the proxy at ADDR answers.
waitup() {
	for _ in $(seq 1 100); do
		curl -fsS -o /dev/null "http://$1/" 2>/dev/null && return
		sleep 0.1
	done
	echo "$2 did not answer on $1:" >&2
	cat "$tmp/$2.err" >&2
	exit 2
}

caddy="" caddy_pid=""
if [ "${CADDY:-1}" = 1 ]; then
	cport=$("$tmp/backend" -free-port)
	mkdir -p "$tmp/caddy"
	cat >"$tmp/caddy/Caddyfile" <<EOF
{
	admin off
	auto_https off
}
http://127.0.0.1:$cport {
	@alice header X-Lane alice
	handle @alice {
		reverse_proxy $alice {
			transport http {
				keepalive 90s
				keepalive_idle_conns_per_host 64
			}
		}
	}
	handle {
		reverse_proxy $base {
			transport http {
				keepalive 90s
				keepalive_idle_conns_per_host 64
			}
		}
	}
}
EOF
	XDG_CONFIG_HOME="$tmp/caddy" XDG_DATA_HOME="$tmp/caddy" HOME="$tmp/caddy" \
		caddy run --adapter caddyfile --config "$tmp/caddy/Caddyfile" >"$tmp/caddy.out" 2>"$tmp/caddy.err" &
	pids+=($!)
	caddy_pid=$!
	caddy=127.0.0.1:$cport
	waitup "$caddy" caddy
fi

haproxy="" haproxy_pid=""
if [ "${HAPROXY:-1}" = 1 ]; then
	HAPROXY_BIN=$(command -v haproxy || echo /usr/sbin/haproxy)
	hport=$("$tmp/backend" -free-port)
	cat >"$tmp/haproxy.cfg" <<EOF
global
	maxconn 4096
	nbthread $(nproc)
defaults
	mode http
	option http-keep-alive
	timeout connect 5s
	timeout client 30s
	timeout server 30s
frontend lanes_bench
	bind 127.0.0.1:$hport
	use_backend alice if { req.hdr(x-lane) -m str alice }
	default_backend baseline
backend baseline
	server baseline1 $base
backend alice
	server alice1 $alice
EOF
	"$HAPROXY_BIN" -db -f "$tmp/haproxy.cfg" >"$tmp/haproxy.out" 2>"$tmp/haproxy.err" &
	pids+=($!)
	haproxy_pid=$!
	haproxy=127.0.0.1:$hport
	waitup "$haproxy" haproxy
fi

# Every proxy answers, from the right lane, before any measurement.
for p in "$lanes" "$nginx" $caddy $haproxy $loop $loophdr; do
	for want in baseline alice; do
		h=()
		[ "$want" = baseline ] || h=(-H "x-lane: $want")
		got=$(curl -fsS -D - -o /dev/null "${h[@]}" "http://$p/" | tr -d '\r' | awk -F': ' 'tolower($1)=="x-backend-lane"{print $2}')
		if [ "$got" != "$want" ]; then
			echo "sanity check: $p answered from lane '$got' for '$want'" >&2
			exit 1
		fi
	done
done

# cputicks PID: the CPU time (user + system, in clock ticks) used so far by
# PID and its children (the nginx workers).
cputicks() {
	local t=0 p f
	for p in "$1" $(pgrep -P "$1" || true); do
		f=$(cut -d' ' -f14,15 "/proc/$p/stat" 2>/dev/null) || continue
		t=$((t + ${f% *} + ${f#* }))
	done
	echo $t
}
hz=$(getconf CLK_TCK)

# 4. wrk, with a Lua script that sets the lane and checks every response.
cat >"$tmp/check.lua" <<'EOF'
-- wrk ... -s check.lua -- <lane>: sets x-lane unless <lane> is "baseline",
-- and counts responses that are not a 200 from that lane.
local threads = {}
function setup(thread) table.insert(threads, thread) end
function init(args)
   want = args[1] or "baseline"
   responses, mismatches = 0, 0
   if want ~= "baseline" then wrk.headers["x-lane"] = want end
end
function response(status, headers, body)
   responses = responses + 1
   -- Header names are case-insensitive (HAProxy sends them in lower case).
   local got = headers["X-Backend-Lane"] or headers["x-backend-lane"]
   if status ~= 200 or got ~= want then
      mismatches = mismatches + 1
   end
end
function done(summary, latency, requests)
   local r, m = 0, 0
   for _, t in ipairs(threads) do
      r = r + t:get("responses")
      m = m + t:get("mismatches")
   end
   local e = summary.errors
   io.write(string.format("RESULT rps=%.0f p50=%.3f p90=%.3f p99=%.3f responses=%d mismatches=%d errors=%d\n",
      summary.requests / (summary.duration / 1e6),
      latency:percentile(50) / 1000, latency:percentile(90) / 1000, latency:percentile(99) / 1000,
      r, m, e.connect + e.read + e.write + e.status + e.timeout))
end
EOF

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(uname -sr)"
echo "wrk -t$THREADS -c$CONNS -d$DURATION, $ROUNDS rounds; lanes on $lanes, nginx $("$NGINX" -v 2>&1 | sed 's/.*\///') on $nginx"
[ -z "$caddy" ] || echo "caddy $(caddy version | cut -d' ' -f1) on $caddy"
[ -z "$haproxy" ] || echo "haproxy $("$HAPROXY_BIN" -v | head -n1 | cut -d' ' -f3) on $haproxy"
echo "backends: baseline $base, alice $alice"

for p in "$lanes" "$nginx" $caddy $haproxy $goproxy $loop $loophdr; do
	wrk -t"$THREADS" -c"$CONNS" -d"$WARMUP" "http://$p/" >/dev/null
done

fail=0
results="$tmp/results"
: >"$results"
for round in $(seq 1 "$ROUNDS"); do
	for want in baseline alice; do
		for proxy in lanes nginx caddy haproxy goproxy loop loophdr; do
			case $proxy in
			lanes) p=$lanes pid=$lanes_pid ;;
			nginx) p=$nginx pid=$nginx_pid ;;
			caddy)
				[ -n "$caddy" ] || continue
				p=$caddy pid=$caddy_pid
				;;
			haproxy)
				[ -n "$haproxy" ] || continue
				p=$haproxy pid=$haproxy_pid
				;;
			goproxy)
				# The plain Go proxy knows no lanes: baseline requests only.
				[ -n "$goproxy" ] && [ "$want" = baseline ] || continue
				p=$goproxy pid=$goproxy_pid
				;;
			loop)
				[ -n "$loop" ] || continue
				p=$loop pid=$loop_pid
				;;
			loophdr)
				[ -n "$loophdr" ] || continue
				p=$loophdr pid=$loophdr_pid
				;;
			esac
			c0=$(cputicks "$pid")
			line=$(wrk -t"$THREADS" -c"$CONNS" -d"$DURATION" --latency -s "$tmp/check.lua" "http://$p/" -- "$want" | grep '^RESULT')
			c1=$(cputicks "$pid")
			n=$(sed 's/.*responses=\([0-9]*\).*/\1/' <<<"$line")
			# The proxy's CPU time per request, in microseconds.
			line="$line cpu_us=$(((c1 - c0) * 1000000 / hz / (n > 0 ? n : 1)))"
			echo "round $round  $proxy  $want  ${line#RESULT }"
			echo "$proxy $want ${line#RESULT }" >>"$results"
			mism=$(sed 's/.*mismatches=\([0-9]*\).*/\1/' <<<"$line")
			errs=$(sed 's/.*errors=\([0-9]*\).*/\1/' <<<"$line")
			if [ "$mism" != 0 ] || [ "$errs" != 0 ]; then
				echo "  !! $mism responses from the wrong lane or not 200, $errs socket errors" >&2
				fail=1
			fi
		done
	done
done

# 5. Medians, and the ratios to nginx.
medians="$tmp/medians"
: >"$medians"
for want in baseline alice; do
	for proxy in lanes nginx caddy haproxy goproxy loop loophdr; do
		grep -q "^$proxy $want " "$results" || continue
		awk -v p=$proxy -v w=$want '
			BEGIN { n = 0 }
			$1 == p && $2 == w {
				for (i = 3; i <= NF; i++) { split($i, kv, "="); v[kv[1], n] = kv[2] }
				n++
			}
			function median(k,   i, j, t, a) {
				for (i = 0; i < n; i++) a[i] = v[k, i] + 0
				for (i = 0; i < n; i++) for (j = i + 1; j < n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
				return a[int((n - 1) / 2)]
			}
			END { printf "%s %s %d %.3f %.3f %.3f %d\n", p, w, median("rps"), median("p50"), median("p90"), median("p99"), median("cpu_us") }
		' "$results" >>"$medians"
	done
done
echo
printf '%-7s %-9s %10s %9s %9s %9s %12s %14s %12s\n' proxy request 'req/s' 'p50 ms' 'p90 ms' 'p99 ms' 'CPU us/req' 'req/s x nginx' 'p99 x nginx'
awk '
	{ line[NR] = $0; if ($1 == "nginx") { rps[$2] = $3; p99[$2] = $6 } }
	END {
		for (i = 1; i <= NR; i++) {
			split(line[i], f, " ")
			r = rps[f[2]] > 0 ? sprintf("%.2f", f[3] / rps[f[2]]) : "-"
			q = p99[f[2]] > 0 ? sprintf("%.2f", f[6] / p99[f[2]]) : "-"
			printf "%-7s %-9s %10d %9.3f %9.3f %9.3f %12d %14s %12s\n", f[1], f[2], f[3], f[4], f[5], f[6], f[7], r, q
		}
	}
' "$medians"
echo
# The summary line: every proxy's requests/s as a ratio to nginx's.
awk '
	{ line[NR] = $0; if ($1 == "nginx") rps[$2] = $3 }
	END {
		printf "summary:"
		for (i = 1; i <= NR; i++) {
			split(line[i], f, " ")
			if (f[1] != "nginx" && rps[f[2]] > 0) printf " %s/nginx(%s)=%.2f", f[1], f[2], f[3] / rps[f[2]]
		}
		printf "\n"
	}
' "$medians"
if [ $fail != 0 ]; then
	echo "FAIL: some responses came from the wrong lane" >&2
	exit 1
fi
