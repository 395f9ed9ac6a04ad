//! `turnstile accuracy`: the approximate window algorithms against the exact sliding log, on
//! synthetic traffic, after Cloudflare's 2017 experiment (400 M requests from 270 k sources:
//! 0.003 % of requests wrongly allowed or limited, 6 % mean difference between the real and
//! the approximate rate, 3 false negatives, no false positives).
//!
//! One stream ([`traffic`]) feeds, request by request:
//!
//! * the reference: `sliding_log` (exact) per source;
//! * each approximate limiter — `sliding_window`, `window_ring` (60 buckets by default), and
//!   `fixed_window` for contrast — with the same limit and window, counting rejected requests
//!   or not as the reference does (`--count-denied`; by default not, as in the engine);
//! * a *meter* per approximate algorithm: the same algorithm with the largest limit it takes,
//!   so it never refuses and counts every request, whose window estimate is compared with
//!   the exact count of the source's requests in the last W (kept in a per-source queue);
//! * a second `sliding_log` through the keyed [`Store`], checked against the reference
//!   transition: the engine end to end, which must agree on every decision.
//!
//! The limiters run the engine's pure transitions ([`Limit::step`], the function the stores
//! wrap in their compare-and-swap) over one record per source, so the run is fast and
//! deterministic. The definitions are in docs/accuracy.md and in [`Tally`].

mod replay;
mod traffic;

use super::args::parse_count;
use clap::Args;
use replay::Replay;
use serde::Serialize;
use std::time::{Duration, Instant};
use traffic::{Kind, Mix, Shape, Traffic, MIXES};
use turnstile::algo::{fixed_window, sliding_window, window_ring};
use turnstile::{Algorithm, Limit, LimitSpec};

/// Replays deterministic synthetic traffic (steady heavy-tailed Poisson sources, on/off
/// bursters, attackers aligned to window edges) through the exact sliding log and the
/// approximate algorithms (sliding_window, window_ring, fixed_window), and reports how often
/// each decides differently from the exact log (over all requests, and over the requests whose
/// source's exact count is within 10 % of the limit), how far its rate estimate is from the
/// exact count, and which sources it let through or limited wrongly.
#[derive(Args)]
pub struct AccuracyArgs {
    /// Requests in the stream (Cloudflare's run: 400M).
    #[arg(long, value_name = "N", value_parser = parse_count, default_value = "20M")]
    requests: u64,
    /// Distinct sources (Cloudflare's run: 270k).
    #[arg(long, value_name = "S", value_parser = parse_count, default_value = "20k")]
    sources: u64,
    /// Traffic seed.
    #[arg(long, value_name = "X", default_value_t = 1)]
    seed: u64,
    /// production: most sources far below the limit, 3 % bursty, 0.1 % edge attackers;
    /// adversarial: a heavy tail across the limit, 19 % bursty, 1 % edge attackers
    /// (see docs/accuracy.md).
    #[arg(long, value_name = "NAME", default_value = "production")]
    mix: String,
    /// Requests per window for every source.
    #[arg(long, value_name = "L", value_parser = parse_count, default_value = "100")]
    limit: u64,
    /// The window, seconds.
    #[arg(long, value_name = "SECS", default_value_t = 60.0)]
    window: f64,
    /// window_ring sub-windows.
    #[arg(long, value_name = "N", value_parser = parse_count, default_value_t = BUCKETS)]
    buckets: u64,
    /// Rejected requests count against the window too (default: they do not, as in the
    /// engine's default).
    #[arg(long)]
    count_denied: bool,
    /// Rate error only at requests whose source sent at least C requests in the last window
    /// (default: limit / 10).
    #[arg(long, value_name = "C", value_parser = parse_count)]
    min_count: Option<u64>,
    /// One JSON document on stdout.
    #[arg(long)]
    json: bool,
}

/// Sub-windows of the window_ring by default (the notes' per-minute counters of an hour).
const BUCKETS: u64 = 60;
/// Seed of the keyed store's placement.
const STORE_SEED: u64 = 0x6163_6375_7261_6379;

/// What one algorithm got right and wrong.
#[derive(Default)]
struct Tally {
    /// Requests decided differently from the reference.
    wrong: u64,
    /// Of those, admitted here but refused by the reference.
    wrongly_allowed: u64,
    /// Of those, refused here but admitted by the reference.
    wrongly_limited: u64,
    /// Wrong decisions by the kind of source (see [`Kind`]).
    wrong_by_kind: [u64; 3],
    /// Wrong decisions among requests whose source's exact count was within 10 % of the
    /// limit.
    wrong_at_limit: u64,
    /// Sum over sampled requests of |estimate − exact| / exact.
    rate_err: f64,
    /// Requests sampled for the rate error (exact count ≥ min_count).
    rate_samples: u64,
    /// The same for requests whose exact count is within [limit/2, 3·limit/2].
    near_err: f64,
    near_samples: u64,
    /// Sources refused at least once.
    limited: Vec<bool>,
}

