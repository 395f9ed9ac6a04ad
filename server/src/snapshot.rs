//! Snapshots of every store: the `CL.THROTTLE` store and the rules engine's (each rule's,
//! each override's, each elastic pool's). Written to a new temporary file, fsynced and renamed
//! over the old one (a crash leaves the old or the new file, never a mix; no link beside it is
//! followed: `snapshot/file.rs`); read whole and checked before anything is restored (a bad file
//! restores nothing).
//!
//! Format (little-endian):
//!
//! ```text
//! "TSNP" | version u32 (3) | payload length u64 | CRC-32 of the payload u32 | payload
//! payload: hash seed u64 | wall-clock ns at write u64 | CL.THROTTLE records u64 |
//!          per record: key id u64 | TAT, wall-clock ns since the Unix epoch u64
//!          rules clock ns at write u64 | rule stores u32 |
//!          per rule store: description length u32 | description (UTF-8) | words u32 |
//!                          records u64 | per record: key id u64 | words × state u64
//! ```
//!
//! Versions 1 and 2 (`CL.THROTTLE` records in one list per parameter set, preceded by their
//! count u32 and each by its three parameters; version 1 without the rules part) are still
//! read: their lists are restored into the one store.
//!
//! **Time.** Each process's default clock counts from its own origin (the TSC clock), so a
//! time stored raw means nothing to the next process. A `CL.THROTTLE` record is one TAT,
//! written as wall-clock nanoseconds (`wall now + (TAT − clock now)`) and converted back on
//! restore. The rules engine's records hold times in every algorithm's own layout (window
//! indexes, logs, rings), so instead of converting each one the engine runs on a [`Timeline`]
//! clock: the default clock shifted so that it continues the timeline of the process that
//! wrote the snapshot, by the pair (wall-clock ns, rules clock ns) written beside the records
//! (`rules clock ns at write` and the payload's wall-clock time). A record's times then
//! convert to wall-clock time as `wall at write + (t − rules clock at write)`, and read the same
//! in the new process. Records already idle (nothing left that a fresh record would not
//! have) are dropped when written and when restored. Key ids are hashes under the seed, which
//! the restored stores and the engine reuse.
//!
//! **Rule identity.** A rule store's records are restored only into the store whose
//! description is identical (`Engine::for_each_store`: rule name, override key, pool, key
//! class, compiled limits, capacity). A rule changed between the snapshot and the restart in
//! any of these starts empty (its records are counted as not restored and logged): a rule
//! never gets the state of another rule or of other limits. (A reload in a running server
//! carries state over limit changes whose records read alike; a restart does not.)

mod file;
mod format;

pub use file::{remove_stale, target, writable};
pub use format::{decode, encode};

use crate::throttle::Throttles;
use std::collections::HashMap;
use std::io::Write;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};
use turnstile::rules::Engine;
use turnstile::{Clock, DefaultClock};

/// Why a snapshot file was refused.
#[derive(Debug)]
pub struct SnapshotError {
    /// The file.
    pub path: String,
    /// What is wrong.
    pub message: String,
}

impl std::fmt::Display for SnapshotError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "snapshot {}: {}", self.path, self.message)
    }
}

impl std::error::Error for SnapshotError {}

/// A snapshot read and checked, not yet restored.
#[derive(Debug, PartialEq, Eq)]
pub struct Snapshot {
    /// The hash seed of the stores that wrote it.
    pub seed: u64,
    /// When it was written (wall-clock ns).
    pub written_ns: u64,
    /// The `CL.THROTTLE` records: `(key id, TAT wall-clock ns)`.
    pub throttle: Vec<(u64, u64)>,
    /// The rules engine's clock when written (0 without rules).
    pub rules_now: u64,
    /// The rules engine's stores.
    pub rules: Vec<RuleStore>,
}

/// One rules engine store in a snapshot.
#[derive(Debug, PartialEq, Eq)]
pub struct RuleStore {
    /// What its records mean (`Engine::for_each_store`).
    pub describe: String,
    /// State words per record.
    pub words: u32,
    /// Per record: the key id, then `words` state words.
    pub data: Vec<u64>,
}

impl RuleStore {
    /// Its records: `(key id, state words)`.
    pub fn records(&self) -> impl Iterator<Item = (u64, &[u64])> {
        self.data
            .chunks_exact(1 + self.words as usize)
            .map(|r| (r[0], &r[1..]))
    }
}

/// The rules engine's clock: the default clock shifted by a fixed offset so that it continues
/// the timeline of the process that wrote the snapshot (module docs). One add per reading.
#[derive(Clone, Copy, Debug)]
pub struct Timeline {
    base: DefaultClock,
    offset: u64,
}

