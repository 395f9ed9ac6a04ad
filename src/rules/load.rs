//! The load signal and priority shedding.
//!
//! The load is `max(in_flight / max_in_flight, reported utilization)`: requests the engine
//! admitted and the application has not finished yet ([`super::Engine::admit`] and
//! [`super::Engine::enter`] guards), and whatever utilization the application reports
//! ([`super::Engine::report_utilization`], e.g. busy workers or CPU, 0..=1).
//!
//! The in-flight counter is sharded and cache-padded (every admitted request writes it twice);
//! a thread picks its shard from the address of a thread-local, and a guard gives back to the
//! shard it took from, so no shard goes negative. Reading the load sums the shards: that
//! happens on checks only when some rule or the shedder needs it, at most once per `sample`
//! interval (0: every such check).
//!
//! Shedding keeps one bit per priority: set when the load reaches its `on` threshold, cleared
//! when it falls under `off` (hysteresis: between the two the bit keeps its state, so the
//! shedder does not flap at a threshold). Independently, non-critical requests are shed while
//! the load is at or above `1 - critical_reserve`, keeping that share for critical ones.

use super::model::{LoadSettings, Shedding};
use super::request::Priority;
use crate::clock::{nanos, Nanos};
use crate::sync::{AtomicU32, AtomicU64, Ordering};
use crossbeam_utils::CachePadded;
use std::cell::Cell;

thread_local! {
    static ANCHOR: Cell<u8> = const { Cell::new(0) };
}

/// Load settings compiled for the check path.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LoadConfig {
    inv_max: f64,
    sample_ns: u64,
}

impl LoadConfig {
    pub(crate) fn new(s: &LoadSettings) -> Self {
        Self {
            inv_max: s.max_in_flight.map_or(0.0, |m| 1.0 / m.max(1) as f64),
            sample_ns: nanos(s.sample),
        }
    }
}

/// Dynamic load state, kept across reloads.
pub(crate) struct Load {
    in_flight: Box<[CachePadded<AtomicU64>]>,
    reported: AtomicU64,
    sampled: AtomicU64,
    last: AtomicU64,
    shed: AtomicU32,
    shed_counts: Box<[CachePadded<[AtomicU64; 4]>]>,
}

impl Load {
    pub(crate) fn new() -> Self {
        let n = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .clamp(1, 64)
            .next_power_of_two();
        Self {
            in_flight: (0..n)
                .map(|_| CachePadded::new(AtomicU64::new(0)))
                .collect(),
            reported: AtomicU64::new(0f64.to_bits()),
            sampled: AtomicU64::new(0f64.to_bits()),
            last: AtomicU64::new(0),
            shed: AtomicU32::new(0),
            shed_counts: (0..n)
                .map(|_| CachePadded::new(std::array::from_fn(|_| AtomicU64::new(0))))
                .collect(),
        }
    }

    /// Number of shards (a power of two).
    pub(crate) fn shards(&self) -> usize {
        self.in_flight.len()
    }

