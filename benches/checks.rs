//! Checks per second with Criterion: every algorithm keyless and keyed (1k / 1M / 10M keys,
//! uniform / Zipf s = 1 / one hot key), against governor 0.10 on the same quota and the same
//! pre-generated keys; plus the allocator's share in governor's keyed inserts.
//!
//! ```text
//! cargo bench --bench checks                 # everything, ~4 min
//! cargo bench --bench checks -- keyed_1M     # a filter
//! cargo bench --bench checks -- --test       # smoke run: each bench once
//! TURNSTILE_BENCH_MIMALLOC=1 cargo bench --bench checks -- alloc   # same, on mimalloc
//! ```
//!
//! One iteration is [`ITER`] checks over consecutive keys of the sequence (a rolling window,
//! so no RNG in the timed loop), reported as `Throughput::Elements`. Benches are generic over
//! [`Engine`]; the turnstile engines run on the default clock (`TscClock`), governor on
//! its default (quanta). `turnstile bench` runs the same workloads on pinned threads with
//! latency percentiles; results and caveats are in `docs/performance.md`.

use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion, Throughput};
use governor::{DefaultDirectRateLimiter, DefaultKeyedRateLimiter, RateLimiter};
use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::time::Duration;
use turnstile::keyed::Store;
use turnstile::{Algorithm, Clock, Decision, Limiter, Limits, Outcome};

#[allow(dead_code)]
#[path = "../cli/src/bench/keys.rs"]
mod keys;
#[allow(dead_code)]
#[path = "../cli/src/bench/limits.rs"]
mod limits;

use keys::Distribution;

/// The allocator: the system's, or mimalloc when built with `TURNSTILE_BENCH_MIMALLOC` set
/// (the `turnstile` binary always uses mimalloc). Decided at compile time, so every
/// allocation and its free go to the same allocator.
struct BenchAlloc;
const MIMALLOC: bool = option_env!("TURNSTILE_BENCH_MIMALLOC").is_some();

// SAFETY: every method forwards to one allocator chosen by a compile-time constant, so a
// block is always freed or resized by the allocator that made it; both allocators uphold the
// GlobalAlloc contract.
unsafe impl GlobalAlloc for BenchAlloc {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        // SAFETY: the caller's guarantees for `l` are forwarded unchanged.
        unsafe {
            if MIMALLOC {
                mimalloc::MiMalloc.alloc(l)
            } else {
                System.alloc(l)
            }
        }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        // SAFETY: as in `alloc`.
        unsafe {
            if MIMALLOC {
                mimalloc::MiMalloc.alloc_zeroed(l)
            } else {
                System.alloc_zeroed(l)
            }
        }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: `p` was allocated by the same allocator (same constant) with layout `l`.
        unsafe {
            if MIMALLOC {
                mimalloc::MiMalloc.dealloc(p, l)
            } else {
                System.dealloc(p, l)
            }
        }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        // SAFETY: as in `dealloc`; `n` is forwarded unchanged.
        unsafe {
            if MIMALLOC {
                mimalloc::MiMalloc.realloc(p, l, n)
            } else {
                System.realloc(p, l, n)
            }
        }
    }
}

#[global_allocator]
static GLOBAL: BenchAlloc = BenchAlloc;

/// Checks per Criterion iteration.
const ITER: usize = 1024;
/// Keys in each pre-generated sequence (8 MB).
const SEQ_LEN: usize = 1 << 20;
/// Batch size of the `check_batch` benches.
const BATCH: usize = 32;

/// One engine, as the benches see it.
trait Engine: Sync {
    /// One check of cost 1 for `key`; whether admitted.
    fn check(&self, key: u64) -> bool;
    /// A batch; how many admitted.
    fn batch(&self, keys: &[u64], _out: &mut [Decision]) -> usize {
        keys.iter().filter(|&&k| self.check(k)).count()
    }
}

impl<C: Clock> Engine for Store<C> {
    #[inline]
    fn check(&self, key: u64) -> bool {
        Store::check(self, &key, 1).allowed()
    }
    #[inline]
    fn batch(&self, keys: &[u64], out: &mut [Decision]) -> usize {
        self.check_batch(keys, 1, out);
        out.iter().filter(|d| d.allowed()).count()
    }
}
impl<C: Clock> Engine for Limiter<C> {
    #[inline]
    fn check(&self, _key: u64) -> bool {
        Limiter::check(self, 1).allowed()
    }
}
impl Engine for DefaultKeyedRateLimiter<u64> {
    #[inline]
    fn check(&self, key: u64) -> bool {
        self.check_key(&key).is_ok()
    }
}
impl Engine for DefaultDirectRateLimiter {
    #[inline]
    fn check(&self, _key: u64) -> bool {
        RateLimiter::check(self).is_ok()
    }
}

fn blank() -> Decision {
    Decision {
        outcome: Outcome::Allowed,
        limit: 0,
        remaining: 0,
        reset_after_ns: 0,
        retry_after_ns: None,
        delay_ns: 0,
    }
}

