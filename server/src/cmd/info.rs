//! `INFO`'s text, section by section, as Redis 7 words it: the fields monitoring tools and
//! load balancers read (HAProxy's Redis check reads `role:master` from `INFO replication`),
//! each filled with what the server knows; a field the server cannot fill truthfully is left
//! out rather than made up.

use super::ArgCursor;
use super::REDIS_VERSION;
use crate::metrics::C;
use std::fmt::Write;
use std::sync::atomic::Ordering;

/// The sections `INFO` knows, in Redis's order.
const SECTIONS: [&str; 9] = [
    "server",
    "clients",
    "memory",
    "persistence",
    "stats",
    "replication",
    "cpu",
    "cluster",
    "keyspace",
];

/// `INFO` text of the sections asked (none, `default`, `all` or `everything`: every one).
pub(crate) fn info(ctx: &super::Ctx<'_>, mut asked: ArgCursor<'_>) -> String {
    let mut want = [false; SECTIONS.len()];
    let mut any = false;
    while let Some(a) = asked.next() {
        any = true;
        let all = ["all", "default", "everything"]
            .iter()
            .any(|w| a.eq_ignore_ascii_case(w.as_bytes()));
        for (i, s) in SECTIONS.iter().enumerate() {
            want[i] |= all || a.eq_ignore_ascii_case(s.as_bytes());
        }
    }
    if !any {
        want = [true; SECTIONS.len()];
    }
    let mut t = String::new();
    for (i, s) in SECTIONS.iter().enumerate() {
        if !want[i] {
            continue;
        }
        if !t.is_empty() {
            t.push_str("\r\n");
        }
        // Writing to a String cannot fail.
        let _ = section(ctx, s, &mut t);
    }
    t
}

/// One section's text, its header first.
fn section(ctx: &super::Ctx<'_>, name: &str, t: &mut String) -> std::fmt::Result {
    let m = ctx.metrics;
    match name {
        "server" => write!(
            t,
            "# Server\r\nredis_version:{REDIS_VERSION}\r\nturnstile_version:{}\r\nturnstile_ready:{}\r\nredis_mode:standalone\r\narch_bits:{}\r\nmultiplexing_api:epoll\r\nprocess_id:{}\r\nuptime_in_seconds:{}\r\nuptime_in_days:{}\r\n",
            env!("CARGO_PKG_VERSION"),
            // Relaxed: a flag read for display.
            u8::from(ctx.ready.load(Ordering::Relaxed)),
            usize::BITS,
            std::process::id(),
            m.uptime().as_secs(),
            m.uptime().as_secs() / 86_400,
        ),
        // Nothing blocks, nothing is tracked, there is no cluster bus.
        "clients" => write!(
            t,
            "# Clients\r\nconnected_clients:{}\r\ncluster_connections:0\r\nmaxclients:{}\r\nblocked_clients:0\r\ntracking_clients:0\r\nclients_in_timeout_table:0\r\n",
            ctx.guard.open(crate::listen::Kind::Resp),
            ctx.resp.max_connections
        ),
        "memory" => write!(
            t,
            "# Memory\r\nclient_buffers_bytes:{}\r\n",
            ctx.buffers.bytes.load(Ordering::Relaxed)
        ),
        "persistence" => write!(t, "# Persistence\r\nloading:0\r\n"),
        // No replicas, no pub/sub, no forks: those counts are 0 by construction.
        "stats" => write!(
            t,
            "# Stats\r\ntotal_connections_received:{}\r\ntotal_commands_processed:{}\r\nrejected_connections:{}\r\nsync_full:0\r\nsync_partial_ok:0\r\nsync_partial_err:0\r\npubsub_channels:0\r\npubsub_patterns:0\r\ntotal_forks:0\r\n",
            m.get(C::Connections),
            m.get(C::Commands),
            m.get(C::RejectedConnections)
        ),
        // A master without replicas, as a standalone Redis reports itself.
        "replication" => write!(
            t,
            "# Replication\r\nrole:master\r\nconnected_slaves:0\r\nmaster_failover_state:no-failover\r\nmaster_repl_offset:0\r\nsecond_repl_offset:-1\r\nrepl_backlog_active:0\r\n",
        ),
        "cpu" => {
            let (user, sys) = cpu(libc::RUSAGE_SELF);
            let (cuser, csys) = cpu(libc::RUSAGE_CHILDREN);
            write!(
                t,
                "# CPU\r\nused_cpu_sys:{sys:.6}\r\nused_cpu_user:{user:.6}\r\nused_cpu_sys_children:{csys:.6}\r\nused_cpu_user_children:{cuser:.6}\r\n"
            )
        }
        "cluster" => write!(t, "# Cluster\r\ncluster_enabled:0\r\n"),
        _ => write!(t, "# Keyspace\r\n"),
    }
}

/// CPU seconds of `who` (`getrusage(2)`): user, system; zero if the call fails.
fn cpu(who: libc::c_int) -> (f64, f64) {
    // SAFETY: `rusage` is plain integers, for which all zeroes is a valid value.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a valid, writable `rusage`; `who` is one of the `RUSAGE_*` constants.
    if unsafe { libc::getrusage(who, &mut u) } != 0 {
        return (0.0, 0.0);
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    (secs(u.ru_utime), secs(u.ru_stime))
}
