//! `turnstile serve`: the rate-limit service.

#![warn(missing_docs)]

pub mod envoy;
