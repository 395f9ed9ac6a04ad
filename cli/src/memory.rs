//! `turnstile memory`: bytes per user, measured as resident memory, per algorithm, against the
//! design notes' estimates and against governor's keyed limiter.
//!
//! Each row runs in fresh child processes (`turnstile memory --one SUBJECT --users N`, a
//! hidden mode), once with transparent huge pages off and once as the binary normally runs.
//! A child builds a store with room for N users, checks N distinct `u64` ids once each, and
//! reports how much its anonymous resident memory grew — from before the store was built to
//! after the last insertion, with the store still alive. A child per row keeps one row's
//! freed-but-retained allocator pages out of the next row's figure.
//!
//! "Anonymous resident" is `/proc/self/statm`'s `resident − shared`: the pages of heap and
//! anonymous mappings that are in RAM, leaving out the binary's own code pages that the first
//! checks fault in. The store's tables are allocated zeroed and untouched, so they count only
//! as keys land in them: the figure is what the users cost, not what was reserved.
//!
//! Beside it: the store's own accounting ([`Store::memory_bytes`]) and the notes' estimate
//! (note 000: 34 B per user for a fixed window, 12 KB for a log of 500 timestamps, 1.6 KB for
//! 60 per-minute counters). See docs/memory.md for the results and why they are what they are.

mod redis;

use super::args::parse_count;
use clap::{Args, ValueEnum};
use serde::{Deserialize, Serialize};
use std::num::NonZeroU32;
use std::process::Command;
use std::time::{Duration, Instant};
use turnstile::keyed::Store;
use turnstile::{Algorithm, Limit, Limits, ManualClock};

/// For each algorithm at 500 requests per hour, builds a keyed store with room for N users,
/// checks N distinct users once each, and reports the resident memory this cost per user (RSS
/// growth of a fresh child process), the store's own accounting, the design notes' estimate
/// and the ratio; and the same for governor's keyed limiter (DashMap).
#[derive(Args)]
pub struct MemoryArgs {
    /// Users to insert (1000000, 1M, 20k, ...).
    #[arg(long, value_name = "N", value_parser = parse_count, default_value = "1M")]
    users: u64,
    /// One JSON document on stdout: {"users": N, "results": [...]}.
    #[arg(long)]
    json: bool,
    /// Where the users are kept: the in-memory store (and governor), or a Redis server
    /// (`--redis-url`; its database is flushed).
    #[arg(long, value_name = "NAME", value_enum, default_value = "memory")]
    backend: Backend,
    /// The Redis server `--backend redis` fills (a scratch one).
    #[arg(long, value_name = "URL")]
    redis_url: Option<String>,
    /// One row, measured in this process (the mode the report runs each row in).
    #[arg(long, value_name = "SUBJECT", hide = true)]
    one: Option<String>,
}

/// Where `memory` keeps the users.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Backend {
    Memory,
    Redis,
}

/// One hour, the notes' window ("500 requests per hour").
const HOUR: Duration = Duration::from_secs(3600);
/// Requests per hour in every row.
const RATE: u64 = 500;
/// Placement seed: the same table layout every run.
const SEED: u64 = 0x7475_726e_7374_696c;
/// The manual clock's time for every check (1000 s, a plain instant inside a window).
const NOW: u64 = 1_000_000_000_000;

/// What a row measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Subject {
    Turnstile(Algorithm),
    Governor,
    /// Each user's own limit (a limits class's entries, without the store).
    OwnLimits,
}

/// The rows, in report order.
const SUBJECTS: [Subject; 8] = [
    Subject::Turnstile(Algorithm::FixedWindow),
    Subject::Turnstile(Algorithm::SlidingWindow),
    Subject::Turnstile(Algorithm::TokenBucket),
    Subject::Turnstile(Algorithm::LeakyBucket),
    Subject::Turnstile(Algorithm::WindowRing),
    Subject::Turnstile(Algorithm::SlidingLog),
    Subject::Governor,
    Subject::OwnLimits,
];

impl Subject {
    fn id(self) -> String {
        match self {
            Subject::Turnstile(a) => a.name().to_string(),
            Subject::Governor => "governor".to_string(),
            Subject::OwnLimits => "own_limits".to_string(),
        }
    }

