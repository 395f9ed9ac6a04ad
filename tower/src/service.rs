//! The middleware: [`RateLimitLayer`] (the configuration, shared), [`RateLimit`] (the
//! service, cheap to clone), [`ResponseFuture`] (a pinned state machine: a check in progress,
//! a ready answer, a shaped wait, or the inner call) and the body that holds the permit
//! ([`RateLimitBody`]).

use crate::answer::{denial_response, grpc_denial, is_grpc, no_key_response};
use crate::answer::{BodyStyle, Denial, HeaderStyle, Policy};
use crate::body::RateLimitBody;
use crate::headers::RateHeaders;
use crate::limit::{bounded_delay, retry_after_secs, Check, Checking, Limit, NoKey};
use crate::observe::{Answer, Event, Observer};
use crate::settle::{by_extension, Reservation, SettleFn};
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::Body;
use pin_project_lite::pin_project;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tower_layer::Layer;
use tower_service::Service;
use turnstile::Decision;

/// The layer's settings, shared by every clone of the layer and its services.
pub struct Config<L> {
    limit: L,
    no_key: NoKey,
    headers: HeaderStyle,
    policy: Policy,
    body: BodyStyle,
    observer: Option<Observer>,
    max_delay: Duration,
    settle: Option<SettleFn>,
}

/// Builds a [`RateLimitLayer`].
pub struct Builder<L> {
    cfg: Config<L>,
}

impl<L: Limit> Builder<L> {
    /// The answer to a request without a key (default: 500).
    pub fn no_key(mut self, n: NoKey) -> Self {
        self.cfg.no_key = n;
        self
    }
    /// The rate-limit headers (default: the IETF draft's).
    pub fn headers(mut self, s: HeaderStyle) -> Self {
        self.cfg.headers = s;
        self
    }
    /// The policy the headers and the problem document name (default `"default"`, no window).
    pub fn policy(mut self, p: Policy) -> Self {
        self.cfg.policy = p;
        self
    }
    /// The body of a refusal (default: problem+json).
    pub fn body(mut self, b: BodyStyle) -> Self {
        self.cfg.body = b;
        self
    }
    /// The application's own refusal: `f` builds the response; status 200 becomes the
    /// refusal's status, and `Retry-After` and the rate-limit headers are added.
    pub fn on_denied(
        mut self,
        f: impl Fn(&Denial<'_>) -> Response<Bytes> + Send + Sync + 'static,
    ) -> Self {
        self.cfg.body = BodyStyle::Custom(Arc::new(f));
        self
    }
    /// Sees every decision (see [`crate::observe`]).
    pub fn on_decision(mut self, f: impl Fn(&Event<'_>) + Send + Sync + 'static) -> Self {
        self.cfg.observer = Some(Arc::new(f));
        self
    }
    /// The longest a shaped request is held (default 30 s; zero: shaping off, a shaper's
    /// delay is not waited).
    pub fn max_delay(mut self, d: Duration) -> Self {
        self.cfg.max_delay = d;
        self
    }
    /// Settles every admitted request at the actual cost its response gives in an
    /// [`ActualCost`](crate::ActualCost) extension ([`crate::settle`]); a response without
    /// one keeps the reservation. The request's head is kept until its response (one clone
    /// and one allocation per admitted request).
    pub fn settle(self) -> Self {
        self.settle_with(by_extension)
    }
    /// Settles every admitted request at the actual cost `f` reads from its response's head
    /// (a header, the status, an extension); `None` keeps the reservation.
    pub fn settle_with(
        mut self,
        f: impl Fn(&http::response::Parts) -> Option<u64> + Send + Sync + 'static,
    ) -> Self {
        self.cfg.settle = Some(Arc::new(f));
        self
    }
    /// The layer.
    pub fn build(self) -> RateLimitLayer<L> {
        RateLimitLayer {
            cfg: Arc::new(self.cfg),
        }
    }
}

/// Rate limiting in front of any tower service over `http` requests. `Clone` shares the
/// configuration and the store or engine behind it. It answers at once: a request over the
/// limit gets its 429 (503 when shed) without queueing.
pub struct RateLimitLayer<L> {
    cfg: Arc<Config<L>>,
}

impl<L> Clone for RateLimitLayer<L> {
    fn clone(&self) -> Self {
        Self {
            cfg: Arc::clone(&self.cfg),
        }
    }
}

impl<L: Limit> RateLimitLayer<L> {
    /// A layer over `limit` with the defaults (500 without a key, IETF headers,
    /// problem+json).
    pub fn new(limit: L) -> Self {
        Self::builder(limit).build()
    }
    /// A builder over `limit`.
    pub fn builder(limit: L) -> Builder<L> {
        Builder {
            cfg: Config {
                limit,
                no_key: NoKey::default(),
                headers: HeaderStyle::default(),
                policy: Policy::default(),
                body: BodyStyle::default(),
                observer: None,
                max_delay: Duration::from_secs(30),
                settle: None,
            },
        }
    }
    /// What requests are checked against.
    pub fn limit(&self) -> &L {
        &self.cfg.limit
    }
}

impl<S, L> Layer<S> for RateLimitLayer<L> {
    type Service = RateLimit<S, L>;
    fn layer(&self, inner: S) -> RateLimit<S, L> {
        RateLimit {
            inner,
            cfg: Arc::clone(&self.cfg),
        }
    }
}

/// The rate-limiting service (from [`RateLimitLayer`]).
pub struct RateLimit<S, L> {
    inner: S,
    cfg: Arc<Config<L>>,
}

impl<S: Clone, L> Clone for RateLimit<S, L> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            cfg: Arc::clone(&self.cfg),
        }
    }
}

