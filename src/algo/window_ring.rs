//! `window_ring`: the notes' "sliding window with counters". W is split into N sub-windows
//! (default 60: "500 per hour" counted per minute), each with a small counter. The window
//! (now − W, now] holds the N − 1 sub-windows before the current one whole, the current one
//! (partly elapsed, all its requests inside), and a part of the sub-window that straddles
//! now − W. That one is weighted as Cloudflare weights the previous window, at sub-window
//! granularity:
//!
//! ```text
//! count = Σ counters of sub-windows cur−N+1 ..= cur  +  round(counter(cur − N) × (s − e) / s)
//! ```
//!
//! with s = W / N and e = now − cur·s the time elapsed in the current sub-window; (s − e)/s
//! is the share of sub-window cur − N still inside the window. A request of cost n is
//! admitted iff count + n ≤ limit. Integer arithmetic (u128): the share is rounded to the
//! nearest integer, halves up, `⌊(2 × counter × (s − e) + s) / 2s⌋`. (Rounding down, as
//! sliding_window does, would undercount by half a request on average: at 10–20 requests a
//! window that alone is 2.5–5 %. With N = 1 the estimate is sliding_window's but for that.)
//!
//! The estimate differs from an exact log only in the straddling sub-window, whose requests
//! are assumed spread evenly across it: |count − exact| ≤ counter(cur − N), at most the
//! requests of one sub-window, and about 0 on average for traffic that is smooth at the scale
//! of a sub-window. It errs both ways: requests late in that sub-window are undercounted,
//! early ones overcounted.
//!
//! # Record layout (`1 + ⌈(N + 1) / ⌊64/w⌋⌉` words of 64 bits)
//!
//! ```text
//! word 0:  | sub-window index mod P (38) | total of the N newest counters (26) |
//! word 1+: | counter | counter | ... |   N + 1 counters (sub-window j at slot j mod (N + 1)),
//!                                         each w = bit length of the limit (≤ 16) bits
//!                                         (wider with count_denied, ≤ 26),
//!                                         ⌊64 / w⌋ to a word, never straddling words
//! ```
//!
//! 500/h in 60 buckets: w = 9, 7 counters a word, 61 counters in 9 words + header = 80 bytes
//! (the notes estimate 1.6 KB). The running total (at most N × (2^16 − 1) < 2^26) makes a
//! check O(1) plus the sub-windows that slid out since the last check. Limits ≤
//! [`MAX_LIMIT`] = 65 535, N ≤ [`MAX_BUCKETS`] = 1024, and the window must split into N whole
//! nanoseconds (with `count_denied`, counters as wide as `docs/algorithms.md` says). The
//! header keeps the sub-window index mod P ([`Params::period`]), the largest multiple of N + 1
//! below 2^38, so an index that has come round names the slots its counters were written to.
//! A stored index ahead of now's by at most [`AHEAD`] = 2^26 sub-windows (time went
//! backwards) keeps the stored sub-window current and its straddling sub-window whole:
//! conservative. Any other distance ahead is an expired ring ("far behind means expired"). A
//! ring idle for about a multiple of P sub-windows can read as recent and is held at most
//! N + `AHEAD` + 2 sub-windows more. An aliased index that reads as N or more sub-windows
//! behind empties the ring, as the truth would; one that reads as fewer keeps the counts until
//! they slide out. While a ring counts anything it is never
//! reported idle (`idle_in`), so reclaiming an idle record never changes a decision. A ring
//! whose counters are all 0 is fresh at any index.

use super::Cells;
use crate::decision::{ConfigError, Decision};