    /// Counts a shed request.
    #[inline]
    pub(crate) fn count_shed(&self, p: Priority) {
        // Relaxed: statistics; nothing is published through them.
        self.shed_counts[self.shard()][p.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Shed requests per priority.
    pub(crate) fn shed_counts(&self) -> [u64; 4] {
        // Relaxed: statistics.
        std::array::from_fn(|i| {
            self.shed_counts
                .iter()
                .map(|c| c[i].load(Ordering::Relaxed))
                .sum()
        })
    }

    /// The calling thread's shard.
    #[inline]
    pub(crate) fn shard(&self) -> usize {
        let a = ANCHOR.with(|c| c as *const Cell<u8> as usize);
        ((a >> 4).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40) & (self.in_flight.len() - 1)
    }

    /// One more request in flight on shard `s`.
    #[inline]
    pub(crate) fn enter(&self, s: usize) {
        // Relaxed: a statistic read by the load estimate; no data is published through it.
        self.in_flight[s].fetch_add(1, Ordering::Relaxed);
    }

    /// One fewer on shard `s` (the one `enter` used).
    #[inline]
    pub(crate) fn exit(&self, s: usize) {
        // Relaxed: as in `enter`.
        self.in_flight[s].fetch_sub(1, Ordering::Relaxed);
    }

    /// Requests in flight (a sum of shards, not linearizable).
    pub(crate) fn in_flight(&self) -> u64 {
        // Relaxed: as in `enter`.
        self.in_flight
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .fold(0u64, u64::wrapping_add)
    }

    /// Stores a reported utilization (clamped to 0..=10; NaN is 0).
    pub(crate) fn report(&self, u: f64) {
        let u = if u.is_nan() { 0.0 } else { u.clamp(0.0, 10.0) };
        // Relaxed: a lone value; readers only need some recent one.
        self.reported.store(u.to_bits(), Ordering::Relaxed);
    }

    fn measure(&self, cfg: &LoadConfig) -> f64 {
        // Relaxed: as in `report`.
        let reported = f64::from_bits(self.reported.load(Ordering::Relaxed));
        let flight = if cfg.inv_max > 0.0 {
            self.in_flight() as f64 * cfg.inv_max
        } else {
            0.0
        };
        flight.max(reported)
    }

    /// The last sampled load.
    pub(crate) fn last_load(&self) -> f64 {
        // Relaxed: as in `report`.
        f64::from_bits(self.sampled.load(Ordering::Relaxed))
    }

    /// Re-measures now, and updates the shedding state.
    pub(crate) fn refresh(&self, cfg: &LoadConfig, shed: Option<&Shedding>) -> f64 {
        let l = self.measure(cfg);
        // Relaxed: as in `report`.
        self.sampled.store(l.to_bits(), Ordering::Relaxed);
        if let Some(s) = shed {
            self.update_shed(l, s);
        }
        l
    }

    /// The load for a check at `now`: re-measured if the sample interval has passed.
    #[inline]
    pub(crate) fn current(&self, cfg: &LoadConfig, shed: Option<&Shedding>, now: Nanos) -> f64 {
        if cfg.sample_ns > 0 {
            // Relaxed: the interval is advisory; the CAS elects one re-measuring thread.
            let last = self.last.load(Ordering::Relaxed);
            if now.wrapping_sub(last) < cfg.sample_ns
                || self
                    .last
                    .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                    .is_err()
            {
                return self.last_load();
            }
        }
        self.refresh(cfg, shed)
    }

    fn update_shed(&self, load: f64, s: &Shedding) {
        // Relaxed: the bits are the only datum; a lost race re-applies the same rule next time.
        let old = self.shed.load(Ordering::Relaxed);
        let mut new = 0;
        for p in Priority::ALL {
            let Some(t) = s.thresholds[p.index()] else {
                continue;
            };
            let bit = p.bit() as u32;
            let on = if old & bit != 0 {
                load >= t.off
            } else {
                load >= t.on
            };
            if on {
                new |= bit;
            }
        }
        if new != old {
            let _ = self
                .shed
                .compare_exchange(old, new, Ordering::Relaxed, Ordering::Relaxed);
        }
    }

    /// Whether a request of priority `p` is shed at `load`.
    #[inline]
    pub(crate) fn sheds(&self, p: Priority, load: f64, s: &Shedding) -> bool {
        // Relaxed: as in `update_shed`.
        self.shed.load(Ordering::Relaxed) & p.bit() as u32 != 0
            || (p != Priority::Critical
                && s.critical_reserve > 0.0
                && load >= 1.0 - s.critical_reserve)
    }

    /// The priorities being shed now (hysteresis state only).
    pub(crate) fn shedding(&self) -> Vec<Priority> {
        // Relaxed: as in `update_shed`.
        let b = self.shed.load(Ordering::Relaxed);
        Priority::ALL
            .into_iter()
            .filter(|p| b & p.bit() as u32 != 0)
            .collect()
    }
}
