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
    /// Limits classes' files re-read, and refused (a bad line).
    pub(crate) limits_reads_ok: AtomicU64,
    pub(crate) limits_reads_failed: AtomicU64,
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
            limits_reads_ok: AtomicU64::new(0),
            limits_reads_failed: AtomicU64::new(0),
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

/// Prometheus text, written family by family.
struct Exposition(String);

impl Exposition {
    /// A family's `# HELP` and `# TYPE` lines.
    fn head(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.0, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    /// One sample; `labels` as written between the braces (empty: none).
    fn sample(&mut self, name: &str, labels: &str, v: impl std::fmt::Display) {
        if labels.is_empty() {
            let _ = writeln!(self.0, "{name} {v}");
        } else {
            let _ = writeln!(self.0, "{name}{{{labels}}} {v}");
        }
    }

    fn counter(&mut self, name: &str, help: &str, v: u64) {
        self.head(name, "counter", help);
        self.sample(name, "", v);
    }

    fn gauge(&mut self, name: &str, help: &str, v: u64) {
        self.head(name, "gauge", help);
        self.sample(name, "", v);
    }

    /// A family whose samples differ by one label.
    fn by<V: std::fmt::Display>(
        &mut self,
        name: &str,
        kind: &str,
        help: &str,
        label: &str,
        rows: impl IntoIterator<Item = (impl std::fmt::Display, V)>,
    ) {
        self.head(name, kind, help);
        for (k, v) in rows {
            self.sample(name, &format!("{label}=\"{k}\""), v);
        }
    }
}

/// A label value with `\`, `"` and newlines escaped.
fn label(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The Prometheus text exposition of everything.
pub(crate) fn render(s: &Server) -> String {
    let mut o = Exposition(String::with_capacity(4096));
    resp(&mut o, s);
    memory(&mut o, s);
    http(&mut o, s);
    operations(&mut o, s);
    latency(&mut o, &s.metrics);
    throttle_store(&mut o, s);
    rules(&mut o, s);
    // Every listener's guard: connections, refusals, deadlines, passwords, bodies.
    s.guard.render(&mut o.0);
    // Envoy's rate limit service, in upstream's names.
    if let Some(e) = &s.envoy {
        o.0.push_str(&e.render_metrics());
    }
    o.0
}

/// RESP connections and commands.
fn resp(o: &mut Exposition, s: &Server) {
    let m = &s.metrics;
    o.counter(
        "turnstile_connections_total",
        "RESP connections accepted.",
        m.get(C::Connections),
    );
    o.counter(
        "turnstile_connections_rejected_total",
        "RESP connections refused at --max-connections.",
        m.get(C::RejectedConnections),
    );
    o.gauge(
        "turnstile_connections",
        "RESP connections open.",
        s.guard.open(crate::listen::Kind::Resp) as u64,
    );
    o.counter(
        "turnstile_resp_commands_total",
        "RESP commands executed.",
        m.get(C::Commands),
    );
    o.counter(
        "turnstile_resp_protocol_errors_total",
        "RESP connections closed for a protocol error.",
        m.get(C::ProtocolErrors),
    );
    o.by(
        "turnstile_throttle_total",
        "counter",
        "CL.THROTTLE answers by result.",
        "result",
        [
            ("allowed", m.get(C::ThrottleAllowed)),
            ("limited", m.get(C::ThrottleLimited)),
        ],
    );
    o.by(
        "turnstile_checks_total",
        "counter",
        "Rules checks (TURNSTILE.CHECK and POST /v1/check) by result.",
        "result",
        [
            ("allowed", m.get(C::CheckAllowed)),
            ("denied", m.get(C::CheckDenied)),
        ],
    );
    o.counter(
        "turnstile_resp_output_limit_closed_total",
        "RESP connections closed for passing --client-output-limit.",
        m.get(C::OutputLimitClosed),
    );
}

/// The connections' buffers now, and the bound of each part of the server's memory.
fn memory(o: &mut Exposition, s: &Server) {
    o.gauge(
        "turnstile_resp_buffer_bytes",
        "Bytes of the RESP connections' buffers now.",
        s.buffers.bytes.load(Ordering::Relaxed) as u64,
    );
    o.gauge(
        "turnstile_resp_deferred_bytes",
        "Bytes of the deferred budget lent to RESP connections (unread output, queued MULTI commands).",
        s.buffers.deferred.load(Ordering::Relaxed) as u64,
    );
    o.by(
        "turnstile_memory_bound_bytes",
        "gauge",
        "The most memory each part may take at the server's flags: RESP connections (--max-connections x each one's bound), the deferred budget they share, the CL.THROTTLE store (--throttle-keys).",
        "part",
        [
            (
                "resp_connections",
                s.resp.max_connections * crate::resp::connection::max_bytes(&s.resp.bounds),
            ),
            ("deferred", s.buffers.deferred_max),
            ("throttle_store", s.throttles.store().memory_bytes()),
        ],
    );
    o.counter(
        "turnstile_refunds_total",
        "TURNSTILE.REFUND requests.",
        s.metrics.get(C::Refunds),
    );
}

/// HTTP requests and connections.
fn http(o: &mut Exposition, s: &Server) {
    let m = &s.metrics;
    o.counter(
        "turnstile_http_requests_total",
        "HTTP requests.",
        m.get(C::HttpRequests),
    );
    o.counter(
        "turnstile_http_checks_total",
        "POST /v1/check requests answered with a decision.",
        m.get(C::HttpChecks),
    );
    o.counter(
        "turnstile_http_connections_rejected_total",
        "HTTP connections closed at once at --max-http-connections.",
        m.get(C::HttpRejectedConnections),
    );
    o.counter(
        "turnstile_http_errors_total",
        "HTTP requests answered with a 4xx error other than 429.",
        m.get(C::HttpErrors),
    );
}

/// Reloads and snapshots.
fn operations(o: &mut Exposition, s: &Server) {
    let m = &s.metrics;
    let r = |x: &AtomicU64| x.load(Ordering::Relaxed);
    o.by(
        "turnstile_reloads_total",
        "counter",
        "Rules reloads by result.",
        "result",
        [("ok", r(&m.reloads_ok)), ("failed", r(&m.reloads_failed))],
    );
    o.by(
        "turnstile_limits_reads_total",
        "counter",
        "Limits classes' files re-read after a change, by result (failed: a bad line; the class kept its entries).",
        "result",
        [
            ("ok", r(&m.limits_reads_ok)),
            ("failed", r(&m.limits_reads_failed)),
        ],
    );
    if s.envoy.is_some() {
        o.by(
            "turnstile_envoy_reloads_total",
            "counter",
            "Envoy configuration reloads by result.",
            "result",
            [
                ("ok", r(&m.envoy_reloads_ok)),
                ("failed", r(&m.envoy_reloads_failed)),
            ],
        );
    }
    o.by(
        "turnstile_snapshots_total",
        "counter",
        "Snapshot writes by result.",
        "result",
        [
            ("ok", r(&m.snapshots_ok)),
            ("failed", r(&m.snapshots_failed)),
        ],
    );
    o.gauge(
        "turnstile_snapshot_records",
        "Records in the last snapshot written.",
        r(&m.snapshot_records),
    );
}

/// The latency histogram, summed over workers.
fn latency(o: &mut Exposition, m: &Metrics) {
    let mut h = [0u64; HIST];
    let mut sum = 0u64;
    for w in m.workers.iter() {
        for (t, x) in h.iter_mut().zip(w.hist.iter()) {
            *t += x.load(Ordering::Relaxed);
        }
        sum += w.sum_ns.load(Ordering::Relaxed);
    }
    const NAME: &str = "turnstile_check_seconds";
    o.head(
        NAME,
        "histogram",
        "Time to execute one CL.THROTTLE, TURNSTILE.* or /v1/check.",
    );
    let mut cum = 0;
    for (i, b) in BOUNDS_NS.iter().enumerate() {
        cum += h[i];
        o.sample(
            "turnstile_check_seconds_bucket",
            &format!("le=\"{}\"", *b as f64 / 1e9),
            cum,
        );
    }
    cum += h[HIST - 1];
    o.sample("turnstile_check_seconds_bucket", "le=\"+Inf\"", cum);
    o.sample("turnstile_check_seconds_sum", "", sum as f64 / 1e9);
    o.sample("turnstile_check_seconds_count", "", cum);
}

/// The store of CL.THROTTLE.
fn throttle_store(o: &mut Exposition, s: &Server) {
    let st = s.throttles.store().stats();
    o.by(
        "turnstile_store_keys",
        "gauge",
        "Live keys in the CL.THROTTLE store.",
        "store",
        [("throttle", st.live)],
    );
    o.head(
        "turnstile_store_events_total",
        "counter",
        "What the CL.THROTTLE store did with records.",
    );
    for (k, v) in [
        ("inserted", st.inserted),
        ("reclaimed", st.reclaimed),
        ("evicted", st.evicted),
        ("rejected", st.rejected),
    ] {
        o.sample(
            "turnstile_store_events_total",
            &format!("store=\"throttle\",event=\"{k}\""),
            v,
        );
    }
}

/// The rules engine, and where its counts live.
fn rules(o: &mut Exposition, s: &Server) {
    if let Some(e) = &s.checks.engine {
        const EVENTS: &str = "turnstile_rule_events_total";
        o.head(EVENTS, "counter", "What each rule did: denied, would_deny (shadow), elastic (admitted from the pool), over_nominal (soft).");
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
                    o.sample(EVENTS, &format!("rule=\"{n}\",event=\"{k}\""), v);
                }
            }
        }
        let keys = names
            .iter()
            .filter_map(|n| e.rule_keys(n).map(|k| (label(n), k)));
        o.by(
            "turnstile_rule_keys",
            "gauge",
            "Live keys in each rule's store.",
            "rule",
            keys.collect::<Vec<_>>(),
        );
        let shed = e.shed_counts();
        o.by(
            "turnstile_shed_total",
            "counter",
            "Requests shed by priority.",
            "priority",
            Priority::ALL.map(|p| (p, shed[p.index()])),
        );
        let name = s.checks.backends.name();
        o.by(
            "turnstile_rules_backend",
            "gauge",
            "Where the rules' counts live ([backend] in the rules file): 1 for the one in use.",
            "backend",
            ["memory", "redis"].map(|b| (b, u8::from(b == name))),
        );
    }
    if let Some((st, open)) = s.checks.backends.stats() {
        o.by(
            "turnstile_backend_calls_total",
            "counter",
            "Rules requests sent to the Redis backend, by what happened: answered by Redis, timed out, failed, not sent (circuit open); fallback counts the answers the failure policy gave (each timeout, error and short circuit).",
            "result",
            [
                ("redis", st.redis),
                ("timeout", st.timeouts),
                ("error", st.errors),
                ("short_circuited", st.short_circuited),
                ("fallback", st.fallbacks),
            ],
        );
        o.counter(
            "turnstile_backend_circuit_opened_total",
            "Times the Redis backend's circuit breaker opened.",
            st.opened,
        );
        o.gauge(
            "turnstile_backend_circuit_open",
            "Whether the Redis backend's circuit breaker is open now (Redis left alone, the policy answers).",
            u64::from(open),
        );
    }
    limits_in_redis(o);
}