/// Largest limit (16-bit counters).
pub const MAX_LIMIT: u64 = u16::MAX as u64;
/// Largest number of sub-windows (N + 1 counters are kept).
pub const MAX_BUCKETS: u64 = 1024;
/// Bits of the sub-window index in the header.
pub const INDEX_BITS: u32 = 38;
/// Bits of the running total (of the N newest counters: ≤ 1024 × 65 535 < 2^26).
pub const TOTAL_BITS: u32 = 26;
const TOTAL_MASK: u64 = (1 << TOTAL_BITS) - 1;
/// Sub-windows a stored index may be ahead of now's and be read as time going backwards;
/// beyond, the record has expired (module docs).
pub const AHEAD: u64 = 1 << (INDEX_BITS - 12);
const _: () = assert!(MAX_BUCKETS * MAX_LIMIT <= TOTAL_MASK);

/// Parameters, validated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Params {
    /// Admissions per window.
    pub limit: u64,
    /// Window, ns.
    pub window: u64,
    /// Sub-windows N.
    pub buckets: u64,
    /// W / N, ns.
    pub sub: u64,
    /// Bits per counter.
    pub width: u32,
    /// Counters per word.
    pub per_word: u64,
    /// Whether denied requests count.
    pub count_denied: bool,
}

impl Params {
    /// `limit` per `window` ns counted in `buckets` sub-windows.
    pub fn new(
        limit: u64,
        window: u64,
        buckets: u64,
        count_denied: bool,
    ) -> Result<Self, ConfigError> {
        if limit == 0 || limit > MAX_LIMIT {
            return Err(ConfigError::new("limit", format!("window_ring holds 1..={MAX_LIMIT} requests per window (16-bit sub-window counters), got {limit}; use sliding_window or token_bucket for larger limits")));
        }
        if buckets == 0 || buckets > MAX_BUCKETS {
            return Err(ConfigError::new(
                "buckets",
                format!("window_ring takes 1..={MAX_BUCKETS} sub-windows, got {buckets}"),
            ));
        }
        if window == 0 || window % buckets != 0 {
            return Err(ConfigError::new("window", format!("a window of {window} ns does not split into {buckets} sub-windows of whole nanoseconds; pick a window that is a multiple of the bucket count")));
        }
        let bits = |x: u128| 128 - x.leading_zeros();
        let sub = window / buckets;
        let width = if count_denied {
            // Denials push a counter past the limit. Any count of at least
            // ⌈(2·limit − 1)·s / 2⌉ denies whatever the share of it still inside the window
            // (module docs), so counters that wide are exact; wider than the running total
            // allows for N of them they cannot be, and saturate (the bound in the docs).
            let exact = bits(((2 * limit as u128 - 1) * sub as u128).div_ceil(2));
            let fit = bits((TOTAL_MASK / buckets) as u128 + 1) - 1;
            exact.min(fit).max(bits(limit as u128))
        } else {
            bits(limit as u128)
        };
        Ok(Self {
            limit,
            window,
            buckets,
            sub,
            width,
            per_word: 64 / width as u64,
            count_denied,
        })
    }

    /// P: sub-window indexes are kept mod P, the largest multiple of N + 1 below 2^38, so
    /// that an index's slot (index mod N + 1) is the same whichever multiple of P it is read
    /// at.
    pub fn period(&self) -> u64 {
        (1u64 << INDEX_BITS) / self.slots() * self.slots()
    }

    /// Words in a record: the header and N + 1 counters.
    pub fn words(&self) -> usize {
        1 + self.slots().div_ceil(self.per_word) as usize
    }

    /// Counters kept: the N sub-windows of the window and the one straddling its start.
    fn slots(&self) -> u64 {
        self.buckets + 1
    }

    /// The largest a sub-window's counter holds: 2^w − 1, w = `width`.
    pub fn max_count(&self) -> u64 {
        (1 << self.width) - 1
    }
}

#[inline]
fn get_counter<C: Cells + ?Sized>(c: &C, p: &Params, pos: u64) -> u64 {
    let w = 1 + (pos / p.per_word) as usize;
    let sh = (pos % p.per_word) as u32 * p.width;
    (c.get(w) >> sh) & p.max_count()
}

