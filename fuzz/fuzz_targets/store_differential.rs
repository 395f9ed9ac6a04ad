//! The keyed store (and the keyless limiter) against a sequential model, on any sequence of
//! operations.
//!
//! The input picks one or two limits of the six keyed-store algorithms with small parameters,
//! a store shape, a start time and operations on a dozen keys (numbers, strings, IPv4 and IPv6
//! addresses, two of them in one /64). The model is a `HashMap<key id, Vec<u64>>` driven
//! through the same pure transitions (`Limits::decide` / `Limits::refund` over `Cells`), so
//! every `Decision` must be *identical*, approximate algorithms included. Also checked:
//!
//! * the store never loses a key whose state is not idle (a key the model holds that is not
//!   live in the store must have been idle when reclaimed, and then decide exactly as a fresh
//!   record), except by `EvictStalest`; it never invents a key; `stats().live` equals the live
//!   keys; `reset` reports whether the key was live;
//! * `StoreFull` / `Untracked` only when the table really is full of keys that are not idle;
//! * sliding_log, independently of its code: admissions in any window never exceed the limit
//!   (a plain list of admission times per key, restarted when time steps back);
//! * the keyless `Limiter` with the same limits, fed key 0's operations, matches the model too;
//! * limits given per check (`Store::check_with_at`, `refund_with_at`) on a packed store: a
//!   check or refund whose byte has its high bit set is decided by a variant of the store's
//!   limit (another limit, burst, rate or `count_denied`; the same window for a window
//!   algorithm), the model deciding the same record by it; a limit the store cannot read is
//!   refused, touching nothing.
//!
//! Shapes: *roomy* (capacity 64 for 13 keys, 1-4 shards; nothing is ever reclaimed, so time
//! may also go backwards) and *tiny* (one shard of one bucket, 1-6 arena records, any
//! full-store policy; records are reclaimed and the store fills; time only moves forward,
//! since reclaiming an idle record is invisible only to later checks).

#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use std::collections::{HashMap, HashSet};
use std::time::Duration;
use turnstile::keyed::{parse_key, FullPolicy, Key, ParsedKey, Store};
use turnstile::{
    Algorithm, Decision, Limit, LimitSpec, Limiter, Limits, ManualClock, Outcome, Verdict,
};

/// `keyed::table::RECLAIM_GRACE_NS` (crate-private): a record is reclaimed only if it was
/// already idle this long before the probe's `now`.
const RECLAIM_GRACE_NS: u64 = 1_000_000;

/// The keys, as a client would give them (parsed with `parse_key`).
const KEYS: [&str; 13] = [
    "0",
    "1",
    "42",
    "18446744073709551615",
    "id:4294967296",
    "user:241531",
    "api-key-6f1d",
    "str:a",
    "10.0.0.1",
    "ip:203.0.113.9",
    "2001:db8::1",
    "2001:db8::2", // same /64 as the previous key: the same limit
    "2001:db8:0:1::1",
];

