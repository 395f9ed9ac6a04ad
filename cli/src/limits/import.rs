//! `turnstile limits import RULES FILE [--class NAME] [--redis-url URL]`: puts a file's
//! entries (CSV or JSON Lines, read and checked as the engine reads a class's file) into the
//! Redis of a class whose entries live there (turnstile-redis's `RedisLimits`), one `HSET`
//! per bucket, pipelined, with a progress bar. Entries already in Redis and not in the file
//! stay; an entry in both takes the file's value. Every running `turnstile serve` of the class
//! applies the new entries within milliseconds (their caches are invalidated by Redis).
//!
//! Not atomic: entries are written pipeline by pipeline, each entry whole (one field of one
//! `HSET`). Cut short (Redis gone, a timeout), it says how many are surely written and how
//! many may be; running it again writes the same values, so a second run completes it.

use redis::aio::MultiplexedConnection;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use turnstile::keyed::KeyHasher;
use turnstile::rules::limits::{LimitsSource, MemoryLimits};
use turnstile::rules::Rules;
use turnstile_redis::limits::{bucket_count, bucket_of, LimitsKeys};

/// Entries written per pipeline (a pipeline of HSETs of whole buckets).
const BATCH_ENTRIES: usize = 50_000;

/// `limits import`'s arguments.
#[derive(clap::Args)]
pub struct ImportArgs {
    /// The rules file defining the class (its key, algorithm, plans and `redis`).
    #[arg(value_name = "RULES")]
    pub rules: PathBuf,
    /// The entries: `key,plan` / `key,limits` lines, or JSON Lines (`.jsonl`).
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    /// The class (`[limits.NAME]`); may be left out when the rules have one class.
    #[arg(long, value_name = "NAME")]
    pub class: Option<String>,
    /// The Redis to write to (default: the class's `redis`).
    #[arg(long, value_name = "URL")]
    pub redis_url: Option<String>,
    /// Key prefix (`<prefix>limits:<class>:<bucket>`); `turnstile serve` reads the default.
    #[arg(long, default_value = "turnstile:")]
    pub prefix: String,
}

/// Runs the import; prints what it wrote and how fast. A bad line of the file: printed as
/// `file:line: message`, exit status 1, nothing written.
pub fn run(a: ImportArgs) -> crate::Result<()> {
    let rules = Rules::from_file(&a.rules).map_err(|e| e.to_string())?;
    let class = super::pick_class(&rules, &a.rules.display(), a.class.as_deref())?;
    let url = a.redis_url.clone().or(class.redis.clone()).ok_or_else(|| {
        format!(
            "class `{}` says no `redis`: give --redis-url URL (or add redis = \"redis://...\" to \
             the class)",
            class.name
        )
    })?;
    let t0 = Instant::now();
    let mut file_class = class.clone();
    file_class.redis = None;
    file_class.file = Some(a.file.clone());
    // The class's own reader: every line checked (`file:line: message` on the first bad one).
    let mem = match MemoryLimits::new(&file_class, KeyHasher::with_seed(0, 64)) {
        Ok(m) => m,
        Err(e) => {
            // As `limits check`: the bad line, exit status 1; nothing written.
            let mut f = crate::Failures::default();
            f.report(e);
            f.exit_if_any();
            unreachable!("exit_if_any exits after a report");
        }
    };
    let mut rows: Vec<(u64, u64, String)> = Vec::with_capacity(mem.len() as usize);
    let read = t0.elapsed();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start a runtime: {e}"))?;
    let keys = LimitsKeys::new(&a.prefix, &class.name);
    let mut conn = rt.block_on(connect(&url))?;
    let capacity = class.capacity.max(mem.len());
    let buckets = rt
        .block_on(bucket_count(&mut conn, &keys, capacity))
        .map_err(|e| format!("{url}: {e}"))?;
    check_compact(&url, &class.name, &keys, mem.len(), buckets)?;
    mem.export(&mut |id, e| rows.push((bucket_of(id, buckets), id, e.to_string())));
    drop(mem);
    rows.sort_unstable();
    let t1 = Instant::now();
    write_rows(&rt, &mut conn, &url, &keys, &rows)?;
    let w = t1.elapsed().as_secs_f64();
    println!(
        "{}: class {}: {} entries into {url} ({} buckets under {}) in {w:.2} s, {:.0} entries/s \
         (file read and checked in {:.2} s)",
        a.file.display(),
        class.name,
        rows.len(),
        buckets,
        keys.prefix,
        rows.len() as f64 / w.max(1e-9),
        read.as_secs_f64()
    );
    Ok(())
}