impl<L: Limit> Config<L> {
    /// The reservation to settle once the response comes, if settling is on and the
    /// admission can be given back.
    fn reserve(
        &self,
        parts: &http::request::Parts,
        refund: Option<(u64, u64)>,
    ) -> Option<Box<Reservation>> {
        let (id, cost) = refund.filter(|_| self.settle.is_some())?;
        Some(Box::new(Reservation {
            parts: parts.clone(),
            id,
            cost,
        }))
    }

    /// Settles `r` at the actual cost the response's head gives, if it gives one.
    fn settle(&self, r: &Reservation, head: &http::response::Parts) {
        if let Some(actual) = self.settle.as_ref().and_then(|f| f(head)) {
            self.limit.settle(&r.parts, r.id, r.cost, actual);
        }
    }

    fn observe(&self, answer: Answer, decision: Option<&Decision>, grpc: bool, rule: Option<&str>) {
        if let Some(o) = &self.observer {
            o(&Event {
                answer,
                decision,
                class: self.limit.class(),
                grpc,
                rule,
            });
        }
    }

    fn refuse(
        &self,
        decision: &Decision,
        shed: bool,
        grpc: bool,
        rule: Option<&str>,
    ) -> Response<Bytes> {
        let denial = Denial {
            status: if shed {
                StatusCode::SERVICE_UNAVAILABLE
            } else {
                StatusCode::TOO_MANY_REQUESTS
            },
            decision,
            retry_after: retry_after_secs(decision),
            shed,
            policy: self.policy.name(),
            rule,
        };
        if grpc {
            grpc_denial(&denial, &self.headers, &self.policy)
        } else {
            denial_response(&denial, &self.body, &self.headers, &self.policy)
        }
    }
}

impl<S, L, ReqB, ResB> Service<Request<ReqB>> for RateLimit<S, L>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone,
    L: Limit,
    ResB: Body<Data = Bytes>,
{
    type Response = Response<RateLimitBody<ResB, L::Permit>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqB, L>;

    /// The inner service's readiness: the layer adds no queue of its own, so its
    /// back-pressure reaches the caller, also for a limit whose check waits.
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        let (parts, body) = req.into_parts();
        match self.cfg.limit.check(&parts, self.cfg.no_key) {
            Checking::Ready(check) => answer(&self.cfg, &mut self.inner, check, parts, body),
            Checking::Pending(check) => {
                // The instance `poll_ready` made ready waits with the request (its readiness
                // reserved for it), a clone takes its place here, as for a shaped request.
                let clone = self.inner.clone();
                let svc = std::mem::replace(&mut self.inner, clone);
                let wait = Box::pin(CheckWait {
                    check,
                    rest: Some((Arc::clone(&self.cfg), svc, parts, body)),
                });
                ResponseFuture {
                    state: State::Checking { wait },
                    headers: RateHeaders::None,
                }
            }
        }
    }
}

