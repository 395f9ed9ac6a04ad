#!/usr/bin/env bash
# The service benchmark (docs/service.md): redis-benchmark against `turnstile serve` doing
# CL.THROTTLE and against redis-server doing INCR on the same keys, in the same run with the
# same client, the server pinned to core 0 and the client to core 1, each server first warmed
# with every key once; then wrk against
# POST /v1/check and against an axum hello world (server/examples/http_baseline.rs) the same way.
#
#   server/bench.sh                 # N1=200000 requests at -P 1, N16=1000000 at -P 16
#   N1=50000 N16=200000 server/bench.sh
#
# Needs redis-server, redis-tools (redis-benchmark) and wrk: apt-get install -y redis-server
# redis-tools wrk. Every run is bounded (request count, wrk -d); servers are stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
N1=${N1:-200000}
N16=${N16:-1000000}
KEYS=${KEYS:-1000000}
WRK_SECS=${WRK_SECS:-10}
# Customers of the HTTP rows: within examples/rules.toml's capacity of 200 000 keys for the rule
# they hit (past it, every new key evicts the stalest live one: the full-store path, another
# workload).
HKEYS=${HKEYS:-100000}
TURNSTILE=${TURNSTILE:-target/release/turnstile}
HELLO=target/release/examples/http_baseline
RPORT=16379 TPORT=16380 HPORT=18080 WPORT=18090

cargo build --release -q -p turnstile-cli -p turnstile-server --examples
TMP=$(mktemp -d)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    [ -f "$TMP/redis.pid" ] && kill "$(cat "$TMP/redis.pid")" 2>/dev/null || true
    rm -rf "$TMP"
}
trap cleanup EXIT

wait_port() {
    for _ in $(seq 1 200); do
        (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
        sleep 0.05
    done
    echo "port $1 did not open" >&2
    exit 1
}

# Server CPU time (user + system) of process $1, in clock ticks: each row also reports the
# requests per server CPU-second, which holds when the client on the other core is the
# bottleneck (it then shows how much of its core the server needed).
TICK=$(getconf CLK_TCK)
cpu() { awk '{print $14 + $15}' "/proc/$1/stat"; }
SERVER_PID=""
per_cpu() {
    local rps=$1 secs=$2 before=$3 after=$4
    awk -v r="$rps" -v s="$secs" -v b="$before" -v a="$after" -v t="$TICK" \
        'BEGIN {c = (a - b) / t; if (c <= 0) print "n/a"; else printf "%.0f", r * s / c}'
}

# redis-benchmark --csv: "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms",
# "p95_latency_ms","p99_latency_ms","max_latency_ms"; print name, rps and p99.
rb() {
    local label=$1 port=$2 n=$3 p=$4 pid=$5
    shift 5
    local c0 c1 client
    c0=$(cpu "$pid")
    # The client's own CPU time too (bash's `time`: user and system seconds): a client at
    # 100 % of its core, not the server, is then what limits requests/s.
    client=$( { TIMEFORMAT='%U %S'; time taskset -c 1 redis-benchmark -p "$port" -n "$n" -r "$KEYS" -P "$p" -c 50 --csv "$@" >"$TMP/rb.out"; } 2>&1 )
    c1=$(cpu "$pid")
    awk -F'","' -v l="$label" -v p="$p" -v n="$n" -v c="$(( c1 - c0 ))" -v t="$TICK" -v cl="$client" \
        'NR==2 {gsub(/"/,"",$2); gsub(/"/,"",$7); cpu = c / t; split(cl, u, " "); secs = n / $2;
            printf "%-40s -P %-2s %12.0f req/s   p99 %s ms   %s req per server CPU-s   server %.0f %%, client %.0f %% on CPU\n", l, p, $2, $7, (cpu > 0 ? sprintf("%.0f", n / cpu) : "n/a"), 100 * cpu / secs, 100 * (u[1] + u[2]) / secs}' \
        "$TMP/rb.out" | tee -a "$TMP/results"
}

# Every key before measuring, for either server: the rows compare steady states, not the
# first touch of a table (page faults) or the insertion of new keys into it or into Redis's
# dictionary. redis-benchmark draws keys at random: KEYS requests reach only 63 % of them
# (1 - 1/e), 5 x KEYS all but 0.7 %.
warm() {
    taskset -c 1 redis-benchmark -p "$1" -n "$((5 * KEYS))" -r "$KEYS" -P 16 -c 50 -q "${@:2}" >/dev/null 2>&1
}

start_turnstile() {
    taskset -c 0 "$TURNSTILE" serve --resp 127.0.0.1:$TPORT --http 127.0.0.1:$HPORT --workers 1 \
        --rules examples/rules.toml --throttle-keys 2000000 --watch-every 0 "$@" 2>"$TMP/serve.log" &
    PIDS+=($!)
    wait_port $TPORT
    wait_port $HPORT
    warm $TPORT CL.THROTTLE key:__rand_int__ 15 30 60
}
stop_last() {
    local p=${PIDS[-1]}
    kill "$p"
    wait "$p" 2>/dev/null || true
    unset 'PIDS[-1]'
}

