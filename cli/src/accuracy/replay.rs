//! One replay of the traffic: every algorithm, the exact count and the keyed store, request by
//! request, and the report they make.

use super::traffic::Kind;
use super::{
    approx, round3, round6, spec, Approx, Cloudflare, Config, KindRow, Ratios, Report, Row, Tally,
    STORE_SEED,
};
use std::collections::VecDeque;
use std::time::Instant;
use turnstile::keyed::Store;
use turnstile::{Algorithm, Limit, Limits, ManualClock};

/// Cloudflare's published figures of 2017 (400 M requests from 270 k sources), beside ours.
const CLOUDFLARE_2017: Cloudflare = Cloudflare {
    requests: 400_000_000,
    sources: 270_000,
    wrong_decisions_pct: 0.003,
    mean_rate_error_pct: 6.0,
    false_negative_sources: 3,
    false_positive_sources: 0,
};

/// One replay of the traffic through every algorithm at once, the exact count beside them.
pub(super) struct Replay<'c> {
    c: &'c Config,
    kinds: Vec<Kind>,
    /// The reference limit (an exact sliding log) and the words of its record.
    reference: Limit,
    rw: usize,
    /// Words of one source's block (every algorithm's records side by side).
    stride: usize,
    algos: [Approx; 3],
    blocks: Vec<u64>,
    ref_limited: Vec<bool>,
    ref_denied: u64,
    /// The engine end to end: the reference limit in a keyed store.
    store: Store<ManualClock>,
    store_tally: Tally,
    /// The exact count: each source's request times in the last window.
    recent: Vec<VecDeque<u64>>,
    /// (sources, requests) per kind of traffic.
    per_kind: [(u64, u64); 3],
    near: (u64, u64),
    at_limit: (u64, u64),
    at_limit_n: u64,
}

impl<'c> Replay<'c> {
    pub(super) fn new(c: &'c Config, kinds: Vec<Kind>, start: u64) -> crate::Result<Self> {
        let n = c.sources as usize;
        // Each source's records, all algorithms', side by side in one block: one source's
        // check touches neighbouring cache lines and one page, not one page per algorithm.
        let reference = spec(
            Algorithm::SlidingLog,
            c.limit,
            c.window,
            c.buckets,
            c.count_denied,
        )?;
        let rw = reference.words();
        let mut stride = rw;
        let algos = [
            approx(Algorithm::SlidingWindow, c, &mut stride)?,
            approx(Algorithm::WindowRing, c, &mut stride)?,
            approx(Algorithm::FixedWindow, c, &mut stride)?,
        ];
        // With room to spare (at exactly its capacity a table may refuse a handful of keys)
        // and one shard (records are split evenly between shards, keys are not).
        let store = Store::builder(Limits::new(vec![reference])?)
            .capacity(c.sources as u64 + c.sources as u64 / 4 + 64)
            .shards(1)
            .seed(STORE_SEED)
            .build_with_clock(ManualClock::new(start))?;
        Ok(Self {
            c,
            kinds,
            reference,
            rw,
            stride,
            algos,
            blocks: vec![0u64; n * stride],
            ref_limited: vec![false; n],
            ref_denied: 0,
            store,
            store_tally: Tally {
                limited: vec![false; n],
                ..Tally::default()
            },
            recent: (0..n).map(|_| VecDeque::new()).collect(),
            per_kind: [(0, 0); 3],
            near: (c.limit / 2, c.limit + c.limit / 2),
            at_limit: (c.limit - c.limit / 10, c.limit + c.limit / 10),
            at_limit_n: 0,
        })
    }

    /// Source `src`'s request at `t`, through the reference, each algorithm and the store.
    pub(super) fn request(&mut self, t: u64, src: u32) -> crate::Result<()> {
        let c = self.c;
        let s = src as usize;
        let kind = self.kinds[s] as usize;
        self.per_kind[kind].1 += 1;

        let q = &mut self.recent[s];
        while q.front().is_some_and(|&x| x + c.window <= t) {
            q.pop_front();
        }
        let exact = q.len() as u64;
        q.push_back(t);
        let near_limit = exact >= self.at_limit.0 && exact <= self.at_limit.1;
        self.at_limit_n += near_limit as u64;

        let block = &mut self.blocks[s * self.stride..(s + 1) * self.stride];
        let truth = self
            .reference
            .step(&mut block[..self.rw], t, 1, true)
            .allowed();
        if !truth {
            self.ref_denied += 1;
            self.ref_limited[s] = true;
        }

        for a in self.algos.iter_mut() {
            let d = a.limit.step(&mut block[a.at..a.meter_at], t, 1, true);
            a.tally.record(d.allowed(), truth, s, kind, near_limit);
            let m = a.meter.step(&mut block[a.meter_at..a.end], t, 1, true);
            if !m.allowed() {
                return Err(format!(
                    "the {} meter saturated at {} requests per window; lower --limit or the traffic",
                    a.algorithm, a.meter_cap
                ).into());
            }
            if exact >= c.min_count {
                let est = a.meter_cap - 1 - m.remaining;
                let e = est.abs_diff(exact) as f64 / exact as f64;
                a.tally.rate_err += e;
                a.tally.rate_samples += 1;
                if exact >= self.near.0 && exact <= self.near.1 {
                    a.tally.near_err += e;
                    a.tally.near_samples += 1;
                }
            }
        }

        let d = self.store.check_at(&(src as u64), 1, t);
        self.store_tally
            .record(d.allowed(), truth, s, kind, near_limit);
        Ok(())
    }

