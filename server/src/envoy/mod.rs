//! Envoy's rate limit service: a drop-in for envoyproxy/ratelimit behind Envoy, Istio, Contour,
//! Gloo and Emissary.
//!
//! * [`config`] reads envoyproxy/ratelimit's YAML as it is (a file or a directory, the files of
//!   one domain merged on request), with its validation, and errors that name file, line and
//!   column.
//! * [`matcher`] finds the limit of a request's descriptor as upstream does (nested
//!   descriptors, `*` wildcards anywhere in a value, default values, last-entry matching).
//! * [`Envoy`] ([`engine`]) answers a `RateLimitRequest` from turnstile stores: one store per
//!   configured limit, fixed windows by default as upstream, any turnstile algorithm with our
//!   `algorithm:` extension; hits_addend, request-level limit overrides, `unlimited`,
//!   `replaces`, shadow mode (per limit and `SHADOW_MODE`), quota mode (per limit and
//!   `QUOTA_MODE`), RateLimit response headers, dynamic metadata.
//! * [`service`] is the tonic gRPC service for the `--grpc` listener, beside `health`'s
//!   `grpc.health.v1.Health`; [`json_router`] serves
//!   `POST /json` and `/healthcheck`; [`metrics`] keeps upstream's per-limit counters.
//! * [`import_to_rules`] turns a configuration into a turnstile rules file.
//!
//! What is upstream's and what differs on purpose: `docs/envoy.md`.

pub mod config;
mod counter;
pub mod engine;
pub mod explain;
pub mod grpc;
pub(crate) mod health;
mod import;
pub mod json;
pub mod limits;
pub mod matcher;
pub mod metrics;
mod response;
mod settings;
mod stamp;
mod yaml;

pub use config::{load, load_with, ConfigError, EnvoyConfig, LoadOptions};
pub use engine::Envoy;
pub use explain::{DescriptorExplanation, EnvoyExplanation};
pub use grpc::service;
pub use import::import_to_rules;
pub use json::json_router;
pub use limits::InvalidRequest;
pub use settings::{Settings, UnixClock};
pub(crate) use stamp::{stamp, Stamp};
