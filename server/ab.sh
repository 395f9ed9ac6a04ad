#!/usr/bin/env bash
# A/B of turnstile builds on pipelined CL.THROTTLE, redis-server's INCR in every round
# (`turnstile bench ab`: server on core 0, client on core 1, rounds interleaved, medians).
#
#   cp target/release/turnstile /tmp/turnstile.a    # one build, then another
#   server/ab.sh /tmp/turnstile.a /tmp/turnstile.b [--rounds 5 --pipeline 16 ...]
#
# Needs redis-server and redis-tools.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: server/ab.sh TURNSTILE_BINARY... [flags of turnstile bench ab]" >&2; exit 2; }
cargo build --release -q -p turnstile-cli
exec target/release/turnstile bench ab "$@"
