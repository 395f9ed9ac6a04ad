#!/usr/bin/env bash
# Instructions redis-server executes per call, by callgrind (repeatable on a loaded machine,
# unlike calls/s; docs/redis.md, "What a call costs"):
#
#   redis/callgrind.sh
#
# One redis-server runs under valgrind; for each row redis-benchmark sends N calls (-P 16,
# -c 8, 10 000 keys) once to warm the keys, then N more between a zeroing and a dump of the
# counters: Ir of the second pass / N. Rows: INCR; an empty script; a store's script of one
# fixed_window (token_bucket) limit called as RedisStore calls it (fast.lua's short
# arguments), and the same script called with driver.lua's arguments (the generic path).
# The scripts are composed as turnstile-redis composes them (src/script.rs). Needs valgrind
# and redis-server / redis-tools.
set -euo pipefail
cd "$(dirname "$0")"
N=${N:-20000}
PORT=${PORT:-16479}
TMP=$(mktemp -d)
valgrind --tool=callgrind --callgrind-out-file="$TMP/cg.%p" \
    redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no >"$TMP/log" 2>&1 &
VP=$!
trap 'kill $VP 2>/dev/null; wait $VP 2>/dev/null; rm -rf "$TMP"' EXIT
for _ in $(seq 1 300); do
    redis-cli -p "$PORT" ping >/dev/null 2>&1 && break
    sleep 0.2
done
PID=$(pgrep -P $VP -f redis-server || echo $VP)

row() {
    local label=$1
    shift
    redis-benchmark -p "$PORT" -c 8 -P 16 -n "$N" -r 10000 -q "$@" >/dev/null 2>&1
    callgrind_control -z "$PID" >/dev/null 2>&1
    redis-benchmark -p "$PORT" -c 8 -P 16 -n "$N" -r 10000 -q "$@" >/dev/null 2>&1
    callgrind_control -d "$PID" >/dev/null 2>&1
    sleep 0.5
    local f ir
    f=$(ls -t "$TMP"/cg.* | head -1)
    ir=$(grep -m1 '^summary' "$f" | awk '{print $2}')
    printf '%-52s %8d Ir per call\n' "$label" $((ir / N))
}

load() { redis-cli -p "$PORT" SCRIPT LOAD "$(cat "$@")"; }
FW=$(load lua/fast.lua lua/prelude.lua lua/fixed_window.lua lua/limits.lua lua/driver.lua)
TB=$(load lua/fast.lua lua/prelude.lua lua/token_bucket.lua lua/limits.lua lua/driver.lua)
EMPTY=$(redis-cli -p "$PORT" SCRIPT LOAD "return 0")
echo "redis-server $(redis-server --version | grep -o 'v=[^ ]*'), $N calls per row"
row "INCR" INCR i:__rand_int__
row "EVALSHA of 'return 0'" EVALSHA "$EMPTY" 0
# Limits as turnstile bench --engine redis has them (1M per second).
row "fixed_window (fast.lua)" EVALSHA "$FW" 1 f:__rand_int__ fw 1 1000000 1000000000 0
row "fixed_window (driver.lua: the generic path)" EVALSHA "$FW" 1 g:__rand_int__ "" 1 c 0 1 fw 1000000 1000000000 0
row "token_bucket (fast.lua)" EVALSHA "$TB" 1 t:__rand_int__ tb 1 1000000 1000 1000000000
row "token_bucket (driver.lua: the generic path)" EVALSHA "$TB" 1 u:__rand_int__ "" 1 c 0 1 tb 1000000 1000 1000000000