#[derive(Arbitrary, Debug, Clone, Copy, PartialEq, Eq)]
enum Alg {
    FixedWindow,
    SlidingWindow,
    TokenBucket,
    LeakyBucket,
    SlidingLog,
    WindowRing,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Unit {
    Ns,
    Us,
    Ms,
    Ms100,
    S,
    Hour,
}

impl Unit {
    fn ns(self) -> u64 {
        match self {
            Unit::Ns => 1,
            Unit::Us => 1_000,
            Unit::Ms => 1_000_000,
            Unit::Ms100 => 100_000_000,
            Unit::S => 1_000_000_000,
            Unit::Hour => 3_600_000_000_000,
        }
    }
}

#[derive(Arbitrary, Debug)]
struct Spec {
    alg: Alg,
    limit: u8,
    window: u16,
    unit: Unit,
    burst: u8,
    buckets: u8,
    delay: Option<u8>,
    count_denied: bool,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Policy {
    Reject,
    AllowUntracked,
    EvictStalest,
}

#[derive(Arbitrary, Debug)]
enum Shape {
    Roomy { shards: u8 },
    Tiny { capacity: u8, policy: Policy },
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Start {
    Zero,
    TenMs,
    Day,
    Year,
    /// 2^62 ns (146 years): near the top of the packed time fields.
    Huge,
}

#[derive(Arbitrary, Debug)]
enum Op {
    Check { key: u8, cost: u8 },
    Peek { key: u8 },
    Refund { key: u8, n: u8 },
    Reset { key: u8 },
    Batch { keys: Vec<u8>, cost: u8 },
    Advance { by: u16, unit: Unit },
    Back { by: u16, unit: Unit },
}

#[derive(Arbitrary, Debug)]
struct Input {
    first: Spec,
    second: Option<Spec>,
    shape: Shape,
    seed: u64,
    start: Start,
    ops: Vec<Op>,
}

/// Builds the limit, or `None` when the parameters are invalid (the error must not panic).
fn build(s: &Spec) -> Option<Limit> {
    let alg = match s.alg {
        Alg::FixedWindow => Algorithm::FixedWindow,
        Alg::SlidingWindow => Algorithm::SlidingWindow,
        Alg::TokenBucket => Algorithm::TokenBucket,
        Alg::LeakyBucket => Algorithm::LeakyBucket,
        Alg::SlidingLog => Algorithm::SlidingLog,
        Alg::WindowRing => Algorithm::WindowRing,
    };
    let mut window = s.window as u64 * s.unit.ns();
    let mut spec = LimitSpec::new(alg, (s.limit % 10) as u64, Duration::ZERO);
    match s.alg {
        Alg::TokenBucket => spec.burst = Some((s.burst % 10) as u64),
        Alg::LeakyBucket => {
            spec.burst = Some((s.burst % 6) as u64);
            spec.delay = s.delay.map(|d| (d % 6) as u64);
        }
        Alg::WindowRing => {
            let n = 1 + (s.buckets % 12) as u64;
            spec.buckets = Some(n);
            window *= n;
        }
        _ => {}
    }
    if matches!(
        s.alg,
        Alg::FixedWindow | Alg::SlidingWindow | Alg::SlidingLog | Alg::WindowRing
    ) {
        spec.count_denied = s.count_denied;
    }
    spec.window = Duration::from_nanos(window);
    match spec.build() {
        Ok(l) => Some(l),
        Err(e) => {
            assert!(!e.message.is_empty(), "a config error says what is wrong");
            None
        }
    }
}

/// Variant `v` (0..16) of `s`: what a check given its own limit brings (`Store::check_with_at`).
/// Buckets vary in every parameter; windows in limit and `count_denied` and, for variants of
/// 12 and up, in window too (which the store must refuse).
fn variant(s: &Spec, v: u8) -> Spec {
    let window = match s.alg {
        Alg::TokenBucket | Alg::LeakyBucket => s.window.wrapping_add(v as u16 / 2),
        _ if v >= 12 => s.window.wrapping_add(1),
        _ => s.window,
    };
    Spec {
        alg: s.alg,
        limit: s.limit.wrapping_add(v),
        window,
        unit: s.unit,
        burst: s.burst.wrapping_add(3 * v),
        buckets: s.buckets,
        delay: s.delay.map(|d| d.wrapping_add(v)),
        count_denied: s.count_denied ^ (v & 1 == 1),
    }
}

/// Independent check of sliding_log: the times of admitted units per key.
struct LogBound {
    /// The limit's L and W (ns).
    limit: u64,
    window: u64,
    /// Per key id: admitted units' times (non-decreasing).
    admitted: HashMap<u64, Vec<u64>>,
}

impl LogBound {
    fn admit(&mut self, id: u64, now: u64, cost: u64) {
        // Time only moves forward here (a step back starts new lists), so times are sorted.
        let times = self.admitted.entry(id).or_default();
        times.extend(std::iter::repeat_n(now, cost as usize));
        let in_window = times.iter().filter(|&&t| now - t < self.window).count() as u64;
        assert!(
            in_window <= self.limit,
            "sliding_log admitted {in_window} > {} in the window ending at {now}",
            self.limit
        );
    }
    fn refund(&mut self, id: u64, n: u64) {
        // The log gives back its newest entries; dropping our newest keeps our list a subset
        // of the log's (with count_denied the log may drop a denial instead).
        if let Some(times) = self.admitted.get_mut(&id) {
            let keep = times.len().saturating_sub(n as usize);
            times.truncate(keep);
        }
    }
    fn forget(&mut self, id: u64) {
        self.admitted.remove(&id);
    }
}

struct Model {
    limits: Limits,
    recs: HashMap<u64, Vec<u64>>,
}

impl Model {
    fn check(&mut self, id: u64, cost: u64, now: u64) -> Decision {
        let limits = self.limits.clone();
        self.check_by(&limits, id, cost, now)
    }