/// Benches `e` over rolling windows of `seq`; `batch` > 0 uses `Engine::batch`.
fn bench<E: Engine>(
    g: &mut BenchmarkGroup<'_, criterion::measurement::WallTime>,
    id: &str,
    e: &E,
    seq: &[u64],
    batch: usize,
) {
    let mut out = vec![blank(); batch.max(1)];
    let mut pos = 0usize;
    g.bench_function(id, |b| {
        b.iter(|| {
            let w = &seq[pos..pos + ITER];
            pos = (pos + ITER) % seq.len();
            let n = if batch == 0 {
                w.iter().filter(|&&k| e.check(k)).count()
            } else {
                w.chunks_exact(batch).map(|c| e.batch(c, &mut out)).sum()
            };
            black_box(n)
        })
    });
}

fn group<'a>(
    c: &'a mut Criterion,
    name: &str,
) -> BenchmarkGroup<'a, criterion::measurement::WallTime> {
    let mut g = c.benchmark_group(name);
    g.throughput(Throughput::Elements(ITER as u64))
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(20);
    g
}

/// The algorithms a store or limiter can be benched with (not concurrency: no rate check).
const ALGORITHMS: [Algorithm; 6] = [
    Algorithm::FixedWindow,
    Algorithm::SlidingWindow,
    Algorithm::TokenBucket,
    Algorithm::LeakyBucket,
    Algorithm::SlidingLog,
    Algorithm::WindowRing,
];

fn limits(a: Algorithm) -> Limits {
    Limits::new(vec![limits::throughput_limit(a).expect("valid")]).expect("one limit")
}

fn keyless(c: &mut Criterion) {
    let seq = vec![0u64; SEQ_LEN];
    let mut g = group(c, "keyless");
    for a in ALGORITHMS {
        let l = Limiter::with_limits(limits(a), turnstile::DefaultClock::new());
        bench(&mut g, a.name(), &l, &seq, 0);
    }
    bench(
        &mut g,
        "governor",
        &RateLimiter::direct(limits::governor_quota()),
        &seq,
        0,
    );
    g.finish();
}

fn fill_store(a: Algorithm, n: u64) -> Store {
    let s = Store::builder(limits(a))
        .capacity(limits::store_capacity(a, n))
        .seed(0x7475_726e)
        .build()
        .expect("store");
    for r in 0..n {
        s.check(&keys::key_id(r), 1);
    }
    s
}

fn fill_governor(n: u64) -> DefaultKeyedRateLimiter<u64> {
    let g = RateLimiter::keyed(limits::governor_quota());
    for r in 0..n {
        let _ = g.check_key(&keys::key_id(r));
    }
    g
}

const DISTS: [Distribution; 3] = [
    Distribution::Uniform,
    Distribution::Zipf(1.0),
    Distribution::Hot,
];

/// Every algorithm at `n` keys under `dists`, then governor; `all` = false benches token_bucket
/// only (10M keys: arena algorithms would need 0.8 GB and the fill would dominate the run).
fn keyed(c: &mut Criterion, n: u64, label: &str, dists: &[Distribution], all: bool) {
    let seqs: Vec<Vec<u64>> = dists
        .iter()
        .map(|d| keys::sequence(*d, n, SEQ_LEN, 0x0be7_c4ec_5eed ^ n))
        .collect();
    let group_name = |d: &Distribution| format!("keyed_{label}_{d}");
    let algs: &[Algorithm] = if all {
        &ALGORITHMS
    } else {
        &[Algorithm::TokenBucket]
    };
    for &a in algs {
        let s = fill_store(a, n);
        for (d, seq) in dists.iter().zip(&seqs) {
            let mut g = group(c, &group_name(d));
            bench(&mut g, a.name(), &s, seq, 0);
            if a == Algorithm::TokenBucket {
                bench(
                    &mut g,
                    &format!("{}_batch{BATCH}", a.name()),
                    &s,
                    seq,
                    BATCH,
                );
            }
            g.finish();
        }
    }
    let gov = fill_governor(n);
    for (d, seq) in dists.iter().zip(&seqs) {
        let mut g = group(c, &group_name(d));
        bench(&mut g, "governor", &gov, seq, 0);
        g.finish();
    }
}

fn keyed_1k(c: &mut Criterion) {
    keyed(c, 1_000, "1k", &DISTS, true);
}
fn keyed_1m(c: &mut Criterion) {
    keyed(c, 1_000_000, "1M", &DISTS, true);
}
fn keyed_10m(c: &mut Criterion) {
    keyed(c, 10_000_000, "10M", &DISTS[..2], false);
}

/// The allocator's share: governor's keyed limiter allocates as its DashMap grows (inserts of
/// fresh keys, then frees it all); turnstile's store allocates once, zeroed, and inserts
/// without allocating. Run with and without `TURNSTILE_BENCH_MIMALLOC`.
fn alloc(c: &mut Criterion) {
    const N: u64 = 100_000;
    let alloc = if MIMALLOC { "mimalloc" } else { "system" };
    let mut g = c.benchmark_group(format!("alloc_{alloc}"));
    g.throughput(Throughput::Elements(N))
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
        .sample_size(20);
    g.bench_function("governor_keyed_insert_100k", |b| {
        b.iter(|| black_box(fill_governor(N)))
    });
    g.bench_function("turnstile_store_build_insert_100k", |b| {
        b.iter(|| black_box(fill_store(Algorithm::TokenBucket, N)))
    });
    g.finish();
}

criterion_group!(benches, keyless, keyed_1k, keyed_1m, keyed_10m, alloc);
criterion_main!(benches);
