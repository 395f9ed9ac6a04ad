//! The server-wide budget of request bodies (`--body-memory`): what every connection's
//! [`Metered`](super::body::Metered) bodies hold at once, and the refusal past it.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Bytes held by many, against one bound.
pub(crate) struct Budget {
    used: AtomicUsize,
    max: usize,
}

impl Budget {
    pub(crate) fn new(max: usize) -> Self {
        Self {
            used: AtomicUsize::new(0),
            max,
        }
    }

    /// Takes `n` bytes, if there are.
    pub(crate) fn reserve(&self, n: usize) -> bool {
        // Relaxed: a count of bytes; no other memory is published through it.
        let before = self.used.fetch_add(n, Ordering::Relaxed);
        if before + n <= self.max {
            return true;
        }
        self.used.fetch_sub(n, Ordering::Relaxed);
        false
    }

    /// Gives back `n` bytes.
    pub(crate) fn release(&self, n: usize) {
        if n > 0 {
            // Relaxed: see `reserve`.
            self.used.fetch_sub(n, Ordering::Relaxed);
        }
    }

    /// Bytes taken now.
    pub(crate) fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// The bound.
    pub(crate) fn max(&self) -> usize {
        self.max
    }
}

/// The server-wide budget of request bodies, and its refusals.
pub(crate) struct Bodies {
    pub(crate) budget: Budget,
    refused: std::sync::atomic::AtomicU64,
}

impl Bodies {
    pub(crate) fn new(max: usize) -> Self {
        Self {
            budget: Budget::new(max),
            refused: Default::default(),
        }
    }

    /// Counts a body refused for the budget.
    pub(crate) fn refuse(&self) {
        // Relaxed: a counter.
        self.refused.fetch_add(1, Ordering::Relaxed);
    }

    /// Bodies refused for the budget.
    pub(crate) fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }
}

/// A body refused because the server holds `--body-memory` of bodies already.
#[derive(Debug)]
pub(crate) struct BodyBudget;

impl std::fmt::Display for BodyBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the server holds as many request bodies as it may (--body-memory): retry")
    }
}

impl std::error::Error for BodyBudget {}

/// Whether `e` (or what caused it) is a [`BodyBudget`] refusal.
pub(crate) fn is_budget(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(e) = cur {
        if e.is::<BodyBudget>() {
            return true;
        }
        cur = e.source();
    }
    false
}