    fn parse(s: &str) -> crate::Result<Self> {
        if s == "governor" {
            return Ok(Subject::Governor);
        }
        if s == "own_limits" {
            return Ok(Subject::OwnLimits);
        }
        let a: Algorithm = s.parse()?;
        match SUBJECTS.iter().find(|x| **x == Subject::Turnstile(a)) {
            Some(x) => Ok(*x),
            None => Err(format!("`memory` does not measure {a}").into()),
        }
    }
}

/// The limit a turnstile row uses: 500 per hour in that algorithm's terms.
fn limit_for(a: Algorithm) -> crate::Result<Limit> {
    let l = match a {
        Algorithm::FixedWindow => Limit::fixed_window(RATE, HOUR),
        Algorithm::SlidingWindow => Limit::sliding_window(RATE, HOUR),
        Algorithm::SlidingLog => Limit::sliding_log(RATE, HOUR),
        Algorithm::WindowRing => Limit::window_ring(RATE, HOUR, 60),
        Algorithm::TokenBucket => Limit::token_bucket(RATE, RATE, HOUR),
        Algorithm::LeakyBucket => Limit::leaky_bucket(RATE, HOUR, 0, None),
        Algorithm::Concurrency => return Err("`memory` does not measure concurrency".into()),
        other => return Err(format!("`memory` does not measure {other}").into()),
    };
    Ok(l?)
}

/// The design notes' per-user estimate for an algorithm, with its arithmetic.
fn notes_estimate(s: Subject) -> (Option<u64>, &'static str) {
    match s {
        Subject::Turnstile(Algorithm::FixedWindow) => (
            Some(34),
            "8 id + 4 time + 2 count + 20 hash-table overhead = 34 B (36 B with a 4-byte lock)",
        ),
        Subject::Turnstile(Algorithm::SlidingLog) => (
            Some(12_028),
            "8 + (4 + 20 sorted-set overhead) x 500 + 20 = 12028 B ('12 KB')",
        ),
        Subject::Turnstile(Algorithm::WindowRing) => (
            Some(1_588),
            "8 + (4 + 2 + 20 Redis-hash overhead) x 60 + 20 = 1588 B ('1.6 KB')",
        ),
        _ => (None, "no estimate in the notes"),
    }
}

fn describe(s: Subject) -> &'static str {
    match s {
        Subject::Turnstile(Algorithm::FixedWindow) => "500/h",
        Subject::Turnstile(Algorithm::SlidingWindow) => "500/h",
        Subject::Turnstile(Algorithm::TokenBucket) => "500/h, burst 500",
        Subject::Turnstile(Algorithm::LeakyBucket) => "500/h, burst 0",
        Subject::Turnstile(Algorithm::WindowRing) => "500/h in 60 buckets",
        Subject::Turnstile(Algorithm::SlidingLog) => "500/h, 500 timestamps",
        Subject::Turnstile(_) => "",
        Subject::Governor => "500/h GCRA, keyed (DashMap)",
        Subject::OwnLimits => "entry: 90% 5 plans, 10% own",
    }
}

/// One measured row (also the child's answer to the parent, as one JSON line).
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Row {
    engine: String,
    algorithm: String,
    limit: String,
    users: u64,
    /// Keys the engine holds after the inserts (the per-user figures divide by this).
    stored: u64,
    /// Users the store could not place at its rated capacity and admitted untracked (the
    /// default full-store policy, `AllowUntracked`).
    #[serde(default)]
    untracked: u64,
    /// Users the store could not place and refused (`StoreFull`).
    #[serde(default)]
    refused: u64,
    /// Growth of anonymous resident memory, bytes.
    rss_bytes: u64,
    bytes_per_user: f64,
    /// `Store::memory_bytes()` (none for governor).
    accounted_bytes: Option<u64>,
    accounted_bytes_per_user: Option<f64>,
    notes_bytes_per_user: Option<u64>,
    notes_arithmetic: String,
    /// bytes_per_user / notes_bytes_per_user.
    ratio_to_notes: Option<f64>,
    /// The same growth with transparent huge pages as the allocator asks for them by default.
    #[serde(default)]
    rss_bytes_thp: Option<u64>,
    #[serde(default)]
    bytes_per_user_thp: Option<f64>,
    /// Time to build and insert, seconds.
    insert_seconds: f64,
    /// Whether the row ran in its own process.
    isolated: bool,
}

