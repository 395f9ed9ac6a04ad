//! `turnstile bench scale`: what a keyed check costs from 1k to 100M keys, uniform and Zipf,
//! single and batched, beside governor's keyed limiter (up to the size its memory fits in)
//! and the floor of the same keys on a bare table of the store's size; with the resident
//! bytes per key at each size and the sizes where the table outgrows each cache level.
//!
//! Each size builds its engines afresh and fills them with every key; the timed loop, the
//! rows, the floors and the key draws are the default suite's (`run`, `row`, `floor`,
//! `keys`). Bytes per key come from `turnstile memory`'s child process at the same size
//! (resident growth in 4 KiB pages over the keys held), so that one size's freed memory
//! cannot lower the next one's figure. One thread: CPU-ns per check is the figure.

use super::floor::{self, FloorRow};
use super::keys::{self, Distribution};
use super::limits::{governor_quota, store_capacity, throughput_limit};
use super::options::ScaleArgs;
use super::plot;
use super::row::{attach_floors, Row, RowSpec};
use super::run::{GovernorKeyed, Mode, Timer, TurnstileKeyed};
use super::scale_table::{self, Footprint};
use super::suite::{sequences, Runner, SEQ_LEN};
use super::text::{fmt_count, load_warning, progress, progress_done};
use std::time::{Duration, Instant};
use turnstile::keyed::Store;
use turnstile::{Algorithm, Limits};

/// The sizes swept, smallest first.
const SIZES: [u64; 6] = [1_000, 10_000, 100_000, 1_000_000, 10_000_000, 100_000_000];

/// Keys per batch in the batched rows and the batch floor (the default suite's).
const BATCH: usize = 32;

/// governor's keyed limiter is built at a size only if 1.5 times its resident bytes there, as
/// the size before predicts them, fit in this share of the memory available beside
/// turnstile's store and the floor table. DashMap grows one shard's table at a time (4 ×
/// cores shards): while one doubles, its old and new tables live together; 1.5 covers that
/// with room for the allocator's slack.
const GOVERNOR_MEMORY_SHARE: f64 = 0.7;

/// The machine's data caches: (level, bytes per instance, CPUs sharing one).
fn caches() -> Vec<(u32, u64, u32)> {
    let mut v = Vec::new();
    for i in 0..8 {
        let d = format!("/sys/devices/system/cpu/cpu0/cache/index{i}");
        let read = |f: &str| std::fs::read_to_string(format!("{d}/{f}")).ok();
        let Some(kind) = read("type") else { break };
        if kind.trim() == "Instruction" {
            continue;
        }
        let level = read("level")
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0);
        let size = read("size").map_or(0, |s| {
            let s = s.trim();
            let (n, mul) = match s.strip_suffix('K') {
                Some(n) => (n, 1024),
                None => match s.strip_suffix('M') {
                    Some(n) => (n, 1024 * 1024),
                    None => (s, 1),
                },
            };
            n.parse::<u64>().unwrap_or(0) * mul
        });
        let shared = read("shared_cpu_list").map_or(1, |s| cpu_count(s.trim()));
        v.push((level, size, shared));
    }
    v
}

/// CPUs in a list like `0-3,8`.
fn cpu_count(list: &str) -> u32 {
    list.split(',')
        .map(|r| match r.split_once('-') {
            Some((a, b)) => b.parse::<u32>().unwrap_or(0) + 1 - a.parse::<u32>().unwrap_or(0),
            None => 1,
        })
        .sum()
}

/// Resident bytes per key of `subject` (an algorithm's name, or `governor`) holding `keys`
/// distinct keys: `turnstile memory --one SUBJECT --users N` in a fresh child process, with
/// transparent huge pages off (resident growth in 4 KiB pages over the keys held, the figure
/// of `memory`'s "measured B/user" column).
fn resident_per_key(subject: &str, keys: u64) -> crate::Result<f64> {
    let exe = std::env::current_exe()
        .map_err(|e| format!("cannot find this program to measure memory in a child: {e}"))?;
    let mut cmd = std::process::Command::new(&exe);
    cmd.args(["memory", "--one", subject, "--users", &keys.to_string()]);
    crate::alloc::without_huge_pages(&mut cmd);
    let out = cmd
        .output()
        .map_err(|e| format!("cannot start {} to measure memory: {e}", exe.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(format!(
            "memory --one {subject} --users {keys} failed ({}): {}",
            out.status,
            err.trim()
        )
        .into());
    }
    let row: serde_json::Value = serde_json::from_str(text.trim())
        .map_err(|e| format!("memory --one {subject}: unreadable answer `{text}`: {e}"))?;
    row["bytes_per_user"]
        .as_f64()
        .ok_or_else(|| format!("memory --one {subject}: no bytes_per_user in `{text}`").into())
}

/// Bytes of memory available (/proc/meminfo's MemAvailable).
fn mem_available() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let l = s.lines().find(|l| l.starts_with("MemAvailable:"))?;
    Some(l.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024)
}

