//! Key sequences for the benchmarks, generated before any timing: a small PRNG (SplitMix64),
//! uniform, Zipf and one-hot-key draws over `n` keys, and the key of each rank.
//!
//! The timed loops only read these sequences; nothing random happens while a clock runs.
//! `benches/checks.rs` includes this file with `#[path]`, so the Criterion benches and
//! `turnstile bench` draw exactly the same keys.

use std::fmt;
use std::str::FromStr;

/// SplitMix64 (Steele, Lea and Flood 2014): 64 bits of state, passes BigCrush, one multiply
/// chain per draw. Good enough for picking keys, and reproducible from its seed.
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix(self.0)
    }

    /// Uniform in `0..n` (multiply-shift; the bias is below n / 2^64).
    #[inline]
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }

    /// Uniform in `[0, 1)` with 53 bits.
    #[inline]
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// The SplitMix64 finalizer: a bijection of `u64` that spreads nearby inputs.
#[inline]
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The key id of the key of popularity rank `rank` (0 is the hottest): a fixed bijection, so
/// ids look like arbitrary customer ids rather than `0..n`, and distinct ranks never collide.
#[inline]
pub fn key_id(rank: u64) -> u64 {
    mix(rank ^ 0x7075_726e_7374_696c)
}

/// How keys are drawn.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Distribution {
    /// Every key equally likely.
    Uniform,
    /// Zipf with exponent `s`: rank k (1-based) has probability ∝ 1/k^s.
    Zipf(f64),
    /// One key only (the hottest).
    Hot,
}

impl fmt::Display for Distribution {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Distribution::Uniform => f.write_str("uniform"),
            Distribution::Zipf(s) if *s == 1.0 => f.write_str("zipf"),
            Distribution::Zipf(s) => write!(f, "zipf:{s}"),
            Distribution::Hot => f.write_str("hot"),
        }
    }
}

impl FromStr for Distribution {
    // Spelled out, not `crate::Error`: `benches/checks.rs` includes this file too.
    type Err = Box<dyn std::error::Error + Send + Sync>;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "uniform" => Ok(Distribution::Uniform),
            "hot" => Ok(Distribution::Hot),
            "zipf" => Ok(Distribution::Zipf(1.0)),
            _ => match s.strip_prefix("zipf:") {
                Some(e) => match e.parse::<f64>() {
                    Ok(x) if x.is_finite() && x > 0.0 && x <= 10.0 => Ok(Distribution::Zipf(x)),
                    _ => Err(format!(
                        "zipf exponent `{e}` must be a number in (0, 10], e.g. zipf:1.0 or zipf:0.8"
                    )
                    .into()),
                },
                None => Err(format!(
                    "unknown distribution `{s}`; expected uniform, zipf, zipf:S (exponent S) or hot"
                )
                .into()),
            },
        }
    }
}

/// Zipf over ranks `1..=n` by rejection-inversion (Hörmann and Derflinger 1996, as in Apache
/// Commons RNG): O(1) per draw, no table, any `n` and `s > 0`.
pub struct Zipf {
    n: f64,
    s: f64,
    h_x1: f64,
    h_n: f64,
    cut: f64,
}

impl Zipf {
    /// Ranks `1..=n` (n ≥ 1) with exponent `s` > 0.
    pub fn new(n: u64, s: f64) -> Self {
        let n = n.max(1) as f64;
        let mut z = Self {
            n,
            s,
            h_x1: 0.0,
            h_n: 0.0,
            cut: 0.0,
        };
        z.h_x1 = z.h_integral(1.5) - 1.0;
        z.h_n = z.h_integral(n + 0.5);
        z.cut = 2.0 - z.h_integral_inv(z.h_integral(2.5) - z.h(2.0));
        z
    }

    /// A rank in `1..=n`.
    pub fn sample(&self, rng: &mut SplitMix64) -> u64 {
        loop {
            let u = self.h_n + rng.unit() * (self.h_x1 - self.h_n);
            let x = self.h_integral_inv(u);
            let k = (x + 0.5).floor().clamp(1.0, self.n);
            if k - x <= self.cut || u >= self.h_integral(k + 0.5) - self.h(k) {
                return k as u64;
            }
        }
    }

