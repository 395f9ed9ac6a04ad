//! The default suite: prepare (both keyed engines built and filled once, the floor table
//! drawn) → measure (every workload, on every thread count, each repeat interleaved with the
//! others) → report (medians, the floors attached, the hot-key checks, table or JSON).

use super::exact::{hot_key_checks, Exactness};
use super::floor::{self, FloorRow};
use super::keys::{self, Distribution};
use super::limits::{governor_quota, store_capacity, throughput_limit};
use super::options::{Options, Workload};
use super::report::SuiteReport;
use super::row::{attach_floors, fold, fold_floor, row, Row, RowSpec};
use super::run::{self, Checker, Mode, Timer};
use super::text::{fmt_count, fmt_ns, fmt_rate, load_warning, progress};
use governor::{DefaultKeyedRateLimiter, RateLimiter};
use std::time::Duration;
use turnstile::keyed::Store;
use turnstile::{Limiter, Limits};

/// Keys each thread walks through (8 MB of u64): long enough that a run does not replay a
/// cache-resident subset of a large key set.
pub(crate) const SEQ_LEN: usize = 1 << 20;

/// `n` key sequences of `len` keys, one per thread, carved from one draw.
pub(crate) fn sequences(d: Distribution, keys: u64, threads: usize, len: usize) -> Vec<u64> {
    keys::sequence(d, keys, len * threads, 0x0be7_c4ec_5eed ^ keys)
}

/// The ranks behind [`sequences`] (the same draws): what the floor rows walk.
fn rank_sequences(d: Distribution, keys: u64, threads: usize, len: usize) -> Vec<u64> {
    keys::ranks(d, keys, len * threads, 0x0be7_c4ec_5eed ^ keys)
}

/// What every run of one key sequence shares: the keys (one slice of `len` per thread), the
/// timer and the warm-up and measured durations.
pub(crate) struct Runner<'a> {
    pub seq: &'a [u64],
    pub len: usize,
    pub timer: &'a Timer,
    pub warmup: Duration,
    pub window: Duration,
}

impl Runner<'_> {
    /// Runs `c` as `spec` says and returns its row; `label` names it in the progress line.
    pub(crate) fn row<C: Checker>(&self, c: &C, spec: RowSpec, label: &str) -> Row {
        let seqs: Vec<&[u64]> = (0..spec.threads)
            .map(|t| &self.seq[t * self.len..(t + 1) * self.len])
            .collect();
        let m = run::measure(c, spec.mode, &seqs, self.warmup, self.window, self.timer);
        let r = row(spec, m);
        progress(format!(
            "{label}: {} checks/s ({:.0}% on CPU), {:.1} CPU-ns/check, p99.9 {}",
            fmt_rate(r.checks_per_sec),
            r.on_cpu * 100.0,
            r.ns_per_check,
            fmt_ns(r.p999_ns)
        ));
        r
    }
}

/// Runs the default suite and prints its report.
pub(crate) fn suite(o: &Options) -> crate::Result<()> {
    let p = prepare(o)?;
    let mut rows: Vec<Row> = Vec::new();
    let mut floors: Vec<FloorRow> = Vec::new();
    for w in &o.workloads {
        let (r, f) = measure_workload(o, &p, *w);
        rows.extend(r);
        floors.extend(f);
    }
    attach_floors(&mut rows, &floors);
    let exact_threads = o.max_threads().max(2);
    let hot = o.workloads.contains(&Workload::Keyed(Distribution::Hot));
    let exact: Vec<Exactness> = if p.store_rows && hot {
        hot_key_checks(exact_threads)?
    } else {
        Vec::new()
    };
    let report = SuiteReport {
        rows: &rows,
        floors: &floors,
        exact: &exact,
        exact_threads,
        timer_overhead_ns: p.timer.overhead_ns,
    };
    if o.json {
        report.print_json();
    } else {
        report.print_table();
    }
    Ok(())
}

/// What every workload shares, built once.
struct Prepared {
    timer: Timer,
    limits: Limits,
    /// Whether turnstile's and governor's rows run.
    store_rows: bool,
    governor_rows: bool,
    /// turnstile's keyed store, every key inserted (keyed workloads only).
    store: Option<Store>,
    /// governor's keyed limiter, every key inserted (keyed workloads only).
    gkeyed: Option<DefaultKeyedRateLimiter<u64>>,
    /// As many slots as the store, each key rank its own slot.
    floor_table: Option<floor::Table>,
}

