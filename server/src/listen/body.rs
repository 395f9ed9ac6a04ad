//! Request bodies: [`Metered`] wraps every HTTP and gRPC request body, tells its connection's
//! [`Conn`] how it progresses (the body deadline and rate), and holds what it has received
//! against the server-wide [`Budget`] (`--body-memory`) until it is dropped; past the budget
//! the body fails with [`BodyBudget`] and the request is answered 503. Per request a body
//! stays within `--max-body` (the handlers' limits), per connection within `--max-streams`
//! of them.

use super::conn::Conn;
use bytes::Buf;
use http_body::{Body, Frame, SizeHint};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

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

pin_project_lite::pin_project! {
    /// A request body, metered: see the module doc.
    pub(crate) struct Metered<B> {
        #[pin]
        inner: B,
        conn: Arc<Conn>,
        // Bytes held against the budget.
        held: usize,
        // Counted in `conn` as a body in progress.
        counting: bool,
    }

    impl<B> PinnedDrop for Metered<B> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if std::mem::take(this.counting) {
                this.conn.body_ends();
            }
            this.conn.budget.budget.release(*this.held);
        }
    }
}

impl<B: Body> Metered<B> {
    /// `inner`, metered on `conn`'s behalf.
    pub(crate) fn new(inner: B, conn: Arc<Conn>) -> Self {
        let counting = !inner.is_end_stream();
        if counting {
            conn.body_begins();
        }
        Self {
            inner,
            conn,
            held: 0,
            counting,
        }
    }
}

impl<B> Body for Metered<B>
where
    B: Body,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Data = B::Data;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let mut this = self.project();
        let end = |counting: &mut bool, conn: &Conn| {
            if std::mem::take(counting) {
                conn.body_ends();
            }
        };
        match this.inner.as_mut().poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(d) = frame.data_ref() {
                    let n = d.remaining();
                    this.conn.body_bytes(n);
                    if !this.conn.budget.budget.reserve(n) {
                        // Relaxed: a count.
                        this.conn.budget.refused.fetch_add(1, Ordering::Relaxed);
                        end(this.counting, this.conn);
                        return Poll::Ready(Some(Err(Box::new(BodyBudget))));
                    }
                    *this.held += n;
                }
                if this.inner.is_end_stream() {
                    end(this.counting, this.conn);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                end(this.counting, this.conn);
                Poll::Ready(Some(Err(e.into())))
            }
            Poll::Ready(None) => {
                end(this.counting, this.conn);
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::listen::guard::tests::limits;
    use crate::listen::{Guard, Kind};
    use http_body_util::{BodyExt, Full};

    #[test]
    fn a_body_is_held_against_the_budget_and_counted_on_its_connection() {
        let g = Guard::new(limits(10), false, 1000); // a budget of 1 MiB
        let t = g.admit(Kind::Http).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let body = Metered::new(
            Full::new(bytes::Bytes::from(vec![7u8; 1000])),
            t.conn().clone(),
        );
        assert_eq!(t.conn().seen(0).bodies, 1);
        let mut body = Box::pin(body);
        // (Box::pin: `frame` needs Unpin.)
        let got = rt.block_on(body.frame()).unwrap().unwrap();
        assert_eq!(got.data_ref().map(|d| d.len()), Some(1000));
        assert_eq!(g.bodies.budget.used(), 1000);
        let s = t.conn().seen(0);
        assert_eq!(
            (s.bodies, s.body_bytes),
            (0, 1000),
            "ended with its last frame"
        );
        drop(body);
        assert_eq!(g.bodies.budget.used(), 0);

        // Past the budget: refused, counted, nothing held.
        let big = Metered::new(
            Full::new(bytes::Bytes::from(vec![0u8; (1 << 20) + 1])),
            t.conn().clone(),
        );
        let err = rt.block_on(big.collect()).unwrap_err();
        assert!(is_budget(&*err), "{err}");
        assert_eq!((g.bodies.budget.used(), t.conn().seen(0).bodies), (0, 0));
        assert_eq!(g.bodies.refused(), 1);
    }
}
