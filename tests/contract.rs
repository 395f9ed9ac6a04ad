//! The contract of a `Decision`, checked against the state it came from, on copies of that
//! state, for every algorithm (count_denied on and off, time going backwards, costs 0, 1, the
//! limit and above it, idle times up to years and the edges of the clock):
//!
//! * a denied request (`Limited`) is still denied at `now + retry_after − 1` and admitted at
//!   `now + retry_after`, nothing else happening; `now + retry_after` is a reachable time;
//! * a `NeverFits` has no `retry_after` and changes no state;
//! * a request of cost `remaining` is admitted at `now`, one of `remaining + 1` is not;
//! * `reset_after` is the record's own idle time (`idle_in`; `u64::MAX`: not within the
//!   clock), and the record is idle
//!   (decides as an absent one) at `now + reset_after` and not 1 ns before; once idle it stays
//!   idle: at any later time it decides as an absent record. The one documented exception is a
//!   packed window index that has come round (`Subject::alias_bound`): the record is then idle
//!   again within the bound.
//!
//! [`check_contract`] works on anything that decides on a copy of its state ([`Subject`]):
//! one limit or several over one record (`Limits`) here, the holders of a record, and one
//! packed record whose limit changes between checks (a store given the limit with each check:
//! the contract holds for the limit a decision was made by, whatever limits wrote the record
//! before); more subjects can be added.
//! `PROPTEST_CASES=N` runs N cases per property.

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use std::fmt::Debug;
use std::time::Duration;
use turnstile::algo::{fixed_window, sliding_window, window_ring};
use turnstile::{Algorithm, Decision, Limit, LimitSpec, Limits, Outcome};

const S: u64 = 1_000_000_000;
const YEAR: u64 = 365 * 86_400 * S;

/// Something that decides on its own state; cloning it copies the state.
pub trait Subject: Clone + Debug {
    /// Decides (and records) a request of `cost` at `now`.
    fn decide(&mut self, now: u64, cost: u64) -> Decision;
    /// Nanoseconds until the state is equivalent to an absent one.
    fn idle_in(&mut self, now: u64) -> u64;
    /// The same subject with an absent (fresh) state.
    fn fresh(&self) -> Self;
    /// Whether the two states are the same.
    fn same_state(&self, other: &Self) -> bool;
    /// Costs to compare an idle record with an absent one by.
    fn probe_costs(&self) -> Vec<u64>;
    /// Where a documented approximation lets a record that went idle count again at `t` (a
    /// window index come round): `Some(bound)`, the record is idle again within `bound` ns.
    fn alias_bound(&self, _t: u64) -> Option<u64> {
        None
    }
}

/// One or several limits over one record, decided all-or-nothing.
#[derive(Clone, Debug)]
pub struct Record {
    pub limits: Limits,
    pub rec: Vec<u64>,
}

impl Record {
    pub fn new(limits: Vec<Limit>) -> Self {
        let limits = Limits::new(limits).unwrap();
        let rec = vec![0; limits.words()];
        Self { limits, rec }
    }
}

impl Subject for Record {
    fn decide(&mut self, now: u64, cost: u64) -> Decision {
        self.limits.decide(&mut self.rec[..], now, cost)
    }
    fn idle_in(&mut self, now: u64) -> u64 {
        self.limits.idle_in(&mut self.rec[..], now)
    }
    fn fresh(&self) -> Self {
        Self {
            limits: self.limits.clone(),
            rec: vec![0; self.rec.len()],
        }
    }
    fn same_state(&self, other: &Self) -> bool {
        self.rec == other.rec
    }
    fn probe_costs(&self) -> Vec<u64> {
        let mut v = vec![0, 1, 2];
        for l in self.limits.limits() {
            let c = l.capacity();
            v.extend([c / 2, c.saturating_sub(1), c, c + 1]);
        }
        v.sort_unstable();
        v.dedup();
        v
    }
    fn alias_bound(&self, t: u64) -> Option<u64> {
        let mut out = None;
        let mut off = 0;
        for l in self.limits.limits() {
            if let Some(b) = alias_bound(l, &self.rec[off..off + l.words()], t) {
                out = Some(out.unwrap_or(0u64).max(b));
            }
            off += l.words();
        }
        out
    }
}