    /// The report of the requests replayed from `start` to `last`.
    pub(super) fn report(mut self, start: u64, last: u64, t0: Instant) -> crate::Result<Report> {
        let c = self.c;
        let st = self.store.stats();
        if st.rejected > 0 || st.untracked > 0 {
            return Err(format!(
                "the keyed store refused {} sources: it was sized too small",
                st.rejected + st.untracked
            )
            .into());
        }
        let total: u64 = self.per_kind.iter().map(|k| k.1).sum();
        let pct = |x: u64| round6(100.0 * x as f64 / total.max(1) as f64);
        let (results, ratios) = self.results(pct);
        let traffic_rows = self.traffic_rows();
        let (at_limit_n, ref_limited) = (self.at_limit_n, &self.ref_limited);

        Ok(Report {
            requests: total,
            sources: c.sources as u64,
            seed: c.seed,
            mix: c.mix.name,
            limit: c.limit,
            window_seconds: c.window as f64 / 1e9,
            window_ring_buckets: c.buckets,
            cloudflare_2017: CLOUDFLARE_2017,
            count_denied: c.count_denied,
            min_count: c.min_count,
            simulated_seconds: round3((last - start) as f64 / 1e9),
            elapsed_seconds: round3(t0.elapsed().as_secs_f64()),
            sources_over_limit: ref_limited.iter().filter(|&&l| l).count() as u64,
            reference_denied_pct: pct(self.ref_denied),
            at_limit_pct: pct(at_limit_n),
            at_limit_requests: at_limit_n,
            traffic: traffic_rows,
            results,
            window_ring_over_sliding_window: ratios,
        })
    }

    /// One row per algorithm run as a transition, then the keyed store's; and the
    /// window_ring / sliding_window ratios. `pct`: a count as a percentage of all requests.
    fn results(&self, pct: impl Fn(u64) -> f64 + Copy) -> (Vec<Row>, Ratios) {
        let (at_limit_n, ref_limited) = (self.at_limit_n, &self.ref_limited);
        let mut results: Vec<Row> = self
            .algos
            .iter()
            .map(|a| {
                a.tally.row(
                    a.algorithm.name(),
                    "transition",
                    ref_limited,
                    pct,
                    at_limit_n,
                )
            })
            .collect();
        let ratio = |f: fn(&Row) -> Option<f64>| {
            let (sw, ring) = (f(&results[0])?, f(&results[1])?);
            (sw > 0.0).then(|| round6(ring / sw))
        };
        let ratios = Ratios {
            mean_rate_error: ratio(|r| r.mean_rate_error_pct),
            wrong_decisions: ratio(|r| Some(r.wrong_decisions_pct)),
            wrong_decisions_at_limit: ratio(|r| r.wrong_decisions_at_limit_pct),
        };
        let mut own =
            self.store_tally
                .row("sliding_log", "keyed_store", ref_limited, pct, at_limit_n);
        own.mean_rate_error_pct = None;
        own.mean_rate_error_near_limit_pct = None;
        results.push(own);
        (results, ratios)
    }

    /// Sources, requests and sources over the limit, by kind of source.
    fn traffic_rows(&mut self) -> Vec<KindRow> {
        for k in &self.kinds {
            self.per_kind[*k as usize].0 += 1;
        }
        Kind::ALL
            .iter()
            .map(|&k| KindRow {
                kind: k.name(),
                sources: self.per_kind[k as usize].0,
                requests: self.per_kind[k as usize].1,
                over_limit_sources: self
                    .kinds
                    .iter()
                    .zip(&self.ref_limited)
                    .filter(|(kk, l)| **kk == k && **l)
                    .count() as u64,
            })
            .collect()
    }
}