echo "== machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
taskset -c 0 redis-server --port $RPORT --bind 127.0.0.1 --save '' --appendonly no \
    --daemonize yes --pidfile "$TMP/redis.pid" >/dev/null
wait_port $RPORT
warm $RPORT incr key:__rand_int__
RPID=$(cat "$TMP/redis.pid")
start_turnstile --runtime per-core
for P in 1 16; do
    N=$([ "$P" = 1 ] && echo "$N1" || echo "$N16")
    rb "redis-server INCR" $RPORT "$N" "$P" "$RPID" incr key:__rand_int__
    rb "turnstile CL.THROTTLE (per-core)" $TPORT "$N" "$P" "${PIDS[-1]}" CL.THROTTLE key:__rand_int__ 15 30 60
done
stop_last
start_turnstile --runtime multi-thread
rb "turnstile CL.THROTTLE (multi-thread)" $TPORT "$N16" 16 "${PIDS[-1]}" CL.THROTTLE key:__rand_int__ 15 30 60
rb "turnstile CL.THROTTLE (multi-thread)" $TPORT "$N1" 1 "${PIDS[-1]}" CL.THROTTLE key:__rand_int__ 15 30 60
stop_last

sed "s/HKEYS/$HKEYS/" >"$TMP/check.lua" <<'LUA'
math.randomseed(1)
request = function()
    local body = '{"key_class":"customer","key":"' .. math.random(1, HKEYS) .. '","route":"/v1/items","method":"GET"}'
    return wrk.format("POST", "/v1/check", { ["content-type"] = "application/json" }, body)
end
LUA
wrk_run() {
    local label=$1 url=$2 pid=$3
    shift 3
    local c0 c1
    c0=$(cpu "$pid")
    taskset -c 1 wrk -t1 -c50 -d"${WRK_SECS}s" --latency "$@" "$url" >"$TMP/wrk.out"
    c1=$(cpu "$pid")
    awk -v l="$label" -v c="$(( c1 - c0 ))" -v t="$TICK" '/Requests\/sec/ {rps=$2} /^ +99%/ {p99=$2} /requests in/ {n=$1} END {cpu = c / t; printf "%-40s %12.0f req/s   p99 %s   %s req per server CPU-s\n", l, rps, p99, (cpu > 0 ? sprintf("%.0f", n / cpu) : "n/a")}' "$TMP/wrk.out" |
        tee -a "$TMP/results"
}
start_turnstile --runtime per-core
# A bounded warm-up pass over the customers first, as for the RESP rows.
taskset -c 1 wrk -t1 -c50 -d2s -s "$TMP/check.lua" "http://127.0.0.1:$HPORT/v1/check" >/dev/null
wrk_run "turnstile POST /v1/check (per-core)" "http://127.0.0.1:$HPORT/v1/check" "${PIDS[-1]}" -s "$TMP/check.lua"
stop_last
taskset -c 0 "$HELLO" 127.0.0.1:$WPORT 1 &
PIDS+=($!)
wait_port $WPORT
# The same client work as for /v1/check (a body built per request by the same script), to /.
sed 's#"/v1/check"#"/"#' "$TMP/check.lua" >"$TMP/hello.lua"
taskset -c 1 wrk -t1 -c50 -d2s -s "$TMP/hello.lua" "http://127.0.0.1:$WPORT/" >/dev/null
wrk_run "axum hello world (POST /)" "http://127.0.0.1:$WPORT/" "${PIDS[-1]}" -s "$TMP/hello.lua"
stop_last

# The issue's two ratios, from the rows above: requests/s, and requests per server CPU-second.
rate() { grep -F "$1" "$TMP/results" | grep -F -- "$2" | head -1 | sed -E 's/.* ([0-9]+) req\/s.*/\1/'; }
percpu() { grep -F "$1" "$TMP/results" | grep -F -- "$2" | head -1 | sed -E 's/.* ([0-9]+) req per server CPU-s.*/\1/'; }
awk -v t="$(rate 'turnstile CL.THROTTLE (per-core)' '-P 16')" -v r="$(rate 'redis-server INCR' '-P 16')" \
    'BEGIN {printf "CL.THROTTLE -P 16 (per-core) / redis-server INCR -P 16: %.2fx (target >= 2x)\n", t / r}'
awk -v t="$(rate 'turnstile POST /v1/check' 'req/s')" -v h="$(rate 'axum hello world' 'req/s')" \
    'BEGIN {printf "POST /v1/check / axum hello world: %.0f %% (target >= 80 %%)\n", 100 * t / h}'
awk -v t="$(percpu 'turnstile CL.THROTTLE (per-core)' '-P 16')" -v r="$(percpu 'redis-server INCR' '-P 16')" \
    'BEGIN {printf "per server CPU-second: CL.THROTTLE -P 16 / INCR -P 16: %.2fx\n", t / r}'
awk -v t="$(percpu 'turnstile POST /v1/check' 'req/s')" -v h="$(percpu 'axum hello world' 'req/s')" \
    'BEGIN {printf "per server CPU-second: POST /v1/check / axum hello world: %.0f %%\n", 100 * t / h}'
echo "== load at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
