#!/usr/bin/env bash
# Calls per second of redis-server CPU (user + sys, from INFO cpu before and after), beside
# INCR's, for the rows of redis/callgrind.sh (docs/redis.md, "What a call costs"):
#
#   redis/cpu.sh [ROW...]
#
# One redis-server on a free port; for each row the `calls` example (redis/examples/calls.rs:
# 10 000 keys, 8 tasks sending pipelines of 16) sends N calls once to warm the keys, then N
# more between two reads of the server's CPU time. Unlike Ir, CPU time moves with the
# machine's load (caches, frequency): compare rows of one run. Needs redis-server.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-100000}
ROWS=("$@")
if [ ${#ROWS[@]} -eq 0 ]; then
    ROWS=(incr fixed_window-plain sliding_window-plain fixed_window token_bucket sliding_window)
fi
cargo build --release -q -p turnstile-redis --example calls
CALLS=target/release/examples/calls
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no >/dev/null 2>&1 &
RP=$!
trap 'kill $RP 2>/dev/null; wait $RP 2>/dev/null' EXIT
for _ in $(seq 1 100); do
    redis-cli -p "$PORT" ping >/dev/null 2>&1 && break
    sleep 0.1
done
URL=redis://127.0.0.1:$PORT
cpu() {
    redis-cli -p "$PORT" info cpu | tr -d '\r' |
        awk -F: '/^used_cpu_(user|sys):/ { s += $2 } END { printf "%.6f", s }'
}
echo "redis-server $(redis-server --version | grep -o 'v=[^ ]*'), $N calls per row"
for row in "${ROWS[@]}"; do
    "$CALLS" "$URL" "$row" "$N"
    a=$(cpu)
    "$CALLS" "$URL" "$row" "$N"
    b=$(cpu)
    python3 -c "print('%-24s %10.0f calls per server CPU-s' % ('$row', $N / ($b - $a)))"
done
