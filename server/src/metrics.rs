//! Counters and the latency histogram, and their Prometheus text.
//!
//! Counters are sharded per worker thread and cache-padded: every worker adds to its own line
//! (a relaxed add, no contention); `/metrics` sums them. Rule and store figures come from the
//! engine and the stores when scraped.

use crate::state::Server;
use crossbeam_utils::CachePadded;
use std::cell::Cell;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use turnstile::rules::Priority;
use turnstile::{Clock, DefaultClock};

/// What is counted per worker.
#[derive(Clone, Copy, Debug)]
pub(crate) enum C {
    Connections,
    RejectedConnections,
    Commands,
    ProtocolErrors,
    ThrottleAllowed,
    ThrottleLimited,
    CheckAllowed,
    CheckDenied,
    Refunds,
    HttpRequests,
    HttpChecks,
    HttpErrors,
    OutputLimitClosed,
    HttpRejectedConnections,
}

const COUNTERS: usize = 14;

/// Latency histogram bucket bounds (ns), per command.
pub(crate) const BOUNDS_NS: [u64; 12] = [
    250, 500, 1_000, 2_000, 4_000, 8_000, 16_000, 32_000, 64_000, 128_000, 1_000_000, 10_000_000,
];
const HIST: usize = BOUNDS_NS.len() + 1;

struct Worker {
    c: [AtomicU64; COUNTERS],
    hist: [AtomicU64; HIST],
    sum_ns: AtomicU64,
}

/// A connection's counts since its last [`Metrics::flush`]: plain integers, so that a pipelined
/// command costs no atomic read-modify-write (three per `CL.THROTTLE` before, each a locked
/// instruction that drains the store buffer, plus a thread-local lookup and a division to find
/// the shard: about 4 % of a pipelined command's time, docs/service.md). The connection
/// flushes it after each pipeline, before writing its replies, so that a client that has read
/// a reply sees it counted.
#[derive(Default)]
pub(crate) struct Tally {
    c: [u64; COUNTERS],
    hist: [u64; HIST],
    sum_ns: u64,
    dirty: bool,
}

impl Tally {
    #[inline]
    pub(crate) fn add(&mut self, c: C, n: u64) {
        self.c[c as usize] += n;
        self.dirty = true;
    }

    #[inline]
    pub(crate) fn latency(&mut self, ns: u64) {
        self.hist[bucket(ns)] += 1;
        self.sum_ns += ns;
        self.dirty = true;
    }
}

/// The latency histogram's bucket of `ns`.
#[inline]
fn bucket(ns: u64) -> usize {
    BOUNDS_NS
        .iter()
        .position(|&b| ns <= b)
        .unwrap_or(BOUNDS_NS.len())
}

thread_local! {
    static WORKER: Cell<usize> = const { Cell::new(usize::MAX) };
}

static NEXT_WORKER: AtomicUsize = AtomicUsize::new(0);

/// Counters of the whole server.
pub(crate) struct Metrics {
    workers: Box<[CachePadded<Worker>]>,
    /// The clock of the latency histogram.
    clock: DefaultClock,
    started: std::time::Instant,
    pub(crate) reloads_ok: AtomicU64,
    pub(crate) reloads_failed: AtomicU64,
    pub(crate) envoy_reloads_ok: AtomicU64,
    pub(crate) envoy_reloads_failed: AtomicU64,
    pub(crate) snapshots_ok: AtomicU64,
    pub(crate) snapshots_failed: AtomicU64,
    pub(crate) snapshot_records: AtomicU64,
}

impl Metrics {
    pub(crate) fn new(workers: usize) -> Self {
        Self {
            workers: (0..workers.max(1) + 1)
                .map(|_| {
                    CachePadded::new(Worker {
                        c: Default::default(),
                        hist: Default::default(),
                        sum_ns: AtomicU64::new(0),
                    })
                })
                .collect(),
            clock: DefaultClock::new(),
            started: std::time::Instant::now(),
            reloads_ok: AtomicU64::new(0),
            reloads_failed: AtomicU64::new(0),
            envoy_reloads_ok: AtomicU64::new(0),
            envoy_reloads_failed: AtomicU64::new(0),
            snapshots_ok: AtomicU64::new(0),
            snapshots_failed: AtomicU64::new(0),
            snapshot_records: AtomicU64::new(0),
        }
    }

    /// The latency clock's reading.
    #[inline]
    pub(crate) fn now(&self) -> u64 {
        self.clock.now()
    }

