//! Counters and the latency histogram (their Prometheus text is [`crate::exposition`]'s).
//!
//! Counters are sharded per worker thread and cache-padded: every worker adds to its own line
//! (a relaxed add, no contention); `/metrics` sums them. Rule and store figures come from the
//! engine and the stores when scraped.

use crossbeam_utils::CachePadded;
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use turnstile::{Clock, DefaultClock};

/// What is counted per worker.
#[derive(Clone, Copy, Debug)]
pub(crate) enum C {
    Connections,
    RejectedConnections,
    Commands,
    ProtocolErrors,
    ThrottleAllowed,
    ThrottleLimited,
    CheckAllowed,
    CheckDenied,
    Refunds,
    Settles,
    Explains,
    HttpRequests,
    HttpChecks,
    HttpErrors,
    OutputLimitClosed,
    HttpRejectedConnections,
}

const COUNTERS: usize = 16;

/// Latency histogram bucket bounds (ns), per command.
pub(crate) const BOUNDS_NS: [u64; 12] = [
    250, 500, 1_000, 2_000, 4_000, 8_000, 16_000, 32_000, 64_000, 128_000, 1_000_000, 10_000_000,
];
pub(crate) const HIST: usize = BOUNDS_NS.len() + 1;

struct Worker {
    c: [AtomicU64; COUNTERS],
    hist: [AtomicU64; HIST],
    sum_ns: AtomicU64,
}

/// A connection's counts since its last [`Metrics::flush`]: plain integers, so that a pipelined
/// command costs no atomic read-modify-write (three per `CL.THROTTLE` before, each a locked
/// instruction that drains the store buffer, plus a thread-local lookup and a division to find
/// the shard: about 4 % of a pipelined command's time, docs/service.md). The connection
/// flushes it after each pipeline, before writing its replies, so that a client that has read
/// a reply sees it counted.
#[derive(Default)]
pub(crate) struct Tally {
    c: [u64; COUNTERS],
    hist: [u64; HIST],
    sum_ns: u64,
    dirty: bool,
}

impl Tally {
    #[inline]
    pub(crate) fn add(&mut self, c: C, n: u64) {
        self.c[c as usize] += n;
        self.dirty = true;
    }

    #[inline]
    pub(crate) fn latency(&mut self, ns: u64) {
        self.hist[bucket(ns)] += 1;
        self.sum_ns += ns;
        self.dirty = true;
    }
}

/// The latency histogram's bucket of `ns`.
#[inline]
fn bucket(ns: u64) -> usize {
    BOUNDS_NS
        .iter()
        .position(|&b| ns <= b)
        .unwrap_or(BOUNDS_NS.len())
}

thread_local! {
    static WORKER: Cell<usize> = const { Cell::new(usize::MAX) };
}

static NEXT_WORKER: AtomicUsize = AtomicUsize::new(0);

/// Counters of the whole server.
pub(crate) struct Metrics {
    workers: Box<[CachePadded<Worker>]>,
    /// The clock of the latency histogram.
    clock: DefaultClock,
    started: std::time::Instant,
    pub(crate) reloads_ok: AtomicU64,
    pub(crate) reloads_failed: AtomicU64,
    pub(crate) envoy_reloads_ok: AtomicU64,
    pub(crate) envoy_reloads_failed: AtomicU64,
    /// Limits classes' files re-read, and refused (a bad line).
    pub(crate) limits_reads_ok: AtomicU64,
    pub(crate) limits_reads_failed: AtomicU64,
    pub(crate) snapshots_ok: AtomicU64,
    pub(crate) snapshots_failed: AtomicU64,
    pub(crate) snapshot_records: AtomicU64,
}

impl Metrics {
    pub(crate) fn new(workers: usize) -> Self {
        Self {
            workers: (0..workers.max(1) + 1)
                .map(|_| {
                    CachePadded::new(Worker {
                        c: Default::default(),
                        hist: Default::default(),
                        sum_ns: AtomicU64::new(0),
                    })
                })
                .collect(),
            clock: DefaultClock::new(),
            started: std::time::Instant::now(),
            reloads_ok: AtomicU64::new(0),
            reloads_failed: AtomicU64::new(0),
            envoy_reloads_ok: AtomicU64::new(0),
            envoy_reloads_failed: AtomicU64::new(0),
            limits_reads_ok: AtomicU64::new(0),
            limits_reads_failed: AtomicU64::new(0),
            snapshots_ok: AtomicU64::new(0),
            snapshots_failed: AtomicU64::new(0),
            snapshot_records: AtomicU64::new(0),
        }
    }

    /// The latency clock's reading.
    #[inline]
    pub(crate) fn now(&self) -> u64 {
        self.clock.now()
    }

    /// Since the server started.
    pub(crate) fn uptime(&self) -> std::time::Duration {
        self.started.elapsed()
    }

    /// This thread's shard (threads are numbered on first use).
    #[inline]
    fn mine(&self) -> &Worker {
        let i = WORKER.with(|w| {
            let mut i = w.get();
            if i == usize::MAX {
                // Relaxed: a unique number is all that is needed.
                i = NEXT_WORKER.fetch_add(1, Ordering::Relaxed);
                w.set(i);
            }
            i
        });
        &self.workers[i % self.workers.len()]
    }

    #[inline]
    pub(crate) fn add(&self, c: C, n: u64) {
        // Relaxed: statistics.
        self.mine().c[c as usize].fetch_add(n, Ordering::Relaxed);
    }

    /// Adds a connection's [`Tally`] to this thread's shard and zeroes it: one relaxed add per
    /// counter that moved, instead of one per event.
    pub(crate) fn flush(&self, t: &mut Tally) {
        if !t.dirty {
            return;
        }
        let w = self.mine();
        for (a, x) in w.c.iter().zip(t.c.iter_mut()) {
            if *x != 0 {
                // Relaxed: statistics.
                a.fetch_add(std::mem::take(x), Ordering::Relaxed);
            }
        }
        for (a, x) in w.hist.iter().zip(t.hist.iter_mut()) {
            if *x != 0 {
                // Relaxed: statistics.
                a.fetch_add(std::mem::take(x), Ordering::Relaxed);
            }
        }
        // Relaxed: statistics.
        w.sum_ns
            .fetch_add(std::mem::take(&mut t.sum_ns), Ordering::Relaxed);
        t.dirty = false;
    }

    #[inline]
    pub(crate) fn latency(&self, ns: u64) {
        let w = self.mine();
        // Relaxed: statistics.
        w.hist[bucket(ns)].fetch_add(1, Ordering::Relaxed);
        w.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// The latency histogram summed over workers: each bucket's count (the last past
    /// [`BOUNDS_NS`]), and the sum in ns.
    pub(crate) fn histogram(&self) -> ([u64; HIST], u64) {
        let mut h = [0u64; HIST];
        let mut sum = 0u64;
        for w in self.workers.iter() {
            for (t, x) in h.iter_mut().zip(w.hist.iter()) {
                // Relaxed: statistics.
                *t += x.load(Ordering::Relaxed);
            }
            sum += w.sum_ns.load(Ordering::Relaxed);
        }
        (h, sum)
    }

    pub(crate) fn get(&self, c: C) -> u64 {
        self.workers
            .iter()
            .map(|w| w.c[c as usize].load(Ordering::Relaxed))
            .sum()
    }
}