    /// A check decided by `limits` (the store's, or one given with the check).
    fn check_by(&mut self, limits: &Limits, id: u64, cost: u64, now: u64) -> Decision {
        if cost == 0 && !self.recs.contains_key(&id) {
            return limits.decide(&mut vec![0; limits.words()][..], now, 0);
        }
        let w = limits.words();
        let rec = self.recs.entry(id).or_insert_with(|| vec![0; w]);
        limits.decide(&mut rec[..], now, cost)
    }

    /// An idle record decides as a fresh one would (what makes reclaiming it invisible).
    fn assert_fresh(&self, rec: &[u64], now: u64, id: u64) {
        if rec.iter().all(|&w| w == 0) {
            return;
        }
        let w = self.limits.words();
        for cost in 0..5 {
            let idle = self.limits.decide(&mut rec.to_vec()[..], now, cost);
            let fresh = self.limits.decide(&mut vec![0; w][..], now, cost);
            assert_eq!(
                idle, fresh,
                "key id {id}: idle record {rec:?} at {now}, cost {cost}"
            );
        }
    }

    /// Whether the record is fresh or equivalent to fresh at `now`.
    fn idle(&self, rec: &[u64], now: u64) -> bool {
        rec.iter().all(|&w| w == 0) || self.limits.idle_in(&mut rec.to_vec()[..], now) == 0
    }
}

struct Run<'a> {
    store: Store<ManualClock>,
    /// The store's limit as specified (variants of it are given with checks).
    spec: Spec,
    limiter: Limiter<&'a ManualClock>,
    clock: &'a ManualClock,
    limiter_rec: Vec<u64>,
    model: Model,
    logs: Vec<LogBound>,
    keys: Vec<ParsedKey<'static>>,
    ids: Vec<u64>,
    tiny: Option<(u64, FullPolicy)>,
    now: u64,
}

impl Run<'_> {
    fn full_decision(&self, o: Outcome) -> Decision {
        self.full_decision_by(&self.model.limits, o)
    }

    /// A refusal as a check decided by `limits` gets it.
    fn full_decision_by(&self, limits: &Limits, o: Outcome) -> Decision {
        // A refusal hints when a record one request makes now is reclaimable.
        let retry = (o == Outcome::StoreFull).then(|| {
            let mut rec = vec![0u64; limits.words()];
            limits.decide(&mut rec[..], self.now, 1);
            limits
                .idle_in(&mut rec[..], self.now)
                .saturating_add(RECLAIM_GRACE_NS)
        });
        Decision {
            outcome: o,
            limit: limits.limits()[0].capacity(),
            remaining: 0,
            reset_after_ns: 0,
            retry_after_ns: retry,
            delay_ns: 0,
        }
    }

    fn live(&self) -> HashSet<u64> {
        let v = self.store.live_ids();
        let set: HashSet<u64> = v.iter().copied().collect();
        assert_eq!(set.len(), v.len(), "a key is live twice: {v:?}");
        assert_eq!(self.store.stats().live, v.len() as u64, "stats().live");
        set
    }

    fn check(&mut self, k: usize, cost: u64, got: Decision) {
        let limits = self.model.limits.clone();
        self.check_by(&limits, k, cost, got)
    }