    /// Since the server started.
    pub(crate) fn uptime(&self) -> std::time::Duration {
        self.started.elapsed()
    }

    /// This thread's shard (threads are numbered on first use).
    #[inline]
    fn mine(&self) -> &Worker {
        let i = WORKER.with(|w| {
            let mut i = w.get();
            if i == usize::MAX {
                // Relaxed: a unique number is all that is needed.
                i = NEXT_WORKER.fetch_add(1, Ordering::Relaxed);
                w.set(i);
            }
            i
        });
        &self.workers[i % self.workers.len()]
    }

    #[inline]
    pub(crate) fn add(&self, c: C, n: u64) {
        // Relaxed: statistics.
        self.mine().c[c as usize].fetch_add(n, Ordering::Relaxed);
    }

    /// Adds a connection's [`Tally`] to this thread's shard and zeroes it: one relaxed add per
    /// counter that moved, instead of one per event.
    pub(crate) fn flush(&self, t: &mut Tally) {
        if !t.dirty {
            return;
        }
        let w = self.mine();
        for (a, x) in w.c.iter().zip(t.c.iter_mut()) {
            if *x != 0 {
                // Relaxed: statistics.
                a.fetch_add(std::mem::take(x), Ordering::Relaxed);
            }
        }
        for (a, x) in w.hist.iter().zip(t.hist.iter_mut()) {
            if *x != 0 {
                // Relaxed: statistics.
                a.fetch_add(std::mem::take(x), Ordering::Relaxed);
            }
        }
        // Relaxed: statistics.
        w.sum_ns
            .fetch_add(std::mem::take(&mut t.sum_ns), Ordering::Relaxed);
        t.dirty = false;
    }

    #[inline]
    pub(crate) fn latency(&self, ns: u64) {
        let w = self.mine();
        // Relaxed: statistics.
        w.hist[bucket(ns)].fetch_add(1, Ordering::Relaxed);
        w.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    pub(crate) fn get(&self, c: C) -> u64 {
        self.workers
            .iter()
            .map(|w| w.c[c as usize].load(Ordering::Relaxed))
            .sum()
    }
}

fn counter(out: &mut String, name: &str, help: &str, v: u64) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}"
    );
}

fn gauge(out: &mut String, name: &str, help: &str, v: u64) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
}

