//! The layer's cost per request, in process: `ServiceExt::oneshot` on a service that answers an
//! empty 200, with no layer, turnstile's layer (keyed by a header, IETF headers on) and
//! tower_governor's `GovernorLayer` (keyed by the same header, its headers on), on the same
//! quota (a bucket of 1M refilled at 1 per ns: nothing is refused), over 1k and 1M keys drawn
//! at random; then each layer without its headers. Each request is built the same way in
//! every variant (in criterion, outside the timed part; under callgrind, counted in "none").
//!
//! `cargo bench -p turnstile-tower --bench layer`, or `tower/bench.sh callgrind` for
//! instructions per request; results in `docs/tower.md`.

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use futures_util::FutureExt;
use http::{HeaderName, HeaderValue, Request, Response};
use http_body_util::Empty;
use std::convert::Infallible;
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tower::{Layer, Service, ServiceExt};
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::key_extractor::KeyExtractor;
use tower_governor::{GovernorError, GovernorLayer};
use turnstile::keyed::Store;
use turnstile::{Limit, Limits};
use turnstile_tower::key::Header;
use turnstile_tower::{HeaderStyle, RateLimitLayer, StoreLimit};

const HEADER: &str = "x-key";

/// tower_governor keyed by the same header (its value as a number, the cheapest key it
/// takes), looked up by a prebuilt name as turnstile's extractor does.
#[derive(Clone)]
struct HeaderKey;

impl KeyExtractor for HeaderKey {
    type Key = u64;
    fn extract<T>(&self, req: &Request<T>) -> Result<u64, GovernorError> {
        static NAME: HeaderName = HeaderName::from_static(HEADER);
        req.headers()
            .get(&NAME)
            .and_then(|v| v.to_str().ok())
            .and_then(|s| s.parse().ok())
            .ok_or(GovernorError::UnableToExtractKey)
    }
}

fn empty() -> impl Service<
    Request<Empty<Bytes>>,
    Response = Response<axum::body::Body>,
    Error = Infallible,
    Future = std::future::Ready<Result<Response<axum::body::Body>, Infallible>>,
> + Clone {
    tower::service_fn(|_req: Request<Empty<Bytes>>| {
        std::future::ready(Ok::<_, Infallible>(
            Response::new(axum::body::Body::empty()),
        ))
    })
}

/// A cheap random key index (xorshift), the same sequence in every variant. Each request's key
/// value is formatted afresh, as a server parses it out of the bytes it has just read: its bytes
/// are in the cache. `LAYER_BENCH_KEY_TABLE=1` clones it from a table of every key's value
/// built at the start instead (as this bench did before): at 1M keys each read of the key's
/// bytes then misses the cache, in the layers alone (the variant without one never reads them),
/// a miss no server pays.
struct Keys {
    n: u64,
    table: Option<Vec<HeaderValue>>,
    x: u64,
}

impl Keys {
    fn new(n: usize) -> Self {
        let table = std::env::var_os("LAYER_BENCH_KEY_TABLE")
            .is_some_and(|v| v == "1")
            .then(|| (0..n as u64).map(HeaderValue::from).collect());
        Self {
            n: n as u64,
            table,
            x: 0x9e37_79b9_7f4a_7c15,
        }
    }
    fn next(&mut self) -> Request<Empty<Bytes>> {
        self.x ^= self.x << 13;
        self.x ^= self.x >> 7;
        self.x ^= self.x << 17;
        let i = self.x % self.n;
        let v = match &self.table {
            Some(t) => t[i as usize].clone(),
            None => HeaderValue::from(i),
        };
        Request::builder()
            .header(HEADER, v)
            .body(Empty::new())
            .unwrap()
    }
}

/// A service of the comparison, called the way a server calls it: a clone per request, the
/// response (headers, body) dropped when done, in every variant alike (each behind the same
/// one dynamic call).
trait Variant {
    /// One request, to its status.
    fn one(&self, req: Request<Empty<Bytes>>) -> u16;
    /// One request, to its response header names.
    fn head(&self, req: Request<Empty<Bytes>>) -> Vec<String>;
}

impl<S, B> Variant for S
where
    S: Service<Request<Empty<Bytes>>, Response = Response<B>, Error = Infallible> + Clone,
{
    #[inline(always)]
    fn one(&self, req: Request<Empty<Bytes>>) -> u16 {
        let r = self.clone().oneshot(req).now_or_never().unwrap().unwrap();
        black_box(r.status()).as_u16()
    }
    fn head(&self, req: Request<Empty<Bytes>>) -> Vec<String> {
        let r = self.clone().oneshot(req).now_or_never().unwrap().unwrap();
        let mut v: Vec<String> = r.headers().keys().map(|k| k.to_string()).collect();
        v.sort();
        v
    }
}

/// The variants, by name: no layer; each layer with its rate-limit headers (the comparison)
/// and without (what its check costs alone).
const VARIANTS: [&str; 5] = [
    "none",
    "turnstile",
    "tower_governor",
    "turnstile_no_headers",
    "tower_governor_no_headers",
];

