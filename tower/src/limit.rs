//! What the layer checks a request against: one keyed [`Store`] and a key extractor
//! ([`StoreLimit`]), a rules [`Engine`] and a description of the request ([`EngineLimit`]),
//! or, with the `redis` feature, a Redis store (`redis::RedisLimit`).
//!
//! A check answers at once ([`Checking::Ready`]: the in-memory limits, in nanoseconds) or
//! with a future ([`Checking::Pending`]: a network round trip); the layer waits for the
//! future in its response future, then answers as for any other check.

use crate::key::{route, Key, KeyExtractor};
use crate::ClientIp;
use http::request::Parts;
use std::convert::Infallible;
use std::future::Future;
use std::marker::PhantomData;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use turnstile::keyed::{Key as _, KeyHasher, Store};
use turnstile::rules::{Engine, OwnedInFlight, Priority, Request};
use turnstile::{Clock, Decision, Outcome};

/// A request without a key: what the layer answers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum NoKey {
    /// 500 Internal Server Error (tower_governor's answer): a misconfiguration to notice.
    #[default]
    Error,
    /// Passes the request on unchecked.
    PassThrough,
    /// Counts it under one shared key ([`Key::Anonymous`]).
    Anonymous,
}

/// The result of one check; `P` is the permit an admitted request holds (see
/// [`Limit::Permit`]).
#[derive(Debug)]
pub enum Check<P = OwnedInFlight> {
    /// Admitted: go on (after `decision.delay` for a shaper). `permit` is held until the
    /// response body ends; `refund` gives the cost back if the request is cancelled while it
    /// waits out its delay.
    Admitted {
        /// The decision.
        decision: Decision,
        /// An in-flight permit to hold until the response body ends.
        permit: Option<P>,
        /// The key id and cost to refund on cancellation, where the limit can refund.
        refund: Option<(u64, u64)>,
    },
    /// Refused: a 429 (or 503 when `shed`).
    Denied {
        /// The decision.
        decision: Decision,
        /// Shed by priority load shedding rather than by a limit.
        shed: bool,
        /// The rule that denied, where the limit knows it (a rules engine): the refusal
        /// names it as the violated policy, and observers see it.
        rule: Option<Arc<str>>,
    },
    /// Passed on unchecked ([`NoKey::PassThrough`]).
    Unchecked,
    /// No key and [`NoKey::Error`].
    NoKey,
}

/// What [`Limit::check`] answers: the check's result now, or a future of it.
#[derive(Debug)]
pub enum Checking<P, F> {
    /// Decided at once.
    Ready(Check<P>),
    /// Decided when the future completes (a network round trip): the layer holds the request
    /// and the inner service, made ready by `poll_ready`, until then.
    Pending(F),
}

/// The future of a limit that always decides at once ([`StoreLimit`], [`EngineLimit`]). It
/// has no value: the layer's state for a pending check is never built for such a limit, and
/// the response future stays as small as without it.
pub struct Never<P> {
    never: Infallible,
    _check: PhantomData<fn() -> P>,
}

impl<P> Future for Never<P> {
    type Output = Check<P>;
    fn poll(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Check<P>> {
        match self.never {}
    }
}

/// What the layer checks requests against. Implemented for [`StoreLimit`], [`EngineLimit`]
/// and (feature `redis`) `redis::RedisLimit`; implement it to put any
/// other decision behind the layer, at once or asynchronously.
pub trait Limit: Send + Sync + 'static {
    /// What an admitted request holds until its response body ends or is dropped: the
    /// engine's [`OwnedInFlight`]; `()` for a store, which counts nothing in flight (then the
    /// response future and body carry no room for one).
    type Permit: Send + 'static;
    /// The future of a check that cannot answer at once; [`Never`] for a limit that always
    /// does.
    type Future: Future<Output = Check<Self::Permit>>;
    /// Checks the request whose head is `parts`: the answer now, or a future of it (which
    /// owns what it needs: it must not borrow `parts`).
    fn check(&self, parts: &Parts, no_key: NoKey) -> Checking<Self::Permit, Self::Future>;
    /// Gives back what an admission took: `id` and `cost` are those its
    /// [`Check::Admitted`] said to refund, and `parts` the head of the request as it was
    /// checked (a shaped request cancelled while it waited).
    fn refund(&self, _parts: &Parts, _id: u64, _cost: u64) {}
    /// Settles an admission that reserved `reserved` at its `actual` cost (the layer's
    /// [`crate::settle`]): `id` is what its [`Check::Admitted`] said to refund, `parts` the
    /// head of the request as it was checked. The difference is charged whatever the limits
    /// hold, or given back, on every limit the reservation touched, all or nothing. The
    /// default keeps the reservation as it is (a limit that cannot settle).
    fn settle(&self, _parts: &Parts, _id: u64, _reserved: u64, _actual: u64) {}
    /// The key class, for observers.
    fn class(&self) -> &'static str;
}

/// One keyed store; every request costs `cost` (default 1) of its key's limits.
pub struct StoreLimit<K, C: Clock> {
    store: Arc<Store<C>>,
    key: K,
    cost: u64,
}

