//! What the rules engine's test files share: an engine over a rules text on a manual clock,
//! and a count of the admissions among some checks.

// Each test file uses the part it needs.
#![allow(dead_code)]

use std::sync::Arc;
use turnstile::rules::{Engine, Request, Rules};
use turnstile::ManualClock;

/// One second in nanoseconds.
pub const S: u64 = 1_000_000_000;
/// One millisecond in nanoseconds.
pub const MS: u64 = 1_000_000;

/// An engine on a manual clock.
pub type E = Engine<Arc<ManualClock>>;

/// The engine of `text` (panics with the error's text if refused), seed 7, on a manual clock
/// at 1000 s, and that clock.
pub fn engine(text: &str) -> (E, Arc<ManualClock>) {
    let rules = Rules::parse(text, "test.toml").unwrap_or_else(|e| panic!("{e}"));
    let clock = Arc::new(ManualClock::new(1000 * S));
    let e = Engine::builder(rules)
        .seed(7)
        .build_with_clock(clock.clone())
        .unwrap_or_else(|e| panic!("{e}"));
    (e, clock)
}

/// How many of `n` checks of `r` are admitted.
pub fn admitted(e: &E, r: &Request<'_>, n: usize) -> usize {
    (0..n).filter(|_| e.check(r).allowed()).count()
}