    fn h(&self, x: f64) -> f64 {
        (-self.s * x.ln()).exp()
    }

    fn h_integral(&self, x: f64) -> f64 {
        let lx = x.ln();
        helper2((1.0 - self.s) * lx) * lx
    }

    fn h_integral_inv(&self, x: f64) -> f64 {
        let t = (x * (1.0 - self.s)).max(-1.0);
        (helper1(t) * x).exp()
    }
}

/// ln(1 + x) / x, accurate near 0.
fn helper1(x: f64) -> f64 {
    if x.abs() > 1e-8 {
        x.ln_1p() / x
    } else {
        1.0 - x * (0.5 - x * (1.0 / 3.0 - 0.25 * x))
    }
}

/// (e^x − 1) / x, accurate near 0.
fn helper2(x: f64) -> f64 {
    if x.abs() > 1e-8 {
        x.exp_m1() / x
    } else {
        1.0 + x * 0.5 * (1.0 + x / 3.0 * (1.0 + 0.25 * x))
    }
}

/// `len` key ids drawn from `dist` over `n` keys, reproducible from `seed`.
pub fn sequence(dist: Distribution, n: u64, len: usize, seed: u64) -> Vec<u64> {
    ranks(dist, n, len, seed).into_iter().map(key_id).collect()
}

/// The ranks (0 the hottest) behind [`sequence`]: the same draws, before `key_id`.
pub fn ranks(dist: Distribution, n: u64, len: usize, seed: u64) -> Vec<u64> {
    let mut rng = SplitMix64::new(seed);
    match dist {
        Distribution::Uniform => (0..len).map(|_| rng.below(n)).collect(),
        Distribution::Zipf(s) => {
            let z = Zipf::new(n, s);
            (0..len).map(|_| z.sample(&mut rng) - 1).collect()
        }
        Distribution::Hot => vec![0; len],
    }
}

#[cfg(test)]
mod tests {
    #[allow(unused_imports)] // unused where the file is included by a bench (no test harness)
    use super::*;

    #[test]
    fn zipf_matches_the_harmonic_frequencies() {
        let n = 1000u64;
        let z = Zipf::new(n, 1.0);
        let mut rng = SplitMix64::new(7);
        let draws = 400_000;
        let mut counts = vec![0u64; n as usize + 1];
        for _ in 0..draws {
            let k = z.sample(&mut rng);
            assert!((1..=n).contains(&k));
            counts[k as usize] += 1;
        }
        let hn: f64 = (1..=n).map(|k| 1.0 / k as f64).sum();
        for k in [1usize, 2, 10] {
            let want = draws as f64 / (k as f64 * hn);
            let got = counts[k] as f64;
            assert!(
                (got - want).abs() < 0.03 * want,
                "rank {k}: {got} vs {want}"
            );
        }
    }

    #[test]
    fn distributions_parse_and_print() {
        assert_eq!(
            "zipf".parse::<Distribution>().ok(),
            Some(Distribution::Zipf(1.0))
        );
        assert_eq!(
            "zipf:0.8".parse::<Distribution>().ok(),
            Some(Distribution::Zipf(0.8))
        );
        assert!("zipf:-1".parse::<Distribution>().is_err());
        assert!("normal".parse::<Distribution>().is_err());
        assert_eq!(Distribution::Zipf(1.0).to_string(), "zipf");
        assert_eq!(Distribution::Hot.to_string(), "hot");
    }

    #[test]
    fn uniform_ids_are_distinct_per_rank() {
        let ids: std::collections::HashSet<u64> = (0..10_000).map(key_id).collect();
        assert_eq!(ids.len(), 10_000);
        let seq = sequence(Distribution::Uniform, 100, 1000, 1);
        assert!(seq.iter().all(|id| (0..100).any(|r| key_id(r) == *id)));
        let r = ranks(Distribution::Uniform, 100, 1000, 1);
        assert_eq!(seq, r.into_iter().map(key_id).collect::<Vec<_>>());
    }
}