impl<K: KeyExtractor, C: Clock + 'static> StoreLimit<K, C> {
    /// Requests keyed by `key` against `store` (shared: clones of the layer and other code
    /// see the same counters).
    pub fn new(store: Arc<Store<C>>, key: K) -> Self {
        Self {
            store,
            key,
            cost: 1,
        }
    }
    /// Each request costs `cost`.
    pub fn cost(mut self, cost: u64) -> Self {
        self.cost = cost;
        self
    }
    /// The store.
    pub fn store(&self) -> &Arc<Store<C>> {
        &self.store
    }
}

/// The key id of the request, or the answer to a request without a key.
#[inline(always)]
pub(crate) fn key_id<K: KeyExtractor, P>(
    key: &K,
    parts: &Parts,
    no_key: NoKey,
    hasher: &KeyHasher,
) -> Result<u64, Check<P>> {
    match key.extract(parts) {
        Some(k) => Ok(k.key_id(hasher)),
        None => match no_key {
            NoKey::Error => Err(Check::NoKey),
            NoKey::PassThrough => Err(Check::Unchecked),
            NoKey::Anonymous => Ok(Key::Anonymous.key_id(hasher)),
        },
    }
}

/// A keyed store's verdict (in memory or in Redis): the cost of `id` is refunded if the
/// request is cancelled while it waits out a shaper's delay; a full store (or Redis away and
/// the policy closed) answers 503, like a shed request.
pub(crate) fn store_check(d: Decision, id: u64, cost: u64) -> Check<()> {
    if d.allowed() {
        Check::Admitted {
            decision: d,
            permit: None,
            refund: Some((id, cost)),
        }
    } else {
        Check::Denied {
            decision: d,
            shed: d.outcome == Outcome::StoreFull,
            rule: None,
        }
    }
}

impl<K: KeyExtractor, C: Clock + 'static> Limit for StoreLimit<K, C> {
    type Permit = ();
    type Future = Never<()>;
    #[inline]
    fn check(&self, parts: &Parts, no_key: NoKey) -> Checking<(), Never<()>> {
        Checking::Ready(
            match key_id(&self.key, parts, no_key, self.store.hasher()) {
                Ok(id) => store_check(self.store.check(&id, self.cost), id, self.cost),
                Err(answer) => answer,
            },
        )
    }
    fn refund(&self, _parts: &Parts, id: u64, cost: u64) {
        self.store.refund(&id, cost);
    }
    /// [`Store::settle`]: every limit of the key in one atomic step.
    fn settle(&self, _parts: &Parts, id: u64, reserved: u64, actual: u64) {
        self.store.settle(&id, reserved, actual);
    }
    fn class(&self) -> &'static str {
        self.key.class()
    }
}

/// How a request becomes a rules [`Request`] (customer, IP, API key, route, method,
/// priority, cost). [`Describer`] covers the usual sources; a closure works too.
pub trait Describe: Send + Sync + 'static {
    /// The request as the rules see it; `None`: it has no key ([`NoKey`]).
    fn describe<'r>(&self, parts: &'r Parts) -> Option<Request<'r>>;
}

impl<F> Describe for F
where
    F: for<'r> Fn(&'r Parts) -> Option<Request<'r>> + Send + Sync + 'static,
{
    fn describe<'r>(&self, parts: &'r Parts) -> Option<Request<'r>> {
        self(parts)
    }
}

/// Where the client address comes from.
#[derive(Clone, Debug, Default)]
pub enum IpSource {
    /// No address (rules keyed by IP do not apply).
    None,
    /// The TCP peer ([`crate::PeerIp`]).
    #[default]
    Peer,
    /// Behind trusted proxies ([`ClientIp`]).
    Client(ClientIp),
}

/// The usual description: the route (axum's `MatchedPath`, else the URI path), the method,
/// the client IP, and optionally an API key header, a customer id from an extension, a
/// priority and a cost.
#[derive(Clone, Default)]
pub struct Describer {
    ip: IpSource,
    api_key: Option<http::HeaderName>,
    customer: Option<fn(&Parts) -> Option<u64>>,
    priority: Option<fn(&Parts) -> Option<Priority>>,
    cost: Option<fn(&Parts) -> u64>,
}

impl Describer {
    /// Route, method and peer IP.
    pub fn new() -> Self {
        Self::default()
    }
    /// Where the IP comes from.
    pub fn ip(mut self, ip: IpSource) -> Self {
        self.ip = ip;
        self
    }
    /// The API key is this header's value (`x-api-key`).
    pub fn api_key(mut self, header: http::HeaderName) -> Self {
        self.api_key = Some(header);
        self
    }
    /// The customer id, e.g. from an extension an authentication layer set.
    pub fn customer(mut self, f: fn(&Parts) -> Option<u64>) -> Self {
        self.customer = Some(f);
        self
    }
    /// The priority (default: from the method).
    pub fn priority(mut self, f: fn(&Parts) -> Option<Priority>) -> Self {
        self.priority = Some(f);
        self
    }
    /// The cost (default 1).
    pub fn cost(mut self, f: fn(&Parts) -> u64) -> Self {
        self.cost = Some(f);
        self
    }
    fn client_ip(&self, parts: &Parts) -> Option<IpAddr> {
        match &self.ip {
            IpSource::None => None,
            IpSource::Peer => crate::ip::peer_addr(&parts.extensions).map(|a| a.ip()),
            IpSource::Client(c) => c.ip(parts),
        }
    }
}