impl Timeline {
    /// The timeline `s` was written on, continued (`now` = its rules clock at write plus the
    /// wall-clock time since); a new one from 0 without a snapshot. If the wall clock went
    /// back since the write, the timeline continues from the write.
    pub fn continuing(s: Option<&Snapshot>) -> Self {
        let base = DefaultClock::new();
        let offset = s.map_or(0, |s| {
            let elapsed = wall_ns().saturating_sub(s.written_ns);
            s.rules_now
                .saturating_add(elapsed)
                .saturating_sub(base.now())
        });
        Self { base, offset }
    }
}

impl Clock for Timeline {
    #[inline]
    fn now(&self) -> turnstile::clock::Nanos {
        self.base.now().wrapping_add(self.offset)
    }
}

/// The engine `turnstile serve` runs rules with.
pub type RulesEngine = Engine<Timeline>;

fn wall_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos().min(u64::MAX as u128) as u64)
}

/// The stores' records: `CL.THROTTLE` times in wall-clock ns, the rules engine's on its
/// timeline.
pub fn collect(t: &Throttles, engine: Option<&RulesEngine>) -> Snapshot {
    let wall = wall_ns();
    let store = t.store();
    let now = store.clock().now();
    let mut throttle = Vec::new();
    store.export_packed(|id, tat| {
        // Only records not yet idle carry information.
        if tat > now {
            throttle.push((id, wall.saturating_add(tat - now)));
        }
    });
    let mut rules = Vec::new();
    let rules_now = engine.map_or(0, |e| e.clock().now());
    if let Some(e) = engine {
        e.for_each_store(|describe, store| {
            let words = store.record_words();
            let limits = store.limits();
            let mut cells = vec![0u64; words];
            let mut data = Vec::new();
            store.export_records(|id, w| {
                cells.copy_from_slice(w);
                // Only records not yet idle carry information.
                if limits.idle_in(&mut cells[..], rules_now) > 0 {
                    data.push(id);
                    data.extend_from_slice(w);
                }
            });
            rules.push(RuleStore {
                describe: describe.to_string(),
                words: words as u32,
                data,
            });
        });
    }
    Snapshot {
        seed: t.seed(),
        written_ns: wall,
        throttle,
        rules_now,
        rules,
    }
}

/// Writes `s` to `path` (a link there followed as [`target`] says): a new temporary file
/// beside it, fsynced, renamed over it, the directory fsynced (`snapshot/file.rs`). On an error
/// the old snapshot is as it was.
pub fn write(path: &Path, s: &Snapshot) -> std::io::Result<()> {
    let bytes = encode(s);
    file::write_with(path, |f| f.write_all(&bytes))
}

/// The snapshot to restore at start, if `--snapshot` names one: the file must be writable (or
/// the start is refused with what to give instead). A file that exists but cannot be restored
/// refuses the start with `--snapshot-required`; otherwise it is moved aside to
/// `FILE.corrupt-SECONDS` (never overwritten by the next snapshot: it is the evidence, and
/// maybe still recoverable), the log says where, and the server starts empty.
pub(crate) fn on_start(
    path: Option<&Path>,
    required: bool,
) -> Result<Option<Snapshot>, crate::ServeError> {
    let Some(p) = path else {
        return Ok(None);
    };
    writable(p).map_err(|e| {
        crate::ServeError::Other(format!(
            "--snapshot {}: cannot write there ({e}): give a file in a directory that exists and this user may write",
            p.display()
        ))
    })?;
    match remove_stale(p) {
        Ok(gone) => {
            for f in gone {
                tracing::warn!(file = %f.display(), "removed the temporary file of an unfinished snapshot");
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "could not look for the temporary files of unfinished snapshots")
        }
    }
    match read(p) {
        Ok(s) => Ok(s),
        Err(e) if required => Err(crate::ServeError::Snapshot(e)),
        Err(e) => {
            // A link at the path stays, as the next snapshot keeps it: its target is moved.
            let aside = target(p)
                .map_err(|e| e.to_string())
                .and_then(|t| quarantine(&t));
            match &aside {
                Ok(to) => {
                    tracing::error!(error = %e, moved_to = %to.display(), "snapshot refused and moved aside; starting empty")
                }
                Err(m) => {
                    tracing::error!(error = %e, move_error = %m, "snapshot refused and could not be moved aside; starting empty, and no snapshot will be written over it")
                }
            }
            aside.map(|_| None).map_err(|m| {
                crate::ServeError::Other(format!(
                    "{e}; it could not be moved aside ({m}), and the next snapshot would overwrite it: move it away, or start with --snapshot-required to keep it and stop"
                ))
            })
        }
    }
}

