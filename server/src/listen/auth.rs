//! [`AuthThrottle`]: wrong passwords slowed per source address, by the engine this server
//! runs — a keyed [`Store`] of token buckets, one per address (IPv6 by its /64): a source may
//! try [`BURST`] passwords at once, then [`PER_SECOND`] a second. An attempt over that is
//! refused without being checked, so that no number of connections guesses faster. Per
//! connection, [`MAX_FAILURES`] wrong passwords close it.

use std::net::IpAddr;
use std::time::Duration;
use turnstile::keyed::{FullPolicy, Store};
use turnstile::{Clock, Limit, Limits};

/// Wrong passwords a source may give at once.
pub(crate) const BURST: u64 = 20;
/// Then this many a second.
pub(crate) const PER_SECOND: u64 = 2;
/// Wrong passwords that close a connection.
pub(crate) const MAX_FAILURES: u32 = 10;
/// Sources tracked at once (the stalest evicted past it: an address that stops guessing is
/// forgotten first).
const SOURCES: u64 = 1 << 16;

/// A source over its attempts: retry after this.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Throttled {
    pub(crate) retry_after: Duration,
}

/// Failed passwords per source address.
pub(crate) struct AuthThrottle {
    store: Store,
}

impl AuthThrottle {
    pub(crate) fn new() -> Self {
        let limit =
            Limit::token_bucket(BURST, PER_SECOND, Duration::from_secs(1)).expect("a valid bucket");
        let store = Store::builder(Limits::new(vec![limit]).expect("one limit"))
            .capacity(SOURCES)
            .policy(FullPolicy::EvictStalest)
            .ipv6_prefix(64)
            .build()
            .expect("a small store builds");
        Self { store }
    }

    /// Before a password from `from` is checked: whether its source may try one.
    pub(crate) fn allow(&self, from: Option<IpAddr>) -> Result<(), Throttled> {
        let Some(ip) = from else { return Ok(()) };
        // What one more wrong password would meet, recording nothing.
        let d = self.store.evaluate_at(&ip, 1, self.store.clock().now());
        if d.allowed() {
            return Ok(());
        }
        Err(Throttled {
            retry_after: d.retry_after().unwrap_or(Duration::from_secs(1)),
        })
    }

    /// A wrong password from `from`.
    pub(crate) fn failed(&self, from: Option<IpAddr>) {
        if let Some(ip) = from {
            self.store.check(&ip, 1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_gets_its_burst_then_waits_and_others_are_not_held() {
        let t = AuthThrottle::new();
        let a: IpAddr = "203.0.113.7".parse().unwrap();
        let b: IpAddr = "2001:db8::1".parse().unwrap();
        for _ in 0..BURST {
            assert!(t.allow(Some(a)).is_ok());
            t.failed(Some(a));
        }
        let Err(th) = t.allow(Some(a)) else {
            panic!("the burst is spent");
        };
        assert!(th.retry_after > Duration::ZERO && th.retry_after <= Duration::from_secs(1));
        assert!(t.allow(Some(b)).is_ok(), "another source is not held");
        // The same /64 is one source.
        let b2: IpAddr = "2001:db8::2".parse().unwrap();
        for _ in 0..BURST {
            t.failed(Some(b));
        }
        assert!(t.allow(Some(b2)).is_err());
        assert!(t.allow(None).is_ok(), "no address: nothing to key on");
    }
}