#[inline]
fn set_counter<C: Cells + ?Sized>(c: &mut C, p: &Params, pos: u64, v: u64) {
    let w = 1 + (pos / p.per_word) as usize;
    let sh = (pos % p.per_word) as u32 * p.width;
    let m = p.max_count() << sh;
    let old = c.get(w);
    c.set(w, (old & !m) | ((v << sh) & m));
}

/// The slot of sub-window `j + plus` (no overflow whatever `j`).
#[inline]
fn slot(p: &Params, j: u64, plus: u64) -> u64 {
    (j % p.slots() + plus % p.slots()) % p.slots()
}

/// How the record looks at `now` without touching it.
struct View {
    /// Full index of the current sub-window.
    cur: u64,
    /// Sub-windows entered since the stored one (≤ N + 1): their slots still hold expired
    /// counts, to be zeroed (0 if none or time went backwards).
    slid: u64,
    /// The live sum of sub-windows cur − N + 1 ..= cur.
    full: u64,
    /// The live counter of sub-window cur − N (0 before time 0).
    old: u64,
    /// Nanoseconds of sub-window cur − N still inside the window, 1..=s (s when `now` lies
    /// before the current sub-window: time went backwards).
    rem: u64,
}

impl View {
    /// The window's count: the full sub-windows and the straddling one's share, rounded.
    fn count(&self, p: &Params) -> u64 {
        self.full + weigh(self.old, self.rem, p)
    }
}

/// old × rem / s rounded to the nearest integer, halves up: ⌊(2·old·rem + s) / 2s⌋, exactly
/// (u128; rem ≤ s, so at most `old`).
#[inline]
fn weigh(old: u64, rem: u64, p: &Params) -> u64 {
    let s = p.sub as u128;
    ((2 * old as u128 * rem as u128 + s) / (2 * s)) as u64
}

/// Nanoseconds from `now` until the end of sub-window `j + plus` (0 if already over).
#[inline]
fn until_end(p: &Params, j: u64, plus: u64, now: u64) -> u64 {
    ((j as u128 + plus as u128 + 1) * p.sub as u128)
        .saturating_sub(now as u128)
        .min(u64::MAX as u128) as u64
}

fn view<C: Cells + ?Sized>(c: &C, now: u64, p: &Params) -> View {
    let h = c.get(0);
    let (idx, total) = (h >> TOTAL_BITS, h & TOTAL_MASK);
    let n = p.buckets;
    let b = now / p.sub;
    // Indexes are kept mod P, a multiple of N + 1 (`Params::period`): an index that has come
    // round then names the same slots as the sub-window that wrote them, so an aliased ring
    // reads as a ring really written then, never as counts no slot holds.
    let period = p.period();
    let d = (b % period + period - idx % period) % period;
    let rem_in = |cur: u64| until_end(p, cur, 0, now).min(p.sub);
    if total == 0 && (1..p.words()).all(|w| c.get(w) == 0) {
        // An empty ring is fresh whatever its stored index (e.g. state 0 at any time).
        return View {
            cur: b,
            slid: 0,
            full: 0,
            old: 0,
            rem: rem_in(b),
        };
    }
    if d >= period - AHEAD {
        // The stored index is ahead of now's by at most AHEAD (time went backwards a little):
        // it stays current, its counts kept as they are: conservative.
        let cur = b.checked_add(period - d);
        if let Some(cur) = cur.filter(|&j| j as u128 * p.sub as u128 <= u64::MAX as u128) {
            return View {
                cur,
                slid: 0,
                full: total,
                old: if cur >= n {
                    get_counter(c, p, slot(p, cur, 1))
                } else {
                    0
                },
                rem: rem_in(cur),
            };
        }
        // No time of the clock lies in that sub-window: not one this ring was in. Expired.
    }
    if d > b || d >= period - AHEAD {
        // Far ahead (a wrapped index; the stored sub-window would lie before time 0): expired.
        // Every slot is cleared when the ring is next written.
        return View {
            cur: b,
            slid: p.slots(),
            full: 0,
            old: 0,
            rem: rem_in(b),
        };
    }
    // The stored sub-window is d ≤ b behind: sub-windows stored − N + 1 ..= b − N left the
    // N newest (the last of them is now the straddling one, if d ≤ N).
    let stored = b - d;
    let mut full = total;
    if d >= n {
        // All N sub-windows the total counted have left the window. Set, not subtracted:
        // after 2^38 sub-windows or more the index aliases (module docs), `stored` is then
        // not the sub-window that wrote the counters, and subtracting the counters at its
        // slots would keep a total that no live counter holds.
        full = 0;
    } else {
        for k in 1..=d {
            // Sub-window stored − N + k ≡ stored + k + 1 (mod N + 1).
            full -= get_counter(c, p, slot(p, stored, k + 1)).min(full);
        }
    }
    let old = if d <= n && b >= n {
        get_counter(c, p, slot(p, b, 1))
    } else {
        0
    };
    View {
        cur: b,
        slid: d.min(p.slots()),
        full,
        old,
        rem: rem_in(b),
    }
}