    /// [`Run::check`] of a check decided by `limits`.
    fn check_by(&mut self, limits: &Limits, k: usize, cost: u64, got: Decision) {
        let id = self.ids[k];
        let now = self.now;
        if matches!(got.outcome, Outcome::StoreFull | Outcome::Untracked) {
            // Only a tiny store fills up; the whole table is the probe range there.
            let Some((cap, policy)) = self.tiny else {
                panic!("a roomy store refused key {k}: {got:?}");
            };
            assert!(cost > 0, "a peek never inserts: {got:?}");
            assert_eq!(got, self.full_decision_by(limits, got.outcome));
            assert_eq!(
                got.outcome == Outcome::Untracked,
                policy == FullPolicy::AllowUntracked,
                "{got:?} under {policy:?}"
            );
            let live = self.live();
            assert!(!live.contains(&id), "key {k} is live yet answered {got:?}");
            let room = if self.store.is_inline() {
                8
            } else {
                cap.min(8)
            };
            assert_eq!(live.len() as u64, room, "{got:?} with room left");
            // Reclaimable: idle at `judged` and still at `now` (a wrapped window index can
            // make an idle record count again).
            let judged = now.saturating_sub(RECLAIM_GRACE_NS);
            for l in &live {
                let rec = &self.model.recs[l];
                assert!(
                    !(self.model.idle(rec, judged) && self.model.idle(rec, now)),
                    "{got:?} although key id {l} is idle and reclaimable"
                );
            }
            return;
        }
        let want = self.model.check_by(limits, id, cost, now);
        assert_eq!(
            got, want,
            "check of key {k} ({}) cost {cost} at {now} by {limits:?}",
            KEYS[k]
        );
        if cost > 0 && got.outcome == Outcome::Allowed {
            for lb in &mut self.logs {
                lb.admit(id, now, cost);
            }
        }
    }

    /// [`Run::check`] for a compact answer: the model's decision, as a `Verdict`.
    fn check_verdict(&mut self, k: usize, cost: u64, got: Verdict) {
        if matches!(got.outcome(), Outcome::StoreFull | Outcome::Untracked) {
            let d = self.full_decision(got.outcome());
            assert_eq!(got, Verdict::from(&d), "key {k}: {d:?}");
            self.check(k, cost, d);
            return;
        }
        let (id, now) = (self.ids[k], self.now);
        let want = self.model.check(id, cost, now);
        assert_eq!(
            got,
            Verdict::from(&want),
            "batch verdict of key {k} ({}) cost {cost} at {now}: {want:?}",
            KEYS[k]
        );
        if cost > 0 && want.outcome == Outcome::Allowed {
            for lb in &mut self.logs {
                lb.admit(id, now, cost);
            }
        }
    }

