//! Loom models of turnstile's concurrent protocols. The library is empty; the models are the
//! integration tests in `tests/`, compiled only with `--cfg loom` (without it they are empty,
//! so `cargo test --workspace` stays fast):
//!
//! ```text
//! RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=3 \
//!     cargo test --release -p loom-tests --target-dir target/loom
//! ```
//!
//! The separate target directory keeps the loom build (every dependency rebuilt with the cfg)
//! from invalidating the normal one. `LOOM_MAX_PREEMPTIONS` must be set: unbounded runs take
//! minutes per model instead of seconds.
//!
//! * `tests/limiter.rs` — the keyless `Limiter`: the CAS loop of each packed algorithm, two
//!   limits on the 16-byte CAS (all-or-nothing), the sequence-word records, concurrency
//!   permits and lease expiry.
//! * `tests/notes_race.rs` — the notes' race (limit 3, count 2, two requests at once) on the
//!   limiter and the keyed store, and the naive read-then-write limiter that loom must catch.
//! * `tests/rules.rs` — the rules engine: a hot reload racing admissions, and the load
//!   counters kept across it.
//! * `tests/store.rs` — the keyed `Store`: insertion through the bucket header with helping,
//!   reclaim and eviction, the full-store policies, arena records and their free list; every
//!   model checks that no key is ever live twice.
//!
//! Under `cfg(loom)` the table is shrunk (`BUCKET` = 2 slots, `RANGE` = 1 bucket, see
//! `src/keyed/table.rs`) so that a probe is 4 slot accesses rather than 64; the protocol is the
//! same.