/// Refuses an import that would pass the 128 fields a hash holds compactly in each of the
/// class's buckets (whose count its first writer fixed).
fn check_compact(
    url: &str,
    class: &str,
    keys: &LimitsKeys,
    entries: u64,
    buckets: u64,
) -> crate::Result<()> {
    // The bucket count is the first writer's, for every process of the class: an import far
    // larger than it was sized for would leave Redis's compact hashes (at most 128 fields).
    let per_bucket = entries.div_ceil(buckets);
    if per_bucket > COMPACT_FIELDS {
        return Err(format!(
            "{url}: class {} keeps its entries in {buckets} buckets (sized by its first writer, \
             in {}); this file's {} entries would put about {per_bucket} in each, past the 128 \
             a hash holds compactly (about 65 bytes per entry instead of 17). Nothing was \
             written. Delete {} and the class's hashes ({}*) to size it again for this file, \
             or raise the class's capacity before the first import",
            class,
            keys.buckets(),
            entries,
            keys.buckets(),
            keys.prefix
        )
        .into());
    }
    Ok(())
}

/// Writes `rows` (bucket, id, entry; sorted) in pipelines of whole buckets, each within 30 s.
fn write_rows(
    rt: &tokio::runtime::Runtime,
    conn: &mut redis::aio::MultiplexedConnection,
    url: &str,
    keys: &LimitsKeys,
    rows: &[(u64, u64, String)],
) -> crate::Result<()> {
    let bar = crate::progress::bar(rows.len() as u64, false, "import");
    let mut i = 0;
    while i < rows.len() {
        let end = batch_end(rows, i);
        let mut p = redis::pipe();
        let mut j = i;
        while j < end {
            let b = rows[j].0;
            let cmd = p.cmd("HSET").arg(keys.bucket(b)).ignore();
            while j < end && rows[j].0 == b {
                cmd.arg(rows[j].1).arg(&rows[j].2);
                j += 1;
            }
        }
        rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(30), p.exec_async(conn)).await
        })
        .map_err(|_| partial(url, "no answer within 30 s", i, end))?
        .map_err(|e| partial(url, &e.to_string(), i, end))?;
        bar.inc((end - i) as u64);
        i = end;
    }
    bar.finish_and_clear();
    Ok(())
}

/// Hashes of at most this many fields stay compact in Redis (`hash-max-listpack-entries`).
const COMPACT_FIELDS: u64 = 128;

/// An import cut short: what is known to be written, and what to do.
fn partial(url: &str, why: &str, done: usize, end: usize) -> String {
    format!(
        "{url}: {why}. The first {done} entries (in bucket order) are written; of the next \
         {}, some may be (a pipeline is not a transaction). Each entry is written whole or \
         not at all, and an import writes the same values again: run it again to finish",
        end - done
    )
}

/// Where the pipeline starting at `i` ends: about `BATCH_ENTRIES` entries, whole buckets.
fn batch_end(rows: &[(u64, u64, String)], i: usize) -> usize {
    let mut end = (i + BATCH_ENTRIES).min(rows.len());
    while end < rows.len() && rows[end].0 == rows[end - 1].0 {
        end += 1;
    }
    end
}

async fn connect(url: &str) -> crate::Result<MultiplexedConnection> {
    let client = redis::Client::open(url).map_err(|e| format!("`{url}`: {e}"))?;
    let cfg = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(2)))
        .set_response_timeout(None);
    client
        .get_multiplexed_async_connection_with_config(&cfg)
        .await
        .map_err(|e| format!("cannot connect to {url}: {e}").into())
}
