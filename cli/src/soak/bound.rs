//! The server's memory bound the soak holds it to, computed from its flags.
//!
//! The HTTP/2 part (HTTP/2 on the HTTP listener, and gRPC) takes each stream's body at
//! `--max-body`, the one body bound the server is to apply to every route and to gRPC
//! messages, and its streams at [`H2_MAX_STREAMS`], a constant of the server today (it has no
//! flag for it).

use turnstile_server::ServeArgs;

/// The server's memory bound, from its flags, as docs/service.md states it: per RESP
/// connection its input buffer (the larger of 16 KiB and the largest frame the bounds
/// allow), 16 KiB of output before it pauses plus one reply, 16 KiB of queued `MULTI`
/// commands, and its fixed part; the deferred budget (64 MiB) shared by all; per HTTP
/// connection its header buffer and one body; per HTTP/2 connection (on the HTTP listener, and
/// gRPC) its header buffer and, per stream it may open, one body and one frame not yet taken;
/// and the `CL.THROTTLE` store (its size at `--throttle-keys`).
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Bound {
    pub per_resp: u64,
    pub per_http: u64,
    pub per_h2: u64,
    pub deferred: u64,
    pub stores: u64,
    pub resp_connections: u64,
    pub http_connections: u64,
    /// HTTP/2 connections: on the HTTP listener, and gRPC's.
    pub h2_connections: u64,
}

/// Fixed part of a RESP connection: its task, state, parse-ahead vectors and socket
/// registration (measured: docs/service.md).
const RESP_FIXED: u64 = 8 << 10;
/// Fixed part of an HTTP connection: hyper's connection state, write buffer and task.
const HTTP_FIXED: u64 = 16 << 10;
/// The server-wide deferred budget (server/src/lib.rs).
const DEFERRED: u64 = 64 << 20;
/// Streams an HTTP/2 connection may have open at once: `max_concurrent_streams` of the HTTP
/// and gRPC listeners (server/src/http.rs, server/src/envoy/grpc.rs), which no flag sets.
pub const H2_MAX_STREAMS: u64 = 100;
/// What a stream may hold beyond its body: one DATA frame received and not yet taken (HTTP/2's
/// default `SETTINGS_MAX_FRAME_SIZE`).
const H2_FRAME: u64 = 16 << 10;

impl Bound {
    pub fn of(a: &ServeArgs, resp_connections: u64, http_connections: u64, h2: u64) -> Self {
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
            per_h2: a.max_header_bytes.max(8192) as u64
                + H2_MAX_STREAMS * (a.max_body as u64 + H2_FRAME)
                + HTTP_FIXED,
            deferred: DEFERRED,
            stores: throttle_store_bytes(a.throttle_keys),
            resp_connections,
            http_connections,
            h2_connections: h2,
        }
    }

    /// The connections' part.
    pub fn connections(&self) -> u64 {
        self.resp_connections * self.per_resp
            + self.deferred
            + self.http_connections * self.per_http
            + self.h2_connections * self.per_h2
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
        let b = Bound::of(&ServeArgs::new(), 1000, 100, 10);
        // 16 arguments of 4 KiB: about 66 KiB of input.
        assert!(
            b.per_resp > 100 << 10 && b.per_resp < 140 << 10,
            "{}",
            b.per_resp
        );
        // 2 Mi keys, about 20 B each (39.4 MiB).
        assert!(b.stores > 36 << 20 && b.stores < 44 << 20, "{}", b.stores);
        // 100 streams of 64 KiB + 16 KiB, and 16 KiB of headers: about 8 MiB.
        assert!(
            b.per_h2 > 8000 << 10 && b.per_h2 < 8100 << 10,
            "{}",
            b.per_h2
        );
        assert_eq!(
            b.connections(),
            1000 * b.per_resp + (64 << 20) + 100 * b.per_http + 10 * b.per_h2
        );
    }
}
