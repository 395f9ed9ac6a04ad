//! The response body: the inner service's, or the layer's own answer, holding the request's
//! in-flight permit until the body has been sent to its end, has failed, or is dropped (a
//! client that disconnects mid-stream drops it).

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use std::pin::Pin;
use std::task::{Context, Poll};
use turnstile::rules::OwnedInFlight;

pin_project! {
    /// The body of every response that passed the layer; `P` is the permit it holds (the
    /// limit's [`Permit`](crate::Limit::Permit): `()` over a store).
    pub struct RateLimitBody<B, P = OwnedInFlight> {
        #[pin]
        inner: Inner<B>,
        permit: Option<P>,
    }
}

pin_project! {
    #[project = InnerProj]
    enum Inner<B> {
        Body { #[pin] body: B },
        Full { data: Option<Bytes> },
    }
}

impl<B, P> RateLimitBody<B, P> {
    pub(crate) fn new(body: B, permit: Option<P>) -> Self {
        Self {
            inner: Inner::Body { body },
            permit,
        }
    }
    pub(crate) fn full(data: Bytes) -> Self {
        Self {
            inner: Inner::Full {
                data: (!data.is_empty()).then_some(data),
            },
            permit: None,
        }
    }
    /// Whether the body still holds an in-flight permit.
    pub fn holds_permit(&self) -> bool {
        self.permit.is_some()
    }
}

impl<B, P> Body for RateLimitBody<B, P>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.project();
        let r = match this.inner.project() {
            InnerProj::Body { body } => body.poll_frame(cx),
            InnerProj::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
        };
        if matches!(r, Poll::Ready(None) | Poll::Ready(Some(Err(_)))) {
            // The body ended (or failed): the request is no longer in flight.
            *this.permit = None;
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Inner::Body { body } => body.is_end_stream(),
            Inner::Full { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Inner::Body { body } => body.size_hint(),
            Inner::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}