#[derive(Serialize)]
struct Report<'a> {
    users: u64,
    results: &'a [Row],
}

/// Runs the subcommand.
pub fn run(a: MemoryArgs) -> crate::Result<()> {
    let MemoryArgs {
        users,
        json,
        one,
        backend,
        redis_url,
    } = a;
    if users == 0 {
        return Err("option --users: give at least 1 user".into());
    }
    match (backend, redis_url) {
        (Backend::Redis, Some(url)) => return redis::run(&url, users, json),
        (Backend::Redis, None) => {
            return Err("--backend redis needs --redis-url redis://HOST:PORT".into())
        }
        (Backend::Memory, Some(_)) => return Err("--redis-url is for --backend redis".into()),
        (Backend::Memory, None) => {}
    }
    if let Some(name) = one {
        let row = measure(Subject::parse(&name)?, users, true)?;
        println!("{}", serde_json::to_string(&row)?);
        return Ok(());
    }
    let mut rows = Vec::with_capacity(SUBJECTS.len());
    let bar = crate::progress::bar(SUBJECTS.len() as u64, json, "memory: measuring");
    for s in SUBJECTS {
        bar.set_message(format!("memory: {} {}", engine_of(s), s.id()));
        rows.push(in_child(s, users)?);
        bar.inc(1);
    }
    bar.finish_and_clear();
    if json {
        let doc = Report {
            users,
            results: &rows,
        };
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        print_table(users, &rows);
    }
    Ok(())
}

fn engine_of(s: Subject) -> &'static str {
    match s {
        Subject::Turnstile(_) | Subject::OwnLimits => "turnstile",
        Subject::Governor => "governor",
    }
}

/// Measures `s` in two child processes: first with transparent huge pages off (resident
/// memory counted in 4 KiB pages: what the users cost), then as the binary
/// normally runs (mimalloc asks for huge pages: memory comes in 2 MiB pieces). In this
/// process, once, if no child can be started.
fn in_child(s: Subject, users: u64) -> crate::Result<Row> {
    let Ok(exe) = std::env::current_exe() else {
        return measure(s, users, false);
    };
    let child = |thp: bool| -> crate::Result<Option<Row>> {
        let mut cmd = Command::new(&exe);
        cmd.args(["memory", "--one", &s.id(), "--users", &users.to_string()]);
        if !thp {
            crate::alloc::without_huge_pages(&mut cmd);
        }
        let Ok(out) = cmd.output() else {
            return Ok(None);
        };
        if !out.status.success() {
            return Err(format!(
                "measuring {} in a child process failed ({}): {}",
                s.id(),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )
            .into());
        }
        let text = String::from_utf8_lossy(&out.stdout);
        serde_json::from_str(text.trim()).map(Some).map_err(|e| {
            format!(
                "measuring {}: unreadable child answer `{text}`: {e}",
                s.id()
            )
            .into()
        })
    };
    let Some(mut row) = child(false)? else {
        return measure(s, users, false);
    };
    if let Some(t) = child(true)? {
        row.rss_bytes_thp = Some(t.rss_bytes);
        row.bytes_per_user_thp = Some(t.bytes_per_user);
    }
    Ok(row)
}

/// Anonymous resident bytes of this process: statm's resident − shared pages.
fn anon_rss() -> crate::Result<u64> {
    let s = std::fs::read_to_string("/proc/self/statm")
        .map_err(|e| format!("cannot read /proc/self/statm (Linux only): {e}"))?;
    let f: Vec<u64> = s
        .split_whitespace()
        .take(3)
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    if f.len() < 3 {
        return Err(format!("unexpected /proc/self/statm: `{}`", s.trim()).into());
    }
    // SAFETY: sysconf has no preconditions; it only reads a system constant.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    let page = if page > 0 { page as u64 } else { 4096 };
    Ok(f[1].saturating_sub(f[2]) * page)
}

