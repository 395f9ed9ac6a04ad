//! [`Backoff`]: what a listener does when an accept fails (out of descriptors, `EMFILE` or
//! `ENFILE`, and the like): wait before the next — 10 ms, doubling to 1 s while they keep
//! failing — and say so at most once every [`LOG_EVERY`], with the count since the last line,
//! and in `turnstile_accept_errors_total`. Never a spin, never a log line per attempt. Used by
//! the tokio accept loops and the io_uring worker alike.

use super::guard::Guard;
use super::Kind;
use std::time::{Duration, Instant};

/// The first wait after a failed accept.
pub(crate) const FIRST: Duration = Duration::from_millis(10);
/// The longest.
pub(crate) const LONGEST: Duration = Duration::from_secs(1);
/// At most one log line this often per listener.
pub(crate) const LOG_EVERY: Duration = Duration::from_secs(10);

/// One listener's accept failures.
pub(crate) struct Backoff {
    kind: Kind,
    next: Duration,
    /// Failures not yet logged, and when the last line was.
    unlogged: u64,
    logged_at: Option<Instant>,
}

impl Backoff {
    pub(crate) fn new(kind: Kind) -> Self {
        Self {
            kind,
            next: FIRST,
            unlogged: 0,
            logged_at: None,
        }
    }

    /// An accept failed with `e` at `now`: how long to wait before the next one.
    pub(crate) fn failed(&mut self, e: &std::io::Error, now: Instant, guard: &Guard) -> Duration {
        guard.accept_error(self.kind);
        self.unlogged += 1;
        if self
            .logged_at
            .is_none_or(|at| now.duration_since(at) >= LOG_EVERY)
        {
            tracing::warn!(
                listener = self.kind.name(),
                error = %e,
                failures = self.unlogged,
                "accept failed; waiting before the next (at most one such line every 10 s)"
            );
            self.unlogged = 0;
            self.logged_at = Some(now);
        }
        let wait = self.next;
        self.next = (self.next * 2).min(LONGEST);
        wait
    }

    /// An accept succeeded: the next failure waits [`FIRST`] again.
    pub(crate) fn ok(&mut self) {
        self.next = FIRST;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::listen::guard::tests::limits;

    #[test]
    fn waits_double_to_a_second_and_lines_are_rare() {
        let g = Guard::new(limits(1), false, 1000);
        let mut b = Backoff::new(Kind::Resp);
        let e = std::io::Error::from_raw_os_error(libc::EMFILE);
        let t0 = Instant::now();
        let waits: Vec<u64> = (0..9)
            .map(|i| b.failed(&e, t0 + Duration::from_millis(i), &g).as_millis() as u64)
            .collect();
        assert_eq!(waits, [10, 20, 40, 80, 160, 320, 640, 1000, 1000]);
        // The first failure was logged; the next eight wait for the next line.
        assert_eq!(b.unlogged, 8);
        b.failed(&e, t0 + LOG_EVERY, &g);
        assert_eq!(b.unlogged, 0);
        b.ok();
        assert_eq!(b.failed(&e, t0 + LOG_EVERY, &g), FIRST);
        let mut m = String::new();
        g.render(&mut m);
        assert!(
            m.contains("turnstile_accept_errors_total{listener=\"resp\"} 11"),
            "{m}"
        );
    }
}