/// The live counter of sub-window `j` (0 outside cur − N ..= cur or entered since the stored
/// one).
fn live<C: Cells + ?Sized>(c: &C, p: &Params, v: &View, j: u64) -> u64 {
    if j > v.cur || j.saturating_add(p.buckets) < v.cur || j.saturating_add(v.slid) > v.cur {
        return 0;
    }
    get_counter(c, p, slot(p, j, 0))
}

/// Full index of the newest sub-window with a non-zero live count, if any.
fn newest_nonzero<C: Cells + ?Sized>(c: &C, p: &Params, v: &View) -> Option<u64> {
    if v.full == 0 && v.old == 0 {
        return None;
    }
    (0..=p.buckets)
        // Near time 0 the window reaches before sub-window 0: stop there.
        .map_while(|k| v.cur.checked_sub(k))
        .find(|&j| live(c, p, v, j) > 0)
}

fn slide<C: Cells + ?Sized>(c: &mut C, p: &Params, v: &View) {
    for k in 0..v.slid {
        // Sub-window cur − k (mod N + 1, so that nothing underflows near time 0).
        set_counter(c, p, slot(p, v.cur, p.slots() - k), 0);
    }
    c.set(
        0,
        ((v.cur % p.period()) << TOTAL_BITS) | v.full.min(TOTAL_MASK),
    );
}

/// The transition, in place. Cost 0 peeks and changes nothing; `apply = false` evaluates
/// without recording (the first phase of an all-or-nothing multi-limit check).
pub fn decide<C: Cells + ?Sized>(
    c: &mut C,
    now: u64,
    p: &Params,
    cost: u64,
    apply: bool,
) -> Decision {
    let v = view(c, now, p);
    let count = v.count(p);
    let reset = reset_in(c, p, &v, now);
    if cost == 0 {
        return Decision::allow(p.limit, p.limit.saturating_sub(count), reset);
    }
    // Saturating: a huge cost must be refused, not wrap around into an admission.
    let fits = count.saturating_add(cost) <= p.limit;
    if fits {
        if apply {
            add(c, p, &v, cost);
        }
        return Decision::allow(
            p.limit,
            p.limit - count - cost,
            until_end(p, v.cur, p.buckets, now),
        );
    }
    let d = denied(c, now, p, &v, cost, reset);
    // A denial is counted (count_denied) only if it can be retried within the clock once
    // counted: by the end of sub-window cur + N everything counted now has slid out.
    let countable = d.retry_after_ns.is_some()
        && (v.cur as u128 + p.buckets as u128 + 1) * (p.sub as u128) <= u64::MAX as u128;
    if !(p.count_denied && countable && apply) {
        return d;
    }
    add(c, p, &v, cost);
    // The denial is counted too: retry, remaining and reset are those of the ring as it is now.
    let after = view(c, now, p);
    let reset = reset_in(c, p, &after, now);
    denied(c, now, p, &after, cost, reset)
}

