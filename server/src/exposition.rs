//! `GET /metrics`: the Prometheus text of the whole server — its counters
//! ([`crate::metrics`]), the guard's, the stores', the rules', the bounds at the running flags
//! — read from the server's state when scraped.

use crate::metrics::{Metrics, BOUNDS_NS, C, HIST};
use crate::state::Server;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use turnstile::rules::Priority;

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
    o.gauge(
        "turnstile_ready",
        "Whether the last readiness check (GET /readyz; every second on the control thread) found the server ready: rules loaded, every limits class in Redis loaded, the Redis of [backend] reached and answering within its timeout.",
        // Relaxed: a flag read for display.
        u64::from(s.ready.load(std::sync::atomic::Ordering::Relaxed)),
    );
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
        o.0.push_str(&e.render_descriptor_metrics());
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
                s.resp.max_connections * crate::conn::max_bytes(&s.resp.bounds),
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
    o.counter(
        "turnstile_settles_total",
        "Requests settled at their actual cost (TURNSTILE.SETTLE, POST /v1/settle).",
        s.metrics.get(C::Settles),
    );
    o.counter(
        "turnstile_explains_total",
        "Decisions explained (TURNSTILE.EXPLAIN, POST /v1/check?explain=1).",
        s.metrics.get(C::Explains),
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
    let (h, sum) = m.histogram();
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
        rule_limits(o, e, &names);
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
    leases(o, s);
    limits_in_redis(o);
}

/// A counter or gauge of one label: (name, kind, help, the value from a row's stats).
type Family<'a, S> = (&'a str, &'a str, &'a str, fn(&S) -> u64);

/// Each family of `families` over `rows`, a series per row labelled `label="row name"`.
fn families<S>(o: &mut Exposition, label_name: &str, rows: &[(String, S)], families: &[Family<S>]) {
    for (name, kind, help, f) in families {
        o.by(
            name,
            kind,
            help,
            label_name,
            rows.iter().map(|(r, st)| (label(r), f(st))),
        );
    }
}

/// What each leased rule's leases did (`[backend] leases = "auto"`), by rule: a series per
/// rule whose limits are leased, never per key.
fn leases(o: &mut Exposition, s: &Server) {
    let all = s.checks.backends.lease_stats();
    if all.is_empty() {
        return;
    }
    families(o, "rule", &all, &[
        ("turnstile_lease_checks_total", "counter", "Checks of a leased rule.", |x| x.checks),
        ("turnstile_lease_local_total", "counter", "Of them, answered in this process (from a lease, or a denial Redis gave until its retry).", |x| x.local),
        ("turnstile_lease_round_trips_total", "counter", "Calls to Redis for a leased rule: one-by-one checks, lease calls, give-backs.", |x| x.round_trips),
        ("turnstile_lease_granted_total", "counter", "Admissions leased beyond the requests that fetched them.", |x| x.granted),
        ("turnstile_lease_returned_total", "counter", "Admissions given back to Redis unspent.", |x| x.returned),
        ("turnstile_lease_stranded_total", "counter", "Admissions held when their lease ended, not given back: counted in Redis, admitted nowhere.", |x| x.stranded),
        ("turnstile_lease_keys", "gauge", "Keys in a leased rule's lease table.", |x| x.keys),
    ]);
}

/// The counters of the limits classes whose entries are in Redis.
fn limits_in_redis(o: &mut Exposition) {
    let all = crate::redis_limits::stats();
    if all.is_empty() {
        return;
    }
    families(o, "class", &all, &[
        ("turnstile_limits_redis_unknown_total", "counter", "Lookups of a key whose bucket was not cached yet: the rule's defaults applied to that request.", |s| s.unknown),
        ("turnstile_limits_redis_fetches_total", "counter", "Buckets of entries fetched from Redis.", |s| s.fetches),
        ("turnstile_limits_redis_fetch_errors_total", "counter", "Fetch pipelines that failed (Redis away or slow).", |s| s.fetch_errors),
        ("turnstile_limits_redis_dropped_total", "counter", "Fetch requests dropped: the queue full, or Redis away.", |s| s.dropped),
        ("turnstile_limits_redis_invalidations_total", "counter", "Invalidations pushed by Redis (a bucket changed).", |s| s.invalidations),
        ("turnstile_limits_redis_reconnects_total", "counter", "Connections to Redis made again after a loss.", |s| s.reconnects),
        ("turnstile_limits_redis_bad_entries_total", "counter", "Entries in Redis the class cannot read, skipped (their keys get the defaults).", |s| s.bad_entries),
        ("turnstile_limits_redis_cached_entries", "gauge", "Entries in the cached buckets.", |s| s.cached_entries),
    ]);
}

/// Each rule's limits: five series per limit (and per `override`, `own` row), never per key.
fn rule_limits(o: &mut Exposition, e: &crate::snapshot::RulesEngine, names: &[String]) {
    const NAME: &str = "turnstile_rule_limit_events_total";
    o.head(NAME, "counter", "What each limit of each rule decided, as the binding limit of a check (the one with the least left, or the one that denied): checks, admitted, denied, shadow_denied (a shadow rule would have denied), near_limit (admitted with less than 1 - --near-limit of the limit left). limit is the position in the rule's limits, override (keys with an override) or own (keys with their own limit). Peeks are not counted.");
    for n in names {
        let Some(rows) = e.limit_stats(n) else {
            continue;
        };
        let n = label(n);
        for l in rows {
            for (k, v) in [
                ("checks", l.checks),
                ("admitted", l.admitted),
                ("denied", l.denied),
                ("shadow_denied", l.shadow_denied),
                ("near_limit", l.near_limit),
            ] {
                o.sample(
                    NAME,
                    &format!("rule=\"{n}\",limit=\"{}\",event=\"{k}\"", l.limit),
                    v,
                );
            }
        }
    }
}
