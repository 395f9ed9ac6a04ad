#!/usr/bin/env bash
# turnstile-tower's benchmarks (docs/tower.md), each in one run, side by side:
#
#   tower/bench.sh [wrk]       axum hello world (tower/examples/hello.rs) without the layer, with
#                              it by Router::layer and with it around the router, under wrk,
#                              server on core 0, wrk on core 1, ROUNDS rounds interleaved;
#                              prints req/s per round, the ratios per round and their medians
#                              (HEADERS=none: the layer without its rate-limit headers)
#   tower/bench.sh callgrind   instructions per request (valgrind --tool=callgrind) of no layer,
#                              turnstile and tower_governor, with and without their rate-limit
#                              headers (benches/layer.rs); exact and repeatable on a loaded machine
#   tower/bench.sh server      user-space instructions per request of the hello server with and
#                              without the layer, under callgrind, driven by wrk (counters zeroed
#                              after a warm-up); kernel time is not in it
#   tower/bench.sh time        time per request of the same variants, ROUNDS_IN rounds
#                              interleaved (median round of each), server-free, pinned to core 1
#   tower/bench.sh criterion   cargo bench -p turnstile-tower --bench layer (time per request)
#
#   ROUNDS=5 WRK_SECS=10 CONNS=50 HEADERS=ietf tower/bench.sh wrk
#   KEYS="1k 1M" REQUESTS=20000 tower/bench.sh callgrind
#
# Needs wrk and valgrind (apt-get install -y wrk valgrind). Every run is bounded (wrk -d, a
# request count); servers are stopped on exit. Prints the load average before and after:
# figures from a loaded machine are provisional.
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=${1:-wrk}
ROUNDS=${ROUNDS:-5}
WRK_SECS=${WRK_SECS:-10}
CONNS=${CONNS:-50}
HEADERS=${HEADERS:-ietf}
case "$HEADERS" in
ietf | none) ;;
*) echo "HEADERS=$HEADERS: use ietf (the default) or none" >&2; exit 2 ;;
esac
KEYS=${KEYS:-1k 1M}
REQUESTS=${REQUESTS:-20000}
ROUNDS_IN=${ROUNDS_IN:-400}
PORT=${PORT:-3931}
TMP=$(mktemp -d)
PID=""
trap '[ -n "$PID" ] && kill "$PID" 2>/dev/null; rm -rf "$TMP"' EXIT

load() { echo "== $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg) ($1)"; }

wrk_mode() {
    cargo build --release -q -p turnstile-tower --example hello
    local hello=target/release/examples/hello
    wait_port() {
        for _ in $(seq 1 200); do
            (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && return 0
            sleep 0.05
        done
        echo "port $PORT did not open" >&2
        exit 1
    }
    # One wrk run against the server started with "$@"; prints requests/s and requests per
    # second of the server's own CPU time (user + system, /proc/PID/stat): the second holds
    # when the client on the other core, not the server, is what limits requests/s.
    local tick
    tick=$(getconf CLK_TCK)
    run() {
        taskset -c 0 "$hello" --addr "127.0.0.1:$PORT" "$@" 2>/dev/null &
        PID=$!
        wait_port
        # The first request checks the server answers, and with the layer, its headers.
        local head
        head=$(curl -sS -D - -o /dev/null "http://127.0.0.1:$PORT/")
        case "$*" in
        *--no-headers*) ! grep -qi '^ratelimit' <<<"$head" || { echo "unexpected RateLimit header" >&2; exit 1; } ;;
        *--layer*) grep -qi '^ratelimit:' <<<"$head" || { echo "no RateLimit header" >&2; exit 1; } ;;
        *) ! grep -qi '^ratelimit' <<<"$head" || { echo "unexpected RateLimit header" >&2; exit 1; } ;;
        esac
        local c0 c1
        c0=$(awk '{print $14 + $15}' "/proc/$PID/stat")
        taskset -c 1 wrk -t1 -c"$CONNS" -d"${WRK_SECS}s" "http://127.0.0.1:$PORT/" >"$TMP/wrk.out"
        c1=$(awk '{print $14 + $15}' "/proc/$PID/stat")
        kill "$PID"
        wait "$PID" 2>/dev/null || true
        PID=""
        awk -v c=$((c1 - c0)) -v t="$tick" '/requests in/ {n = $1} /Requests\/sec/ {r = $2}
            END {printf "%s %.0f\n", r, (c > 0 ? n * t / c : 0)}' "$TMP/wrk.out"
        if grep -q 'Non-2xx' "$TMP/wrk.out"; then
            echo "non-2xx answers: $(grep 'Non-2xx' "$TMP/wrk.out")" >&2
            exit 1
        fi
    }
    load before
    echo "axum hello world, wrk -t1 -c$CONNS -d${WRK_SECS}s, server on core 0, wrk on core 1"
    echo "req/s, and requests per server CPU-second (cpu-s); the layer by Router::layer"
    echo "(inside) and around the router (outside), rate-limit headers: $HEADERS;"
    echo "ratios against the run without the layer"
    printf "%-6s %10s %10s %7s %10s %7s %11s %7s %7s\n" round without inside ratio outside ratio \
        "cpu-s w/o" inside outside
    local ratios=() cratios=() oratios=() ocratios=()
    median() { sort -n | awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }
    ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.3f", (a > 0 ? b / a : 0)}'; }
    local h=()
    [ "$HEADERS" = none ] && h=(--no-headers)
    for r in $(seq 1 "$ROUNDS"); do
        local a ac b bc o oc
        read -r a ac <<<"$(run)"
        read -r b bc <<<"$(run --layer "${h[@]}")"
        read -r o oc <<<"$(run --layer-outside "${h[@]}")"
        ratios+=("$(ratio "$a" "$b")")
        cratios+=("$(ratio "$ac" "$bc")")
        oratios+=("$(ratio "$a" "$o")")
        ocratios+=("$(ratio "$ac" "$oc")")
        printf "%-6s %10.0f %10.0f %7s %10.0f %7s %11.0f %7s %7s\n" "$r" "$a" "$b" "${ratios[-1]}" \
            "$o" "${oratios[-1]}" "$ac" "${cratios[-1]}" "${ocratios[-1]}"
    done
    printf "median ratio, inside: %s req/s, %s per server CPU-second\n" \
        "$(printf '%s\n' "${ratios[@]}" | median)" "$(printf '%s\n' "${cratios[@]}" | median)"
    printf "median ratio, outside: %s req/s, %s per server CPU-second\n" \
        "$(printf '%s\n' "${oratios[@]}" | median)" "$(printf '%s\n' "${ocratios[@]}" | median)"
    load after
}

