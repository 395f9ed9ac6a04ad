//! What a connection knows of its client, and its line of `CLIENT INFO`.

use crate::config::Access;
use crate::metrics::Tally;
use crate::resp::Proto;
use crate::throttle::LastStore;
use std::net::SocketAddr;
use std::time::Instant;

/// What the connection knows of its client.
pub(crate) struct Session {
    pub(crate) proto: Proto,
    pub(crate) access: Access,
    pub(crate) id: u64,
    pub(crate) name: Vec<u8>,
    pub(crate) lib_name: Vec<u8>,
    pub(crate) lib_ver: Vec<u8>,
    pub(crate) peer: Option<SocketAddr>,
    pub(crate) local: Option<SocketAddr>,
    pub(crate) since: Instant,
    pub(crate) last: LastStore,
    /// Counts since the last flush to the shared metrics.
    pub(crate) tally: Tally,
    /// Whether a `MULTI` is open (for `CLIENT INFO`).
    pub(crate) in_multi: bool,
    /// The socket's descriptor, if it has one (for `CLIENT INFO`).
    pub(crate) fd: Option<i32>,
    /// The connection's buffers when its last connection command ran (for `CLIENT INFO`).
    pub(crate) buffers: BufferStats,
    /// Wrong passwords it gave (too many close it).
    pub(crate) auth_failures: u32,
}

/// A connection's buffers, as `CLIENT INFO` reports them.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct BufferStats {
    /// Input not yet answered, and free input space.
    pub(crate) qbuf: usize,
    pub(crate) qbuf_free: usize,
    /// Bytes of the queued `MULTI` commands.
    pub(crate) multi_mem: usize,
    /// The input buffer's size.
    pub(crate) rbs: usize,
    /// Output waiting for the client, and the output buffer's size.
    pub(crate) obl: usize,
    pub(crate) omem: usize,
}

impl Session {
    /// Back to a new connection's state (`RESET`).
    pub(crate) fn reset(&mut self, access: Access) {
        self.proto = Proto::Resp2;
        self.access = access;
        self.name.clear();
        self.in_multi = false;
    }

    /// This connection's line of `CLIENT INFO`: every field of Redis 7's (clients such as
    /// redis-py parse them all), those without a meaning here as Redis gives them for a
    /// client that does not use them.
    pub(crate) fn info_line(&self) -> String {
        let addr = |a: Option<SocketAddr>| a.map_or_else(String::new, |a| a.to_string());
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        let b = &self.buffers;
        format!(
            "id={} addr={} laddr={} fd={} name={} age={} idle=0 flags={} db=0 sub=0 psub=0 ssub=0 multi={} qbuf={} qbuf-free={} argv-mem=0 multi-mem={} rbs={} rbp={} obl={} oll=0 omem={} tot-mem={} events=r cmd=client|info user={} redir=-1 resp={} lib-name={} lib-ver={}\n",
            self.id,
            addr(self.peer),
            addr(self.local),
            self.fd.unwrap_or(-1),
            text(&self.name),
            self.since.elapsed().as_secs(),
            if self.in_multi { "x" } else { "N" },
            if self.in_multi { 0 } else { -1 },
            b.qbuf,
            b.qbuf_free,
            b.multi_mem,
            b.rbs,
            b.rbs,
            b.obl,
            b.omem,
            b.rbs + b.omem + b.multi_mem,
            "default",
            if self.proto == Proto::Resp3 { 3 } else { 2 },
            text(&self.lib_name),
            text(&self.lib_ver),
        )
    }
}
