//! The guard every listener goes through — RESP (tokio and io_uring), HTTP/1 and HTTP/2, the
//! admin listener, gRPC, each with or without TLS — so that a bound is written once and a new
//! listener is bounded by construction (as Envoy's overload manager and nginx's core
//! timeouts are, not each protocol's handler).
//!
//! A connection is admitted by [`Guard::admit`] before anything is read from it: its kind's
//! `--max-*-connections` and the descriptors the process may open (the soft `RLIMIT_NOFILE`,
//! raised to the hard one at start, less a reserve for files and refusals) decide; a refused
//! one is closed at once (RESP is told `-ERR max number of clients reached` first). The
//! [`Ticket`] it gets holds its place until it ends and carries its [`Conn`] state: whether
//! it has authenticated, its requests in progress, the bodies it is sending. One pure
//! function, [`Limits::expired`], says when a connection has overstayed:
//!
//! | deadline | flag (default) | what it closes |
//! |---|---|---|
//! | TLS handshake | `--tls-handshake-timeout` (10 s) | a handshake not finished |
//! | authentication | `--auth-timeout` (10 s) | a connection that has not shown the password, when one is set |
//! | request head / idle | `--header-timeout` (60 s) | HTTP without a request in progress (slowloris, idle keep-alive); gRPC before its first call (silent) |
//! | gRPC idle | `--grpc-idle-timeout` (1 h) | gRPC without a call in progress, once it has had one |
//! | request body | `--body-timeout` (30 s), `--min-body-rate` (1 KiB/s) | a body not finished in time, or slower than the rate after its first 5 s |
//! | RESP idle | `--idle-timeout` (300 s) | no progress either way |
//!
//! The tokio connections (HTTP, admin, gRPC) are looked at by one sweeper thread once a second
//! ([`sweep`]); RESP's drivers look at their own (the tokio driver's wait, the io_uring tick)
//! with the same function. Bytes a client can make the server hold are bounded per connection
//! and server-wide ([`body`]: request bodies; RESP's output budget before authentication is
//! its fixed allowance only). Accept errors back off ([`Backoff`]); failed passwords are slowed
//! per source address by the engine itself ([`AuthThrottle`]). docs/service.md has the table of
//! every bound.

pub(crate) mod accept;
mod auth;
mod backoff;
pub(crate) mod body;
mod conn;
mod guard;
pub(crate) mod hyper;
mod limits;
mod rlimit;
pub(crate) mod sweep;

pub(crate) use auth::{AuthThrottle, MAX_FAILURES as MAX_AUTH_FAILURES};
pub(crate) use backoff::Backoff;
pub(crate) use conn::{Busy, Conn, Expired};
pub(crate) use guard::{Guard, Refusal, Ticket};
pub(crate) use limits::{Limits, PRE_AUTH_BODY};
pub(crate) use rlimit::raise_nofile;

/// The listeners, each with its own bound on connections: a flood on one does not lock out
/// another (the admin listener least of all).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `--resp`.
    Resp,
    /// `--http`.
    Http,
    /// `--admin`.
    Admin,
    /// `--grpc`.
    Grpc,
}

impl Kind {
    /// Every kind, in the order of their counters.
    pub(crate) const ALL: [Kind; 4] = [Kind::Resp, Kind::Http, Kind::Admin, Kind::Grpc];

    /// The listener's name in logs and metrics.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Resp => "resp",
            Kind::Http => "http",
            Kind::Admin => "admin",
            Kind::Grpc => "grpc",
        }
    }
}

/// Resolves once `rx` reads `true` (or its sender is gone): the server's shutdown signal.
pub(crate) async fn stopped(rx: &mut tokio::sync::watch::Receiver<bool>) {
    while !*rx.borrow_and_update() {
        if rx.changed().await.is_err() {
            return;
        }
    }
}
