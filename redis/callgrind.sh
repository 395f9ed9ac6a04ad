#!/usr/bin/env bash
# Instructions redis-server executes per call, by callgrind (repeatable on a loaded machine,
# unlike calls/s; docs/redis.md, "What a call costs"):
#
#   redis/callgrind.sh [ROW...]
#
# One redis-server runs under valgrind on a free port; for each row the `calls` example
# (redis/examples/calls.rs: 10 000 keys, 8 tasks sending pipelines of 16, or 128 calls in
# flight) sends N calls once to warm the keys, then N more between a zeroing and a dump of
# the counters: Ir of the second pass / N. Needs valgrind, redis-server and a release build
# of the example (built here).
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-20000}
ROWS=("$@")
if [ ${#ROWS[@]} -eq 0 ]; then
    ROWS=(incr fixed_window-plain sliding_window-plain fixed_window token_bucket fixed_window-packed token_bucket-packed fixed_window-leased
        sliding_window leaky_bucket sliding_window-packed leaky_bucket-packed
        sliding_log window_ring concurrency rules-1 rules-3)
fi
cargo build --release -q -p turnstile-redis --example calls
CALLS=target/release/examples/calls
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
TMP=$(mktemp -d)
valgrind --tool=callgrind --callgrind-out-file="$TMP/cg.%p" \
    redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no >"$TMP/log" 2>&1 &
VP=$!
trap 'kill $VP 2>/dev/null; wait $VP 2>/dev/null; rm -rf "$TMP"' EXIT
for _ in $(seq 1 300); do
    redis-cli -p "$PORT" ping >/dev/null 2>&1 && break
    sleep 0.2
done
URL=redis://127.0.0.1:$PORT
echo "redis-server $(redis-server --version | grep -o 'v=[^ ]*'), $N calls per row"
for row in "${ROWS[@]}"; do
    "$CALLS" "$URL" "$row" "$N"
    callgrind_control -z "$VP" >/dev/null 2>&1
    "$CALLS" "$URL" "$row" "$N"
    callgrind_control -d "$VP" >/dev/null 2>&1
    sleep 0.5
    f=$(ls -t "$TMP"/cg.* | head -1)
    ir=$(grep -m1 '^summary' "$f" | awk '{print $2}')
    printf '%-24s %8d Ir per call\n' "$row" $((ir / N))
done
