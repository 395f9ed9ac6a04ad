//! [`Error`]: why a call to Redis gave no decision.

use std::fmt;
use std::time::Duration;
use turnstile::ConfigError;

/// Why a call to Redis gave no decision.
#[derive(Debug)]
pub enum Error {
    /// The limits cannot run on Redis (see the message).
    Config(ConfigError),
    /// Redis answered with an error, or the connection failed.
    Redis(redis::RedisError),
    /// No answer within the per-call timeout.
    Timeout(Duration),
    /// The library answered something that is not a decision (a bug; the reply is given), or
    /// the server cannot run it (see the message).
    Reply(String),
    /// A key cannot be used (see the message).
    Key(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Config(e) => write!(f, "{e}"),
            Error::Redis(e) => write!(f, "redis: {e}"),
            Error::Timeout(t) => write!(f, "redis did not answer within {t:?}"),
            Error::Reply(r) => write!(f, "unexpected reply: {r}"),
            Error::Key(m) => write!(f, "{m}"),
        }
    }
}

impl std::error::Error for Error {}

impl Error {
    /// The kind, in a word (a span's `error.type`).
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Config(_) => "config",
            Error::Redis(_) => "redis",
            Error::Timeout(_) => "timeout",
            Error::Reply(_) => "reply",
            Error::Key(_) => "key",
        }
    }
}

impl From<redis::RedisError> for Error {
    fn from(e: redis::RedisError) -> Self {
        Error::Redis(e)
    }
}

impl From<ConfigError> for Error {
    fn from(e: ConfigError) -> Self {
        Error::Config(e)
    }
}
