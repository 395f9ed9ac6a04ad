#!/usr/bin/env bash
# turnstile-tower's benchmarks (docs/tower.md): builds what they run, then runs them.
#
#   tower/bench.sh [wrk] [FLAGS]   the hello server with and without the layer under wrk
#   tower/bench.sh callgrind       instructions per request, in process, beside tower_governor
#   tower/bench.sh server          instructions per request of the hello server under wrk
#   tower/bench.sh time            time per request in process, the variants interleaved
#   tower/bench.sh criterion       cargo bench -p turnstile-tower --bench layer
#
# FLAGS go to `turnstile bench tower MODE` (see its --help: --rounds, --seconds, --headers,
# --keys, --requests ...). Needs wrk and valgrind (apt-get install -y wrk valgrind).
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-wrk}
shift || true
layer_bench() {
    cargo bench -q -p turnstile-tower --bench layer --no-run --message-format=json |
        sed -n 's/.*"executable":"\([^"]*layer-[^"]*\)".*/\1/p' | tail -1
}
case "$mode" in
wrk | server)
    cargo build --release -q -p turnstile-cli -p turnstile-tower --example hello
    exec target/release/turnstile bench tower "$mode" "$@"
    ;;
callgrind)
    cargo build --release -q -p turnstile-cli
    exec target/release/turnstile bench tower callgrind --bench-bin "$(layer_bench)" "$@"
    ;;
time)
    bin=$(layer_bench)
    for k in 1k 1M; do LAYER_BENCH_KEYS=$k LAYER_BENCH_ROUNDS=400 taskset -c 1 "$bin" --bench; done
    ;;
criterion) exec cargo bench -p turnstile-tower --bench layer -- --warm-up-time 1 --measurement-time 5 ;;
*)
    echo "usage: tower/bench.sh [wrk|callgrind|server|time|criterion] [flags of turnstile bench tower MODE]" >&2
    exit 2
    ;;
esac
