//! What a cache miss of `RedisLimits` costs, against a Redis holding a class's entries (as
//! `turnstile limits import` writes them), and what a hit costs:
//!
//! ```text
//! turnstile limits import rules.toml entries.csv --redis-url redis://127.0.0.1:6379
//! cargo run --release -p turnstile-redis --example limits_miss -- rules.toml redis://127.0.0.1:6379
//! ```
//!
//! 1. one miss at a time: `get` answers `Unknown`, then polls until the bucket is cached (the
//!    time a key of a bucket never seen gets its own limit), over 500 buckets;
//! 2. every bucket fetched (prefetch, in waves the queue takes): buckets and entries per
//!    second, and the mean time per bucket within its pipeline;
//! 3. `get` of cached keys: ns per lookup (one thread), against the in-memory source.

use std::time::{Duration, Instant};
use turnstile::keyed::KeyHasher;
use turnstile::rules::limits::{LimitsSource, Lookup, MemoryLimits};
use turnstile::rules::Rules;
use turnstile_redis::limits::bucket_of;
use turnstile_redis::RedisLimits;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let (Some(rules), Some(url)) = (args.get(1), args.get(2)) else {
        return Err("usage: limits_miss RULES REDIS_URL".into());
    };
    let rules = Rules::from_file(rules)?;
    let class = rules
        .classes
        .first()
        .ok_or("the rules have no limits class")?;
    let src = RedisLimits::builder(class).connect(url)?;
    let buckets = src.buckets();
    println!("class {}: {buckets} buckets in {url}", class.name);

    // 1. One miss at a time, each in a bucket not fetched yet.
    let mut lat = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mut id = 1u64;
    while lat.len() < 500 {
        id += 1;
        if !seen.insert(bucket_of(id, buckets)) {
            continue;
        }
        let t = Instant::now();
        assert_eq!(src.get(id), Lookup::Unknown);
        while src.get(id) == Lookup::Unknown {
            if t.elapsed() > Duration::from_secs(5) {
                return Err("a bucket was not fetched within 5 s".into());
            }
            std::hint::spin_loop();
        }
        lat.push(t.elapsed());
    }
    lat.sort_unstable();
    let q = |p: f64| lat[((lat.len() - 1) as f64 * p) as usize].as_secs_f64() * 1e6;
    println!(
        "miss, Unknown to cached (one at a time): median {:.0} us, p90 {:.0} us, p99 {:.0} us",
        q(0.5),
        q(0.9),
        q(0.99)
    );

    // 2. Every other bucket, in waves of 2 000 prefetches (the queue holds 4 096).
    let mut reps = Vec::new();
    let mut i = 0u64;
    while (seen.len() as u64) < buckets && i < buckets * 1000 {
        i += 1;
        if seen.insert(bucket_of(i, buckets)) {
            reps.push(i);
        }
    }
    let before = src.stats();
    let t = Instant::now();
    for (k, wave) in reps.chunks(2000).enumerate() {
        for &id in wave {
            src.prefetch(id);
        }
        let want = ((k * 2000 + wave.len()) as u64).min(reps.len() as u64);
        while src.stats().fetches - before.fetches < want && t.elapsed() < Duration::from_secs(60) {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    let s = src.stats();
    let secs = t.elapsed().as_secs_f64();
    let n = s.fetches - before.fetches;
    println!(
        "bulk: {n} buckets ({} entries cached) in {secs:.2} s: {:.0} buckets/s, {:.0} entries/s; \
         {:.1} us per bucket within its pipeline; {} dropped",
        s.cached_entries,
        n as f64 / secs,
        s.cached_entries as f64 / secs,
        (s.fetch_ns - before.fetch_ns) as f64 / n.max(1) as f64 / 1e3,
        s.dropped
    );

    println!(
        "cache: {} bytes for {} entries ({:.1} per entry)",
        src.bytes(),
        s.cached_entries,
        src.bytes() as f64 / s.cached_entries.max(1) as f64
    );

    // 3. Hits: the same keys through RedisLimits and through the in-memory source.
    let mem = MemoryLimits::new(class, KeyHasher::with_seed(0, 64))?;
    src.export(&mut |id, e| {
        let _ = mem.set(id, e);
    });
    let keys: Vec<u64> = (0..1_000_000u64)
        .map(|i| i.wrapping_mul(0x9e37_79b9) % 1_000_000 + 1)
        .collect();
    for (name, s) in [
        ("RedisLimits", &src as &dyn LimitsSource),
        ("MemoryLimits", &mem as &dyn LimitsSource),
    ] {
        let mut best = f64::MAX;
        for _ in 0..3 {
            let t = Instant::now();
            let mut own = 0u64;
            for &k in &keys {
                own += matches!(s.get(k), Lookup::Own(_)) as u64;
            }
            std::hint::black_box(own);
            best = best.min(t.elapsed().as_secs_f64() * 1e9 / keys.len() as f64);
        }
        println!("hit: {name}::get {best:.0} ns (best of 3 runs of 1M random keys)");
    }
    Ok(())
}
