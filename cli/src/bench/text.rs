//! What `turnstile bench` says while it runs (progress lines on stderr, a spinner on a
//! terminal, a warning when the machine is busy) and the number formats every report shares.

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
