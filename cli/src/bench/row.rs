//! Results: one [`Row`] per measured configuration, built from the timed loop's [`Measured`],
//! repeats folded into their medians, and each keyed row set against its floor.

use super::floor::FloorRow;
use super::run::{Measured, Mode};
use super::text::fmt_count;
use serde::Serialize;

/// One row of results (one JSON object of `results`).
#[derive(Serialize, Clone, Debug)]
pub(crate) struct Row {
    pub engine: &'static str,
    pub algorithm: String,
    /// `null` for the keyless limiters.
    pub keys: Option<u64>,
    /// uniform, zipf, zipf:S, hot; "unkeyed" for the keyless limiters.
    pub distribution: String,
    pub threads: usize,
    /// "single" or "batch".
    pub mode: &'static str,
    /// Keys per `check_batch` (1 for single).
    pub batch: usize,
    /// CPU time per check: the workers' CPU ns over the window / checks. What a check costs,
    /// whether or not the scheduler ran something else on the cores meanwhile.
    pub ns_per_check: f64,
    /// Checks per wall-clock second, all threads.
    pub checks_per_sec: f64,
    /// Sum over threads of checks per second of that thread's CPU time: the rate with the
    /// cores to themselves (= checks_per_sec on an idle machine). Ratios use this.
    pub cpu_checks_per_sec: f64,
    /// Fraction of the window the workers were on a CPU (1.0 on an idle machine).
    pub on_cpu: f64,
    /// Involuntary context switches of the workers during the window.
    pub preemptions: u64,
    pub p50_ns: u64,
    pub p99_ns: u64,
    pub p999_ns: u64,
    pub max_ns: u64,
    pub checks: u64,
    pub denied: u64,
    /// Repeats this row is the median of.
    pub runs: usize,
    /// The floor this row is compared with: "dependent" (single checks) or "batch"
    /// (`check_batch`), measured in the same run over a table of the store's size; `null`
    /// for the keyless rows.
    pub floor: Option<&'static str>,
    /// ns_per_check / that floor's ns_per_access.
    pub x_floor: Option<f64>,
}

impl Row {
    /// "unkeyed", or the key count and distribution ("1M uniform").
    pub(crate) fn workload(&self) -> String {
        match self.keys {
            None => "unkeyed".into(),
            Some(k) => format!("{} {}", fmt_count(k), self.distribution),
        }
    }

    /// Whether `o` ran on the same keys, distribution and threads.
    pub(crate) fn same_run(&self, o: &Row) -> bool {
        self.keys == o.keys && self.distribution == o.distribution && self.threads == o.threads
    }
}

/// What a row measures: everything but the figures.
pub(crate) struct RowSpec {
    pub engine: &'static str,
    pub algorithm: String,
    pub keys: Option<u64>,
    pub distribution: String,
    pub threads: usize,
    pub mode: Mode,
}

/// The row of one measurement.
pub(crate) fn row(spec: RowSpec, m: Measured) -> Row {
    let q = |p: f64| m.hist.value_at_quantile(p);
    Row {
        engine: spec.engine,
        algorithm: spec.algorithm,
        keys: spec.keys,
        distribution: spec.distribution,
        threads: spec.threads,
        mode: spec.mode.name(),
        batch: match spec.mode {
            Mode::Single => 1,
            Mode::Batch(b) | Mode::BatchDecisions(b) => b,
        },
        ns_per_check: m.cpu_ns as f64 / m.checks.max(1) as f64,
        checks_per_sec: m.checks_per_sec,
        cpu_checks_per_sec: m.cpu_checks_per_sec,
        on_cpu: m.cpu_ns as f64 / m.wall_ns.max(1) as f64,
        preemptions: m.preemptions,
        p50_ns: q(0.5),
        p99_ns: q(0.99),
        p999_ns: q(0.999),
        max_ns: m.hist.max(),
        checks: m.checks,
        denied: m.checks - m.allowed,
        runs: 1,
        floor: None,
        x_floor: None,
    }
}

/// The median of `v` (the upper one of an even count).
pub(crate) fn median<T: PartialOrd + Copy>(mut v: Vec<T>) -> T {
    v.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
    v[v.len() / 2]
}

/// Rows of the same configuration, one per repeat, folded into their medians.
pub(crate) fn fold(runs: Vec<Row>) -> Row {
    let mut r = runs[0].clone();
    let n = runs.len();
    r.checks_per_sec = median(runs.iter().map(|x| x.checks_per_sec).collect());
    r.cpu_checks_per_sec = median(runs.iter().map(|x| x.cpu_checks_per_sec).collect());
    r.ns_per_check = median(runs.iter().map(|x| x.ns_per_check).collect());
    r.on_cpu = median(runs.iter().map(|x| x.on_cpu).collect());
    r.preemptions = median(runs.iter().map(|x| x.preemptions).collect());
    r.p50_ns = median(runs.iter().map(|x| x.p50_ns).collect());
    r.p99_ns = median(runs.iter().map(|x| x.p99_ns).collect());
    r.p999_ns = median(runs.iter().map(|x| x.p999_ns).collect());
    r.max_ns = median(runs.iter().map(|x| x.max_ns).collect());
    r.checks = runs.iter().map(|x| x.checks).sum();
    r.denied = runs.iter().map(|x| x.denied).sum();
    r.runs = n;
    r
}

