//! The server's memory bound the soak holds it to, computed from its flags.

use turnstile_server::ServeArgs;

/// The server's memory bound, from its flags, as docs/service.md states it: per RESP
/// connection its input buffer (the larger of 16 KiB and the largest frame the bounds
/// allow), 16 KiB of output before it pauses plus one reply, 16 KiB of queued `MULTI`
/// commands, and its fixed part; the deferred budget (64 MiB) shared by all; per HTTP
/// connection its header buffer and one body; and the `CL.THROTTLE` store (its size at
/// `--throttle-keys`).
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Bound {
    pub per_resp: u64,
    pub per_http: u64,
    pub deferred: u64,
    pub stores: u64,
    pub resp_connections: u64,
    pub http_connections: u64,
}

/// Fixed part of a RESP connection: its task, state, parse-ahead vectors and socket
/// registration (measured: docs/service.md).
const RESP_FIXED: u64 = 8 << 10;
/// Fixed part of an HTTP connection: hyper's connection state, write buffer and task.
const HTTP_FIXED: u64 = 16 << 10;
/// The server-wide deferred budget (server/src/lib.rs).
const DEFERRED: u64 = 64 << 20;

impl Bound {
    pub fn of(a: &ServeArgs, resp_connections: u64, http_connections: u64) -> Self {
        let b = turnstile_server::resp::Bounds {
            max_args: a.max_args.max(1),
            max_bulk: a.max_bulk,
            max_inline: a.max_inline.max(16),
            unauthenticated: false,
        };
        let input = (16u64 << 10).max(b.max_frame() as u64);
        Self {
            per_resp: input + (16 << 10) + (8 << 10) + (16 << 10) + RESP_FIXED,
            per_http: (a.max_header_bytes.max(8192) + a.max_body) as u64 + HTTP_FIXED,
            deferred: DEFERRED,
            stores: throttle_store_bytes(a.throttle_keys),
            resp_connections,
            http_connections,
        }
    }

    /// The connections' part.
    pub fn connections(&self) -> u64 {
        self.resp_connections * self.per_resp
            + self.deferred
            + self.http_connections * self.per_http
    }

    pub fn total(&self) -> u64 {
        self.connections() + self.stores
    }
}

/// The size of the server's `CL.THROTTLE` store at `keys`: the same store built here, which
/// is exact (a store's size depends on its shards and tables, not on the key count alone).
fn throttle_store_bytes(keys: u64) -> u64 {
    turnstile_server::throttle::Throttles::new(keys, 0)
        .map_or(keys * 20, |t| t.store().memory_bytes() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bound_at_the_defaults() {
        let b = Bound::of(&ServeArgs::new(), 1000, 100);
        // 16 arguments of 4 KiB: about 66 KiB of input.
        assert!(
            b.per_resp > 100 << 10 && b.per_resp < 140 << 10,
            "{}",
            b.per_resp
        );
        // 2 Mi keys, about 20 B each (39.4 MiB).
        assert!(b.stores > 36 << 20 && b.stores < 44 << 20, "{}", b.stores);
        assert_eq!(
            b.connections(),
            1000 * b.per_resp + (64 << 20) + 100 * b.per_http
        );
    }
}