/// Builds, fills and measures one subject in this process.
fn measure(s: Subject, users: u64, isolated: bool) -> crate::Result<Row> {
    // A tiny run first: the allocator's and the engine's one-time set-up is not the users'.
    fill(s, 64, |_| Ok(()))?;
    let before = anon_rss()?;
    let t0 = Instant::now();
    let mut after = 0;
    let Filled {
        stored,
        untracked,
        refused,
        accounted,
    } = fill(s, users, |_| {
        after = anon_rss()?;
        Ok(())
    })?;
    let secs = t0.elapsed().as_secs_f64();
    let rss = after.saturating_sub(before);
    let per_user = rss as f64 / stored.max(1) as f64;
    let (notes, arithmetic) = notes_estimate(s);
    Ok(Row {
        engine: engine_of(s).to_string(),
        algorithm: match s {
            Subject::Turnstile(a) => a.name().to_string(),
            Subject::Governor => Algorithm::TokenBucket.name().to_string(),
            Subject::OwnLimits => "own limits".to_string(),
        },
        limit: describe(s).to_string(),
        users,
        stored,
        untracked,
        refused,
        rss_bytes: rss,
        bytes_per_user: round2(per_user),
        accounted_bytes: accounted,
        accounted_bytes_per_user: accounted.map(|b| round2(b as f64 / stored.max(1) as f64)),
        notes_bytes_per_user: notes,
        notes_arithmetic: arithmetic.to_string(),
        ratio_to_notes: notes.map(|n| round3(per_user / n as f64)),
        rss_bytes_thp: None,
        bytes_per_user_thp: None,
        insert_seconds: round3(secs),
        isolated,
    })
}

/// What a filled structure holds.
struct Filled {
    /// Keys held.
    stored: u64,
    /// Keys admitted without a record (no slot free in their probe range).
    untracked: u64,
    /// Keys refused (no slot free, and the policy refuses).
    refused: u64,
    /// The store's own accounting, bytes (none for governor).
    accounted: Option<u64>,
}