/// Variant `name` over `n` keys; a layer is warmed with `2n` requests (most keys present),
/// and each variant is checked to write the headers the comparison says it does.
fn variant(name: &str, n: usize) -> Box<dyn Variant> {
    let store = || {
        Arc::new(
            Store::builder(
                Limits::new(vec![Limit::token_bucket(
                    1_000_000,
                    1_000_000_000,
                    Duration::from_secs(1),
                )
                .unwrap()])
                .unwrap(),
            )
            .capacity(n as u64 + n as u64 / 4)
            .build()
            .unwrap(),
        )
    };
    let ours = |headers| {
        RateLimitLayer::builder(StoreLimit::new(store(), Header::named(HEADER)))
            .headers(headers)
            .build()
            .layer(empty())
    };
    let theirs = || {
        GovernorConfigBuilder::default()
            .per_nanosecond(1)
            .burst_size(1_000_000)
            .key_extractor(HeaderKey)
    };
    let (v, headers): (Box<dyn Variant>, &[&str]) = match name {
        "none" => (Box::new(empty()), &[]),
        "turnstile" => (
            Box::new(ours(HeaderStyle::Ietf)),
            &["ratelimit", "ratelimit-policy"],
        ),
        "turnstile_no_headers" => (Box::new(ours(HeaderStyle::None)), &[]),
        "tower_governor" => (
            Box::new(GovernorLayer::new(theirs().use_headers().finish().unwrap()).layer(empty())),
            &["x-ratelimit-limit", "x-ratelimit-remaining"],
        ),
        "tower_governor_no_headers" => (
            Box::new(GovernorLayer::new(theirs().finish().unwrap()).layer(empty())),
            &[],
        ),
        _ => panic!("no variant {name}: one of {VARIANTS:?}"),
    };
    let mut keys = Keys::new(n);
    if name != "none" {
        for _ in 0..n * 2 {
            assert_eq!(v.one(keys.next()), 200);
        }
    }
    assert_eq!(v.head(keys.next()), headers, "{name}");
    v
}

/// Under callgrind (`LAYER_BENCH_CALLGRIND=N`, `LAYER_BENCH_VARIANT=NAME`, see
/// `tower/bench.sh callgrind`) the variant runs N requests here, so that
/// `--toggle-collect=*cg_run*` counts only them.
#[inline(never)]
fn cg_run(v: &dyn Variant, keys: &mut Keys, n: usize) {
    for _ in 0..n {
        black_box(v.one(keys.next()));
    }
}

fn key_sets() -> impl Iterator<Item = (&'static str, usize)> {
    // `LAYER_BENCH_KEYS=1k` runs one key set only.
    let only = std::env::var("LAYER_BENCH_KEYS").ok();
    [("1k", 1_000usize), ("1M", 1_000_000)]
        .into_iter()
        .filter(move |(l, _)| only.as_deref().is_none_or(|o| o == *l))
}

/// `LAYER_BENCH_ROUNDS=R` (`tower/bench.sh time`): time per request of every variant in R
/// interleaved rounds (each round times `BATCH` requests of each variant in turn), then the
/// median round of each. On a shared machine this is steadier than criterion, which runs the
/// variants one after the other: a busy spell slows every variant's rounds alike.
fn interleaved(rounds: usize) {
    const BATCH: usize = 1000;
    for (label, n) in key_sets() {
        let vs: Vec<Box<dyn Variant>> = VARIANTS.iter().map(|v| variant(v, n)).collect();
        let mut keys = Keys::new(n);
        let mut ns = vec![Vec::with_capacity(rounds); vs.len()];
        for _ in 0..rounds {
            for (v, t) in vs.iter().zip(&mut ns) {
                let reqs: Vec<_> = (0..BATCH).map(|_| keys.next()).collect();
                let start = Instant::now();
                for r in reqs {
                    black_box(v.one(r));
                }
                t.push(start.elapsed().as_nanos() as f64 / BATCH as f64);
            }
        }
        let median = |t: &mut Vec<f64>| {
            t.sort_by(f64::total_cmp);
            t[t.len() / 2]
        };
        let m: Vec<f64> = ns.iter_mut().map(median).collect();
        println!("{label} keys, {rounds} rounds of {BATCH} requests, median ns per request:");
        for (name, t) in VARIANTS.iter().zip(&m) {
            println!("  {name:<26} {t:8.1}  added {:+8.1}", t - m[0]);
        }
        println!(
            "  ratio of added costs, turnstile / tower_governor: {:.2} with headers, {:.2} without",
            (m[1] - m[0]) / (m[2] - m[0]),
            (m[3] - m[0]) / (m[4] - m[0])
        );
    }
}

fn bench(c: &mut Criterion) {
    if let Ok(r) = std::env::var("LAYER_BENCH_ROUNDS") {
        interleaved(r.parse().expect("LAYER_BENCH_ROUNDS: a round count"));
        return;
    }
    if let Ok(reqs) = std::env::var("LAYER_BENCH_CALLGRIND") {
        let reqs: usize = reqs
            .parse()
            .expect("LAYER_BENCH_CALLGRIND: a request count");
        let name = std::env::var("LAYER_BENCH_VARIANT").expect("LAYER_BENCH_VARIANT");
        for (_, n) in key_sets() {
            cg_run(&*variant(&name, n), &mut Keys::new(n), reqs);
        }
        return;
    }
    for (label, n) in key_sets() {
        let mut g = c.benchmark_group(format!("layer/{label}"));
        g.throughput(Throughput::Elements(1));
        g.measurement_time(Duration::from_secs(5));
        let mut keys = Keys::new(n);
        for name in VARIANTS {
            let v = variant(name, n);
            g.bench_function(name, |b| {
                b.iter_batched(|| keys.next(), |req| v.one(req), BatchSize::SmallInput)
            });
        }
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
