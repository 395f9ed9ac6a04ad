#!/usr/bin/env bash
# Instructions per pipelined CL.THROTTLE in the server's worker thread, by callgrind
# (repeatable on a loaded machine, unlike requests/s; docs/service.md):
#
#   server/callgrind.sh            # N=20000 and N=100000 requests, -P 16, -c 50, 100k keys
#   KEYS=100 ARGS="0 1 3600" server/callgrind.sh      # nearly every request denied, 100 keys
#   KEYS=1000000 ARGS="0 1 3600 2" server/callgrind.sh  # every request denied, mostly new keys
#   SERVE_ARGS="--rules r.toml" CMD="TURNSTILE.CHECK customer __rand_int__" server/callgrind.sh
#
# The server runs under valgrind with one worker while redis-benchmark sends N requests; the
# worker's instruction count is taken for two values of N and the difference divided by the
# difference of N, so that start-up and shutdown cancel out. Needs valgrind and redis-tools.
set -euo pipefail
cd "$(dirname "$0")/.."
N_A=${N_A:-20000}
N_B=${N_B:-100000}
PORT=${PORT:-16395}
TURNSTILE=${TURNSTILE:-target/release/turnstile}
# The default runtime (io_uring); RUNTIME=per-core for tokio's. valgrind runs one thread at a
# time and does not know that io_uring_enter waits: --fair-sched=yes lets the other threads
# (the signal that stops the server among them) have their turn.
RUNTIME=${RUNTIME:-uring}
# The keys redis-benchmark draws from, and CL.THROTTLE's arguments after the key.
KEYS=${KEYS:-100000}
ARGS=${ARGS:-15 30 60}
# The command sent (default CL.THROTTLE with ARGS), and more flags for the server.
CMD=${CMD:-CL.THROTTLE key:__rand_int__ $ARGS}
SERVE_ARGS=${SERVE_ARGS:-}
cargo build --release -q -p turnstile-cli
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

worker_ir() {
    local n=$1
    # shellcheck disable=SC2086 # SERVE_ARGS is several words
    valgrind --tool=callgrind --fair-sched=yes --separate-threads=yes --callgrind-out-file="$TMP/cg.$n" \
        "$TURNSTILE" serve --runtime "$RUNTIME" --workers 1 --resp 127.0.0.1:$PORT --http 127.0.0.1:$((PORT + 1)) \
        --throttle-keys 100000 --snapshot-every 0 --watch-every 0 $SERVE_ARGS 2>"$TMP/log.$n" &
    local vp=$!
    for _ in $(seq 1 600); do
        redis-cli -p $PORT ping >/dev/null 2>&1 && break
        sleep 0.2
    done
    # shellcheck disable=SC2086 # CMD is several words
    redis-benchmark -p $PORT -n "$n" -r "$KEYS" -P 16 -c 50 --csv $CMD >/dev/null 2>&1
    kill -TERM $vp
    wait $vp || true
    # The worker thread is the busiest one.
    for f in "$TMP"/cg.$n-*; do grep -m1 '^summary' "$f" | awk '{print $2}'; done | sort -n | tail -1
}

A=$(worker_ir "$N_A")
B=$(worker_ir "$N_B")
echo "worker Ir: $A at N=$N_A, $B at N=$N_B"
echo "Ir per CL.THROTTLE: $(( (B - A) / (N_B - N_A) ))"