/// The answer to a check: the inner call (`svc`, made ready), a shaped wait, a refusal, or
/// a 500 without a key; and the headers the inner service's response gets.
#[inline(always)]
fn answer<S, L, ReqB>(
    cfg: &Arc<Config<L>>,
    svc: &mut S,
    check: Check<L::Permit>,
    parts: http::request::Parts,
    body: ReqB,
) -> ResponseFuture<S, ReqB, L>
where
    S: Service<Request<ReqB>> + Clone,
    L: Limit,
{
    // Only a refusal and an observer need to know: no header lookup on the admitted path.
    let grpc = (cfg.observer.is_some() || matches!(check, Check::Denied { .. } | Check::NoKey))
        && is_grpc(&parts.headers);
    match check {
        Check::Admitted {
            decision,
            permit,
            refund,
        } => {
            let headers = RateHeaders::new(&cfg.headers, &cfg.policy, &decision);
            let delay = bounded_delay(&decision, cfg.max_delay);
            if delay.is_zero() {
                cfg.observe(Answer::Admitted, Some(&decision), grpc, None);
                let settle = cfg.reserve(&parts, refund).map(|r| (Arc::clone(cfg), r));
                let fut = svc.call(Request::from_parts(parts, body));
                let state = State::Inner {
                    fut,
                    permit,
                    settle,
                };
                return ResponseFuture { state, headers };
            }
            cfg.observe(Answer::Delayed, Some(&decision), grpc, None);
            let held = Held {
                cfg: Arc::clone(cfg),
                parts: Some(parts),
                refund,
            };
            ResponseFuture {
                state: delayed(svc, held, body, permit, delay),
                headers,
            }
        }
        Check::Denied {
            decision,
            shed,
            rule,
        } => {
            let rule = rule.as_deref();
            let answer = if shed { Answer::Shed } else { Answer::Limited };
            cfg.observe(answer, Some(&decision), grpc, rule);
            let res = Some(cfg.refuse(&decision, shed, grpc, rule));
            ResponseFuture::ready(res)
        }
        Check::Unchecked => {
            cfg.observe(Answer::Unchecked, None, grpc, None);
            let fut = svc.call(Request::from_parts(parts, body));
            ResponseFuture {
                state: State::Inner {
                    fut,
                    permit: None,
                    settle: None,
                },
                headers: RateHeaders::None,
            }
        }
        Check::NoKey => {
            cfg.observe(Answer::NoKey, None, grpc, None);
            ResponseFuture::ready(Some(no_key_response()))
        }
    }
}

/// A shaped request's state: the ready instance waits with the request, a clone takes its
/// place. One allocation for the wait (the timer, the request, the service): a shaped request
/// is rare, and the future of every other stays small.
fn delayed<S, L, ReqB>(
    svc: &mut S,
    held: Held<L>,
    body: ReqB,
    permit: Option<L::Permit>,
    delay: std::time::Duration,
) -> State<S::Future, S, ReqB, L>
where
    S: Service<Request<ReqB>> + Clone,
    L: Limit,
{
    let clone = svc.clone();
    let svc = std::mem::replace(svc, clone);
    let wait = Box::pin(Wait {
        sleep: tokio::time::sleep(delay),
        svc: Some(svc),
        body: Some(body),
        held,
        permit,
    });
    State::Delayed { wait }
}

pin_project! {
    /// A check in progress ([`Checking::Pending`]) and what its answer needs: the layer's
    /// settings, the ready inner service, the request.
    struct CheckWait<S, ReqB, L: Limit> {
        #[pin]
        check: L::Future,
        rest: Option<(Arc<Config<L>>, S, http::request::Parts, ReqB)>,
    }
}

/// The head of a shaped request while it waits: if it is dropped before the wait ends
/// (the request cancelled), the limit gets the admission back (`Limit::refund`, given the
/// head, which an engine describes again to reach the same rules).
struct Held<L: Limit> {
    cfg: Arc<Config<L>>,
    parts: Option<http::request::Parts>,
    refund: Option<(u64, u64)>,
}

