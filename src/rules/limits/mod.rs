//! Each key's own limit: the notes' configuration store ("`user:241531`: 5 per 1 s"), for
//! millions of customers on a few plans and thousands of contracts of their own.
//!
//! A *limits class* (`[limits.NAME]` in a rules file) says which keys have limits of their own
//! (its key class: customer ids, API keys, ...), by which algorithm, and names its plans. Each
//! key of the class may have an entry: a plan (`pro`) or a limit of its own (`5000/1h`). A rule
//! takes them with `limits_from = "NAME"`; for a key it checks, the precedence is
//!
//! 1. the key's own entry in the class,
//! 2. the rule's override for the key,
//! 3. the rule's limits.
//!
//! The entries live in a [`LimitsSource`]. The built-in one, [`MemoryLimits`], keeps them in
//! this process in a compact map (about 20 bytes per key, `map`) that checks read without a
//! lock while [`LimitsSource::set`] changes it; loaded from a file (CSV or JSON Lines,
//! `file`) it is re-read when the file changes and on every reload, and a file with a bad
//! line is refused with `file:line` while the entries already loaded stay. A source in front
//! of a remote store (Redis, for a fleet) implements the same trait as a cache: its
//! [`LimitsSource::get`] never waits, answers [`Lookup::Unknown`] for a key it has not cached
//! yet (the rule's defaults then apply to that request) and fetches it in the background.
//!
//! A key's entry is decided over the rule's own store, given with each check
//! ([`Store::check_with_at`](crate::keyed::Store::check_with_at)): the record keeps the key's
//! state whichever limit decides it, and a change of plan carries it over by the algorithm's
//! rule (docs/algorithms.md). So the class's limits all have the rule's algorithm (and, for a
//! window algorithm, its window), and the rule has one limit of it.

mod entry;
mod file;
mod map;
mod memory;

pub use entry::{KeyLimit, LimitsClass, DEFAULT_LIMITS_CAPACITY};
pub(crate) use file::key_id;
pub use file::{FileFormat, LoadReport};
pub use memory::MemoryLimits;

use crate::algo::Limit;
use std::fmt;

/// What a source knows of a key's own limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// The key's own limit (its plan's, or its own).
    Own(Limit),
    /// The key has no entry: the rule's override or limits apply.
    Default,
    /// Not known yet (a cache that has not fetched the key): the rule's override or limits
    /// apply to this request, and the source fetches the entry for the next ones.
    Unknown,
}

/// Where each key's own limit comes from, for the rules engine. See the module docs.
///
/// `get` is on the check path: it must not block, allocate or take a lock. The management
/// methods (`entry`, `set`, `remove`, `export`) are not; a source backed by a remote store
/// may apply `set` and `remove` there and in its cache.
pub trait LimitsSource: Send + Sync {
    /// The key's own limit, by key id (the rule's id of the key: `Engine::key_id`).
    fn get(&self, id: u64) -> Lookup;
    /// A hint that `id` is about to be looked up: fetch its line (default: nothing).
    fn prefetch(&self, _id: u64) {}
    /// [`LimitsSource::get`] on the check path: starts the fetch of `id`'s line, calls `fetch`
    /// (which starts the fetch of the key's record in the store), then looks `id` up, so
    /// that both misses to memory are in flight together. Default: `prefetch`, `fetch`,
    /// `get`; a source that reads a snapshot once per lookup takes it once here.
    #[inline]
    fn get_fetching(&self, id: u64, fetch: &dyn Fn()) -> Lookup {
        self.prefetch(id);
        fetch();
        self.get(id)
    }
    /// The key's entry as it was given (a plan's name, or its limit).
    fn entry(&self, id: u64) -> Option<KeyLimit>;
    /// Sets the key's entry, checked against the class (its algorithm, window and plans).
    fn set(&self, id: u64, limit: &KeyLimit) -> Result<(), LimitsError>;
    /// Removes the key's entry; whether it had one.
    fn remove(&self, id: u64) -> Result<bool, LimitsError>;
    /// Keys with an entry.
    fn len(&self) -> u64;
    /// Whether no key has an entry.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Bytes the source keeps in this process.
    fn bytes(&self) -> usize;
    /// Visits every entry (a scan, not linearizable).
    fn export(&self, f: &mut dyn FnMut(u64, &KeyLimit));
    /// The class changed on a reload of the rules (its plans redefined, say): entries naming a
    /// plan decide by its new definition from now on. Called before any check uses them.
    fn reclass(&self, class: &LimitsClass) -> Result<(), LimitsError>;
    /// Re-reads what the entries come from, if it changed (a file); `Ok(None)` if nothing was
    /// read. On an error the entries stay as they were.
    fn refresh(&self) -> Result<Option<LoadReport>, LimitsError> {
        Ok(None)
    }
}

/// Why an entry, a file or a class was refused: what, where (a file's line), how to fix it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LimitsError {
    /// The file, if the error is in one.
    pub origin: Option<String>,
    /// 1-based line in the file, 0 if none.
    pub line: usize,
    /// What is wrong and how to fix it.
    pub message: String,
    /// The setting at fault, if the error is about one: a class's `algorithm`, `window`,
    /// `capacity` or `key`, or a limit's field (`limit`, `burst`, ...). Where a rules file's
    /// error points.
    pub setting: Option<&'static str>,
}

impl LimitsError {
    /// An error with no place; `message` says what is wrong and how to fix it (for sources
    /// outside this crate, e.g. Redis's).
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            origin: None,
            line: 0,
            message: message.into(),
            setting: None,
        }
    }

    /// The error about `setting`.
    pub(crate) fn of(setting: &'static str, message: impl Into<String>) -> Self {
        Self {
            setting: Some(setting),
            ..Self::new(message)
        }
    }
}

impl fmt::Display for LimitsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.origin, self.line) {
            (Some(o), 0) => write!(f, "{o}: {}", self.message),
            (Some(o), l) => write!(f, "{o}:{l}: {}", self.message),
            (None, _) => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for LimitsError {}

impl From<crate::ConfigError> for LimitsError {
    fn from(e: crate::ConfigError) -> Self {
        LimitsError::of(e.field, e.to_string())
    }
}

impl From<super::DurationError> for LimitsError {
    fn from(e: super::DurationError) -> Self {
        LimitsError::new(e.to_string())
    }
}
