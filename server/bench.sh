#!/usr/bin/env bash
# The service benchmark (docs/service.md): redis-benchmark against `turnstile serve` doing
# CL.THROTTLE on each RESP runtime (io_uring and tokio per-core), against redis-server doing
# INCR on the same keys and, given CELL_SO=path/to/libredis_cell.so, against redis-cell's
# CL.THROTTLE, in the same run with the same client, the servers pinned to core 0 and the
# client to core 1, each server first warmed with every key once; ROUNDS interleaved rounds
# (each round measures every server in turn), then the median of the rounds per row. Then wrk
# against POST /v1/check and against an axum hello world (server/examples/http_baseline.rs)
# the same way.
#
#   server/bench.sh                 # N1=200000 requests at -P 1, N16=1000000 at -P 16, 3 rounds
#   N1=50000 N16=200000 ROUNDS=1 server/bench.sh
#   CELL_SO=/tmp/redis-cell/target/release/libredis_cell.so server/bench.sh
#   RUNTIMES="uring per-core multi-thread" server/bench.sh
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
ROUNDS=${ROUNDS:-3}
RUNTIMES=${RUNTIMES:-uring per-core}
CELL_SO=${CELL_SO:-}
TURNSTILE=${TURNSTILE:-target/release/turnstile}
HELLO=target/release/examples/http_baseline
RPORT=16379 CPORT=16378 TPORT=16380 HPORT=18080 WPORT=18090

cargo build --release -q -p turnstile-cli -p turnstile-server --examples
TMP=$(mktemp -d)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    for f in "$TMP"/*.pid; do [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null; done
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

# Server CPU time of process $1, in ns: the time on CPU of each of its threads (schedstat; the
# kernel's work done on their behalf, the io_uring's included, is theirs), exact where the
# user + system ticks of /proc/PID/stat are 10 ms each. Each row also reports the requests per
# server CPU-second, which holds when the client on the other core is the bottleneck (it then
# shows how much of its core the server needed).
TICK=1000000000
cpu() { cat /proc/"$1"/task/*/schedstat 2>/dev/null | awk '{s += $1} END {printf "%.0f", s}'; }
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

# start_turnstile RESP_PORT HTTP_PORT FLAGS...
start_turnstile() {
    local rp=$1 hp=$2
    shift 2
    taskset -c 0 "$TURNSTILE" serve --resp 127.0.0.1:$rp --http 127.0.0.1:$hp --workers 1 \
        --rules examples/rules.toml --throttle-keys 2000000 --watch-every 0 "$@" 2>>"$TMP/serve.log" &
    PIDS+=($!)
    wait_port $rp
    wait_port $hp
    warm $rp CL.THROTTLE key:__rand_int__ 15 30 60
}
stop_last() {
    local p=${PIDS[-1]}
    kill "$p"
    wait "$p" 2>/dev/null || true
    unset 'PIDS[-1]'
}

echo "== machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
# Every RESP server is started and warmed first, then measured in ROUNDS interleaved rounds.
# SERVERS rows: label, port, pid, command.
SERVERS=()
taskset -c 0 redis-server --port $RPORT --bind 127.0.0.1 --save '' --appendonly no \
    --daemonize yes --pidfile "$TMP/redis.pid" >/dev/null
wait_port $RPORT
warm $RPORT incr key:__rand_int__
SERVERS+=("redis-server INCR|$RPORT|$(cat "$TMP/redis.pid")|incr key:__rand_int__")
if [ -n "$CELL_SO" ]; then
    taskset -c 0 redis-server --port $CPORT --bind 127.0.0.1 --save '' --appendonly no \
        --loadmodule "$CELL_SO" --daemonize yes --pidfile "$TMP/cell.pid" >/dev/null
    wait_port $CPORT
    warm $CPORT CL.THROTTLE key:__rand_int__ 15 30 60
    SERVERS+=("redis-cell CL.THROTTLE|$CPORT|$(cat "$TMP/cell.pid")|CL.THROTTLE key:__rand_int__ 15 30 60")
fi
i=0
for rt in $RUNTIMES; do
    start_turnstile $((TPORT + i)) $((HPORT + i)) --runtime "$rt"
    SERVERS+=("turnstile CL.THROTTLE ($rt)|$((TPORT + i))|${PIDS[-1]}|CL.THROTTLE key:__rand_int__ 15 30 60")
    i=$((i + 1))