/// Floor rows of the same configuration, one per repeat, folded into their medians.
pub(crate) fn fold_floor(runs: Vec<FloorRow>) -> FloorRow {
    let mut r = runs[0].clone();
    r.ns_per_access = median(runs.iter().map(|x| x.ns_per_access).collect());
    r.on_cpu = median(runs.iter().map(|x| x.on_cpu).collect());
    r.preemptions = median(runs.iter().map(|x| x.preemptions).collect());
    r.accesses = runs.iter().map(|x| x.accesses).sum();
    r.runs = runs.len();
    r
}

/// Sets each keyed row's "× floor": a single check (turnstile or governor) against the
/// dependent access, a `check_batch` against the batch floor, of the same keys, distribution
/// and threads.
pub(crate) fn attach_floors(rows: &mut [Row], floors: &[FloorRow]) {
    for r in rows.iter_mut() {
        let kind = match r.mode {
            "batch" | "batch_decisions" => "batch",
            _ => "dependent",
        };
        let f = floors.iter().find(|f| {
            f.kind == kind
                && Some(f.keys) == r.keys
                && f.distribution == r.distribution
                && f.threads == r.threads
                && (kind != "batch" || f.batch == r.batch)
        });
        if let Some(f) = f {
            r.floor = Some(f.kind);
            r.x_floor = Some(r.ns_per_check / f.ns_per_access);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(engine: &'static str, mode: &'static str, dist: &str, threads: usize, ns: f64) -> Row {
        Row {
            engine,
            algorithm: "token_bucket".into(),
            keys: (dist != "unkeyed").then_some(1000),
            distribution: dist.into(),
            threads,
            mode,
            batch: if mode == "batch" { 32 } else { 1 },
            ns_per_check: ns,
            checks_per_sec: 0.0,
            cpu_checks_per_sec: 0.0,
            on_cpu: 1.0,
            preemptions: 0,
            p50_ns: 0,
            p99_ns: 0,
            p999_ns: 0,
            max_ns: 0,
            checks: 0,
            denied: 0,
            runs: 1,
            floor: None,
            x_floor: None,
        }
    }

    fn floor_row(kind: &'static str, dist: &str, threads: usize, ns: f64) -> FloorRow {
        FloorRow {
            kind,
            batch: if kind == "batch" { 32 } else { 1 },
            keys: 1000,
            distribution: dist.into(),
            threads,
            slots: 1200,
            ns_per_access: ns,
            accesses: 1,
            on_cpu: 1.0,
            preemptions: 0,
            runs: 1,
        }
    }

    #[test]
    fn each_row_is_divided_by_its_own_floor() {
        let mut rows = vec![
            row("turnstile", "single", "uniform", 1, 120.0),
            row("turnstile", "batch", "uniform", 1, 30.0),
            row("governor", "single", "uniform", 1, 250.0),
            row("turnstile", "single", "uniform", 2, 130.0),
            row("turnstile", "batch", "zipf", 1, 20.0),
            row("turnstile", "single", "unkeyed", 1, 15.0),
        ];
        let floors = vec![
            floor_row("dependent", "uniform", 1, 100.0),
            floor_row("load_cas", "uniform", 1, 40.0),
            floor_row("batch", "uniform", 1, 12.0),
            floor_row("dependent", "uniform", 2, 104.0),
            floor_row("batch", "zipf", 1, 8.0),
        ];
        attach_floors(&mut rows, &floors);
        let x: Vec<Option<f64>> = rows.iter().map(|r| r.x_floor).collect();
        assert_eq!(
            x,
            [Some(1.2), Some(2.5), Some(2.5), Some(1.25), Some(2.5), None]
        );
        let f: Vec<Option<&str>> = rows.iter().map(|r| r.floor).collect();
        assert_eq!(
            f,
            [
                Some("dependent"),
                Some("batch"),
                Some("dependent"),
                Some("dependent"),
                Some("batch"),
                None
            ]
        );
    }

    #[test]
    fn medians_of_floor_repeats() {
        let f = fold_floor(vec![
            floor_row("batch", "uniform", 1, 14.0),
            floor_row("batch", "uniform", 1, 11.0),
            floor_row("batch", "uniform", 1, 12.0),
        ]);
        assert_eq!((f.ns_per_access, f.runs, f.accesses), (12.0, 3, 3));
    }
}
