//! The layer's cost per request, in process: `ServiceExt::oneshot` on a service that answers an
//! empty 200, with no layer, turnstile's layer (keyed by a header, IETF headers on) and
//! tower_governor's `GovernorLayer` (keyed by the same header, its headers on), on the same
//! quota (a bucket of 1M refilled at 1 per ns: nothing is refused), over 1k and 1M keys drawn
//! at random. Each request is built the same way in every variant (that cost is in "none").
//!
//! `cargo bench -p turnstile-tower --bench layer`; results in `docs/tower.md`.

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use futures_util::FutureExt;
use http::{HeaderValue, Request, Response};
use http_body_util::Empty;
use std::convert::Infallible;
use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;
use tower::{Layer, Service, ServiceExt};
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::key_extractor::KeyExtractor;
use tower_governor::{GovernorError, GovernorLayer};
use turnstile::keyed::Store;
use turnstile::{Limit, Limits};
use turnstile_tower::key::Header;
use turnstile_tower::{RateLimitLayer, StoreLimit};

const HEADER: &str = "x-key";

/// tower_governor keyed by the same header (its value as a number).
#[derive(Clone)]
struct HeaderKey;

impl KeyExtractor for HeaderKey {
    type Key = u64;
    fn extract<T>(&self, req: &Request<T>) -> Result<u64, GovernorError> {
        req.headers()
            .get(HEADER)
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

/// A cheap random key index (xorshift), the same sequence in every variant.
struct Keys {
    values: Vec<HeaderValue>,
    x: u64,
}

impl Keys {
    fn new(n: usize) -> Self {
        Self {
            values: (0..n as u64).map(HeaderValue::from).collect(),
            x: 0x9e37_79b9_7f4a_7c15,
        }
    }
    fn next(&mut self) -> Request<Empty<Bytes>> {
        self.x ^= self.x << 13;
        self.x ^= self.x >> 7;
        self.x ^= self.x << 17;
        let v = self.values[(self.x % self.values.len() as u64) as usize].clone();
        Request::builder()
            .header(HEADER, v)
            .body(Empty::new())
            .unwrap()
    }
}

/// A service of the comparison, called the way a server calls it: a clone per request, the
/// response (headers, body) dropped when done, in every variant alike.
trait Variant {
    /// One request, to its status.
    fn one(&self, req: Request<Empty<Bytes>>) -> u16;
    /// One request, to its response headers.
    fn head(&self, req: Request<Empty<Bytes>>) -> http::HeaderMap;
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
    fn head(&self, req: Request<Empty<Bytes>>) -> http::HeaderMap {
        let r = self.clone().oneshot(req).now_or_never().unwrap().unwrap();
        r.headers().clone()
    }
}

/// The three services of one key set, the two layers warmed with `2n` requests each (most
/// keys present).
struct Variants<A, B, C> {
    none: A,
    ours: B,
    theirs: C,
}

fn variants(n: usize) -> Variants<impl Variant, impl Variant, impl Variant> {
    let store = Arc::new(
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
    );
    let ours = RateLimitLayer::new(StoreLimit::new(store, Header::named(HEADER))).layer(empty());
    let conf = GovernorConfigBuilder::default()
        .per_nanosecond(1)
        .burst_size(1_000_000)
        .key_extractor(HeaderKey)
        .use_headers()
        .finish()
        .unwrap();
    let theirs = GovernorLayer::new(conf).layer(empty());
    let (mut a, mut b) = (Keys::new(n), Keys::new(n));
    for _ in 0..n * 2 {
        assert_eq!(ours.one(a.next()), 200);
        assert_eq!(theirs.one(b.next()), 200);
    }
    // Each variant writes what the comparison says it does.
    let none = empty();
    let names = |h: http::HeaderMap| {
        let mut v: Vec<String> = h.keys().map(|k| k.to_string()).collect();
        v.sort();
        v
    };
    assert!(names(none.head(a.next())).is_empty());
    assert_eq!(
        names(ours.head(a.next())),
        ["ratelimit", "ratelimit-policy"]
    );
    assert_eq!(
        names(theirs.head(b.next())),
        ["x-ratelimit-limit", "x-ratelimit-remaining"]
    );
    Variants { none, ours, theirs }
}

// Under callgrind (`LAYER_BENCH_CALLGRIND=N`, see `tower/callgrind.sh`) each variant runs N
// requests in its own function, so that `--toggle-collect=*cg_run_*` counts only them.
macro_rules! cg_run {
    ($name:ident) => {
        #[inline(never)]
        fn $name(svc: &impl Variant, keys: &mut Keys, n: usize) {
            for _ in 0..n {
                black_box(svc.one(keys.next()));
            }
        }
    };
}
cg_run!(cg_run_none);
cg_run!(cg_run_turnstile);
cg_run!(cg_run_tower_governor);

fn key_sets() -> impl Iterator<Item = (&'static str, usize)> {
    // `LAYER_BENCH_KEYS=1k` runs one key set only (e.g. under callgrind).
    let only = std::env::var("LAYER_BENCH_KEYS").ok();
    [("1k", 1_000usize), ("1M", 1_000_000)]
        .into_iter()
        .filter(move |(l, _)| only.as_deref().is_none_or(|o| o == *l))
}

fn bench(c: &mut Criterion) {
    if let Ok(n) = std::env::var("LAYER_BENCH_CALLGRIND") {
        let reqs: usize = n.parse().expect("LAYER_BENCH_CALLGRIND: a request count");
        for (_, n) in key_sets() {
            let v = variants(n);
            // The same key sequence in each variant.
            cg_run_none(&v.none, &mut Keys::new(n), reqs);
            cg_run_turnstile(&v.ours, &mut Keys::new(n), reqs);
            cg_run_tower_governor(&v.theirs, &mut Keys::new(n), reqs);
        }
        return;
    }
    for (label, n) in key_sets() {
        let mut g = c.benchmark_group(format!("layer/{label}"));
        g.throughput(Throughput::Elements(1));
        g.measurement_time(Duration::from_secs(5));
        let v = variants(n);
        let mut keys = Keys::new(n);
        g.bench_function("none", |b| {
            b.iter_batched(|| keys.next(), |req| v.none.one(req), BatchSize::SmallInput)
        });
        g.bench_function("turnstile", |b| {
            b.iter_batched(|| keys.next(), |req| v.ours.one(req), BatchSize::SmallInput)
        });
        g.bench_function("tower_governor", |b| {
            b.iter_batched(
                || keys.next(),
                |req| v.theirs.one(req),
                BatchSize::SmallInput,
            )
        });
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