/// Builds and fills both keyed engines once: every keyed workload draws from the same keys.
fn prepare(o: &Options) -> crate::Result<Prepared> {
    let timer = Timer::calibrate();
    let limits = Limits::new(vec![throughput_limit(o.algorithm)?])?;
    let (turn, gov) = o.turnstile_and_governor();
    let keyed = o.workloads.iter().any(|w| matches!(w, Workload::Keyed(_)));
    load_warning();
    progress(format!(
        "{} on {} core(s), {:.1} s per run; timer overhead {:.0} ns (in every latency)",
        o.algorithm,
        core_affinity::get_core_ids().map_or(0, |c| c.len()),
        o.seconds,
        timer.overhead_ns
    ));
    let store = if keyed && turn {
        progress(format!(
            "turnstile store: {} keys, inserting all",
            fmt_count(o.keys)
        ));
        let s = Store::builder(limits.clone())
            .capacity(store_capacity(o.algorithm, o.keys))
            .seed(0x7475_726e)
            .build()?;
        for r in 0..o.keys {
            s.check(&keys::key_id(r), 1);
        }
        Some(s)
    } else {
        None
    };
    let gkeyed = if keyed && gov {
        progress(format!(
            "governor keyed: {} keys, inserting all",
            fmt_count(o.keys)
        ));
        let g = RateLimiter::keyed(governor_quota());
        for r in 0..o.keys {
            let _ = g.check_key(&keys::key_id(r));
        }
        Some(g)
    } else {
        None
    };
    let floor_table = match &store {
        Some(s) => {
            progress(format!(
                "floor table: {} slots of 16 bytes (the store's), one random cycle",
                fmt_count(s.slot_count())
            ));
            floor::Table::new(s.slot_count(), o.keys, 0xf100_12ab ^ o.keys)
        }
        None => None,
    };
    Ok(Prepared {
        timer,
        limits,
        store_rows: turn,
        governor_rows: gov,
        store,
        gkeyed,
        floor_table,
    })
}

/// One workload's rows and floor rows, each the median of its repeats.
fn measure_workload(o: &Options, p: &Prepared, w: Workload) -> (Vec<Row>, Vec<FloorRow>) {
    let max_t = o.max_threads();
    let (distribution, seq) = match w {
        Workload::Unkeyed => ("unkeyed".to_string(), vec![0u64; SEQ_LEN * max_t]),
        Workload::Keyed(d) => {
            progress(format!(
                "drawing {} {d} keys",
                fmt_count((SEQ_LEN * max_t) as u64)
            ));
            (d.to_string(), sequences(d, o.keys, max_t, SEQ_LEN))
        }
    };
    let keys = matches!(w, Workload::Keyed(_)).then_some(o.keys);
    // The slot of every key of the sequence, drawn before timing (the same draws).
    let floor_idx = match (w, &p.floor_table) {
        (Workload::Keyed(d), Some(ft)) => ft.indices(&rank_sequences(d, o.keys, max_t, SEQ_LEN)),
        _ => Vec::new(),
    };
    let workload = match keys {
        None => "unkeyed".to_string(),
        Some(k) => format!("{} {distribution}", fmt_count(k)),
    };
    let runner = Runner {
        seq: &seq,
        len: SEQ_LEN,
        timer: &p.timer,
        warmup: o.warmup(),
        window: o.window(),
    };
    // reps[i][j]: repeat i, configuration j (the same order every repeat).
    let mut reps: Vec<Vec<Row>> = Vec::new();
    let mut floor_reps: Vec<Vec<FloorRow>> = Vec::new();
    for rep in 0..o.repeat {
        let round = Round {
            o,
            p,
            w,
            runner: &runner,
            distribution: &distribution,
            keys,
            workload: &workload,
            floor_idx: &floor_idx,
            rep,
        };
        let (out, fout) = round.measure();
        reps.push(out);
        floor_reps.push(fout);
    }
    let rows = (0..reps[0].len())
        .map(|j| fold(reps.iter().map(|r| r[j].clone()).collect()))
        .collect();
    let floors = (0..floor_reps[0].len())
        .map(|j| fold_floor(floor_reps.iter().map(|r| r[j].clone()).collect()))
        .collect();
    (rows, floors)
}

/// One repeat of one workload: every engine on every thread count.
struct Round<'a> {
    o: &'a Options,
    p: &'a Prepared,
    w: Workload,
    runner: &'a Runner<'a>,
    distribution: &'a str,
    /// `None` for the keyless limiters.
    keys: Option<u64>,
    /// The workload as the progress lines name it.
    workload: &'a str,
    /// The floor table's slot of every key of the sequence.
    floor_idx: &'a [u32],
    rep: usize,
}

