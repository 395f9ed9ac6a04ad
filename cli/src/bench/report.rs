//! What `turnstile bench` shows on stdout: the table (or one JSON document). Progress lines
//! and number formats are in `text`.

use super::exact::Exactness;
use super::floor::FloorRow;
use super::row::Row;
use super::run;
use super::text::{fmt_count, fmt_ns, fmt_rate};

/// The results table: one line per row, each configuration followed by its floor rows.
pub(crate) fn print_table(rows: &[Row], floors: &[FloorRow]) {
    println!(
        "{:<14} {:<10} {:<9} {:>3} {:>9} {:>5} {:>9} {:>8} {:>8} {:>8} {:>8} {:>7} {:>7}",
        "workload",
        "engine",
        "mode",
        "thr",
        "checks/s",
        "cpu",
        "ns/check",
        "p50",
        "p99",
        "p99.9",
        "max",
        "vs gov",
        "× floor"
    );
    for (i, r) in rows.iter().enumerate() {
        let gov = rows
            .iter()
            .find(|g| g.engine == "governor" && g.same_run(r))
            .filter(|_| r.engine == "turnstile")
            .map(|g| format!("{:.1}×", r.cpu_checks_per_sec / g.cpu_checks_per_sec))
            .unwrap_or_default();
        let mode = match r.mode {
            "batch" => format!("batch {}", r.batch),
            "batch_decisions" => format!("batch {} D", r.batch),
            m => m.to_string(),
        };
        println!(
            "{:<14} {:<10} {:<9} {:>3} {:>9} {:>4.0}% {:>9.1} {:>8} {:>8} {:>8} {:>8} {:>7} {:>7}",
            r.workload(),
            r.engine,
            mode,
            r.threads,
            fmt_rate(r.checks_per_sec),
            r.on_cpu * 100.0,
            r.ns_per_check,
            fmt_ns(r.p50_ns),
            fmt_ns(r.p99_ns),
            fmt_ns(r.p999_ns),
            fmt_ns(r.max_ns),
            gov,
            r.x_floor.map(|x| format!("{x:.2}×")).unwrap_or_default()
        );
        // After the last row of a configuration: its floor rows.
        if rows.get(i + 1).is_none_or(|n| !n.same_run(r)) {
            print_floors(r, floors);
        }
    }
}

/// The floor rows measured beside `r`'s configuration.
fn print_floors(r: &Row, floors: &[FloorRow]) {
    for f in floors.iter().filter(|f| {
        Some(f.keys) == r.keys && f.distribution == r.distribution && f.threads == r.threads
    }) {
        let mode = match f.kind {
            "dependent" => "dependent".to_string(),
            "load_cas" => "load+CAS".to_string(),
            _ => format!("batch {}", f.batch),
        };
        println!(
            "{:<14} {:<10} {:<9} {:>3} {:>9} {:>4.0}% {:>9.1}",
            r.workload(),
            "floor",
            mode,
            f.threads,
            "",
            f.on_cpu * 100.0,
            f.ns_per_access
        );
    }
}

/// Scaling (2 threads against 1) and the hot key against governor's keyless limiter.
fn print_ratios(rows: &[Row]) {
    let find = |engine: &str, mode: &str, keys: Option<u64>, dist: &str, t: usize| {
        rows.iter().find(|r| {
            r.engine == engine
                && r.mode == mode
                && r.keys == keys
                && r.distribution == dist
                && r.threads == t
        })
    };
    let mut lines = Vec::new();
    for r in rows
        .iter()
        .filter(|r| r.engine == "turnstile" && r.threads > 1)
    {
        if let Some(one) = find("turnstile", r.mode, r.keys, &r.distribution, 1) {
            lines.push(format!(
                "  turnstile {} {}, {} threads / 1 thread: {:.2}×",
                r.workload(),
                r.mode,
                r.threads,
                r.cpu_checks_per_sec / one.cpu_checks_per_sec
            ));
        }
    }
    // The keyed hot key against governor's keyless limiter: the same one-record contention.
    for r in rows
        .iter()
        .filter(|r| r.engine == "turnstile" && r.distribution == "hot" && r.mode == "single")
    {
        if let Some(g) = find("governor", "single", None, "unkeyed", r.threads) {
            lines.push(format!(
                "  turnstile {} ({} thr) / governor keyless ({} thr): {:.2}×",
                r.workload(),
                r.threads,
                g.threads,
                r.cpu_checks_per_sec / g.cpu_checks_per_sec
            ));
        }
    }
    if !lines.is_empty() {
        println!();
        println!("ratios (checks per CPU-second, i.e. as on an idle machine):");
        for l in lines {
            println!("{l}");
        }
    }
}

/// Everything the default suite measured.
pub(crate) struct SuiteReport<'a> {
    pub rows: &'a [Row],
    pub floors: &'a [FloorRow],
    pub exact: &'a [Exactness],
    /// Threads of the hot-key checks.
    pub exact_threads: usize,
    pub timer_overhead_ns: f64,
}

impl SuiteReport<'_> {
    /// One JSON document on stdout.
    pub(crate) fn print_json(&self) {
        let doc = serde_json::json!({
            "results": self.rows,
            "floors": self.floors,
            "hot_key": self.exact,
            "timer_overhead_ns": self.timer_overhead_ns,
            "latency_sampling": format!("1 in {} single checks, 1 in 4 batches (batch time / batch size)", run::SAMPLE),
        });
        println!(
            "{}",
            serde_json::to_string_pretty(&doc).expect("serializable")
        );
    }

    /// The table, the ratios, the hot-key checks and what each column means.
    pub(crate) fn print_table(&self) {
        print_table(self.rows, self.floors);
        print_ratios(self.rows);
        if !self.exact.is_empty() {
            println!();
            println!(
                "hot key, {} threads, every attempt on one key:",
                self.exact_threads
            );
            for e in self.exact {
                println!("  {}", e.line());
            }
        }
        println!();
        println!(
            "checks/s: wall clock, all threads; cpu: share of the window the workers ran; ns/check: \
             CPU-ns per check; vs gov and ratios: checks per CPU-second."
        );
        if let Some(f) = self.floors.first() {
            println!(
                "floor rows: the same keys over a table of the store's {} slots, no hashing, no \
                 clock: a dependent access (single checks' × floor), an independent load + \
                 16-byte CAS, and batches prefetched whole before their loads + CASes \
                 (check_batch's × floor); ns/check is CPU-ns per access.",
                fmt_count(f.slots)
            );
        }
        println!(
            "latency: 1 in {} single checks timed (1 in 4 batches, per check); timer overhead {:.0} ns included",
            run::SAMPLE,
            self.timer_overhead_ns
        );
    }
}