    fn op(&mut self, op: &Op) {
        let n_keys = self.ids.len();
        let now = self.now;
        match *op {
            Op::Check { key, cost } if cost & 0x80 != 0 && self.store.is_inline() => {
                let k = key as usize % n_keys;
                let given = self.given((cost >> 3) & 0xf);
                let cost = (cost % 5) as u64;
                let Some(limit) = given else {
                    return;
                };
                match self.store.check_with_at(&self.keys[k], &limit, cost, now) {
                    Ok(got) => {
                        let limits = Limits::new(vec![limit]).expect("one limit");
                        self.check_by(&limits, k, cost, got);
                    }
                    Err(e) => self.refused(&limit, e),
                }
            }
            Op::Check { key, cost } => {
                let k = key as usize % n_keys;
                let cost = (cost % 5) as u64;
                let got = self.store.check_at(&self.keys[k], cost, now);
                self.check(k, cost, got);
                if k == 0 {
                    self.limiter_op(Some(cost), None, false);
                }
            }
            Op::Refund { key, n } if n & 0x80 != 0 && self.store.is_inline() => {
                let k = key as usize % n_keys;
                let given = self.given((n >> 3) & 0xf);
                let n = (n % 5) as u64;
                let Some(limit) = given else {
                    return;
                };
                let id = self.ids[k];
                match self.store.refund_with_at(&self.keys[k], &limit, n, now) {
                    Ok(()) => {
                        if let Some(r) = self.model.recs.get_mut(&id) {
                            limit.refund(&mut r[..], now, n);
                        }
                        for lb in &mut self.logs {
                            lb.refund(id, n);
                        }
                    }
                    Err(e) => self.refused(&limit, e),
                }
            }
            Op::Peek { key } => {
                let k = key as usize % n_keys;
                let got = self.store.peek_at(&self.keys[k], now);
                self.check(k, 0, got);
                if k == 0 {
                    self.limiter_op(Some(0), None, false);
                }
            }
            Op::Refund { key, n } => {
                let k = key as usize % n_keys;
                let n = (n % 5) as u64;
                let id = self.ids[k];
                self.store.refund_at(&self.keys[k], n, now);
                let limits = &self.model.limits;
                if let Some(r) = self.model.recs.get_mut(&id) {
                    limits.refund(&mut r[..], now, n);
                }
                for lb in &mut self.logs {
                    lb.refund(id, n);
                }
                if k == 0 {
                    self.limiter_op(None, Some(n), false);
                }
            }
            Op::Reset { key } => {
                let k = key as usize % n_keys;
                let id = self.ids[k];
                let was_live = self.live().contains(&id);
                assert_eq!(
                    self.store.reset(&self.keys[k]),
                    was_live,
                    "reset of key {k}"
                );
                self.model.recs.remove(&id);
                for lb in &mut self.logs {
                    lb.forget(id);
                }
                if k == 0 {
                    self.limiter_op(None, None, true);
                }
            }
            Op::Batch { ref keys, cost } => {
                let raw_cost = cost;
                let ks: Vec<usize> = keys.iter().take(20).map(|&k| k as usize % n_keys).collect();
                let batch: Vec<ParsedKey<'static>> = ks.iter().map(|&k| self.keys[k]).collect();
                let cost = (cost % 5) as u64;
                if matches!(self.tiny, Some((_, FullPolicy::EvictStalest))) {
                    // An eviction inside a batch would change later keys of the same batch
                    // before the model learns of it: one check at a time.
                    for k in ks {
                        self.step(&Op::Check {
                            key: k as u8,
                            cost: cost as u8,
                        });
                    }
                    return;
                }
                // The high bit of the cost byte: the compact answers (`check_batch_verdicts`).
                let verdicts = raw_cost & 0x80 != 0;
                let mut out = vec![self.full_decision(Outcome::StoreFull); batch.len()];
                let mut vout = vec![Verdict::default(); batch.len()];
                if verdicts {
                    self.store
                        .check_batch_verdicts_at(&batch, cost, now, &mut vout);
                } else {
                    self.store.check_batch_at(&batch, cost, now, &mut out);
                }
                for (i, &k) in ks.iter().enumerate() {
                    if verdicts {
                        self.check_verdict(k, cost, vout[i]);
                    } else {
                        self.check(k, cost, out[i]);
                    }
                    if k == 0 {
                        self.limiter_op(Some(cost), None, false);
                    }
                }
            }
            Op::Advance { by, unit } => {
                self.now = self.now.saturating_add(by as u64 * unit.ns());
            }
            Op::Back { by, unit } => {
                let back = by as u64 * unit.ns();
                if self.tiny.is_none() && back > 0 && self.now > 0 {
                    self.now = self.now.saturating_sub(back);
                    // "At most L in any window" speaks of one timeline: start a new one.
                    // (The log only stays conservative: an earlier `now` expires fewer.)
                    for lb in &mut self.logs {
                        lb.admitted.clear();
                    }
                }
            }
        }
    }

    /// Variant `v` of the store's limit, if it builds.
    fn given(&self, v: u8) -> Option<Limit> {
        build(&variant(&self.spec, v))
    }

    /// A limit given with a check was refused: exactly when the store's records do not read
    /// alike under it (the store checked nothing: the invariants after the op see to that).
    fn refused(&self, limit: &Limit, e: turnstile::keyed::LimitMismatch) {
        let own = self.model.limits.limits()[0];
        assert!(!own.carries_to(limit), "{limit:?} refused ({e}) by a store of {own:?}");
        assert!(!e.to_string().is_empty());
    }

    /// Key 0's operation on the keyless limiter, against its own model record.
    fn limiter_op(&mut self, cost: Option<u64>, refund: Option<u64>, reset: bool) {
        let now = self.now;
        let limits = &self.model.limits;
        if let Some(cost) = cost {
            let got = self.limiter.check_at(cost, now);
            let want = limits.decide(&mut self.limiter_rec[..], now, cost);
            assert_eq!(got, want, "keyless limiter, cost {cost} at {now}");
        }
        if let Some(n) = refund {
            self.clock.set(now);
            self.limiter.refund(n);
            limits.refund(&mut self.limiter_rec[..], now, n);
        }
        if reset {
            self.limiter.reset();
            self.limiter_rec.iter_mut().for_each(|w| *w = 0);
        }
    }