/// A label value with `\`, `"` and newlines escaped.
fn label(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The Prometheus text exposition of everything.
pub(crate) fn render(s: &Server) -> String {
    let m = &s.metrics;
    let mut o = String::with_capacity(4096);
    let r = |x: &AtomicU64| x.load(Ordering::Relaxed);
    counter(
        &mut o,
        "turnstile_connections_total",
        "RESP connections accepted.",
        m.get(C::Connections),
    );
    counter(
        &mut o,
        "turnstile_connections_rejected_total",
        "RESP connections refused at --max-connections.",
        m.get(C::RejectedConnections),
    );
    gauge(
        &mut o,
        "turnstile_connections",
        "RESP connections open.",
        s.connections.load(Ordering::Relaxed) as u64,
    );
    counter(
        &mut o,
        "turnstile_resp_commands_total",
        "RESP commands executed.",
        m.get(C::Commands),
    );
    counter(
        &mut o,
        "turnstile_resp_protocol_errors_total",
        "RESP connections closed for a protocol error.",
        m.get(C::ProtocolErrors),
    );
    let _ = writeln!(o, "# HELP turnstile_throttle_total CL.THROTTLE answers by result.\n# TYPE turnstile_throttle_total counter");
    let _ = writeln!(
        o,
        "turnstile_throttle_total{{result=\"allowed\"}} {}",
        m.get(C::ThrottleAllowed)
    );
    let _ = writeln!(
        o,
        "turnstile_throttle_total{{result=\"limited\"}} {}",
        m.get(C::ThrottleLimited)
    );
    let _ = writeln!(o, "# HELP turnstile_checks_total Rules checks (TURNSTILE.CHECK and POST /v1/check) by result.\n# TYPE turnstile_checks_total counter");
    let _ = writeln!(
        o,
        "turnstile_checks_total{{result=\"allowed\"}} {}",
        m.get(C::CheckAllowed)
    );
    let _ = writeln!(
        o,
        "turnstile_checks_total{{result=\"denied\"}} {}",
        m.get(C::CheckDenied)
    );
    counter(
        &mut o,
        "turnstile_resp_output_limit_closed_total",
        "RESP connections closed for passing --client-output-limit.",
        m.get(C::OutputLimitClosed),
    );
    gauge(
        &mut o,
        "turnstile_resp_buffer_bytes",
        "Bytes of the RESP connections' buffers now.",
        s.buffers.bytes.load(Ordering::Relaxed) as u64,
    );
    gauge(
        &mut o,
        "turnstile_resp_deferred_bytes",
        "Bytes of the deferred budget lent to RESP connections (unread output, queued MULTI commands).",
        s.buffers.deferred.load(Ordering::Relaxed) as u64,
    );
    let _ = writeln!(o, "# HELP turnstile_memory_bound_bytes The most memory each part may take at the server's flags: RESP connections (--max-connections x each one's bound), the deferred budget they share, the CL.THROTTLE store (--throttle-keys).\n# TYPE turnstile_memory_bound_bytes gauge");
    for (part, v) in [
        (
            "resp_connections",
            s.resp.max_connections * crate::resp::connection::max_bytes(&s.resp.bounds),
        ),
        ("deferred", s.buffers.deferred_max),
        ("throttle_store", s.throttles.store().memory_bytes()),
    ] {
        let _ = writeln!(o, "turnstile_memory_bound_bytes{{part=\"{part}\"}} {v}");
    }
    counter(
        &mut o,
        "turnstile_refunds_total",
        "TURNSTILE.REFUND requests.",
        m.get(C::Refunds),
    );
    counter(
        &mut o,
        "turnstile_http_requests_total",
        "HTTP requests.",
        m.get(C::HttpRequests),
    );
    counter(
        &mut o,
        "turnstile_http_checks_total",
        "POST /v1/check requests answered with a decision.",
        m.get(C::HttpChecks),
    );
    counter(
        &mut o,
        "turnstile_http_connections_rejected_total",
        "HTTP connections closed at once at --max-http-connections.",
        m.get(C::HttpRejectedConnections),
    );
    counter(
        &mut o,
        "turnstile_http_errors_total",
        "HTTP requests answered with a 4xx error other than 429.",
        m.get(C::HttpErrors),
    );
    let _ = writeln!(o, "# HELP turnstile_reloads_total Rules reloads by result.\n# TYPE turnstile_reloads_total counter");
    let _ = writeln!(
        o,
        "turnstile_reloads_total{{result=\"ok\"}} {}",
        r(&m.reloads_ok)
    );
    let _ = writeln!(
        o,
        "turnstile_reloads_total{{result=\"failed\"}} {}",
        r(&m.reloads_failed)
    );
    if s.envoy.is_some() {
        let _ = writeln!(o, "# HELP turnstile_envoy_reloads_total Envoy configuration reloads by result.\n# TYPE turnstile_envoy_reloads_total counter");
        for (k, v) in [
            ("ok", &m.envoy_reloads_ok),
            ("failed", &m.envoy_reloads_failed),
        ] {
            let _ = writeln!(
                o,
                "turnstile_envoy_reloads_total{{result=\"{k}\"}} {}",
                r(v)
            );
        }
    }
    let _ = writeln!(o, "# HELP turnstile_snapshots_total Snapshot writes by result.\n# TYPE turnstile_snapshots_total counter");
    let _ = writeln!(
        o,
        "turnstile_snapshots_total{{result=\"ok\"}} {}",
        r(&m.snapshots_ok)
    );
    let _ = writeln!(
        o,
        "turnstile_snapshots_total{{result=\"failed\"}} {}",
        r(&m.snapshots_failed)
    );
    gauge(
        &mut o,
        "turnstile_snapshot_records",
        "Records in the last snapshot written.",
        r(&m.snapshot_records),
    );

    // Latency histogram, summed over workers.
    let mut h = [0u64; HIST];
    let mut sum = 0u64;
    for w in m.workers.iter() {
        for (t, x) in h.iter_mut().zip(w.hist.iter()) {
            *t += x.load(Ordering::Relaxed);
        }
        sum += w.sum_ns.load(Ordering::Relaxed);
    }
    let _ = writeln!(o, "# HELP turnstile_check_seconds Time to execute one CL.THROTTLE, TURNSTILE.* or /v1/check.\n# TYPE turnstile_check_seconds histogram");
    let mut cum = 0;
    for (i, b) in BOUNDS_NS.iter().enumerate() {
        cum += h[i];
        let _ = writeln!(
            o,
            "turnstile_check_seconds_bucket{{le=\"{}\"}} {cum}",
            *b as f64 / 1e9
        );
    }
    cum += h[HIST - 1];
    let _ = writeln!(o, "turnstile_check_seconds_bucket{{le=\"+Inf\"}} {cum}");
    let _ = writeln!(o, "turnstile_check_seconds_sum {}", sum as f64 / 1e9);
    let _ = writeln!(o, "turnstile_check_seconds_count {cum}");

    // The store of CL.THROTTLE.
    let st = s.throttles.store().stats();
    let _ = writeln!(o, "# HELP turnstile_store_keys Live keys in the CL.THROTTLE store.\n# TYPE turnstile_store_keys gauge\nturnstile_store_keys{{store=\"throttle\"}} {}", st.live);
    let _ = writeln!(o, "# HELP turnstile_store_events_total What the CL.THROTTLE store did with records.\n# TYPE turnstile_store_events_total counter");
    for (k, v) in [
        ("inserted", st.inserted),
        ("reclaimed", st.reclaimed),
        ("evicted", st.evicted),
        ("rejected", st.rejected),
    ] {
        let _ = writeln!(
            o,
            "turnstile_store_events_total{{store=\"throttle\",event=\"{k}\"}} {v}"
        );
    }

    // The rules engine.
    if let Some(e) = &s.checks.engine {
        let _ = writeln!(o, "# HELP turnstile_rule_events_total What each rule did: denied, would_deny (shadow), elastic (admitted from the pool), over_nominal (soft).\n# TYPE turnstile_rule_events_total counter");
        let names = e.rule_names();
        for n in &names {
            if let Some(rs) = e.rule_stats(n) {
                let n = label(n);
                for (k, v) in [
                    ("denied", rs.denied),
                    ("would_deny", rs.would_deny),
                    ("elastic", rs.elastic),
                    ("over_nominal", rs.over_nominal),
                ] {
                    let _ = writeln!(
                        o,
                        "turnstile_rule_events_total{{rule=\"{n}\",event=\"{k}\"}} {v}"
                    );
                }
            }
        }
        let _ = writeln!(o, "# HELP turnstile_rule_keys Live keys in each rule's store.\n# TYPE turnstile_rule_keys gauge");
        for n in &names {
            if let Some(k) = e.rule_keys(n) {
                let _ = writeln!(o, "turnstile_rule_keys{{rule=\"{}\"}} {k}", label(n));
            }
        }
        let _ = writeln!(o, "# HELP turnstile_shed_total Requests shed by priority.\n# TYPE turnstile_shed_total counter");
        let shed = e.shed_counts();
        for p in Priority::ALL {
            let _ = writeln!(
                o,
                "turnstile_shed_total{{priority=\"{p}\"}} {}",
                shed[p.index()]
            );
        }
    }
    // Where the rules' counts live, and what the Redis backend did.
    if s.checks.engine.is_some() {
        let name = s.checks.backends.name();
        let _ = writeln!(o, "# HELP turnstile_rules_backend Where the rules' counts live ([backend] in the rules file): 1 for the one in use.\n# TYPE turnstile_rules_backend gauge");
        for b in ["memory", "redis"] {
            let _ = writeln!(
                o,
                "turnstile_rules_backend{{backend=\"{b}\"}} {}",
                u8::from(b == name)
            );
        }
    }
    if let Some((st, open)) = s.checks.backends.stats() {
        let _ = writeln!(o, "# HELP turnstile_backend_calls_total Rules requests sent to the Redis backend, by what happened: answered by Redis, timed out, failed, not sent (circuit open); fallback counts the answers the failure policy gave (each timeout, error and short circuit).\n# TYPE turnstile_backend_calls_total counter");
        for (k, v) in [
            ("redis", st.redis),
            ("timeout", st.timeouts),
            ("error", st.errors),
            ("short_circuited", st.short_circuited),
            ("fallback", st.fallbacks),
        ] {
            let _ = writeln!(o, "turnstile_backend_calls_total{{result=\"{k}\"}} {v}");
        }
        counter(
            &mut o,
            "turnstile_backend_circuit_opened_total",
            "Times the Redis backend's circuit breaker opened.",
            st.opened,
        );
        gauge(
            &mut o,
            "turnstile_backend_circuit_open",
            "Whether the Redis backend's circuit breaker is open now (Redis left alone, the policy answers).",
            u64::from(open),
        );
    }
    // Envoy's rate limit service, in upstream's names.
    if let Some(e) = &s.envoy {
        o.push_str(&e.render_metrics());
    }
    o
}