callgrind_mode() {
    local bin
    bin=$(bench_bin)
    [ -x "$bin" ] || { echo "bench binary not found" >&2; exit 1; }
    load before
    echo "instructions per request (callgrind), $REQUESTS requests per variant after warm-up;"
    echo "+: added over no layer; ratio: turnstile's added / tower_governor's"
    printf "%-5s %-14s %8s %10s %8s\n" keys layer headers "no headers" none
    for k in $KEYS; do
        local v
        declare -A ir=()
        for v in none turnstile tower_governor turnstile_no_headers tower_governor_no_headers; do
            LAYER_BENCH_KEYS=$k LAYER_BENCH_VARIANT=$v LAYER_BENCH_CALLGRIND=$REQUESTS \
                valgrind --tool=callgrind --collect-atstart=no '--toggle-collect=*cg_run*' \
                --callgrind-out-file="$TMP/$v.out" "$bin" --bench >/dev/null 2>"$TMP/$v.err" ||
                { cat "$TMP/$v.err" >&2; exit 1; }
            ir[$v]=$(sed -n 's/^summary: //p' "$TMP/$v.out")
        done
        awk -v k="$k" -v n="$REQUESTS" -v a="${ir[none]}" -v t="${ir[turnstile]}" \
            -v g="${ir[tower_governor]}" -v tn="${ir[turnstile_no_headers]}" \
            -v gn="${ir[tower_governor_no_headers]}" 'BEGIN {
            printf "%-5s %-14s %8.0f %10.0f %8.0f\n", k, "turnstile", t/n, tn/n, a/n
            printf "%-5s %-14s %8.0f %10.0f\n", k, "tower_governor", g/n, gn/n
            printf "%-5s %-14s %+8.0f %+10.0f\n", k, "turnstile+", (t-a)/n, (tn-a)/n
            printf "%-5s %-14s %+8.0f %+10.0f\n", k, "governor+", (g-a)/n, (gn-a)/n
            printf "%-5s %-14s %8.2f %10.2f\n", k, "ratio", (t-a)/(g-a), (tn-a)/(gn-a) }'
        unset ir
    done
    load after
}

server_mode() {
    cargo build --release -q -p turnstile-tower --example hello
    load before
    echo "hello server under callgrind, wrk -t1 -c10: user-space instructions per request"
    local l
    for l in "" --layer --layer-outside; do
        valgrind --tool=callgrind --callgrind-out-file="$TMP/srv.out" \
            target/release/examples/hello --addr "127.0.0.1:$PORT" $l 2>"$TMP/srv.err" &
        PID=$!
        for _ in $(seq 1 600); do
            (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break
            sleep 0.1
        done
        wrk -t1 -c10 -d3s "http://127.0.0.1:$PORT/" >/dev/null
        callgrind_control -z "$PID" >/dev/null 2>&1
        wrk -t1 -c10 -d"${WRK_SECS}s" "http://127.0.0.1:$PORT/" >"$TMP/wrk.out"
        callgrind_control -d "$PID" >/dev/null 2>&1
        kill "$PID"
        wait "$PID" 2>/dev/null || true
        PID=""
        local n ir
        n=$(awk '/requests in/ {print $1}' "$TMP/wrk.out")
        ir=$(sed -n 's/^summary: //p' "$TMP/srv.out.1")
        printf "%-14s %8d requests %8.0f Ir/request\n" "${l:-no layer}" "$n" "$(awk -v a="$ir" -v b="$n" 'BEGIN {print a / b}')"
        rm -f "$TMP"/srv.out*
    done
    load after
}

bench_bin() {
    cargo bench -p turnstile-tower --bench layer --no-run --message-format=json 2>/dev/null |
        sed -n 's/.*"executable":"\([^"]*layer-[^"]*\)".*/\1/p' | tail -1
}

case "$MODE" in
wrk) wrk_mode ;;
server) server_mode ;;
time)
    bin=$(bench_bin)
    load before
    for k in $KEYS; do LAYER_BENCH_KEYS=$k LAYER_BENCH_ROUNDS=$ROUNDS_IN taskset -c 1 "$bin" --bench; done
    load after
    ;;
callgrind) callgrind_mode ;;
criterion)
    load before
    cargo bench -p turnstile-tower --bench layer -- --warm-up-time 1 --measurement-time 5
    load after
    ;;
*)
    echo "usage: tower/bench.sh [wrk|callgrind|server|time|criterion]" >&2
    exit 2
    ;;
esac
