//! The server's memory bound the soak holds it to, computed from its flags as
//! docs/service.md states it ("Every listener's bounds").

use turnstile_server::ServeArgs;

/// The server's memory bound, from its flags: per RESP connection its input buffer (the
/// larger of 16 KiB and the largest frame the bounds allow), 16 KiB of output before it
/// pauses plus one reply, 16 KiB of queued `MULTI` commands, and its fixed part; the deferred
/// budget (64 MiB) shared by all; per HTTP/1 connection its header buffer; per HTTP/2
/// connection (on the HTTP listener, and gRPC) its connection window, and per stream it may
/// open (`--max-streams`) a header list and a response's send buffer; the request bodies held
/// at once, every connection's together (`--body-memory`); and the `CL.THROTTLE` store (its
/// size at `--throttle-keys`).
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Bound {
    pub per_resp: u64,
    pub per_http: u64,
    pub per_h2: u64,
    pub max_streams: u64,
    pub deferred: u64,
    pub bodies: u64,
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
/// What a client may send an HTTP/2 connection before the server has read it: its connection
/// window (server/src/listen/limits.rs; no flag sets it).
const H2_CONN_WINDOW: u64 = 128 << 10;
/// What HTTP/2 buffers of one stream's response (server/src/listen/limits.rs; no flag).
const H2_SEND_BUF: u64 = 64 << 10;

impl Bound {
    pub fn of(a: &ServeArgs, resp_connections: u64, http_connections: u64, h2: u64) -> Self {
        let b = turnstile_server::resp::Bounds {
            max_args: a.max_args.max(1),
            max_bulk: a.max_bulk,
            max_inline: a.max_inline.max(16),
            unauthenticated: false,
        };
        let input = (16u64 << 10).max(b.max_frame() as u64);
        let head = a.max_header_bytes.max(8192) as u64;
        let streams = u64::from(a.max_streams.max(1));
        Self {
            per_resp: input + (16 << 10) + (8 << 10) + (16 << 10) + RESP_FIXED,
            per_http: head + HTTP_FIXED,
            per_h2: H2_CONN_WINDOW + streams * (head + H2_SEND_BUF) + HTTP_FIXED,
            max_streams: streams,
            deferred: DEFERRED,
            bodies: a.body_memory as u64,
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
            + self.bodies
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
        // 32 streams of 16 KiB of headers and 64 KiB of response, and a 128 KiB window.
        assert_eq!(b.per_h2, (128 << 10) + 32 * (80 << 10) + (16 << 10));
        assert_eq!(b.bodies, 64 << 20);
        assert_eq!(
            b.connections(),
            1000 * b.per_resp + (64 << 20) + 100 * b.per_http + 10 * b.per_h2 + (64 << 20)
        );
    }
}