done
grep -E "io_uring|serving" "$TMP/serve.log" | sed 's/^/   /'
for round in $(seq 1 "$ROUNDS"); do
    echo "== round $round of $ROUNDS, load $(cut -d' ' -f1-3 /proc/loadavg)"
    for P in 1 16; do
        N=$([ "$P" = 1 ] && echo "$N1" || echo "$N16")
        for s in "${SERVERS[@]}"; do
            IFS='|' read -r label port pid command <<<"$s"
            # shellcheck disable=SC2086
            rb "$label" "$port" "$N" "$P" "$pid" $command
        done
    done
done
for p in "${PIDS[@]}"; do kill "$p"; wait "$p" 2>/dev/null || true; done
PIDS=()

# The median of the rounds per row: requests/s, p99, requests per server CPU-second.
echo "== medians of $ROUNDS rounds"
awk '{
        match($0, / -P [0-9]+ /); key = substr($0, 1, RSTART + RLENGTH - 1);
        match($0, /[0-9]+ req\/s/); r = substr($0, RSTART, RLENGTH - 6);
        match($0, /p99 [0-9.]+ ms/); q = substr($0, RSTART + 4, RLENGTH - 7);
        match($0, /[0-9]+ req per server/); c = substr($0, RSTART, RLENGTH - 15);
        if (!(key in n)) order[++k] = key;
        n[key]++; R[key, n[key]] = r; Q[key, n[key]] = q; C[key, n[key]] = c
    }
    function med(A, key, m,    i, j, t, v) {
        for (i = 1; i <= m; i++) v[i] = A[key, i] + 0;
        for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
        return (m % 2) ? v[(m + 1) / 2] : (v[m / 2] + v[m / 2 + 1]) / 2
    }
    END {
        for (i = 1; i <= k; i++) {
            key = order[i];
            printf "%s %12.0f req/s   p99 %.3f ms   %.0f req per server CPU-s   (median of %d)\n", key, med(R, key, n[key]), med(Q, key, n[key]), med(C, key, n[key]), n[key]
        }
    }' "$TMP/results" | tee "$TMP/medians"
# The targets, from the medians: io_uring against redis-server's INCR.
ratio() {
    local a b
    a=$(grep -F "$1" "$TMP/medians" | grep -F -- "-P $3 " | head -1)
    b=$(grep -F "$2" "$TMP/medians" | grep -F -- "-P $3 " | head -1)
    [ -n "$a" ] && [ -n "$b" ] || return 0
    awk -v a="$a" -v b="$b" -v la="$1" -v lb="$2" -v p="$3" 'BEGIN {
        match(a, /[0-9.]+ req per server/); ca = substr(a, RSTART, RLENGTH - 15);
        match(b, /[0-9.]+ req per server/); cb = substr(b, RSTART, RLENGTH - 15);
        match(a, /p99 [0-9.]+/); qa = substr(a, RSTART + 4, RLENGTH - 4);
        match(b, /p99 [0-9.]+/); qb = substr(b, RSTART + 4, RLENGTH - 4);
        printf "-P %-2s %s / %s per server CPU-second: %.2fx; p99 %s ms against %s ms\n", p, la, lb, ca / cb, qa, qb }'
}
for P in 1 16; do
    for rt in $RUNTIMES; do
        ratio "turnstile CL.THROTTLE ($rt)" "redis-server INCR" "$P"
        ratio "turnstile CL.THROTTLE ($rt)" "redis-cell CL.THROTTLE" "$P"
    done
done
echo "(targets, io_uring: -P 1 >= 1.3x INCR per server CPU-second with a p99 no higher; -P 16 >= 2x)"
# The rest measures HTTP: the RESP rows above are kept apart.
mv "$TMP/results" "$TMP/resp-results"

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
start_turnstile $TPORT $HPORT --runtime per-core
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

# POST /v1/check against the hello world: requests/s, and requests per server CPU-second.
rate() { grep -F "$1" "$TMP/results" | grep -F -- "$2" | head -1 | sed -E 's/.* ([0-9]+) req\/s.*/\1/'; }
percpu() { grep -F "$1" "$TMP/results" | grep -F -- "$2" | head -1 | sed -E 's/.* ([0-9]+) req per server CPU-s.*/\1/'; }
awk -v t="$(rate 'turnstile POST /v1/check' 'req/s')" -v h="$(rate 'axum hello world' 'req/s')" \
    'BEGIN {printf "POST /v1/check / axum hello world: %.0f %% (target >= 80 %%)\n", 100 * t / h}'
awk -v t="$(percpu 'turnstile POST /v1/check' 'req/s')" -v h="$(percpu 'axum hello world' 'req/s')" \
    'BEGIN {printf "per server CPU-second: POST /v1/check / axum hello world: %.0f %%\n", 100 * t / h}'
echo "== load at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