/// The documented window-index aliasing of the packed window counters: an index kept mod 2^k
/// reads, after 2^k windows or more, as a recent one. A stored index at most `AHEAD` windows
/// ahead of now's is taken for time going backwards and kept; one 0 or 1 window behind is
/// the current or previous window (N sub-windows for window_ring). Either way the record is
/// idle again within `AHEAD` + 2 windows (N + 2 sub-windows for a window_ring).
fn alias_bound(l: &Limit, rec: &[u64], t: u64) -> Option<u64> {
    // (stored index, its period, window, windows kept behind, windows of backwards tolerated)
    let (idx, period, w, behind, ahead) = match l {
        Limit::FixedWindow(p) => {
            let bits = fixed_window::INDEX_BITS;
            let idx = (rec[0] >> fixed_window::COUNT_BITS) & ((1 << bits) - 1);
            (idx, 1 << bits, p.window, 0, fixed_window::AHEAD)
        }
        Limit::SlidingWindow(p) => {
            let bits = sliding_window::INDEX_BITS;
            let idx = (rec[0] >> (2 * sliding_window::COUNT_BITS)) & ((1 << bits) - 1);
            (idx, 1 << bits, p.window, 1, sliding_window::AHEAD)
        }
        Limit::WindowRing(p) => {
            // Indexes mod P, a multiple of N + 1 below 2^38 (`Params::period`).
            let idx = (rec[0] >> window_ring::TOTAL_BITS) % p.period();
            (idx, p.period(), p.sub, p.buckets, window_ring::AHEAD)
        }
        _ => return None,
    };
    let d = ((t / w) % period + period - idx) % period;
    (d <= behind || d >= period - ahead).then(|| (ahead + behind + 2).saturating_mul(w))
}

fn fail(what: &str, ctx: &str) -> TestCaseError {
    TestCaseError::fail(format!("{what}: {ctx}"))
}