impl Round<'_> {
    fn measure(&self) -> (Vec<Row>, Vec<FloorRow>) {
        let mut out = Vec::new();
        let mut fout = Vec::new();
        // The keyless limiters start afresh each repeat.
        let direct = Limiter::with_limits(self.p.limits.clone(), turnstile::DefaultClock::new());
        let gdirect = RateLimiter::direct(governor_quota());
        for &t in &self.o.threads {
            match self.w {
                Workload::Unkeyed => {
                    if self.p.store_rows {
                        let c = run::TurnstileDirect(&direct);
                        out.push(self.row(&c, t, "turnstile", Mode::Single));
                    }
                    if self.p.governor_rows {
                        let c = run::GovernorDirect(&gdirect);
                        out.push(self.row(&c, t, "governor", Mode::Single));
                    }
                }
                Workload::Keyed(d) => {
                    self.keyed(t, &mut out);
                    if let Some(ft) = &self.p.floor_table {
                        let mut kinds = vec![floor::Kind::Dependent, floor::Kind::LoadCas];
                        if self.o.batch > 0 {
                            kinds.push(floor::Kind::Batch(self.o.batch));
                        }
                        for kind in kinds {
                            fout.push(self.floor_row(ft, kind, d, t));
                        }
                    }
                }
            }
        }
        (out, fout)
    }

    /// The keyed engines' rows on `t` threads.
    fn keyed(&self, t: usize, out: &mut Vec<Row>) {
        let batch = self.o.batch;
        if let Some(s) = &self.p.store {
            let c = run::TurnstileKeyed(s);
            out.push(self.row(&c, t, "turnstile", Mode::Single));
            if batch > 0 {
                out.push(self.row(&c, t, "turnstile", Mode::Batch(batch)));
            }
            if batch > 0 && self.o.batch_decisions {
                out.push(self.row(&c, t, "turnstile", Mode::BatchDecisions(batch)));
            }
        }
        if let Some(g) = &self.p.gkeyed {
            let c = run::GovernorKeyed(g);
            out.push(self.row(&c, t, "governor", Mode::Single));
        }
    }

    /// One row of `engine` (turnstile or governor, through `c`) on `t` threads.
    fn row<C: Checker>(&self, c: &C, t: usize, engine: &'static str, mode: Mode) -> Row {
        let algorithm = match engine {
            "governor" => "gcra",
            _ => self.o.algorithm.name(),
        };
        let what = match mode {
            Mode::Single => engine.to_string(),
            Mode::Batch(b) => format!("{engine} batch {b}"),
            Mode::BatchDecisions(b) => format!("{engine} batch {b} (Decisions)"),
        };
        let spec = RowSpec {
            engine,
            algorithm: algorithm.to_string(),
            keys: self.keys,
            distribution: self.distribution.to_string(),
            threads: t,
            mode,
        };
        self.runner.row(c, spec, &self.label(t, &what))
    }

    /// "1M uniform, turnstile, 2 thread(s) (run 1/3)".
    fn label(&self, t: usize, what: &str) -> String {
        let run = if self.o.repeat > 1 {
            format!(" (run {}/{})", self.rep + 1, self.o.repeat)
        } else {
            String::new()
        };
        format!("{}, {what}, {t} thread(s){run}", self.workload)
    }

    /// One floor measurement of `kind` on `t` threads (one slice of `SEQ_LEN` slots per
    /// thread).
    fn floor_row(
        &self,
        ft: &floor::Table,
        kind: floor::Kind,
        d: Distribution,
        t: usize,
    ) -> FloorRow {
        let seqs: Vec<&[u32]> = (0..t)
            .map(|i| &self.floor_idx[i * SEQ_LEN..(i + 1) * SEQ_LEN])
            .collect();
        let uniform = d == Distribution::Uniform;
        let (o, window) = (self.o, self.o.window());
        let (ns, n, on_cpu, pre) = floor::measure(ft, kind, uniform, &seqs, o.warmup(), window);
        let batch = match kind {
            floor::Kind::Batch(b) => b,
            _ => 1,
        };
        let what = match kind {
            floor::Kind::Dependent if uniform => "floor, dependent (chase)".to_string(),
            floor::Kind::Dependent => "floor, dependent (chained)".to_string(),
            floor::Kind::LoadCas => "floor, load + CAS".to_string(),
            floor::Kind::Batch(b) => format!("floor, batch {b} prefetched"),
        };
        progress(format!(
            "{}: {ns:.1} CPU-ns/access ({:.0}% on CPU)",
            self.label(t, &what),
            on_cpu * 100.0
        ));
        FloorRow {
            kind: kind.name(),
            batch,
            keys: o.keys,
            distribution: d.to_string(),
            threads: t,
            slots: ft.len(),
            ns_per_access: ns,
            accesses: n,
            on_cpu,
            preemptions: pre,
            runs: 1,
        }
    }
}
