//! The keyed store: millions of keys' limits in thread-per-core shards of 16-byte records,
//! lock-free, inside a fixed memory budget.
//!
//! * A key (customer id, IP address, API key, ...) becomes a 64-bit id ([`key`]).
//! * The id's keyed mix picks a shard (its top bits) and a home bucket in it. Shards are a
//!   power of two ≥ the available cores, each its own allocation that the thread pinned to
//!   its core can first-touch ([`Store::prefault_shard`]).
//! * One packed limit (fixed_window, sliding_window, token_bucket, leaky_bucket) lives
//!   entirely in its slot: 8 bytes of key, 8 of state, one 16-byte CAS per check, nothing
//!   else touched. Other limits (sliding_log, window_ring, concurrency, several limits per
//!   key) keep a record in the shard's arena, referenced from the slot (`src/keyed/arena.rs`).
//! * Memory is allocated once, when the store is built, from the budget or key capacity, and
//!   never grows. Idle records are reclaimed in place by probes that need room; when a probe
//!   range is full of live keys the [`FullPolicy`] decides, and every outcome is counted.
//!
//! The table's protocol and why it is correct are in the docs of `src/keyed/table.rs`.
//!
//! | module | what |
//! |---|---|
//! | `store` | [`Store`]: checks, peeks, refunds of one key, statistics |
//! | `builder` | [`Store::builder`], [`StoreBuilder`] and the sizing of a store (`Geometry`) |
//! | `policy` | [`FullPolicy`]: a new key when its probe range is full |
//! | `batch` | [`Store::check_batch`], [`Store::check_batch_verdicts`] |
//! | `snapshot` | [`Store::export_records`], [`Store::import_record`] |
//! | `per_check` | [`Store::check_with`]: limits given with each check, one record per key |
//! | `permit` | [`Store::acquire_owned`], [`StorePermit`] |
//! | `ops` | each operation on a record, as the table runs it |
//! | `records` | [`Records`]: the same table for records of the caller's own kind |
//! | `table`, `arena`, `alloc` | the lock-free table, the arena of larger records, their memory |

pub(crate) mod alloc;
pub(crate) mod arena;
mod batch;
mod builder;
mod inspect;
pub mod key;
mod ops;
mod per_check;
mod permit;
mod policy;
mod records;
mod snapshot;
mod store;
pub(crate) mod table;

pub use builder::{max_keys_per_shard, StoreBuilder, LOAD_FACTOR, PLACE_BITS};
pub use key::{parse_key, Key, KeyError, KeyHasher, ParsedKey};
pub use per_check::LimitMismatch;
pub use permit::StorePermit;
pub use policy::FullPolicy;
pub use records::{RecordOp, Records};
pub use store::{Store, StoreStats};
pub use table::RecordKind;