/// Checks the contract of the decision `subject` makes for `cost` at `now`, on copies, then
/// the idle record at `now + reset_after + Δ` for each Δ in `idle`. Returns the decision and
/// the state after it.
pub fn check_contract<T: Subject>(
    subject: &T,
    now: u64,
    cost: u64,
    idle: &[u64],
    ctx: &str,
) -> Result<(Decision, T), TestCaseError> {
    let mut after = subject.clone();
    let d = after.decide(now, cost);
    let ctx = format!("{ctx}; now {now}, cost {cost}: {d:?}");
    let ctx = &ctx;
    if cost == 0 && !d.allowed() {
        return Err(fail("a peek is always allowed", ctx));
    }
    match d.outcome {
        Outcome::Allowed => {
            if d.retry_after_ns.is_some() {
                return Err(fail("allowed with a retry", ctx));
            }
        }
        Outcome::NeverFits => {
            if d.retry_after_ns.is_some() {
                return Err(fail("NeverFits with a retry", ctx));
            }
            if !after.same_state(subject) {
                return Err(fail("NeverFits changed the state", ctx));
            }
        }
        Outcome::Limited => {
            let Some(r) = d.retry_after_ns else {
                return Err(fail("Limited without a retry", ctx));
            };
            if r == 0 {
                return Err(fail("retry 0", ctx));
            }
            let Some(at) = now.checked_add(r) else {
                return Err(fail("retry past the end of the clock", ctx));
            };
            if after.clone().decide(at - 1, cost).allowed() {
                return Err(fail("admitted at now + retry - 1", ctx));
            }
            let then = after.clone().decide(at, cost);
            if !then.allowed() {
                return Err(fail(&format!("denied at now + retry: {then:?}"), ctx));
            }
        }
        o => return Err(fail(&format!("unexpected outcome {o:?}"), ctx)),
    }
    // remaining: what is left after this decision, at `now`.
    if d.remaining > 0 {
        let e = after.clone().decide(now, d.remaining);
        if !e.allowed() {
            return Err(fail(&format!("cost `remaining` denied: {e:?}"), ctx));
        }
    }
    if let Some(c) = d.remaining.checked_add(1) {
        let e = after.clone().decide(now, c);
        if e.allowed() {
            return Err(fail(&format!("cost `remaining + 1` admitted: {e:?}"), ctx));
        }
    }
    // reset: the record's idle time; idle then and not 1 ns before.
    let r = d.reset_after_ns;
    let idle_now = after.clone().idle_in(now);
    if idle_now != r {
        return Err(fail(
            &format!("reset_after {r} but idle_in {idle_now}"),
            ctx,
        ));
    }
    // u64::MAX: not idle within the clock (nor is a time past its end).
    let Some(t) = now.checked_add(r).filter(|_| r < u64::MAX) else {
        return Ok((d, after));
    };
    let fresh = after.fresh();
    let costs = after.probe_costs();
    let same_as_fresh = |at: u64| -> Option<(u64, Decision, Decision)> {
        costs.iter().find_map(|&c| {
            let a = after.clone().decide(at, c);
            let b = fresh.clone().decide(at, c);
            (a != b).then_some((c, a, b))
        })
    };
    // (With several limits, `now + reset` is one limit's idle time, which can be where another
    // one's window index has come round: the documented exception, within its bound.)
    if let Some(bound) = after.alias_bound(t) {
        let i = after.clone().idle_in(t);
        if i > bound {
            return Err(fail(
                &format!("at now + reset: aliased, idle in {i} > bound {bound}"),
                ctx,
            ));
        }
    } else if let Some((c, a, b)) = same_as_fresh(t) {
        return Err(fail(
            &format!("not idle at now + reset: cost {c}: {a:?} vs absent {b:?}"),
            ctx,
        ));
    }
    if r > 0 {
        let a = after.clone().decide(t - 1, 0);
        let b = fresh.clone().decide(t - 1, 0);
        if a == b {
            return Err(fail("already idle at now + reset - 1", ctx));
        }
    }
    for &delta in idle {
        let Some(u) = t.checked_add(delta) else {
            continue;
        };
        if let Some(bound) = after.alias_bound(u) {
            let i = after.clone().idle_in(u);
            if i > bound {
                return Err(fail(
                    &format!("idle {delta} ns more: aliased, idle in {i} > bound {bound}"),
                    ctx,
                ));
            }
            continue;
        }
        if let Some((c, a, b)) = same_as_fresh(u) {
            return Err(fail(
                &format!("idle {delta} ns more, not as absent: cost {c}: {a:?} vs absent {b:?}"),
                ctx,
            ));
        }
    }
    Ok((d, after))
}

// ------------------------------------------------------------------------------------------
// Single limits.
// ------------------------------------------------------------------------------------------

/// A limit: algorithm, limit, window unit, count_denied, a variant (buckets, burst, delay).
fn spec(a: usize) -> impl Strategy<Value = LimitSpec> {
    (
        Just(a),
        1u64..=6,
        prop_oneof![
            Just(1u64),
            Just(3),
            Just(7),
            Just(1_000),
            Just(1_000_000),
            Just(S),
            Just(3600 * S),
            Just(YEAR),
            Just(1 << 62),
        ],
        any::<bool>(),
        0u64..4,
    )
        .prop_map(|(a, limit, unit, count_denied, v)| {
            let algorithm = Algorithm::ALL[a];
            let mut spec = LimitSpec::new(algorithm, limit, Duration::from_nanos(unit));
            match algorithm {
                Algorithm::FixedWindow | Algorithm::SlidingWindow | Algorithm::SlidingLog => {
                    spec.count_denied = count_denied;
                }
                Algorithm::WindowRing => {
                    let buckets = [1, 2, 3, 10][v as usize];
                    spec.buckets = Some(buckets);
                    spec.window = Duration::from_nanos(unit.saturating_mul(buckets));
                    spec.count_denied = count_denied;
                }
                Algorithm::TokenBucket => {
                    spec.burst = Some(limit + v);
                    spec.window = Duration::from_nanos(unit.max(limit));
                }
                Algorithm::LeakyBucket => {
                    spec.burst = Some(limit + v - 1);
                    spec.delay = count_denied.then_some((limit + v - 1) / 2);
                    spec.window = Duration::from_nanos(unit.max(limit));
                }
                // Concurrency, and any algorithm added later (the enum is non_exhaustive):
                // the spec's defaults.
                _ => {}
            }
            spec
        })
}