impl Describe for Describer {
    #[inline]
    fn describe<'r>(&self, parts: &'r Parts) -> Option<Request<'r>> {
        let mut r = Request::new()
            .route(route(parts))
            .method(parts.method.as_str());
        r.ip = self.client_ip(parts);
        if let Some(h) = &self.api_key {
            r.api_key = crate::key::first_value(&parts.headers, h).and_then(|v| v.to_str().ok());
        }
        if let Some(f) = self.customer {
            r.customer = f(parts);
        }
        if let Some(f) = self.priority {
            r.priority = f(parts);
        }
        if let Some(f) = self.cost {
            r.cost = f(parts);
        }
        Some(r)
    }
}

/// A rules engine: the rules decide per customer, IP, API key, route, method and priority.
/// Every admitted request holds an in-flight permit until its response body ends (the load
/// that shedding and elastic rules read).
pub struct EngineLimit<D, C: Clock> {
    engine: Arc<Engine<C>>,
    describe: D,
}

impl<D: Describe, C: Clock + 'static> EngineLimit<D, C> {
    /// `engine` (shared: reload it from anywhere), requests described by `describe`.
    pub fn new(engine: Arc<Engine<C>>, describe: D) -> Self {
        Self { engine, describe }
    }
    /// The engine.
    pub fn engine(&self) -> &Arc<Engine<C>> {
        &self.engine
    }
}

/// Whether an engine's denial is a shed: `docs/rules.md` ("One check"): a shed request gets
/// `Outcome::Limited` with `limit` 0, which no rule's limit can be (limits are ≥ 1).
pub fn is_shed(d: &Decision) -> bool {
    d.outcome == Outcome::Limited && d.limit == 0
}

impl<D: Describe, C: Clock + 'static> Limit for EngineLimit<D, C> {
    type Permit = OwnedInFlight;
    type Future = Never<OwnedInFlight>;
    #[inline]
    fn check(&self, parts: &Parts, no_key: NoKey) -> Checking<OwnedInFlight, Self::Future> {
        Checking::Ready(self.admit(parts, no_key))
    }
    /// Gives an admitted request back to every rule that took it ([`Engine::refund`]),
    /// described again from the same head, so it reaches the same rules and keys. A head the
    /// describer gives no request for was admitted as the anonymous request
    /// ([`NoKey::Anonymous`]: with any other answer there is nothing to refund).
    fn refund(&self, parts: &Parts, _id: u64, _cost: u64) {
        let req = self
            .describe
            .describe(parts)
            .unwrap_or_else(|| anonymous(parts));
        self.engine.refund(&req);
    }
    /// [`Engine::settle`] of the request described again from the same head (as
    /// [`Limit::refund`]), at its reserved cost: every rule it matches.
    fn settle(&self, parts: &Parts, _id: u64, reserved: u64, actual: u64) {
        let mut req = self
            .describe
            .describe(parts)
            .unwrap_or_else(|| anonymous(parts));
        req.cost = reserved;
        self.engine.settle(&req, actual);
    }
    fn class(&self) -> &'static str {
        "rules"
    }
}

impl<D: Describe, C: Clock + 'static> EngineLimit<D, C> {
    #[inline]
    fn admit(&self, parts: &Parts, no_key: NoKey) -> Check {
        let req = match self.describe.describe(parts) {
            Some(r) => r,
            None => match no_key {
                NoKey::Error => return Check::NoKey,
                NoKey::PassThrough => return Check::Unchecked,
                NoKey::Anonymous => anonymous(parts),
            },
        };
        match self.engine.try_admit_owned(&req) {
            Ok(p) => Check::Admitted {
                decision: *p.decision(),
                permit: Some(p),
                // The engine refunds a request, not a key: `refund` describes it again
                // from the same head (the id is not used).
                refund: Some((0, req.cost)),
            },
            Err(r) => Check::Denied {
                shed: is_shed(&r.decision) || r.decision.outcome == Outcome::StoreFull,
                decision: r.decision,
                rule: r.rule,
            },
        }
    }
}

/// The request of a head with no key, under [`NoKey::Anonymous`]: its route and method only.
fn anonymous(parts: &Parts) -> Request<'_> {
    Request::new()
        .route(route(parts))
        .method(parts.method.as_str())
}

/// `Retry-After` in whole seconds: rounded up and at least 1, so that a client that waits it
/// out is never early ([`Decision::retry_after_secs_ceil`]).
#[inline]
pub fn retry_after_secs(d: &Decision) -> Option<u64> {
    d.retry_after_secs_ceil()
}

/// The delay a shaper asks for, bounded by `max`.
#[inline]
pub(crate) fn bounded_delay(d: &Decision, max: Duration) -> Duration {
    d.delay().min(max)
}
