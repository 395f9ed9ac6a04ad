#!/usr/bin/env bash
# The service benchmark (docs/service.md): builds turnstile and the HTTP baseline, then runs
# `turnstile bench serve`: redis-benchmark against turnstile's CL.THROTTLE (both runtimes),
# redis-server's INCR and, given CELL_SO=path/to/libredis_cell.so, redis-cell's CL.THROTTLE,
# at -P 1 and -P 16; wrk on POST /v1/check and on an axum hello world; server on core 0,
# client on core 1, medians of three interleaved rounds.
#
#   server/bench.sh [FLAGS]                    # e.g. --keys 100k --rounds 5 --plot docs/perf/service.svg
#   CELL_SO=/path/libredis_cell.so server/bench.sh
#
# FLAGS: see `turnstile bench serve --help`. Needs redis-server, redis-tools and wrk
# (apt-get install -y redis-server redis-tools wrk).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p turnstile-cli
cargo build --release -q -p turnstile-server --example http_baseline
exec target/release/turnstile bench serve --http-baseline target/release/examples/http_baseline \
    ${CELL_SO:+--cell-so "$CELL_SO"} "$@"