/// Records `cost` in the current sub-window (its counter saturating at `max_count`).
fn add<C: Cells + ?Sized>(c: &mut C, p: &Params, v: &View, cost: u64) {
    slide(c, p, v);
    let pos = slot(p, v.cur, 0);
    let cnt = get_counter(c, p, pos);
    let add = cost.min(p.max_count() - cnt);
    set_counter(c, p, pos, cnt + add);
    let full = (v.full + add).min(TOTAL_MASK);
    c.set(0, ((v.cur % p.period()) << TOTAL_BITS) | full);
}

fn denied<C: Cells + ?Sized>(
    c: &C,
    now: u64,
    p: &Params,
    v: &View,
    cost: u64,
    reset: u64,
) -> Decision {
    // Past the end of the clock it never fits.
    let retry = (cost <= p.limit)
        .then(|| first_fit(c, now, p, v, cost))
        .filter(|&r| now as u128 + r <= u64::MAX as u128)
        .map(|r| r as u64);
    Decision::deny(p.limit, p.limit.saturating_sub(v.count(p)), reset, retry)
}

/// Nanoseconds (≥ 1) until `cost` ≤ limit fits, nothing else happening. The count only falls
/// with time, so: the first sub-window (from the current one on) whose N newest counters leave
/// room, and in it the first instant at which the straddling sub-window's weighted share
/// fits: ⌊(2·old·r + s) / 2s⌋ ≤ room ⟺ 2·old·r < (2·room + 1)·s ⟺
/// r ≤ ⌈(2·room + 1)·s / 2·old⌉ − 1, r the nanoseconds of it still inside the window. By sub-window cur + N + 1 nothing is left, so the loop always returns.
fn first_fit<C: Cells + ?Sized>(c: &C, now: u64, p: &Params, v: &View, cost: u64) -> u128 {
    let s = p.sub as u128;
    let (mut full, mut old) = (v.full, v.old);
    for k in 0..=p.buckets + 1 {
        let j = v.cur as u128 + k as u128;
        if k > 0 {
            // Sub-window j − N leaves the N newest and straddles the window's start; j is
            // empty (nothing has happened there yet).
            old = match (j + 1).checked_sub(p.buckets as u128 + 1) {
                Some(o) => live(c, p, v, o as u64),
                None => 0,
            };
            full -= old.min(full);
        }
        if full + cost > p.limit {
            continue;
        }
        let room = (p.limit - cost - full) as u128;
        let start = (now as u128).max(j * s);
        let at = if old == 0 {
            start
        } else {
            let r_max = ((2 * room + 1) * s).div_ceil(2 * old as u128) - 1;
            if r_max == 0 {
                continue;
            }
            start.max((j + 1) * s - r_max.min(s))
        };
        return (at - now as u128).max(1);
    }
    ((v.cur as u128 + p.buckets as u128 + 2) * s - now as u128).max(1)
}

/// Gives `n` back, newest sub-windows first (the straddling one last).
pub fn refund<C: Cells + ?Sized>(c: &mut C, now: u64, p: &Params, n: u64) {
    let v = view(c, now, p);
    slide(c, p, &v);
    let mut left = n;
    let mut full = v.full;
    for k in 0..=p.buckets {
        if left == 0 {
            break;
        }
        let Some(j) = v.cur.checked_sub(k) else { break };
        let pos = slot(p, j, 0);
        let cnt = get_counter(c, p, pos);
        let take = cnt.min(left);
        set_counter(c, p, pos, cnt - take);
        left -= take;
        if k < p.buckets {
            full -= take.min(full);
        }
    }
    c.set(0, ((v.cur % p.period()) << TOTAL_BITS) | full);
}

/// Adds `n` to the current sub-window whatever the window holds (a settled cost above the one
/// checked): the count may pass the limit, up to the counter's width (`max_count`), and slides
/// out as any count does.
pub fn charge<C: Cells + ?Sized>(c: &mut C, now: u64, p: &Params, n: u64) {
    if n == 0 {
        return;
    }
    let v = view(c, now, p);
    add(c, p, &v, n);
}