/// Runs the sweep.
pub fn run(a: ScaleArgs) -> crate::Result<()> {
    if !SIZES.contains(&a.max_keys) {
        return Err(format!(
            "option --max-keys: {}; give one of 1k, 10k, 100k, 1M, 10M, 100M",
            a.max_keys
        )
        .into());
    }
    let seconds = if a.quick { 0.1 } else { a.seconds };
    if !(seconds.is_finite() && seconds > 0.0 && seconds <= 3600.0) {
        return Err(
            format!("option --seconds: {seconds}; give a duration above 0, at most 3600").into(),
        );
    }
    super::text::quiet(a.json);
    load_warning();
    let t0 = Instant::now();
    let timer = Timer::calibrate();
    let limits = Limits::new(vec![throughput_limit(Algorithm::TokenBucket)?])?;
    let (warm, win) = (
        Duration::from_secs_f64(seconds / 10.0),
        Duration::from_secs_f64(seconds),
    );
    let mut rows = Vec::new();
    let mut floors = Vec::new();
    let mut prints = Vec::new();
    let mut governor_bpk: Option<f64> = None;
    for &n in SIZES.iter().filter(|&&n| n <= a.max_keys) {
        let sz = Size {
            n,
            limits: &limits,
            timer: &timer,
            warm,
            win,
        };
        let (r, f, fp) = sz.measure(!a.no_governor, &mut governor_bpk)?;
        rows.extend(r);
        floors.extend(f);
        prints.push(fp);
    }
    attach_floors(&mut rows, &floors);
    if let Some(file) = &a.plot {
        plot::scale(file, &rows, &floors)
            .map_err(|e| format!("cannot write the plot to {file}: {e}"))?;
        progress(format!("wrote {file}"));
    }
    let secs = t0.elapsed().as_secs_f64();
    progress_done();
    let caches = caches();
    if a.json {
        let doc = serde_json::json!({
            "results": rows, "floors": floors, "memory": prints,
            "caches": caches.iter().map(|c| serde_json::json!({"level": c.0, "bytes": c.1, "shared_by_cpus": c.2})).collect::<Vec<_>>(),
            "seconds": secs,
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        scale_table::print(&rows, &floors, &prints, &caches, secs);
    }
    Ok(())
}

/// One size of the sweep and what its runs share.
struct Size<'a> {
    n: u64,
    limits: &'a Limits,
    timer: &'a Timer,
    warm: Duration,
    win: Duration,
}

impl Size<'_> {
    /// Bytes per key (child processes), then both engines built and filled, then every row.
    fn measure(
        &self,
        governor: bool,
        governor_bpk: &mut Option<f64>,
    ) -> crate::Result<(Vec<Row>, Vec<FloorRow>, Footprint)> {
        let n = self.n;
        progress(format!(
            "{}: resident bytes per key (child process)",
            fmt_count(n)
        ));
        let tbpk = resident_per_key("token_bucket", n)?;
        let gov_skip = if governor {
            self.governor_fits(*governor_bpk)
        } else {
            Some("--no-governor".into())
        };
        let gbpk = match &gov_skip {
            None => {
                let g = resident_per_key("governor", n)?;
                *governor_bpk = Some(g);
                Some(g)
            }
            Some(_) => None,
        };
        progress(format!("{}: filling turnstile's store", fmt_count(n)));
        let store = Store::builder(self.limits.clone())
            .capacity(store_capacity(Algorithm::TokenBucket, n))
            .seed(0x7475_726e)
            .build()?;
        for r in 0..n {
            store.check(&keys::key_id(r), 1);
        }
        let gov = gbpk.map(|_| {
            progress(format!(
                "{}: filling governor's keyed limiter",
                fmt_count(n)
            ));
            let g = governor::RateLimiter::keyed(governor_quota());
            for r in 0..n {
                let _ = g.check_key(&keys::key_id(r));
            }
            g
        });
        progress(format!(
            "{}: floor table of {} slots",
            fmt_count(n),
            fmt_count(store.slot_count())
        ));
        let table = floor::Table::new(store.slot_count(), n, 0xf100_12ab ^ n)
            .ok_or_else(|| format!("{} keys do not fit a floor table", fmt_count(n)))?;
        let fp = Footprint {
            keys: n,
            turnstile_bytes_per_key: tbpk,
            table_bytes: store.slot_count() * 16,
            governor_bytes_per_key: gbpk,
            governor_skipped: gov_skip,
        };
        let (mut rows, mut floors) = (Vec::new(), Vec::new());
        for d in [Distribution::Uniform, Distribution::Zipf(1.0)] {
            self.rows(d, &store, gov.as_ref(), &table, &mut rows, &mut floors);
        }
        Ok((rows, floors, fp))
    }

    /// The rows of one distribution: turnstile single and batched, governor, both floors.
    fn rows(
        &self,
        d: Distribution,
        store: &Store,
        gov: Option<&governor::DefaultKeyedRateLimiter<u64>>,
        table: &floor::Table,
        rows: &mut Vec<Row>,
        floors: &mut Vec<FloorRow>,
    ) {
        let n = self.n;
        let seq = sequences(d, n, 1, SEQ_LEN);
        let r = Runner {
            seq: &seq,
            len: SEQ_LEN,
            timer: self.timer,
            warmup: self.warm,
            window: self.win,
        };
        let spec = |engine, alg: &str, mode| RowSpec {
            engine,
            algorithm: alg.to_string(),
            keys: Some(n),
            distribution: d.to_string(),
            threads: 1,
            mode,
        };
        let label = |e: &str| format!("{} {d}, {e}", fmt_count(n));
        let c = TurnstileKeyed(store);
        rows.push(r.row(
            &c,
            spec("turnstile", "token_bucket", Mode::Single),
            &label("turnstile"),
        ));
        let m = Mode::Batch(BATCH);
        rows.push(r.row(
            &c,
            spec("turnstile", "token_bucket", m),
            &label("turnstile batch"),
        ));
        if let Some(g) = gov {
            let g = GovernorKeyed(g);
            rows.push(r.row(
                &g,
                spec("governor", "gcra", Mode::Single),
                &label("governor"),
            ));
        }
        let ranks = keys::ranks(d, n, SEQ_LEN, 0x0be7_c4ec_5eed ^ n);
        let idx = table.indices(&ranks);
        for kind in [floor::Kind::Dependent, floor::Kind::Batch(BATCH)] {
            floors.push(self.floor_row(table, kind, d, &idx));
        }
    }

    /// `None` if governor's keyed limiter fits in memory at this size, else why not.
    fn governor_fits(&self, bpk_before: Option<f64>) -> Option<String> {
        // Before any size is measured: governor's figure at 1M keys in docs/memory.md, rounded up.
        let bpk = bpk_before.unwrap_or(64.0);
        let need = 1.5 * bpk * self.n as f64;
        let avail = mem_available()? as f64;
        // turnstile's store and the floor table live beside it: ~48 B a key.
        let room = GOVERNOR_MEMORY_SHARE * avail - 48.0 * self.n as f64;
        (need > room).then(|| {
            format!(
                "governor would need ~{:.1} GiB here (1.5 × {bpk:.0} B × {} keys, while a shard's table doubles) of {:.1} GiB available",
                need / (1u64 << 30) as f64,
                fmt_count(self.n),
                avail / (1u64 << 30) as f64
            )
        })
    }

    /// One floor row of `kind` over the slots of the keys `idx`.
    fn floor_row(
        &self,
        t: &floor::Table,
        kind: floor::Kind,
        d: Distribution,
        idx: &[u32],
    ) -> FloorRow {
        let uniform = d == Distribution::Uniform;
        let (ns, accesses, on_cpu, preemptions) =
            floor::measure(t, kind, uniform, &[idx], self.warm, self.win);
        progress(format!(
            "{} {d}, floor {}: {ns:.1} CPU-ns/access",
            fmt_count(self.n),
            kind.name()
        ));
        FloorRow {
            kind: kind.name(),
            batch: match kind {
                floor::Kind::Batch(b) => b,
                _ => 1,
            },
            keys: self.n,
            distribution: d.to_string(),
            threads: 1,
            slots: t.len(),
            ns_per_access: ns,
            accesses,
            on_cpu,
            preemptions,
            runs: 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_count_their_cpus() {
        assert_eq!(cpu_count("0"), 1);
        assert_eq!(cpu_count("0-1"), 2);
        assert_eq!(cpu_count("0-3,8"), 5);
    }
}
