#!/usr/bin/env bash
# What the parts of a function call cost redis-server, by callgrind (docs/redis.md, "Where a
# function call's instructions go"): a probe library whose functions make only the Redis
# calls of a single-limit check, one more each, called as `redis-benchmark -c 8 -P 16` calls
# them (one key of 10 000, three arguments); Ir per call of a second pass of N, beside INCR.
# Needs valgrind, redis-server and redis-benchmark.
set -euo pipefail
N=${N:-5000}
TMP=$(mktemp -d)
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
valgrind --tool=callgrind --callgrind-out-file="$TMP/cg.%p" \
    redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no >"$TMP/log" 2>&1 &
VP=$!
trap 'kill $VP 2>/dev/null; wait $VP 2>/dev/null; rm -rf "$TMP"' EXIT
for _ in $(seq 1 300); do
    redis-cli -p "$PORT" ping >/dev/null 2>&1 && break
    sleep 0.2
done
redis-cli -p "$PORT" -x FUNCTION LOAD >/dev/null <<'LUA'
#!lua name=probe
local function noop(keys, args) return 'x' end
local function time(keys, args) redis.call('TIME') return 'x' end
local function get(keys, args)
  redis.call('TIME')
  redis.call('GET', keys[1])
  return 'x'
end
local function set(keys, args)
  redis.call('TIME')
  redis.call('GET', keys[1])
  redis.call('SET', keys[1], '1763900000123456789', 'PX', 1000)
  return 'x'
end
local function format(keys, args)
  local t = redis.call('TIME')
  redis.call('GET', keys[1])
  redis.call('SET', keys[1], string.format('%d%09d', t[1] + 0, t[2] * 1000), 'PX', 1000 + t[2] % 7)
  return string.format('%d %d %d', 1000000, 999999, 1000)
end
redis.register_function('noop', noop)
redis.register_function('time', time)
redis.register_function('get', get)
redis.register_function('set', set)
redis.register_function('format', format)
LUA
echo "redis-server $(redis-server --version | grep -o 'v=[^ ]*'), $N calls per row"
row() {
    redis-benchmark -p "$PORT" -n "$N" -c 8 -P 16 -r 10000 -q "$@" >/dev/null
    callgrind_control -z "$VP" >/dev/null 2>&1
    redis-benchmark -p "$PORT" -n "$N" -c 8 -P 16 -r 10000 -q "$@" >/dev/null
    callgrind_control -d "$VP" >/dev/null 2>&1
    sleep 0.5
    f=$(ls -t "$TMP"/cg.* | head -1)
    ir=$(grep -m1 '^summary' "$f" | awk '{print $2}')
    printf '%-14s %8d Ir per call\n' "$1 $2" $((ir / N))
}
SPEC='k 1 tb 1000000 1000 1000000000000000'
row INCR k:__rand_int__
for f in noop time get set format; do
    row FCALL "$f" 1 k:__rand_int__ "$SPEC" c 1
done