    /// One operation, then the invariants.
    fn step(&mut self, op: &Op) {
        let evicted_before = self.store.stats().evicted;
        self.op(op);
        self.invariants(evicted_before);
    }

    /// After every operation: live keys against the model.
    fn invariants(&mut self, evicted_before: u64) {
        let live = self.live();
        for id in &live {
            assert!(
                self.model.recs.contains_key(id),
                "key id {id} is live but was never admitted a request"
            );
        }
        let st = self.store.stats();
        // A key the model holds but the store does not was reclaimed in this operation (an
        // earlier one would have been dropped then), so it was idle when the store judged it,
        // `RECLAIM_GRACE_NS` before now; or evicted; or never inserted (a fresh record).
        let judged = self.now.saturating_sub(RECLAIM_GRACE_NS);
        let (mut gone, mut lost) = (Vec::new(), Vec::new());
        for (&id, rec) in &self.model.recs {
            if live.contains(&id) {
                continue;
            }
            if self.model.idle(rec, judged) {
                self.model.assert_fresh(rec, judged, id);
                gone.push(id);
            } else {
                lost.push(id);
            }
        }
        let evicted = st.evicted - evicted_before;
        assert!(
            lost.len() as u64 <= evicted,
            "the store lost the state of key ids {lost:?} (not idle at {judged}), evicted {evicted}"
        );
        // The model forgets them too: an idle record is equivalent to a fresh one only from
        // then on until its window index wraps around, where a fresh one stays fresh.
        for id in gone.into_iter().chain(lost) {
            self.model.recs.remove(&id);
            for lb in &mut self.logs {
                lb.forget(id);
            }
        }
        if self.tiny.is_none() {
            assert_eq!(
                (st.reclaimed, st.evicted, st.rejected, st.untracked),
                (0, 0, 0, 0),
                "a roomy store never runs out of room: {st:?}"
            );
        }
    }
}

fuzz_target!(|input: Input| {
    let Some(first) = build(&input.first) else {
        return;
    };
    let mut list = vec![first];
    if let Some(s) = &input.second {
        match build(s) {
            Some(l) => list.push(l),
            None => return,
        }
    }
    let limits = match Limits::new(list) {
        Ok(l) => l,
        Err(_) => return,
    };
    let start = match input.start {
        Start::Zero => 0,
        Start::TenMs => 10_000_000,
        Start::Day => 86_400_000_000_000,
        Start::Year => 365 * 86_400_000_000_000,
        Start::Huge => 1 << 62,
    };
    let builder = Store::builder(limits.clone()).seed(input.seed);
    let (builder, tiny) = match input.shape {
        Shape::Roomy { shards } => (builder.capacity(64).shards(1 + (shards % 4) as usize), None),
        Shape::Tiny { capacity, policy } => {
            let cap = 1 + (capacity % 6) as u64;
            let policy = match policy {
                Policy::Reject => FullPolicy::Reject,
                Policy::AllowUntracked => FullPolicy::AllowUntracked,
                Policy::EvictStalest => FullPolicy::EvictStalest,
            };
            (
                builder.capacity(cap).shards(1).policy(policy),
                Some((cap, policy)),
            )
        }
    };
    let store = builder
        .build_with_clock(ManualClock::new(start))
        .expect("a small store builds");
    let keys: Vec<ParsedKey<'static>> = KEYS
        .iter()
        .map(|s| parse_key(s).expect("valid key"))
        .collect();
    let ids: Vec<u64> = keys.iter().map(|k| k.key_id(store.hasher())).collect();
    let logs = limits
        .limits()
        .iter()
        .filter_map(|l| match l {
            Limit::SlidingLog(p) => Some(LogBound {
                limit: p.limit,
                window: p.window,
                admitted: HashMap::new(),
            }),
            _ => None,
        })
        .collect();
    let clock = ManualClock::new(start);
    let mut run = Run {
        spec: input.first,
        limiter: Limiter::with_limits(limits.clone(), &clock),
        limiter_rec: vec![0; limits.words()],
        clock: &clock,
        store,
        model: Model {
            limits,
            recs: HashMap::new(),
        },
        logs,
        keys,
        ids,
        tiny,
        now: start,
    };
    for op in input.ops.iter().take(400) {
        run.step(op);
    }
});
