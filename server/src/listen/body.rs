//! Request bodies: [`Metered`] wraps every HTTP and gRPC request body, tells its connection's
//! [`Conn`] how it progresses (the body deadline and rate), and holds what it has received
//! on its connection's behalf ([`Conn::hold`]: its own allowance, then its share of the
//! server-wide [`Budget`](super::budget::Budget), `--body-memory`) until it is dropped; past
//! them the body fails with [`BodyBudget`] and the request is answered 503. Per request a body
//! stays within `--max-body` (the handlers' limits), per connection within `--max-streams`
//! of them and its share.

use super::budget::BodyBudget;
use super::conn::Conn;
use bytes::Buf;
use http_body::{Body, Frame, SizeHint};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

pin_project_lite::pin_project! {
    /// A request body, metered: see the module doc.
    pub(crate) struct Metered<B> {
        #[pin]
        inner: B,
        conn: Arc<Conn>,
        // Bytes held on the connection's behalf.
        held: usize,
        // Of which drawn on the shared budget.
        drawn: usize,
        // Counted in `conn` as a body in progress.
        counting: bool,
    }

    impl<B> PinnedDrop for Metered<B> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if std::mem::take(this.counting) {
                this.conn.body_ends();
            }
            this.conn.unhold(*this.held, *this.drawn);
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
            drawn: 0,
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
                    let Some(drawn) = this.conn.hold(n) else {
                        end(this.counting, this.conn);
                        return Poll::Ready(Some(Err(Box::new(BodyBudget))));
                    };
                    *this.held += n;
                    *this.drawn += drawn;
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
    use crate::listen::budget::is_budget;
    use crate::listen::guard::tests::limits;
    use crate::listen::{Guard, Kind, PRE_AUTH_BODY};
    use http_body_util::{BodyExt, Full};

    type Held = Pin<Box<Metered<Full<bytes::Bytes>>>>;
    type BoxError = Box<dyn std::error::Error + Send + Sync>;

    /// A body of `n` bytes on `t`'s connection, its one frame received: held until dropped;
    /// or the refusal.
    fn body(
        rt: &tokio::runtime::Runtime,
        t: &crate::listen::Ticket,
        n: usize,
    ) -> Result<Held, BoxError> {
        let mut b = Box::pin(Metered::new(
            Full::new(bytes::Bytes::from(vec![7u8; n])),
            t.conn().clone(),
        ));
        // (Box::pin: `frame` needs Unpin.)
        let got = rt.block_on(b.frame()).unwrap()?;
        assert_eq!(got.data_ref().map(|d| d.len()), Some(n));
        Ok(b)
    }

    #[test]
    fn a_body_is_held_on_its_connections_allowance_then_the_shared_budget() {
        // A budget of 1 MiB for 30 connections: 17 476 bytes each of their own, 524 296
        // shared, of which one connection may hold 64 KiB.
        let g = Guard::new(limits(10), false, 1000);
        let own = (1 << 20) / 2 / 30;
        assert_eq!(
            (g.bodies.own, g.bodies.budget.max(), g.bodies.share),
            (own, (1 << 20) - 30 * own, 64 << 10)
        );
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let t = g.admit(Kind::Http).unwrap();
        let small = body(&rt, &t, 1000).unwrap();
        assert_eq!(g.bodies.budget.used(), 0, "within its own allowance");
        let s = t.conn().seen(0);
        assert_eq!(
            (s.bodies, s.body_bytes),
            (0, 1000),
            "ended with its last frame"
        );
        let big = body(&rt, &t, 60_000).unwrap();
        assert_eq!(
            g.bodies.budget.used(),
            61_000 - own,
            "past it, drawn on the shared"
        );
        // Past the connection's share: refused, counted, nothing more held.
        let err = body(&rt, &t, 5000).err().unwrap();
        assert!(is_budget(&*err), "{err}");
        assert_eq!(t.conn().seen(0).bodies, 0);
        assert_eq!(
            (g.bodies.budget.used(), g.bodies.refused()),
            (61_000 - own, 1)
        );
        drop((small, big));
        assert_eq!(g.bodies.budget.used(), 0);
    }

    #[test]
    fn others_holding_the_shared_budget_leave_a_connection_its_own_allowance() {
        let g = Guard::new(limits(10), false, 1000);
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let share = g.bodies.share;
        let hogs: Vec<_> = (0..10).map(|_| g.admit(Kind::Grpc).unwrap()).collect();
        let held: Vec<_> = hogs.iter().map(|t| body(&rt, t, share).unwrap()).collect();
        let t = g.admit(Kind::Http).unwrap();
        assert!(
            is_budget(&*body(&rt, &t, share).err().unwrap()),
            "the shared half spent"
        );
        let honest = body(&rt, &t, 500).unwrap();
        assert_eq!(g.bodies.budget.used(), 10 * (share - g.bodies.own));
        drop((held, honest));
        assert_eq!(g.bodies.budget.used(), 0);
    }

    #[test]
    fn before_authentication_a_fixed_allowance_and_none_of_the_budget() {
        let g = Guard::new(limits(10), true, 1000);
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let t = g.admit(Kind::Http).unwrap();
        let first = body(&rt, &t, PRE_AUTH_BODY - 1).unwrap();
        assert_eq!(g.bodies.budget.used(), 0);
        assert!(
            is_budget(&*body(&rt, &t, 2).err().unwrap()),
            "past the allowance, whichever body"
        );
        let last = body(&rt, &t, 1).unwrap();
        drop((first, last));
        // Authenticated, the same connection has its own allowance and its share.
        t.conn().authenticated();
        let b = body(&rt, &t, 60_000).unwrap();
        assert_eq!(g.bodies.budget.used(), 60_000 - g.bodies.own);
        drop(b);
        assert_eq!(g.bodies.budget.used(), 0);
    }
}