/// Nanoseconds until the record is equivalent to a fresh one: the end of the sub-window in
/// which the newest non-zero sub-window straddles the window's start.
pub fn idle_in<C: Cells + ?Sized>(c: &C, now: u64, p: &Params) -> u64 {
    reset_in(c, p, &view(c, now, p), now)
}

/// Nanoseconds until the record is idle: the newest non-zero sub-window has slid out whole.
/// A count that no live counter holds (an index aliased after 2^38 idle sub-windows, module
/// docs) keeps the record busy until the current sub-window has slid out too, when `view`
/// drops it: never idle while it still counts, so a record reported idle decides as a fresh
/// one.
fn reset_in<C: Cells + ?Sized>(c: &C, p: &Params, v: &View, now: u64) -> u64 {
    match newest_nonzero(c, p, v) {
        Some(j) => until_end(p, j, p.buckets, now),
        None if v.full > 0 || v.old > 0 => until_end(p, v.cur, p.buckets, now),
        None => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    const MIN: u64 = 60_000_000_000;

    #[test]
    fn five_hundred_per_hour_in_minutes() {
        let p = Params::new(500, 60 * MIN, 60, false).unwrap();
        // 61 nine-bit counters, 7 to a word: 9 words and the header.
        assert_eq!(p.words(), 10);
        let mut rec = vec![0u64; p.words()];
        // 10 per minute for 50 minutes = 500, then denied until minute 0 starts sliding out.
        for m in 0..50 {
            for _ in 0..10 {
                assert!(decide(&mut rec[..], m * MIN + 1, &p, 1, true).allowed());
            }
        }
        let d = decide(&mut rec[..], 55 * MIN, &p, 1, true);
        assert!(!d.allowed());
        // From 60 min minute 0 straddles the window's start: 10 × (s − e)/s rounds to 9 once
        // below 9.5, e > s/20 = 3 s: 490 + 9 = 499.
        assert_eq!(d.retry_after_ns, Some(5 * MIN + MIN / 20 + 1));
        assert!(!decide(&mut rec[..], 60 * MIN + MIN / 20, &p, 1, true).allowed());
        assert!(decide(&mut rec[..], 60 * MIN + MIN / 20 + 1, &p, 1, true).allowed());
        assert!(!decide(&mut rec[..], 60 * MIN + MIN / 20 + 1, &p, 1, true).allowed());
        // Half-way through minute 60: 491 + round(10 / 2) = 496.
        assert_eq!(
            decide(&mut rec[..], 60 * MIN + MIN / 2, &p, 0, true).remaining,
            4
        );
        // Minute 0 is gone at 61 min; minute 1 now straddles: 491 − 10 + 10 = 491.
        assert_eq!(decide(&mut rec[..], 61 * MIN, &p, 0, true).remaining, 9);
    }

    /// One sub-window: the two-window estimate, its share rounded to nearest, halves up.
    #[test]
    fn one_bucket_rounds_the_share_to_nearest() {
        let p = Params::new(10, 1000, 1, false).unwrap();
        let mut rec = vec![0u64; p.words()];
        assert!(decide(&mut rec[..], 0, &p, 3, true).allowed());
        // 3 in [0, 1000); at t in [1000, 2000) they count 3 × (2000 − t) / 1000.
        for (t, counted) in [(1000, 3), (1500, 2), (1510, 1), (1833, 1), (1834, 0)] {
            assert_eq!(
                decide(&mut rec[..], t, &p, 0, true).remaining,
                10 - counted,
                "{t}"
            );
        }
    }

    /// Whatever `now` — time 0, the end of u64 with nanosecond sub-windows, time going
    /// backwards, wrapped indices — nothing overflows (checked with overflow checks on) and a
    /// denial that can be retried waits at least 1 ns.
    #[test]
    fn extreme_times_never_overflow() {
        let mut times = vec![
            0,
            1,
            2,
            59,
            60,
            61,
            1 << 37,
            (1 << 38) + 3,
            1 << 62,
            u64::MAX - 61,
            u64::MAX - 1,
            u64::MAX,
        ];
        times.extend(times.clone().into_iter().rev());
        for (n, window) in [(1, 1), (3, 3), (60, 60), (60, 60 * MIN), (1024, 1024)] {
            for count_denied in [false, true] {
                let p = Params::new(3, window, n, count_denied).unwrap();
                let mut rec = vec![0u64; p.words()];
                for round in 0..3 {
                    for &t in &times {
                        for cost in [0, 1, 2, 3, 4, u64::MAX] {
                            let d = decide(&mut rec[..], t, &p, cost, true);
                            assert!(d.retry_after_ns.is_none_or(|r| r >= 1));
                            assert!(d.remaining <= 3);
                        }
                        idle_in(&rec[..], t, &p);
                        refund(&mut rec[..], t, &p, 1 + round);
                    }
                }
            }
        }
    }

    #[test]
    fn refuses_bad_params() {
        assert!(Params::new(70_000, 60, 60, false).is_err());
        assert!(Params::new(5, 61, 60, false).is_err());
        assert!(Params::new(5, 60, 0, false).is_err());
    }

    /// Found by fuzzing (store_differential): 4 per 4 ns in four 1 ns sub-windows, a record
    /// last written more than 2^38 sub-windows before `now`. Its index aliased to a sub-window
    /// that had not written the counters, the total was kept, and the record counted 4 while
    /// `idle_in` called it idle, so reclaiming it would have changed a decision.
    #[test]
    fn an_aliased_index_is_idle_only_when_it_counts_nothing() {
        let p = Params::new(4, 4, 4, false).unwrap();
        let rec = [0x4cb6_8c00_0000_0004u64, 4];
        let now = 31_540_420_899_000_000;
        assert_eq!(idle_in(&rec[..], now, &p), 0);
        for cost in 0..6 {
            let mut r = rec;
            let mut fresh = [0u64; 2];
            assert_eq!(
                decide(&mut r[..], now, &p, cost, true),
                decide(&mut fresh[..], now, &p, cost, true),
                "cost {cost}"
            );
        }
    }

    proptest::proptest! {
        /// Whatever the record holds (any words, any index, any time): if it is idle it
        /// decides as a fresh one, the property the store's reclaim relies on.
        #[test]
        fn any_idle_record_decides_as_fresh(
            limit in 1u64..20,
            buckets in 1u64..9,
            sub in 1u64..6,
            words in proptest::collection::vec(proptest::prelude::any::<u64>(), 4),
            now in 0u64..1 << 62,
            count_denied in proptest::prelude::any::<bool>(),
            behind in proptest::option::of(0u64..12),
            counters in 0u8..3,
        ) {
            let p = Params::new(limit, sub * buckets, buckets, count_denied).unwrap();
            let mut words = words;
            // Random counters, all zero (a total no counter holds), or one non-zero.
            match counters {
                0 => {}
                1 => words[1..].fill(0),
                _ => {
                    let w = words[1];
                    words[1..].fill(0);
                    words[1] = w & 0xffff;
                }
            }
            if let Some(k) = behind {
                // A stored index a few sub-windows behind now's, counters at any slots: what
                // an index aliased after 2^38 sub-windows looks like.
                let idx = (now / sub).wrapping_sub(k) % p.period();
                words[0] = idx << TOTAL_BITS | (words[0] & TOTAL_MASK);
            }
            let rec = &words[..p.words()];
            if idle_in(rec, now, &p) == 0 {
                for cost in 0..limit + 2 {
                    let mut r = rec.to_vec();
                    let mut fresh = vec![0u64; p.words()];
                    proptest::prop_assert_eq!(
                        decide(&mut r[..], now, &p, cost, true),
                        decide(&mut fresh[..], now, &p, cost, true),
                        "cost {}", cost
                    );
                }
            }
        }
    }
}
