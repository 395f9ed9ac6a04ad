#!/usr/bin/env bash
# A/B of turnstile builds on the pipelined CL.THROTTLE row of server/bench.sh, with
# redis-server's INCR in every round: each round starts redis-server and then each build in
# turn (server on core 0, redis-benchmark on core 1), warms it with 5 x KEYS random keys,
# measures 1M requests at -P 16 -c 50, and prints requests/s and requests per server
# CPU-second (/proc/PID/stat). Rounds interleave the builds, so that a machine's drift over
# the run touches every build alike.
#
#   cp target/release/turnstile /tmp/turnstile.a    # one build, then another
#   ROUNDS=3 server/ab.sh /tmp/turnstile.a /tmp/turnstile.b
#
# Needs redis-server and redis-tools. Every run is bounded (request counts); servers are
# stopped after each measurement.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: server/ab.sh TURNSTILE_BINARY..." >&2; exit 2; }
ROUNDS=${ROUNDS:-3}
KEYS=${KEYS:-1000000}
N=${N:-1000000}
TICK=$(getconf CLK_TCK)
PID=""
trap '[ -n "$PID" ] && kill "$PID" 2>/dev/null || true' EXIT

wait_port() {
    for _ in $(seq 1 200); do
        (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
        sleep 0.05
    done
    echo "port $1 did not open" >&2
    exit 1
}

# measure PORT LABEL COMMAND...: one run of N requests against the server $PID.
measure() {
    local port=$1 label=$2 c0 c1 rps
    shift 2
    taskset -c 1 redis-benchmark -p "$port" -n "$((5 * KEYS))" -r "$KEYS" -P 16 -c 50 -q "$@" >/dev/null 2>&1
    c0=$(awk '{print $14 + $15}' "/proc/$PID/stat")
    rps=$(taskset -c 1 redis-benchmark -p "$port" -n "$N" -r "$KEYS" -P 16 -c 50 --csv "$@" | tail -1 | cut -d, -f2 | tr -d '"')
    c1=$(awk '{print $14 + $15}' "/proc/$PID/stat")
    awk -v l="$label" -v r="$rps" -v n="$N" -v c=$((c1 - c0)) -v t="$TICK" \
        'BEGIN {printf "%-28s %12.0f req/s %12s req per server CPU-s\n", l, r, (c > 0 ? sprintf("%.0f", n * t / c) : "n/a")}'
    kill "$PID"
    wait "$PID" 2>/dev/null || true
    PID=""
}

echo "== $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq 1 "$ROUNDS"); do
    taskset -c 0 redis-server --port 16389 --bind 127.0.0.1 --save '' --appendonly no >/dev/null &
    PID=$!
    wait_port 16389
    measure 16389 "$r redis-server INCR" incr key:__rand_int__
    for b in "$@"; do
        taskset -c 0 "$b" serve --resp 127.0.0.1:16390 --http 127.0.0.1:16391 --workers 1 \
            --throttle-keys 2000000 --watch-every 0 --snapshot-every 0 2>/dev/null &
        PID=$!
        wait_port 16390
        measure 16390 "$r $(basename "$b")" CL.THROTTLE key:__rand_int__ 15 30 60
    done
done
echo "== load at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
