//! What `turnstile bench scale` prints: one line per size and distribution (CPU-ns per check
//! of each engine and floor, the ratios, the bytes per key), then where the table outgrows
//! each cache level and where the cost per check jumps most (the knee).

use super::floor::FloorRow;
use super::row::Row;
use super::text::fmt_count;
use serde::Serialize;

/// Resident bytes per key at one size.
#[derive(Serialize, Clone, Debug)]
pub(crate) struct Footprint {
    pub keys: u64,
    /// turnstile's store (token bucket, a 16-byte slot per key).
    pub turnstile_bytes_per_key: f64,
    /// The store's slots × 16 B: the table the checks walk.
    pub table_bytes: u64,
    /// governor's keyed limiter; `None` where it did not run.
    pub governor_bytes_per_key: Option<f64>,
    /// Why governor did not run at this size.
    pub governor_skipped: Option<String>,
}

/// MiB with one decimal, or KiB below one MiB.
fn fmt_bytes(b: u64) -> String {
    if b >= 1 << 20 {
        format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64)
    } else {
        format!("{:.0} KiB", b as f64 / 1024.0)
    }
}

/// The table, the caches and the knee.
pub(crate) fn print(
    rows: &[Row],
    floors: &[FloorRow],
    prints: &[Footprint],
    caches: &[(u32, u64, u32)],
    secs: f64,
) {
    println!(
        "{:<6} {:<8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7} {:>7} {:>7} {:>7} {:>8}",
        "keys",
        "dist",
        "turnstile",
        "batch 32",
        "governor",
        "floor",
        "floor b",
        "×floor",
        "×fl b",
        "vs gov",
        "B/key",
        "gov B/key"
    );
    let ns = |engine: &str, mode: &str, k: u64, d: &str| {
        rows.iter().find(|r| {
            r.engine == engine && r.mode == mode && r.keys == Some(k) && r.distribution == d
        })
    };
    let fl = |kind: &str, k: u64, d: &str| {
        floors
            .iter()
            .find(|f| f.kind == kind && f.keys == k && f.distribution == d)
    };
    let opt =
        |x: Option<f64>, p: usize| x.map(|v| format!("{v:.p$}")).unwrap_or_else(|| "—".into());
    for fp in prints {
        for d in ["uniform", "zipf"] {
            let single = ns("turnstile", "single", fp.keys, d);
            let batch = ns("turnstile", "batch", fp.keys, d);
            let gov = ns("governor", "single", fp.keys, d);
            let vs_gov = match (single, gov) {
                (Some(s), Some(g)) => Some(g.ns_per_check / s.ns_per_check),
                _ => None,
            };
            println!(
                "{:<6} {:<8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7} {:>7} {:>7} {:>7} {:>8}",
                fmt_count(fp.keys),
                d,
                opt(single.map(|r| r.ns_per_check), 1),
                opt(batch.map(|r| r.ns_per_check), 1),
                opt(gov.map(|r| r.ns_per_check), 1),
                opt(fl("dependent", fp.keys, d).map(|f| f.ns_per_access), 1),
                opt(fl("batch", fp.keys, d).map(|f| f.ns_per_access), 1),
                opt(single.and_then(|r| r.x_floor), 2),
                opt(batch.and_then(|r| r.x_floor), 2),
                opt(vs_gov, 2),
                format!("{:.1}", fp.turnstile_bytes_per_key),
                opt(fp.governor_bytes_per_key, 1),
            );
        }
    }
    println!();
    println!(
        "CPU-ns per check, 1 thread pinned; batch 32: check_batch_verdicts per key; floor: one dependent \
         access of the same keys on a bare table of the store's slots (floor b: 32 prefetched load + \
         CAS); ×floor and vs gov: ratios of CPU-ns; B/key: resident growth per key held \
         (`turnstile memory --one`, 4 KiB pages)."
    );
    for fp in prints.iter().filter(|f| f.governor_skipped.is_some()) {
        println!(
            "governor not run at {} keys: {}",
            fmt_count(fp.keys),
            fp.governor_skipped.as_deref().unwrap_or("")
        );
    }
    print_knee(rows, prints, caches);
    println!("sweep: {:.0} s", secs);
}

/// Where the table outgrows each data cache, and the step between sizes where a uniform
/// single check's cost grows most.
fn print_knee(rows: &[Row], prints: &[Footprint], caches: &[(u32, u64, u32)]) {
    for &(level, size, shared) in caches.iter().filter(|c| c.0 >= 2) {
        let first = prints.iter().find(|f| f.table_bytes > size);
        let what = match first {
            Some(f) => format!(
                "the table outgrows it at {} keys ({})",
                fmt_count(f.keys),
                fmt_bytes(f.table_bytes)
            ),
            None => "every table measured fits in it".into(),
        };
        println!(
            "L{level} cache: {} (shared by {shared} CPU(s)): {what}",
            fmt_bytes(size)
        );
    }
    let uni: Vec<&Row> = rows
        .iter()
        .filter(|r| r.engine == "turnstile" && r.mode == "single" && r.distribution == "uniform")
        .collect();
    let knee = uni
        .windows(2)
        .map(|w| (w[0], w[1], w[1].ns_per_check / w[0].ns_per_check))
        .max_by(|a, b| a.2.total_cmp(&b.2));
    if let Some((a, b, x)) = knee {
        let ka = a.keys.unwrap_or(0);
        let kb = b.keys.unwrap_or(0);
        let tb = prints
            .iter()
            .find(|f| f.keys == kb)
            .map_or(0, |f| f.table_bytes);
        println!(
            "knee: a uniform check grows most from {} to {} keys ({:.1} → {:.1} CPU-ns, {x:.2}×), as the table grows to {}",
            fmt_count(ka),
            fmt_count(kb),
            a.ns_per_check,
            b.ns_per_check,
            fmt_bytes(tb)
        );
    }
}
