//! Distinct keys in bounded memory: exact (a set of 64-bit key hashes) up to [`EXACT`] keys,
//! then a HyperLogLog of 2^12 registers (Flajolet et al. 2007, with the small-range
//! correction), whose standard error is 1.04 / √4096 = 1.6 %. Memory: at most 64 KiB for the
//! set, 4 KiB after. The set is kept small so that it stays in cache: each replayed request
//! adds to one per rule that decided it, and a set of 64k keys made those inserts a sixth of
//! a replay's time (cache misses, measured with perf).

use std::collections::HashSet;
use std::hash::{BuildHasherDefault, Hasher};

/// The hasher of sets and maps whose keys are already 64-bit hashes: the key itself.
#[derive(Default, Clone, Copy)]
pub struct Prehashed(u64);

impl Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8 | b as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn write_u64(&mut self, h: u64) {
        self.0 = h;
    }
}

/// A set of key hashes.
pub type HashSet64 = HashSet<u64, BuildHasherDefault<Prehashed>>;

/// Keys counted exactly before switching to the estimate.
pub const EXACT: usize = 1 << 12;
const P: u32 = 12;
const M: usize = 1 << P;

/// A count of distinct 64-bit hashes.
pub enum Distinct {
    Exact(HashSet64),
    Approx(Box<[u8; M]>),
}

impl Default for Distinct {
    fn default() -> Self {
        Distinct::Exact(HashSet64::default())
    }
}

impl Distinct {
    /// Adds a key's hash (well mixed: the estimate reads its bits).
    #[inline]
    pub fn add(&mut self, h: u64) {
        match self {
            Distinct::Exact(s) => {
                s.insert(h);
                if s.len() > EXACT {
                    let mut regs = Box::new([0u8; M]);
                    for &x in s.iter() {
                        put(&mut regs, x);
                    }
                    *self = Distinct::Approx(regs);
                }
            }
            Distinct::Approx(r) => put(r, h),
        }
    }

    /// The count: exact, or the estimate.
    pub fn count(&self) -> u64 {
        match self {
            Distinct::Exact(s) => s.len() as u64,
            Distinct::Approx(r) => estimate(r),
        }
    }

    /// Whether [`Distinct::count`] is exact.
    pub fn exact(&self) -> bool {
        matches!(self, Distinct::Exact(_))
    }
}

#[inline]
fn put(r: &mut [u8; M], h: u64) {
    // Mixed again (murmur3's finalizer): the estimate reads the top and the low bits, and a
    // fast hash of small integers leaves them poorly spread.
    let h = (h ^ (h >> 33)).wrapping_mul(0xff51_afd7_ed55_8ccd);
    let h = (h ^ (h >> 33)).wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    let h = h ^ (h >> 33);
    let i = (h >> (64 - P)) as usize;
    let rank = ((h << P) | (1 << (P - 1))).leading_zeros() as u8 + 1;
    if rank > r[i] {
        r[i] = rank;
    }
}

fn estimate(r: &[u8; M]) -> u64 {
    let m = M as f64;
    let sum: f64 = r.iter().map(|&x| 2f64.powi(-(x as i32))).sum();
    let e = 0.7213 / (1.0 + 1.079 / m) * m * m / sum;
    let zeros = r.iter().filter(|&&x| x == 0).count();
    if e <= 2.5 * m && zeros > 0 {
        (m * (m / zeros as f64).ln()).round() as u64
    } else {
        e.round() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    #[test]
    fn exact_then_within_five_percent() {
        let h = foldhash::fast::FixedState::with_seed(1);
        let mut d = Distinct::default();
        for i in 0..1000u64 {
            d.add(h.hash_one(i));
            d.add(h.hash_one(i));
        }
        assert_eq!(d.count(), 1000);
        assert!(d.exact());
        for n in [10_000u64, 100_000, 1_000_000] {
            let mut d = Distinct::default();
            for i in 0..n {
                d.add(h.hash_one(i));
            }
            assert!(!d.exact());
            let e = d.count() as f64 / n as f64;
            assert!((0.95..1.05).contains(&e), "{n}: {}", d.count());
        }
    }
}
