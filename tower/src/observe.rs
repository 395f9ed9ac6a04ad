//! Seeing each decision: a callback ([`crate::Builder::on_decision`]) gets an [`Event`] built
//! on the stack — the admitted path allocates nothing for it — or [`tracing_observer`] turns
//! each into a `tracing` event (target `turnstile_tower`, DEBUG when admitted, INFO when not).

use std::sync::Arc;
use turnstile::Decision;

/// What the layer answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Answer {
    /// Passed on at once.
    Admitted,
    /// Passed on after a shaper's delay.
    Delayed,
    /// Refused: over a limit (429, `RESOURCE_EXHAUSTED`).
    Limited,
    /// Refused: shed by priority, or the store is full (503, `UNAVAILABLE`).
    Shed,
    /// No key: passed on unchecked ([`crate::NoKey::PassThrough`]).
    Unchecked,
    /// No key: 500 ([`crate::NoKey::Error`]).
    NoKey,
}

impl Answer {
    /// A lowercase name.
    pub fn name(self) -> &'static str {
        match self {
            Answer::Admitted => "admitted",
            Answer::Delayed => "delayed",
            Answer::Limited => "limited",
            Answer::Shed => "shed",
            Answer::Unchecked => "unchecked",
            Answer::NoKey => "no_key",
        }
    }
}

/// One decision of the layer.
#[derive(Clone, Copy, Debug)]
pub struct Event<'a> {
    /// The answer.
    pub answer: Answer,
    /// The decision behind it (none without a key).
    pub decision: Option<&'a Decision>,
    /// The key class (`"ip"`, `"header"`, `"rules"`...).
    pub class: &'static str,
    /// Whether the request was gRPC.
    pub grpc: bool,
    /// The rule that denied a refused request, where the limit says (a rules engine's).
    pub rule: Option<&'a str>,
}

/// A decision callback.
pub type Observer = Arc<dyn Fn(&Event<'_>) + Send + Sync>;

/// An observer that emits one `tracing` event per decision, with fields `answer`, `class`,
/// `limit`, `remaining`, `retry_after_ns`, `grpc`, and `rule` when a refusal names one.
#[cfg(feature = "tracing")]
pub fn tracing_observer() -> impl Fn(&Event<'_>) + Send + Sync + 'static {
    |e: &Event<'_>| {
        let (limit, remaining, retry) = e.decision.map_or((0, 0, 0), |d| {
            (d.limit, d.remaining, d.retry_after_ns.unwrap_or(0))
        });
        if matches!(
            e.answer,
            Answer::Admitted | Answer::Delayed | Answer::Unchecked
        ) {
            tracing::debug!(target: "turnstile_tower", answer = e.answer.name(), class = e.class,
                limit, remaining, retry_after_ns = retry, grpc = e.grpc, "rate limit decision");
        } else {
            tracing::info!(target: "turnstile_tower", answer = e.answer.name(), class = e.class,
                limit, remaining, retry_after_ns = retry, grpc = e.grpc, rule = e.rule,
                "rate limit decision");
        }
    }
}
