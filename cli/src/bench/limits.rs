//! The limits a throughput run uses, for turnstile and for governor: generous enough that
//! almost nothing is denied, so that both engines do the full work of an admitted request,
//! and the same numbers on both sides. `benches/checks.rs` includes this file with `#[path]`.

use governor::Quota;
use std::num::NonZeroU32;
use std::time::Duration;
use turnstile::{Algorithm, Limit};

/// Tokens per second and burst of the token bucket (and of governor's quota).
pub const RATE: u64 = 1_000_000_000;

/// turnstile's limit for a throughput run of `a`.
///
/// The error is spelled out, not `crate::Error`: `benches/checks.rs` includes this file too.
pub fn throughput_limit(a: Algorithm) -> Result<Limit, Box<dyn std::error::Error + Send + Sync>> {
    let l = match a {
        // GCRA with T = 1 ns and τ = 1 s: exactly governor's Quota::per_second(1e9), burst 1e9.
        Algorithm::TokenBucket => Limit::token_bucket(RATE, RATE, Duration::from_secs(1)),
        Algorithm::LeakyBucket => Limit::leaky_bucket(RATE, Duration::from_secs(1), RATE, None),
        // The largest counts the packed layouts hold, over short windows: 1.6e8/s, 1e8/s.
        Algorithm::FixedWindow => Limit::fixed_window(16_000_000, Duration::from_millis(100)),
        Algorithm::SlidingWindow => Limit::sliding_window(1_000_000, Duration::from_millis(10)),
        Algorithm::WindowRing => Limit::window_ring(65_535, Duration::from_millis(1), 8),
        // A log stores 4 bytes per admitted request: keep it small (80 bytes per key); a hot
        // key is then mostly denied, which is still a full check.
        Algorithm::SlidingLog => Limit::sliding_log(16, Duration::from_micros(100)),
        Algorithm::Concurrency => {
            return Err("concurrency limits acquire and release permits; `bench` measures rate checks (choose another --algorithm)".into())
        }
        other => return Err(format!("`bench` has no throughput limit for {other}").into()),
    };
    Ok(l?)
}

/// governor's quota with the token bucket's numbers: 1e9 per second, burst 1e9.
pub fn governor_quota() -> Quota {
    let n = NonZeroU32::new(RATE as u32).expect("non-zero");
    Quota::per_second(n).allow_burst(n)
}

/// The capacity to build a store with so that `keys` distinct keys all get a record. Packed
/// algorithms live in their slots: `keys`. Arena-backed ones (sliding_log, window_ring) get
/// `keys / shards` records per shard, and hashing loads shards unevenly, so the fullest shard
/// would run out of records while its table still has empty slots: 25 % headroom.
pub fn store_capacity(a: Algorithm, keys: u64) -> u64 {
    if a.is_packed() {
        keys
    } else {
        keys + keys / 4 + 16
    }
}