impl<L: Limit> Drop for Held<L> {
    fn drop(&mut self) {
        if let (Some(parts), Some((id, cost))) = (&self.parts, self.refund) {
            if cost > 0 {
                self.cfg.limit.refund(parts, id, cost);
            }
        }
    }
}

pin_project! {
    /// A shaped request waiting out its delay.
    struct Wait<S, ReqB, L: Limit> {
        #[pin]
        sleep: tokio::time::Sleep,
        svc: Option<S>,
        body: Option<ReqB>,
        // Before `permit` (fields drop in order): a cancelled request is given back before
        // it stops counting in flight, so whoever sees it gone sees its refund.
        held: Held<L>,
        permit: Option<L::Permit>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, S, ReqB, L: Limit> {
        // Boxed: the future of a limit that answers at once has no value, and the other
        // states keep the response future's size (one allocation beside a round trip).
        Checking { wait: Pin<Box<CheckWait<S, ReqB, L>>> },
        Ready { res: Option<Response<Bytes>> },
        Delayed { wait: Pin<Box<Wait<S, ReqB, L>>> },
        // `settle`: the reservation to settle at the response's actual cost (settling on).
        Inner {
            #[pin] fut: F,
            permit: Option<L::Permit>,
            settle: Option<(Arc<Config<L>>, Box<Reservation>)>,
        },
    }
}

pin_project! {
    /// The response future of [`RateLimit`].
    pub struct ResponseFuture<S: Service<Request<ReqB>>, ReqB, L: Limit> {
        #[pin]
        state: State<S::Future, S, ReqB, L>,
        // The decision's rate-limit headers, for the inner service's response.
        headers: RateHeaders,
    }
}

impl<S: Service<Request<ReqB>>, ReqB, L: Limit> ResponseFuture<S, ReqB, L> {
    /// An answer of the layer's own (a refusal, a 500 without a key).
    fn ready(res: Option<Response<Bytes>>) -> Self {
        ResponseFuture {
            state: State::Ready { res },
            headers: RateHeaders::None,
        }
    }
}

impl<S, ReqB, ResB, L> Future for ResponseFuture<S, ReqB, L>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone,
    L: Limit,
    ResB: Body<Data = Bytes>,
{
    type Output = Result<Response<RateLimitBody<ResB, L::Permit>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Checking { wait } => {
                    let w = wait.as_mut().project();
                    let check = ready!(w.check.poll(cx));
                    let (cfg, mut svc, parts, body) =
                        w.rest.take().expect("polled after completion");
                    let ResponseFuture { state, headers } =
                        answer(&cfg, &mut svc, check, parts, body);
                    *this.headers = headers;
                    this.state.set(state);
                }
                StateProj::Ready { res } => {
                    let res = res.take().expect("polled after completion");
                    return Poll::Ready(Ok(res.map(RateLimitBody::full)));
                }
                StateProj::Delayed { wait } => {
                    let w = wait.as_mut().project();
                    ready!(w.sleep.poll(cx));
                    let s = w.svc.as_mut().expect("polled after completion");
                    ready!(s.poll_ready(cx))?;
                    // Waited out: the request goes on and keeps its cost (`Held` without its
                    // head refunds nothing).
                    let parts = w.held.parts.take().expect("polled after completion");
                    let body = w.body.take().expect("polled after completion");
                    let cfg = &w.held.cfg;
                    let settle = cfg
                        .reserve(&parts, w.held.refund)
                        .map(|r| (Arc::clone(cfg), r));
                    let fut = s.call(Request::from_parts(parts, body));
                    let permit = w.permit.take();
                    this.state.set(State::Inner {
                        fut,
                        permit,
                        settle,
                    });
                }
                StateProj::Inner {
                    fut,
                    permit,
                    settle,
                } => {
                    let mut res = ready!(fut.poll(cx))?;
                    if let Some((cfg, r)) = settle.take() {
                        let (head, body) = res.into_parts();
                        cfg.settle(&r, &head);
                        res = Response::from_parts(head, body);
                    }
                    let mut res = res.map(|b| RateLimitBody::new(b, permit.take()));
                    std::mem::replace(this.headers, RateHeaders::None).write(res.headers_mut());
                    return Poll::Ready(Ok(res));
                }
            }
        }
    }
}