/// An approximate algorithm under test: the limiter and its meter. Their records live in
/// each source's block (see `simulate`): words `at..meter_at` and `meter_at..end`.
struct Approx {
    algorithm: Algorithm,
    limit: Limit,
    at: usize,
    meter: Limit,
    meter_cap: u64,
    meter_at: usize,
    end: usize,
    tally: Tally,
}

#[derive(Serialize)]
struct Row {
    algorithm: &'static str,
    /// How it ran: "transition" (the pure algorithm) or "keyed_store".
    path: &'static str,
    wrong_decisions: u64,
    wrongly_allowed: u64,
    wrongly_limited: u64,
    wrong_decisions_pct: f64,
    /// Wrong decisions among the requests whose source's exact count (all its requests in
    /// the last W) was within 10 % of the limit, over those requests: the algorithm's error
    /// where decisions are close, whatever the mix.
    wrong_decisions_at_limit: u64,
    wrong_decisions_at_limit_pct: Option<f64>,
    mean_rate_error_pct: Option<f64>,
    mean_rate_error_near_limit_pct: Option<f64>,
    rate_samples: u64,
    false_negative_sources: u64,
    false_positive_sources: u64,
    limited_sources: u64,
    /// Wrong decisions by the kind of source.
    wrong_by_kind: ByKind,
}

#[derive(Serialize)]
struct ByKind {
    steady: u64,
    bursty: u64,
    edge_attacker: u64,
}

#[derive(Serialize)]
struct KindRow {
    kind: &'static str,
    sources: u64,
    requests: u64,
    over_limit_sources: u64,
}

#[derive(Serialize)]
struct Cloudflare {
    requests: u64,
    sources: u64,
    wrong_decisions_pct: f64,
    mean_rate_error_pct: f64,
    false_negative_sources: u64,
    false_positive_sources: u64,
}

/// window_ring's figures over sliding_window's (the goal: at most 0.1).
#[derive(Serialize)]
struct Ratios {
    mean_rate_error: Option<f64>,
    wrong_decisions: Option<f64>,
    wrong_decisions_at_limit: Option<f64>,
}

#[derive(Serialize)]
struct Report {
    requests: u64,
    sources: u64,
    seed: u64,
    /// The traffic mix (`--mix`).
    mix: &'static str,
    limit: u64,
    window_seconds: f64,
    window_ring_buckets: u64,
    /// Cloudflare's published figures, for comparison (sliding_window on their traffic).
    cloudflare_2017: Cloudflare,
    count_denied: bool,
    min_count: u64,
    simulated_seconds: f64,
    elapsed_seconds: f64,
    /// Sources the reference refused at least once: more than `limit` requests in some window.
    sources_over_limit: u64,
    /// Share of requests the reference refused.
    reference_denied_pct: f64,
    /// Share of requests that found their source's exact count within 10 % of the limit:
    /// where a small error of the estimate turns a decision.
    at_limit_pct: f64,
    at_limit_requests: u64,
    traffic: Vec<KindRow>,
    results: Vec<Row>,
    window_ring_over_sliding_window: Ratios,
}

/// Runs the subcommand.
pub fn run(a: AccuracyArgs) -> crate::Result<()> {
    let AccuracyArgs {
        requests,
        sources,
        seed,
        mix: mix_name,
        limit,
        window: window_s,
        buckets,
        count_denied,
        min_count,
        json,
    } = a;
    let mix = *MIXES.iter().find(|x| x.name == mix_name).ok_or_else(|| {
        format!("option --mix: `{mix_name}` is not a mix; give production or adversarial")
    })?;
    let min_count = min_count.unwrap_or((limit / 10).max(1));
    if sources == 0 || sources > u32::MAX as u64 {
        return Err("option --sources: give 1 to 4294967295 sources".into());
    }
    if !(window_s.is_finite() && window_s > 0.0 && window_s <= 86_400.0 * 365.0) {
        return Err(format!("option --window: `{window_s}` is not a window in seconds").into());
    }
    if min_count == 0 {
        return Err("option --min-count: give at least 1".into());
    }
    // A whole number of nanoseconds that splits into the ring's sub-windows.
    if buckets == 0 || buckets > window_ring::MAX_BUCKETS {
        return Err(format!(
            "option --buckets: give 1 to {} sub-windows",
            window_ring::MAX_BUCKETS
        )
        .into());
    }
    // A whole number of nanoseconds that splits into the ring's sub-windows.
    let window = ((window_s * 1e9) as u64 / buckets).max(1) * buckets;
    let report = simulate(&Config {
        requests,
        sources: sources as u32,
        seed,
        mix,
        limit,
        window,
        buckets,
        count_denied,
        min_count,
        progress: !json,
    })?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_report(&report);
    }
    Ok(())
}