/// A time step from `now`, saturating at the ends of the clock.
fn step(kind: u8, raw: u64, now: u64, w: u64) -> u64 {
    match kind % 12 {
        0 => now,
        1 => now.saturating_add(1),
        2 | 3 => now.saturating_add(raw % w.saturating_mul(3).max(1)),
        // To a window boundary, ± 1 ns.
        4 => {
            let next = (now / w).saturating_add(1 + raw % 2).saturating_mul(w);
            next.saturating_add(raw % 3).saturating_sub(1)
        }
        // Backwards, by up to two windows.
        5 | 6 => now.saturating_sub(1 + raw % w.saturating_mul(2).max(1)),
        // Idle for up to 4 years.
        7 => now.saturating_add(raw % (4 * YEAR)),
        // Idle for 2^k windows of a packed index, and nearby.
        8 => {
            let bits = [22u32, 23, 37, 38][(raw % 4) as usize];
            let k = w.saturating_mul(1 << bits);
            now.saturating_add(k)
                .saturating_add((raw >> 8) % 5)
                .saturating_sub(2)
        }
        // The edges of the clock: 2^63 ns (a bucket's TAT) and 2^64 − 1.
        9 => (1u64 << 63)
            .saturating_sub(raw % 4)
            .saturating_sub((raw >> 4) % 2 * w),
        10 => u64::MAX - raw % 4 - (raw >> 4) % 2 * w.min(u64::MAX / 2),
        _ => raw,
    }
}

fn cost(kind: u8, raw: u64, cap: u64) -> u64 {
    match kind % 8 {
        0 => 0,
        1 | 2 => 1,
        3 => cap,
        4 => cap + 1,
        5 => u64::MAX,
        _ => raw % (cap + 2),
    }
}

/// Idle times after a reset: 0, 1 ns, a window, years, and 2^k windows ± a little.
fn idles(w: u64, raw: &[u64]) -> Vec<u64> {
    let mut v = vec![0, 1, w, 2 * w + 1];
    for &r in raw {
        v.push(r % (30 * YEAR));
        let bits = [22u32, 23, 37, 38][(r % 4) as usize];
        v.push(w.saturating_mul((1 << bits) + (r >> 8) % 4));
    }
    v
}

fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(512);
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::with_cases(cases)
    }
}

/// The window (or period) a spec's times are stepped by.
fn unit(l: &Limit) -> u64 {
    match l {
        Limit::FixedWindow(p) => p.window,
        Limit::SlidingWindow(p) => p.window,
        Limit::SlidingLog(p) => p.window,
        Limit::WindowRing(p) => p.sub,
        Limit::TokenBucket(p) => p.interval,
        Limit::LeakyBucket(p) => p.interval,
        Limit::Concurrency(p) => p.lease,
    }
}

/// Drives `subject` through `ops` (time step, cost), checking every decision's contract.
pub fn drive<T: Subject>(
    subject: T,
    start: u64,
    w: u64,
    cap: u64,
    ops: &[(u8, u64, u8, u64)],
    idle_raw: &[u64],
) -> Result<(), TestCaseError> {
    drive_with(subject, start, w, cap, ops, idle_raw, |_, _| {})
}

/// [`drive`], with `before(subject, i)` run before operation `i`'s decision.
fn drive_with<T: Subject>(
    mut subject: T,
    start: u64,
    w: u64,
    cap: u64,
    ops: &[(u8, u64, u8, u64)],
    idle_raw: &[u64],
    mut before: impl FnMut(&mut T, usize),
) -> Result<(), TestCaseError> {
    let mut now = start;
    let idle = idles(w, idle_raw);
    for (i, &(sk, sr, ck, cr)) in ops.iter().enumerate() {
        now = step(sk, sr, now, w);
        before(&mut subject, i);
        let c = cost(ck, cr, cap);
        let (_, after) = check_contract(&subject, now, c, &idle, &format!("op {i}"))?;
        subject = after;
    }
    Ok(())
}

