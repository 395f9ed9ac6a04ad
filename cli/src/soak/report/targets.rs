//! The soak's targets, each met, missed or not measured (`None`), with its figure: memory
//! (peak within the bound and 256 MiB, back near idle after the settle), descriptors back to
//! idle, the honest p99 per protocol, no panic, nothing admitted lost, no honest errors, and
//! the server's log lines per second per kind of message.

use super::super::{mib, p, SoakArgs, MAX_GROWTH, MAX_LOG_PER_SECOND, MAX_P99_MS, SETTLE_WITHIN};
use super::{sum, Bound, Memory, Run, Shared};
use serde_json::{json, Value};

/// One target.
fn target(name: &str, met: Option<bool>, figure: String) -> Value {
    json!({ "target": name, "met": met, "figure": figure })
}

/// Every target of run `r` of `a`.
pub(super) fn all(
    a: &SoakArgs,
    r: &Run,
    sh: &Shared,
    m: &Memory,
    bound: &Bound,
    metric_checks: &[Value],
) -> Vec<Value> {
    let mut targets = memory(a, m, bound);
    targets.push(descriptors(r));
    targets.extend(latency(a, sh));
    let (keys, alive, panicked) = (&r.keys, r.alive, &r.panicked);
    targets.push(target(
        "no panic",
        Some(alive && panicked.as_ref().is_none_or(Vec::is_empty)),
        format!(
            "server {}{}",
            if alive { "alive" } else { "gone" },
            match panicked {
                None => ", log not read".to_string(),
                Some(v) if v.is_empty() => ", no panic in its log".to_string(),
                Some(v) => format!(": {}", v.join(" | ")),
            }
        ),
    ));
    targets.push(target(
        "nothing admitted lost",
        Some(keys.mismatches.is_empty() && metric_checks.iter().all(|c| c["ok"] != json!(false))),
        format!(
            "{} keys: {} admissions seen, {} consumed; {} mismatches",
            keys.keys,
            keys.seen,
            keys.consumed,
            keys.mismatches.len()
        ),
    ));
    let errors = |v| sum(v, |s| s.errors);
    let (resp, http, grpc) = (
        errors(&r.seen.resp),
        errors(&r.seen.http),
        errors(&r.seen.grpc),
    );
    targets.push(target(
        "no honest errors",
        Some(resp + http + grpc == 0),
        format!(
            "{} errors: RESP {resp}, HTTP {http}, gRPC {grpc}",
            resp + http + grpc
        ),
    ));
    targets.push(log_rate(r));
    targets
}

/// The honest p99 under attack, per protocol that had honest clients.
fn latency(a: &SoakArgs, sh: &Shared) -> Vec<Value> {
    let mut targets = Vec::new();
    let p99_attack = [
        (
            "honest CL.THROTTLE p99 under attack <= 10 ms",
            &sh.resp_rec,
            true,
        ),
        (
            "honest POST /v1/check p99 under attack <= 10 ms",
            &sh.http_rec,
            a.http.is_some() && a.honest_http > 0,
        ),
        (
            "honest gRPC ShouldRateLimit p99 under attack <= 10 ms",
            &sh.grpc_rec,
            a.grpc.is_some() && a.honest_grpc > 0,
        ),
    ];
    for (name, rec, on) in p99_attack {
        if !on {
            continue;
        }
        let v = p(&rec.phase(1), 0.99);
        targets.push(target(
            name,
            v.map(|x| x <= MAX_P99_MS),
            v.map_or("no answer under attack".into(), |x| format!("{x:.2} ms")),
        ));
    }
    targets
}

/// The memory targets: the peak within the bound and 256 MiB, back near idle after the
/// settle.
fn memory(a: &SoakArgs, m: &Memory, bound: &Bound) -> Vec<Value> {
    let growth = m.growth;
    let growth_mib = growth.map_or("?".into(), |g| format!("{:.1}", mib(g)));
    vec![
        target(
            "peak RSS <= idle + the documented bound",
            growth.map(|g| g <= bound.total()),
            format!(
                "+{growth_mib} MiB against +{:.1} MiB (connections {:.1} MiB + CL.THROTTLE store {:.1} MiB)",
                mib(bound.total()),
                mib(bound.connections()),
                mib(bound.stores)
            ),
        ),
        target(
            "peak RSS <= idle + 256 MiB",
            growth.map(|g| g <= MAX_GROWTH),
            format!("+{growth_mib} MiB"),
        ),
        target(
            "RSS within 10 % of idle after the settle",
            m.settle_ratio.map(|r| r.abs() <= SETTLE_WITHIN),
            format!(
                "{} after {:?}",
                m.settle_ratio
                    .map_or("?".into(), |r| format!("{:+.1} %", r * 100.0)),
                a.settle
            ),
        ),
    ]
}

/// The server's descriptors after the settle: no more than idle.
fn descriptors(r: &Run) -> Value {
    let [idle, after] = r.fds;
    target(
        "server descriptors back to idle after the settle",
        idle.zip(after).map(|(i, x)| x <= i),
        match (idle, after) {
            (Some(i), Some(x)) => format!("{i} idle, {x} after the settle"),
            _ => "not read (no --pid, or /proc/PID/fd not readable)".into(),
        },
    )
}

/// The most lines of one kind of message in one second of the server's log.
fn log_rate(r: &Run) -> Value {
    let name = "server log lines per second per kind of message <= 10";
    let Some(log) = r.log.as_ref().filter(|l| l.readable) else {
        return target(name, None, "no --server-log".into());
    };
    let worst = log.worst();
    match worst.first() {
        None => target(name, Some(true), "no line".into()),
        Some((kind, c)) => target(
            name,
            Some(c.max() <= MAX_LOG_PER_SECOND),
            format!(
                "{} lines; the most: {}/s of `{kind:.120}`{}",
                log.lines,
                c.max(),
                if log.skipped_bytes > 0 {
                    format!(" ({} MiB of log skipped unread)", log.skipped_bytes >> 20)
                } else {
                    String::new()
                }
            ),
        ),
    }
}