struct Config {
    requests: u64,
    sources: u32,
    seed: u64,
    mix: Mix,
    limit: u64,
    window: u64,
    buckets: u64,
    count_denied: bool,
    min_count: u64,
    progress: bool,
}

fn spec(
    a: Algorithm,
    limit: u64,
    window: u64,
    buckets: u64,
    count_denied: bool,
) -> crate::Result<Limit> {
    let mut s = LimitSpec::new(a, limit, Duration::from_nanos(window));
    s.count_denied = count_denied;
    if a == Algorithm::WindowRing {
        s.buckets = Some(buckets);
    }
    s.build()
        .map_err(|e| format!("{a} with limit {limit}: {e}").into())
}

/// The algorithm `a` under test, its records placed from word `*at` of a source's block on.
fn approx(a: Algorithm, c: &Config, at: &mut usize) -> crate::Result<Approx> {
    let limit = spec(a, c.limit, c.window, c.buckets, c.count_denied)?;
    let meter_cap = match a {
        Algorithm::SlidingWindow => sliding_window::MAX_LIMIT,
        Algorithm::WindowRing => window_ring::MAX_LIMIT,
        _ => fixed_window::MAX_LIMIT,
    };
    let meter = spec(a, meter_cap, c.window, c.buckets, false)?;
    let (lim_at, meter_at) = (*at, *at + limit.words());
    *at = meter_at + meter.words();
    Ok(Approx {
        algorithm: a,
        limit,
        at: lim_at,
        meter,
        meter_cap,
        meter_at,
        end: *at,
        tally: Tally {
            limited: vec![false; c.sources as usize],
            ..Tally::default()
        },
    })
}

fn simulate(c: &Config) -> crate::Result<Report> {
    let t0 = Instant::now();
    let start = c.window * 1000;
    let mut traffic = Traffic::new(
        c.sources,
        c.seed,
        Shape {
            limit: c.limit,
            window: c.window,
            start,
        },
        &c.mix,
    );
    let mut replay = Replay::new(c, traffic.kinds().to_vec(), start)?;
    let mut last = start;
    let tick = (c.requests / 100).max(1);
    let bar = crate::progress::bar(100, !c.progress, "accuracy: replaying");
    for (k, (t, src)) in (&mut traffic).take(c.requests as usize).enumerate() {
        if c.progress && (k as u64) % tick == 0 {
            bar.set_position(k as u64 / tick);
        }
        last = t;
        replay.request(t, src)?;
    }
    if c.progress {
        bar.finish_and_clear();
    }
    replay.report(start, last, t0)
}

impl Tally {
    #[inline]
    fn record(&mut self, allowed: bool, truth: bool, s: usize, kind: usize, at_limit: bool) {
        if !allowed {
            self.limited[s] = true;
        }
        if allowed != truth {
            self.wrong += 1;
            self.wrong_at_limit += at_limit as u64;
            self.wrong_by_kind[kind] += 1;
            if allowed {
                self.wrongly_allowed += 1;
            } else {
                self.wrongly_limited += 1;
            }
        }
    }

    /// False negatives: sources the reference limited (more than `limit` in some window) and
    /// this algorithm never did. False positives: the other way round.
    fn row(
        &self,
        algorithm: &'static str,
        path: &'static str,
        reference: &[bool],
        pct: impl Fn(u64) -> f64,
        at_limit: u64,
    ) -> Row {
        let (mut fneg, mut fpos) = (0, 0);
        for (&r, &a) in reference.iter().zip(&self.limited) {
            fneg += (r && !a) as u64;
            fpos += (!r && a) as u64;
        }
        let mean = |sum: f64, n: u64| (n > 0).then(|| round6(100.0 * sum / n as f64));
        Row {
            algorithm,
            path,
            wrong_decisions: self.wrong,
            wrongly_allowed: self.wrongly_allowed,
            wrongly_limited: self.wrongly_limited,
            wrong_decisions_pct: pct(self.wrong),
            wrong_decisions_at_limit: self.wrong_at_limit,
            wrong_decisions_at_limit_pct: mean(self.wrong_at_limit as f64, at_limit),
            mean_rate_error_pct: mean(self.rate_err, self.rate_samples),
            mean_rate_error_near_limit_pct: mean(self.near_err, self.near_samples),
            rate_samples: self.rate_samples,
            false_negative_sources: fneg,
            false_positive_sources: fpos,
            limited_sources: self.limited.iter().filter(|&&l| l).count() as u64,
            wrong_by_kind: ByKind {
                steady: self.wrong_by_kind[Kind::Steady as usize],
                bursty: self.wrong_by_kind[Kind::Bursty as usize],
                edge_attacker: self.wrong_by_kind[Kind::EdgeAttacker as usize],
            },
        }
    }
}