/// One generated case: the limit, the start time, the operations (raw values `drive` turns
/// into time steps and costs) and the raw idle gaps.
type Case = (LimitSpec, u64, Vec<(u8, u64, u8, u64)>, Vec<u64>);

/// One property per algorithm (its index in `Algorithm::ALL`).
fn single(a: usize) -> impl Strategy<Value = Case> {
    (
        spec(a),
        prop_oneof![Just(0u64), 0u64..1 << 40, any::<u64>()],
        prop::collection::vec(
            (any::<u8>(), any::<u64>(), any::<u8>(), any::<u64>()),
            1..24,
        ),
        prop::collection::vec(any::<u64>(), 3),
    )
}

fn run_single((spec, start, ops, idle_raw): Case) -> Result<(), TestCaseError> {
    // Parameters that cannot be represented are refused when built: nothing to check.
    if let Ok(l) = spec.build() {
        let w = unit(&l);
        let cap = l.capacity();
        drive(Record::new(vec![l]), start, w, cap, &ops, &idle_raw)?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn fixed_window_keeps_its_contract(case in single(0)) {
        run_single(case)?;
    }

    #[test]
    fn sliding_log_keeps_its_contract(case in single(1)) {
        run_single(case)?;
    }

    #[test]
    fn sliding_window_keeps_its_contract(case in single(2)) {
        run_single(case)?;
    }

    #[test]
    fn window_ring_keeps_its_contract(case in single(3)) {
        run_single(case)?;
    }

    #[test]
    fn token_bucket_keeps_its_contract(case in single(4)) {
        run_single(case)?;
    }

    #[test]
    fn leaky_bucket_keeps_its_contract(case in single(5)) {
        run_single(case)?;
    }

    #[test]
    fn concurrency_keeps_its_contract(case in single(6)) {
        run_single(case)?;
    }
}

// ------------------------------------------------------------------------------------------
// Several limits on one key, and the holders of a record: the keyless limiter (its 16-byte
// record for two packed limits, its sequence-word record otherwise), the keyed store (its
// arena record), and the rules engine (several rules, consume then refund).
// ------------------------------------------------------------------------------------------

/// Where a [`Replay`] keeps its record.
#[derive(Clone, Copy, Debug)]
enum Holder {
    Limiter,
    Store,
}

/// A holder of `limits`, its state being the requests it was given: every decision rebuilds
/// the holder and replays them (a holder cannot be copied; ops are few). Idle times and state
/// comparisons go through the same limits over a plain record ([`Record`]).
#[derive(Clone, Debug)]
struct Replay {
    holder: Holder,
    limits: Limits,
    ops: Vec<(u64, u64)>,
}

impl Replay {
    fn record(&self) -> Record {
        let mut r = Record {
            limits: self.limits.clone(),
            rec: vec![0; self.limits.words()],
        };
        for &(now, cost) in &self.ops {
            r.decide(now, cost);
        }
        r
    }
}

impl Subject for Replay {
    fn decide(&mut self, now: u64, cost: u64) -> Decision {
        use std::sync::Arc;
        use turnstile::keyed::Store;
        use turnstile::{Limiter, ManualClock};
        let clock = Arc::new(ManualClock::new(0));
        let d = match self.holder {
            Holder::Limiter => {
                let l = Limiter::with_limits(self.limits.clone(), clock);
                for &(t, c) in &self.ops {
                    l.check_at(c, t);
                }
                l.check_at(cost, now)
            }
            Holder::Store => {
                let s = Store::builder(self.limits.clone())
                    .capacity(4)
                    .shards(1)
                    .seed(3)
                    .build_with_clock(clock)
                    .unwrap();
                for &(t, c) in &self.ops {
                    s.check_at(&1u64, c, t);
                }
                s.check_at(&1u64, cost, now)
            }
        };
        self.ops.push((now, cost));
        d
    }
    fn idle_in(&mut self, now: u64) -> u64 {
        self.record().idle_in(now)
    }
    fn fresh(&self) -> Self {
        Self {
            ops: vec![],
            ..self.clone()
        }
    }
    fn same_state(&self, other: &Self) -> bool {
        self.record().same_state(&other.record())
    }
    fn probe_costs(&self) -> Vec<u64> {
        self.record().probe_costs()
    }
    fn alias_bound(&self, t: u64) -> Option<u64> {
        self.record().alias_bound(t)
    }
}

/// Limits, start time, ops (time step, cost), idle times.
type Several = (Vec<LimitSpec>, u64, Vec<(u8, u64, u8, u64)>, Vec<u64>);

/// 2 or 3 limits of any rate algorithm (a concurrency limit stands alone), the ops, idles.
fn several() -> impl Strategy<Value = Several> {
    (
        prop::collection::vec((0usize..6).prop_flat_map(spec), 2..=3),
        prop_oneof![Just(0u64), 0u64..1 << 40, any::<u64>()],
        prop::collection::vec(
            (any::<u8>(), any::<u64>(), any::<u8>(), any::<u64>()),
            1..16,
        ),
        prop::collection::vec(any::<u64>(), 2),
    )
}

/// Builds the limits (`None` if one cannot be represented) with the shortest unit and the
/// largest capacity to step and cost by.
fn build_several(specs: &[LimitSpec]) -> Option<(Vec<Limit>, u64, u64)> {
    let limits: Vec<Limit> = specs
        .iter()
        .map(|s| s.build().ok())
        .collect::<Option<_>>()?;
    let w = limits.iter().map(unit).min()?;
    let cap = limits.iter().map(|l| l.capacity()).max()?;
    Some((limits, w, cap))
}

fn run_several(
    (specs, start, ops, idle_raw): Several,
    holder: Option<Holder>,
) -> Result<(), TestCaseError> {
    let Some((limits, w, cap)) = build_several(&specs) else {
        return Ok(());
    };
    match holder {
        None => drive(Record::new(limits), start, w, cap, &ops, &idle_raw),
        Some(holder) => {
            let limits = Limits::new(limits).unwrap();
            let r = Replay {
                holder,
                limits,
                ops: vec![],
            };
            drive(r, start, w, cap, &ops, &idle_raw)
        }
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn several_limits_keep_the_contract(case in several()) {
        run_several(case, None)?;
    }

    #[test]
    fn the_limiter_keeps_the_contract(case in several()) {
        run_several(case, Some(Holder::Limiter))?;
    }

    #[test]
    fn the_store_keeps_the_contract(case in several()) {
        run_several(case, Some(Holder::Store))?;
    }
}

// ------------------------------------------------------------------------------------------
// One packed record whose limit changes between checks: decided over a plain record, and by
// the keyed store given the limit with each check (`Store::check_with_at`).
// ------------------------------------------------------------------------------------------

/// One packed record, decided by the member `cur` of `family` (limits whose records read
/// alike: `Limit::carries_to`).
#[derive(Clone, Debug)]
struct Relimited {
    family: Vec<Limit>,
    cur: usize,
    rec: Vec<u64>,
}

impl Relimited {
    fn record(&self) -> Record {
        Record {
            limits: Limits::new(vec![self.family[self.cur]]).unwrap(),
            rec: self.rec.clone(),
        }
    }
}

impl Subject for Relimited {
    fn decide(&mut self, now: u64, cost: u64) -> Decision {
        let mut r = self.record();
        let d = r.decide(now, cost);
        self.rec = r.rec;
        d
    }
    fn idle_in(&mut self, now: u64) -> u64 {
        self.record().idle_in(now)
    }
    fn fresh(&self) -> Self {
        Self {
            rec: vec![0; self.rec.len()],
            ..self.clone()
        }
    }
    fn same_state(&self, other: &Self) -> bool {
        self.rec == other.rec
    }
    fn probe_costs(&self) -> Vec<u64> {
        self.record().probe_costs()
    }
    fn alias_bound(&self, t: u64) -> Option<u64> {
        self.record().alias_bound(t)
    }
}

/// The keyed store, given a member of `family` with each check: its state is the checks it
/// was given (time, cost, member), replayed into a new store for every decision, as
/// [`Replay`] does.
#[derive(Clone, Debug)]
struct ReplayWith {
    family: Vec<Limit>,
    cur: usize,
    ops: Vec<(u64, u64, usize)>,
}

impl ReplayWith {
    fn relimited(&self) -> Relimited {
        let mut r = Relimited {
            family: self.family.clone(),
            cur: 0,
            rec: vec![0],
        };
        for &(now, cost, cur) in &self.ops {
            r.cur = cur;
            r.decide(now, cost);
        }
        r.cur = self.cur;
        r
    }
}

impl Subject for ReplayWith {
    fn decide(&mut self, now: u64, cost: u64) -> Decision {
        use std::sync::Arc;
        use turnstile::keyed::Store;
        use turnstile::ManualClock;
        let s = Store::builder(Limits::new(vec![self.family[0]]).unwrap())
            .capacity(4)
            .shards(1)
            .seed(3)
            .build_with_clock(Arc::new(ManualClock::new(0)))
            .unwrap();
        for &(t, c, cur) in &self.ops {
            s.check_with_at(&1u64, &self.family[cur], c, t).unwrap();
        }
        let d = s.check_with_at(&1u64, &self.family[self.cur], cost, now);
        self.ops.push((now, cost, self.cur));
        d.unwrap()
    }
    fn idle_in(&mut self, now: u64) -> u64 {
        self.relimited().idle_in(now)
    }
    fn fresh(&self) -> Self {
        Self {
            ops: vec![],
            ..self.clone()
        }
    }
    fn same_state(&self, other: &Self) -> bool {
        self.relimited().same_state(&other.relimited())
    }
    fn probe_costs(&self) -> Vec<u64> {
        self.relimited().probe_costs()
    }
    fn alias_bound(&self, t: u64) -> Option<u64> {
        self.relimited().alias_bound(t)
    }
}

/// 2 to 4 limits of one packed algorithm that read each other's records (a window algorithm's
/// share the first one's window), the ops, which member decides each, idles.
type Family = (
    Vec<LimitSpec>,
    u64,
    Vec<(u8, u64, u8, u64)>,
    Vec<u8>,
    Vec<u64>,
);

fn family() -> impl Strategy<Value = Family> {
    (
        (0usize..4).prop_flat_map(|k| prop::collection::vec(spec([0, 2, 4, 5][k]), 2..=4)),
        prop_oneof![Just(0u64), 0u64..1 << 40, any::<u64>()],
        prop::collection::vec(
            (any::<u8>(), any::<u64>(), any::<u8>(), any::<u64>()),
            1..20,
        ),
        prop::collection::vec(any::<u8>(), 20),
        prop::collection::vec(any::<u64>(), 2),
    )
        .prop_map(|(mut specs, start, ops, picks, idle)| {
            let w = specs[0].window;
            for s in &mut specs {
                if matches!(
                    s.algorithm,
                    Algorithm::FixedWindow | Algorithm::SlidingWindow
                ) {
                    s.window = w;
                }
            }
            (specs, start, ops, picks, idle)
        })
}

fn run_family(
    (specs, start, ops, picks, idle_raw): Family,
    store: bool,
) -> Result<(), TestCaseError> {
    let Some((family, w, cap)) = build_several(&specs) else {
        return Ok(());
    };
    for l in &family {
        prop_assert!(family[0].carries_to(l), "{:?} reads {:?}", family[0], l);
    }
    let n = family.len();
    let pick = |i: usize| picks[i % picks.len()] as usize % n;
    if store {
        let r = ReplayWith {
            family,
            cur: 0,
            ops: vec![],
        };
        drive_with(r, start, w, cap, &ops, &idle_raw, |r, i| r.cur = pick(i))
    } else {
        let r = Relimited {
            family,
            cur: 0,
            rec: vec![0],
        };
        drive_with(r, start, w, cap, &ops, &idle_raw, |r, i| r.cur = pick(i))
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn a_record_keeps_the_contract_as_its_limit_changes(case in family()) {
        run_family(case, false)?;
    }

    #[test]
    fn the_store_given_limits_per_check_keeps_the_contract(case in family()) {
        run_family(case, true)?;
    }
}