/// Builds `s` for `users`, checks each once, calls `at_full` with the structure still alive,
/// and says what it holds.
fn fill(
    s: Subject,
    users: u64,
    mut at_full: impl FnMut(u64) -> crate::Result<()>,
) -> crate::Result<Filled> {
    match s {
        Subject::Turnstile(a) => {
            let limits = Limits::new(vec![limit_for(a)?])?;
            // One shard: an arena store's records are split evenly between shards while keys
            // are not, so with several shards one of them can run out of records before N
            // users are in. One shard holds exactly N; the per-user cost is the same.
            let store = Store::builder(limits)
                .capacity(users)
                .shards(1)
                .seed(SEED)
                .build_with_clock(ManualClock::new(NOW))?;
            for id in 0..users {
                std::hint::black_box(store.check_at(&id, 1, NOW));
            }
            let st = store.stats();
            at_full(st.live)?;
            // Filled to exactly its rated capacity, the table places all but a handful of keys
            // (`tests/store_fill.rs`: at most 0.001 % of 1M random ids); the others go as the
            // full-store policy says — untracked by default, refused under `Reject`. The
            // figures are per key held, and the report says how many were not. Every user must
            // be one of the three, and the unplaced few must stay within the table's contract
            // (0.1 % here, for the small stores of a short run): anything else is a defect of
            // the store, not a figure.
            let unplaced = st.untracked + st.rejected;
            if st.live + unplaced != users || unplaced * 1000 > users {
                return Err(format!(
                    "{a}: the store placed {} of {users} users ({} untracked, {} refused): \
                     more than 0.1 % unplaced, or users unaccounted for",
                    st.live, st.untracked, st.rejected
                )
                .into());
            }
            Ok(Filled {
                stored: st.live,
                untracked: st.untracked,
                refused: st.rejected,
                accounted: Some(store.memory_bytes() as u64),
            })
        }
        Subject::OwnLimits => own_limits(users, at_full),
        Subject::Governor => {
            use governor::{Quota, RateLimiter};
            let q = Quota::per_hour(NonZeroU32::new(RATE as u32).expect("non-zero"));
            let lim = RateLimiter::keyed(q);
            for id in 0..users {
                let _ = std::hint::black_box(lim.check_key(&id));
            }
            let n = lim.len() as u64;
            at_full(n)?;
            Ok(Filled {
                stored: n,
                untracked: 0,
                refused: 0,
                accounted: None,
            })
        }
    }
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

fn human(b: f64) -> String {
    if b >= 1024.0 * 1024.0 * 1024.0 {
        format!("{:.2} GiB", b / (1024.0 * 1024.0 * 1024.0))
    } else if b >= 1024.0 * 1024.0 {
        format!("{:.1} MiB", b / (1024.0 * 1024.0))
    } else if b >= 1024.0 {
        format!("{:.1} KiB", b / 1024.0)
    } else {
        format!("{b:.0} B")
    }
}

fn print_table(users: u64, rows: &[Row]) {
    println!("memory: {users} users, one check each, 500 requests per hour; resident memory growth of a fresh process per row");
    println!();
    println!(
        "{:<10} {:<15} {:<28} {:>9} {:>9} {:>7} {:>8} {:>10} {:>10} {:>7} {:>7} {:>10}",
        "engine",
        "algorithm",
        "limit",
        "placed",
        "untracked",
        "refused",
        "B/user",
        "B/user THP",
        "accounted",
        "notes",
        "ratio",
        "RSS"
    );
    let dash = || "-".to_string();
    for r in rows {
        let thp = r
            .bytes_per_user_thp
            .map_or_else(dash, |b| format!("{b:.1}"));
        let acc = r
            .accounted_bytes_per_user
            .map_or_else(dash, |b| format!("{b:.1}"));
        let notes = r.notes_bytes_per_user.map_or_else(dash, |n| n.to_string());
        let ratio = r.ratio_to_notes.map_or_else(dash, |x| format!("{x:.3}"));
        println!(
            "{:<10} {:<15} {:<28} {:>9} {:>9} {:>7} {:>8.1} {:>10} {:>10} {:>7} {:>7} {:>10}",
            r.engine,
            r.algorithm,
            r.limit,
            r.stored,
            r.untracked,
            r.refused,
            r.bytes_per_user,
            thp,
            acc,
            notes,
            ratio,
            human(r.rss_bytes as f64)
        );
    }
    println!();
    println!("placed: users the store holds, filled to its rated capacity. untracked / refused:");
    println!("  users it found no slot for, admitted untracked (the default full-store policy) or");
    println!("  refused; at most 0.001 % of 1M random ids (tests/store_fill.rs).");
    println!("B/user: anonymous resident memory growth / users placed, counted in 4 KiB pages");
    println!("  (transparent huge pages off). B/user THP: the same as the binary runs by default,");
    println!("  where mimalloc asks for 2 MiB huge pages (coarse below ~100k users).");
    println!("accounted: the store's memory_bytes() / users. notes: the design notes' estimate;");
    println!("ratio = B/user / notes. The notes' arithmetic:");
    for r in rows.iter().filter(|r| r.notes_bytes_per_user.is_some()) {
        println!("  {:<15} {}", r.algorithm, r.notes_arithmetic);
    }
    if rows.iter().any(|r| !r.isolated) {
        println!("(some rows ran in this process: no child could be started)");
    }
}

/// The own-limits row: a limits class (token_bucket, five plans) with an entry for each of
/// `users` customers, 90 % on the plans and 10 % a limit of their own (1000 distinct ones),
/// set through its source; its entries and the class's accounted bytes.
fn own_limits(
    users: u64,
    mut at_full: impl FnMut(u64) -> crate::Result<()>,
) -> crate::Result<Filled> {
    use turnstile::keyed::KeyHasher;
    use turnstile::rules::limits::{KeyLimit, LimitsClass, LimitsSource, MemoryLimits};
    use turnstile::rules::KeyClass;
    use turnstile::LimitSpec;
    let spec = |l: u64| LimitSpec {
        burst: Some(l),
        ..LimitSpec::new(Algorithm::TokenBucket, l, HOUR)
    };
    let mut class = LimitsClass::new("users", KeyClass::customer(), Algorithm::TokenBucket)
        .capacity(users.max(1));
    for k in 0..5 {
        class = class.plan(format!("p{k}"), spec(RATE * (k + 1)));
    }
    let src =
        MemoryLimits::new(&class, KeyHasher::with_seed(SEED, 64)).map_err(|e| e.to_string())?;
    let plans: Vec<KeyLimit> = (0..5).map(|k| KeyLimit::Plan(format!("p{k}"))).collect();
    for id in 0..users {
        let e = if id % 10 == 9 {
            KeyLimit::Limit(spec(RATE + (id / 10) % 1000))
        } else {
            plans[(id % 5) as usize].clone()
        };
        src.set(id, &e).map_err(|e| e.to_string())?;
    }
    at_full(src.len())?;
    Ok(Filled {
        stored: src.len(),
        untracked: 0,
        refused: 0,
        accounted: Some(src.bytes() as u64),
    })
}
