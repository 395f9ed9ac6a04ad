//! The server-wide budget of request bodies (`--body-memory`): what every connection's
//! [`Metered`](super::body::Metered) bodies hold at once, how it is shared, and the refusal
//! past it.
//!
//! Half of the budget is set aside in equal parts for every connection the HTTP, admin and
//! gRPC listeners may hold at once (`--max-*-connections`): a connection's *own* allowance
//! (at most `--max-body`), which no other connection can take. What a connection holds past
//! its own allowance it draws on the other half, the *shared* [`Budget`], and it may hold at
//! most its *share* in all (a sixteenth of the shared half, at least `--max-body`). So a
//! client whose bodies fit in its own allowance (a check's body is a few dozen bytes) gets
//! them in however many connections hold the rest. Before authentication a connection may
//! hold a small fixed allowance ([`PRE_AUTH_BODY`](super::PRE_AUTH_BODY)), never the budget.

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

/// The server-wide budget of request bodies, how it is shared, and its refusals: see the
/// module doc.
pub(crate) struct Bodies {
    /// What connections hold past their own allowance, every connection's together.
    pub(crate) budget: Budget,
    /// What one connection may hold without drawing on `budget`.
    pub(crate) own: usize,
    /// The most one connection may hold (authenticated), its own allowance included.
    pub(crate) share: usize,
    refused: std::sync::atomic::AtomicU64,
}

impl Bodies {
    /// `memory` (`--body-memory`, at least `max_body`) shared by at most `connections`
    /// connections at once, whose bodies are at most `max_body` each.
    pub(crate) fn new(memory: usize, max_body: usize, connections: usize) -> Self {
        let own = (memory / 2 / connections.max(1)).min(max_body);
        let shared = memory - own * connections.max(1);
        Self {
            budget: Budget::new(shared),
            own,
            share: (shared / 16).max(max_body),
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