/// Moves a refused snapshot to `FILE.corrupt-SECONDS` (a free name: `-2`, `-3`, … if taken).
fn quarantine(p: &Path) -> Result<std::path::PathBuf, String> {
    let secs = wall_ns() / 1_000_000_000;
    for n in 1..1000u32 {
        let mut name = p.as_os_str().to_owned();
        name.push(format!(".corrupt-{secs}"));
        if n > 1 {
            name.push(format!("-{n}"));
        }
        let to = std::path::PathBuf::from(name);
        // Anything there, a link (even a dangling one) too, is kept.
        if std::fs::symlink_metadata(&to).is_ok() {
            continue;
        }
        return std::fs::rename(p, &to)
            .map(|()| to)
            .map_err(|e| e.to_string());
    }
    Err("no free name".into())
}

/// Reads `path`: `Ok(None)` if there is no file, the checked snapshot, or why it is refused.
pub fn read(path: &Path) -> Result<Option<Snapshot>, SnapshotError> {
    let err = |message: String| SnapshotError {
        path: path.display().to_string(),
        message,
    };
    match std::fs::read(path) {
        Ok(b) => decode(&b).map(Some).map_err(err),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(err(format!("cannot read: {e}"))),
    }
}

/// What a restore did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Restored {
    /// `CL.THROTTLE` records restored.
    pub throttle: u64,
    /// Rules engine records restored.
    pub rules: u64,
    /// Records dropped because they were idle by now.
    pub idle: u64,
    /// Rules engine records of stores no loaded rule has (a rule changed or removed since).
    pub unmatched: u64,
}

/// Restores a checked snapshot into `t` (built with the snapshot's seed) and `engine` (built
/// with the seed, on [`Timeline::continuing`] the snapshot). Idle records are dropped.
pub fn restore(t: &Throttles, engine: Option<&RulesEngine>, s: Snapshot) -> Restored {
    let mut out = Restored::default();
    restore_rules(engine, &s.rules, &mut out);
    let wall = wall_ns();
    let store = t.store();
    let now = store.clock().now();
    for (id, tat_wall) in s.throttle {
        if tat_wall <= wall {
            out.idle += 1;
            continue;
        }
        let tat = now.saturating_add(tat_wall - wall);
        // A key of several parameter sets (a file of version 1 or 2) keeps its first record.
        if tat >> 63 == 0 && store.import_packed(id, tat, now) {
            out.throttle += 1;
        }
    }
    out
}

fn restore_rules(engine: Option<&RulesEngine>, rules: &[RuleStore], out: &mut Restored) {
    let mut by: HashMap<&str, &RuleStore> = rules.iter().map(|r| (&*r.describe, r)).collect();
    if let Some(e) = engine {
        let now = e.clock().now();
        e.for_each_store(|describe, store| {
            let Some(r) = by.remove(describe) else {
                return;
            };
            // The same description means the same limits, so the same record size; checked
            // all the same.
            if r.words as usize != store.record_words() {
                out.unmatched += (r.data.len() / (1 + r.words as usize)) as u64;
                return;
            }
            let limits = store.limits();
            let mut cells = vec![0u64; r.words as usize];
            for (id, w) in r.records() {
                cells.copy_from_slice(w);
                if limits.idle_in(&mut cells[..], now) == 0 {
                    out.idle += 1;
                } else if store.import_record(id, w, now) {
                    out.rules += 1;
                }
            }
        });
    }
    for r in by.into_values() {
        let n = (r.data.len() / (1 + r.words as usize)) as u64;
        if n > 0 {
            out.unmatched += n;
            tracing::warn!(store = %r.describe, records = n, "snapshot records of a rule that changed or is gone since: not restored");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restore_keeps_counts_and_drops_idle() {
        let a = Throttles::new(1000, 42).unwrap();
        let limit = crate::throttle::limit_of((9, 1, 60)).unwrap();
        let check = |t: &Throttles, key: &str| t.store().check_with(key, &limit, 1).unwrap();
        for _ in 0..4 {
            check(&a, "busy");
        }
        check(&a, "once");
        let snap = collect(&a, None);
        assert_eq!(snap.throttle.len(), 2);
        let b = Throttles::new(1000, snap.seed).unwrap();
        assert_eq!(
            restore(&b, None, decode(&encode(&snap)).unwrap()).throttle,
            2
        );
        // 4 of 10 taken: 5 left after this one.
        assert_eq!(check(&b, "busy").remaining, 5);
        assert_eq!(check(&b, "once").remaining, 8);
        assert_eq!(check(&b, "new").remaining, 9);
        // A snapshot whose records are all in the past restores nothing.
        let mut old = collect(&a, None);
        for x in old.throttle.iter_mut() {
            x.1 = 1;
        }
        let c = Throttles::new(1000, old.seed).unwrap();
        let r = restore(&c, None, old);
        assert_eq!((r.throttle, r.idle), (0, 2));
    }
}