/// The counters of the limits classes whose entries are in Redis.
fn limits_in_redis(o: &mut Exposition) {
    let all = crate::redis_limits::stats();
    if all.is_empty() {
        return;
    }
    type Field = fn(&turnstile_redis::RedisLimitsStats) -> u64;
    let families: [(&str, &str, &str, Field); 8] = [
        ("turnstile_limits_redis_unknown_total", "counter", "Lookups of a key whose bucket was not cached yet: the rule's defaults applied to that request.", |s| s.unknown),
        ("turnstile_limits_redis_fetches_total", "counter", "Buckets of entries fetched from Redis.", |s| s.fetches),
        ("turnstile_limits_redis_fetch_errors_total", "counter", "Fetch pipelines that failed (Redis away or slow).", |s| s.fetch_errors),
        ("turnstile_limits_redis_dropped_total", "counter", "Fetch requests dropped: the queue full, or Redis away.", |s| s.dropped),
        ("turnstile_limits_redis_invalidations_total", "counter", "Invalidations pushed by Redis (a bucket changed).", |s| s.invalidations),
        ("turnstile_limits_redis_reconnects_total", "counter", "Connections to Redis made again after a loss.", |s| s.reconnects),
        ("turnstile_limits_redis_bad_entries_total", "counter", "Entries in Redis the class cannot read, skipped (their keys get the defaults).", |s| s.bad_entries),
        ("turnstile_limits_redis_cached_entries", "gauge", "Entries in the cached buckets.", |s| s.cached_entries),
    ];
    for (name, kind, help, f) in families {
        o.by(
            name,
            kind,
            help,
            "class",
            all.iter().map(|(n, s)| (label(n), f(s))),
        );
    }
}
