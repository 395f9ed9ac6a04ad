//! What `turnstile bench` shows: progress lines on stderr, then the table (or one JSON
//! document) on stdout, and the number formats they share.

use super::exact::Exactness;
use super::floor::FloorRow;
use super::row::Row;
use super::run;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

/// Whether `--json` was given: progress is then not shown.
static QUIET: AtomicBool = AtomicBool::new(false);
/// The spinner drawn under the progress lines when stderr is a terminal.
static SPINNER: OnceLock<indicatif::ProgressBar> = OnceLock::new();

/// Shows no progress from now on (`--json`).
pub(crate) fn quiet(json: bool) {
    QUIET.store(json, Ordering::Relaxed);
}

/// A progress line on stderr: above a spinner on a terminal, a plain line in a log, nothing
/// with `--json`.
pub(crate) fn progress(msg: impl AsRef<str>) {
    let json = QUIET.load(Ordering::Relaxed);
    let line = format!("bench: {}", msg.as_ref());
    if crate::progress::visible(json) {
        let s = SPINNER.get_or_init(|| {
            let s = indicatif::ProgressBar::new_spinner();
            s.enable_steady_tick(Duration::from_millis(120));
            s.set_message("bench: running");
            s
        });
        s.println(line);
    } else if !json {
        eprintln!("{line}");
    }
}

/// Clears the spinner, if one was drawn.
pub(crate) fn progress_done() {
    if let Some(s) = SPINNER.get() {
        s.finish_and_clear();
    }
}

/// The 1-minute load average (/proc/loadavg), if the system gives one.
pub(crate) fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<f64>().ok())
}

/// Warns on stderr when the machine is busy (1-minute load average above half the cores).
pub(crate) fn load_warning() {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if let Some(l) = load_average().filter(|l| *l > cores as f64 / 2.0) {
        progress(format!(
            "warning: load average {l:.1} on {cores} cores before the run; other work shares the CPUs and the figures will be noisy"
        ));
    }
}

/// 1000000 → "1M", 10000 → "10k", others as they are.
pub(crate) fn fmt_count(n: u64) -> String {
    if n >= 1_000_000 && n % 1_000_000 == 0 {
        format!("{}M", n / 1_000_000)
    } else if n >= 1_000 && n % 1_000 == 0 {
        format!("{}k", n / 1_000)
    } else {
        n.to_string()
    }
}

/// 4.7e7 → "47.0M".
pub(crate) fn fmt_rate(r: f64) -> String {
    if r >= 1e9 {
        format!("{:.2}G", r / 1e9)
    } else if r >= 1e6 {
        format!("{:.1}M", r / 1e6)
    } else if r >= 1e3 {
        format!("{:.1}k", r / 1e3)
    } else {
        format!("{r:.0}")
    }
}

/// Nanoseconds with a readable unit.
pub(crate) fn fmt_ns(ns: u64) -> String {
    if ns < 10_000 {
        format!("{ns}ns")
    } else if ns < 10_000_000 {
        format!("{:.1}µs", ns as f64 / 1e3)
    } else {
        format!("{:.1}ms", ns as f64 / 1e6)
    }
}

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