fn round6(x: f64) -> f64 {
    (x * 1e6).round() / 1e6
}

fn round3(x: f64) -> f64 {
    (x * 1e3).round() / 1e3
}

fn print_report(r: &Report) {
    print_traffic(r);
    println!();
    print_results(r);
    println!();
    print_by_kind(r);
    println!();
    print_legend(r);
}

/// The run's parameters and the traffic it simulated.
fn print_traffic(r: &Report) {
    println!(
        "accuracy: {} requests from {} sources (seed {}, {} mix), {} requests per {} s, window_ring of {} buckets; rejected requests {}",
        r.requests,
        r.sources,
        r.seed,
        r.mix,
        r.limit,
        r.window_seconds,
        r.window_ring_buckets,
        if r.count_denied { "count" } else { "do not count" }
    );
    println!(
        "{:.0} s of traffic simulated in {:.1} s; {} sources went over the limit ({:.3} % of requests refused by the exact log)",
        r.simulated_seconds, r.elapsed_seconds, r.sources_over_limit, r.reference_denied_pct
    );
    println!(
        "{:.3} % of requests met their source's exact count within 10 % of the limit",
        r.at_limit_pct
    );
    for k in &r.traffic {
        println!(
            "  {:<14} {:>8} sources {:>11} requests {:>7} over the limit",
            k.kind, k.sources, k.requests, k.over_limit_sources
        );
    }
}

/// One row per algorithm and way of running it, Cloudflare's 2017 figures, then the
/// window_ring / sliding_window ratios.
fn print_results(r: &Report) {
    println!(
        "{:<15} {:<12} {:>12} {:>10} {:>10} {:>10} {:>11} {:>11} {:>9} {:>9}",
        "algorithm",
        "run as",
        "wrong %",
        "allowed",
        "limited",
        "at lim %",
        "rate err %",
        "near lim %",
        "false -",
        "false +"
    );
    let opt = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{v:.3}"));
    for x in &r.results {
        println!(
            "{:<15} {:<12} {:>12.5} {:>10} {:>10} {:>10} {:>11} {:>11} {:>9} {:>9}",
            x.algorithm,
            x.path,
            x.wrong_decisions_pct,
            x.wrongly_allowed,
            x.wrongly_limited,
            opt(x.wrong_decisions_at_limit_pct),
            opt(x.mean_rate_error_pct),
            opt(x.mean_rate_error_near_limit_pct),
            x.false_negative_sources,
            x.false_positive_sources
        );
    }
    let cf = &r.cloudflare_2017;
    println!(
        "{:<15} {:<12} {:>12.5} {:>10} {:>10} {:>10} {:>11} {:>11} {:>9} {:>9}",
        "Cloudflare 2017",
        "(400M, 270k)",
        cf.wrong_decisions_pct,
        "",
        "",
        "",
        cf.mean_rate_error_pct,
        "",
        cf.false_negative_sources,
        cf.false_positive_sources
    );
    let q = &r.window_ring_over_sliding_window;
    println!(
        "window_ring / sliding_window: rate error {}, wrong decisions {}, at the limit {}",
        opt(q.mean_rate_error),
        opt(q.wrong_decisions),
        opt(q.wrong_decisions_at_limit)
    );
}

/// Wrong decisions per algorithm by kind of source.
fn print_by_kind(r: &Report) {
    println!("wrong decisions by kind of source:      steady      bursty  edge_attacker");
    for x in &r.results {
        let k = &x.wrong_by_kind;
        println!(
            "  {:<15} {:<20} {:>11} {:>11} {:>14}",
            x.algorithm, x.path, k.steady, k.bursty, k.edge_attacker
        );
    }
}

/// What the columns mean.
fn print_legend(r: &Report) {
    println!("wrong %: requests decided differently from the exact sliding log (allowed: admitted");
    println!("  here, refused there; limited: the reverse). at lim %: the same over the requests");
    println!("  whose source's exact count was within 10 % of the limit. rate err %: mean |estimate - exact| /");
    println!(
        "  exact over requests whose source sent >= {} requests in the last window (near lim:",
        r.min_count
    );
    println!(
        "  exact count within limit/2..3*limit/2); each estimate is the algorithm's own window"
    );
    println!("  count, every request counted. false -: sources over the limit never refused;");
    println!(
        "  false +: sources never over the limit refused. sliding_log/keyed_store: the engine's"
    );
    println!("  keyed store against the reference transition (must be 0).");
}
