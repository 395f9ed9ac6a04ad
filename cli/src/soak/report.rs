//! The soak's report: what a run measured, summed up against the targets ([`targets`]), as
//! JSON (printed as is with `--json`, or as text by `text::print`).

mod targets;

use super::attack::{self, Proto};
use super::bound::Bound;
use super::check::{metric_checks, KeyCheck};
use super::honest::{HonestRun, Recorder, Seen};
use super::logs::Log;
use super::{mib, p, Sample, Shared, SoakArgs, PHASES};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use turnstile_server::ServeArgs;

/// What one soak measured.
pub(super) struct Run {
    pub pid: Option<u32>,
    pub flags: ServeArgs,
    pub flags_read: bool,
    /// The load average at the start and at the end.
    pub load: [Option<f64>; 2],
    /// RSS: idle (the quiet run's median), VmHWM after the attack (valid if `peak_reset`),
    /// after the settle.
    pub idle: Option<u64>,
    pub hwm: Option<u64>,
    pub peak_reset: bool,
    pub after: Option<u64>,
    /// The server's descriptors: idle (the quiet run's median), and once settled.
    pub fds: [Option<u64>; 2],
    /// `/metrics` before the quiet run and after the settle.
    pub before: Option<HashMap<String, f64>>,
    pub metrics_after: Option<HashMap<String, f64>>,
    pub seen: HonestRun,
    pub keys: KeyCheck,
    pub alive: bool,
    /// The `panicked` lines of the server's log (`None`: not read).
    pub panicked: Option<Vec<String>>,
    /// The server's log as read during the run (`None`: no `--server-log`).
    pub log: Option<Log>,
    pub samples: Vec<Sample>,
}

/// The server's memory, from the samples.
struct Memory {
    idle: Option<u64>,
    peak: Option<u64>,
    after: Option<u64>,
    growth: Option<u64>,
    settle_ratio: Option<f64>,
    peak_buffers: Option<f64>,
    peak_deferred: Option<f64>,
    peak_conns: Option<f64>,
    kernel_idle: Option<u64>,
    kernel_peak: Option<u64>,
    queues_peak: Option<(u64, u64)>,
}

impl Memory {
    fn of(r: &Run) -> Self {
        let samples = &r.samples;
        let in_attack = |s: &&Sample| s.phase == 1;
        let sampled_peak = samples.iter().filter(in_attack).filter_map(|s| s.rss).max();
        let peak = match (sampled_peak, r.hwm.filter(|_| r.peak_reset)) {
            (Some(x), Some(y)) => Some(x.max(y)),
            (x, y) => x.or(y),
        };
        let max_of = |f: fn(&Sample) -> Option<f64>| {
            samples
                .iter()
                .filter(in_attack)
                .filter_map(f)
                .fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x))))
        };
        Self {
            idle: r.idle,
            peak,
            after: r.after,
            growth: match (r.idle, peak) {
                (Some(i), Some(p)) => Some(p.saturating_sub(i)),
                _ => None,
            },
            settle_ratio: match (r.idle, r.after) {
                (Some(i), Some(x)) if i > 0 => Some((x as f64 - i as f64) / i as f64),
                _ => None,
            },
            peak_buffers: max_of(|s| s.buffers),
            peak_deferred: max_of(|s| s.deferred),
            peak_conns: max_of(|s| s.resp_connections),
            kernel_idle: samples
                .iter()
                .filter(|s| s.phase == 0)
                .filter_map(|s| s.kernel_tcp)
                .min(),
            kernel_peak: samples
                .iter()
                .filter(in_attack)
                .filter_map(|s| s.kernel_tcp)
                .max(),
            queues_peak: samples
                .iter()
                .filter(in_attack)
                .filter_map(|s| s.server_queues)
                .fold(None, |m: Option<(u64, u64)>, (t, r)| {
                    Some(m.map_or((t, r), |(a, b)| (a.max(t), b.max(r))))
                }),
        }
    }

    fn json(&self, bound: &Bound, peak_from_vmhwm: bool, server_bound: Option<Value>) -> Value {
        json!({
            "idle_rss_mib": self.idle.map(mib),
            "peak_rss_mib": self.peak.map(mib),
            "peak_from_vmhwm": peak_from_vmhwm,
            "after_settle_rss_mib": self.after.map(mib),
            "growth_mib": self.growth.map(mib),
            "after_settle_vs_idle": self.settle_ratio,
            "peak_resp_buffer_mib": self.peak_buffers.map(|b| b / (1 << 20) as f64),
            "peak_resp_deferred_mib": self.peak_deferred.map(|b| b / (1 << 20) as f64),
            "peak_resp_connections": self.peak_conns,
            "kernel_tcp_idle_mib": self.kernel_idle.map(mib),
            "kernel_tcp_peak_mib": self.kernel_peak.map(mib),
            "server_send_queues_peak_mib": self.queues_peak.map(|q| mib(q.0)),
            "server_receive_queues_peak_mib": self.queues_peak.map(|q| mib(q.1)),
            "bound": {
                "per_resp_connection_kib": bound.per_resp as f64 / 1024.0,
                "per_http_connection_kib": bound.per_http as f64 / 1024.0,
                "per_http2_connection_kib": bound.per_h2 as f64 / 1024.0,
                "http2_max_streams": bound.max_streams,
                "bodies_mib": mib(bound.bodies),
                "deferred_mib": mib(bound.deferred),
                "resp_connections": bound.resp_connections,
                "http_connections": bound.http_connections,
                "http2_connections": bound.h2_connections,
                "connections_mib": mib(bound.connections()),
                "stores_mib": mib(bound.stores),
                "total_mib": mib(bound.total()),
            },
            "server_stated_bound_mib": server_bound,
        })
    }
}

/// The report of run `r` of `a`, the honest latencies and the attackers' counts in `sh`.
pub(super) fn build(a: &SoakArgs, r: &Run, sh: &Shared) -> Value {
    let m = Memory::of(r);
    let st = &sh.attack;
    let peak = |p: Proto| st.proto(p).peak();
    let resp_conns = m
        .peak_conns
        .map_or(peak(Proto::Resp) + u64::from(a.honest_resp) + 2, |c| {
            c as u64
        });
    // The honest clients, the sampler's /metrics and the preflight's connection.
    let http_conns = peak(Proto::Http) + peak(Proto::Admin) + u64::from(a.honest_http) + 2;
    let h2_conns = peak(Proto::HttpH2) + peak(Proto::Grpc) + u64::from(a.honest_grpc);
    let bound = Bound::of(&r.flags, resp_conns, http_conns, h2_conns);
    let metric_checks = metric_checks(r.before.as_ref(), r.metrics_after.as_ref(), &r.seen, st);
    let targets = targets::all(a, r, sh, &m, &bound, &metric_checks);
    let peak_from_vmhwm = r.peak_reset;
    let lat = |rec: &Recorder| json!({ "quiet": latency(rec, 0), "attack": latency(rec, 1), "settle": latency(rec, 2) });
    let keys = &r.keys;
    let count = |on: Option<std::net::SocketAddr>, n: u32| if on.is_some() { n } else { 0 };
    json!({
        "target": a.target.to_string(),
        "http": a.http.map(|h| h.to_string()),
        "grpc": a.grpc.map(|h| h.to_string()),
        "admin": a.admin.map(|h| h.to_string()),
        "pid": r.pid,
        "flags_read": r.flags_read,
        "connections": a.connections,
        "seconds": a.seconds.as_secs_f64(),
        "quiet_seconds": a.quiet.as_secs_f64(),
        "settle_seconds": a.settle.as_secs_f64(),
        "honest_clients": { "resp": a.honest_resp, "http": count(a.http, a.honest_http), "grpc": count(a.grpc, a.honest_grpc), "every_ms": a.every.as_secs_f64() * 1e3 },
        "load_average": { "start": r.load[0], "end": r.load[1] },
        "server": per_phase(&r.samples),
        "memory": m.json(&bound, peak_from_vmhwm, server_bound(r.before.as_ref())),
        "descriptors": descriptors(r),
        "log": log(r.log.as_ref()),
        "latency": { "resp": lat(&sh.resp_rec), "http": lat(&sh.http_rec), "grpc": lat(&sh.grpc_rec), "client_wakeup_late": lat(&sh.late_rec) },
        "honest": { "resp": seen(&r.seen.resp), "http": seen(&r.seen.http), "grpc": seen(&r.seen.grpc) },
        "keys": { "checked": keys.keys, "admissions_seen": keys.seen, "consumed": keys.consumed, "mismatches": keys.mismatches },
        "metrics": metric_checks,
        "attacks": attacks(st),
        "attacking_connections_peak": Proto::ALL.iter().map(|p| (p.name(), peak(*p))).collect::<std::collections::BTreeMap<_, _>>(),
        "targets": targets,
        "samples": r.samples,
    })
}

/// The server's descriptors: idle, at the attack's peak, once settled.
fn descriptors(r: &Run) -> Value {
    let peak = r
        .samples
        .iter()
        .filter(|s| s.phase == 1)
        .filter_map(|s| s.fds)
        .max();
    json!({ "idle": r.fds[0], "peak": peak, "after_settle": r.fds[1] })
}

/// The server's log: its lines, and the kinds of message with the most in one second.
fn log(l: Option<&Log>) -> Value {
    let Some(l) = l.filter(|l| l.readable) else {
        return Value::Null;
    };
    let worst: Vec<Value> = l
        .worst()
        .iter()
        .take(8)
        .map(|(k, c)| json!({ "kind": k, "lines": c.lines, "max_per_second": c.max() }))
        .collect();
    json!({ "lines": l.lines, "kinds": l.kinds.len(), "skipped_bytes": l.skipped_bytes, "worst": worst })
}

/// Per phase: the server's CPU share (of one core) and RESP commands per second.
fn per_phase(samples: &[Sample]) -> Vec<Value> {
    (0..PHASES.len())
        .map(|ph| {
            let v: Vec<&Sample> = samples.iter().filter(|s| s.phase == ph).collect();
            // Between the phase's first and last samples that have the figure (a /metrics
            // not read within its wait leaves a sample without it).
            let rate = |f: fn(&Sample) -> Option<f64>| {
                let mut got = v.iter().filter_map(|s| Some((s.t, f(s)?)));
                let a = got.next()?;
                let b = got.next_back()?;
                let dt = b.0 - a.0;
                (dt > 0.0).then(|| (b.1 - a.1) / dt)
            };
            json!({ "phase": PHASES[ph], "server_cpu": rate(|s| s.cpu), "resp_commands_per_s": rate(|s| s.commands) })
        })
        .collect()
}

/// What the server states itself (turnstile_memory_bound_bytes, by part).
fn server_bound(before: Option<&HashMap<String, f64>>) -> Option<Value> {
    before.map(|m| {
        let part = |p: &str| {
            m.get(&format!("turnstile_memory_bound_bytes{{part=\"{p}\"}}"))
                .map(|v| v / (1 << 20) as f64)
        };
        json!({
            "resp_connections": part("resp_connections"),
            "deferred": part("deferred"),
            "throttle_store": part("throttle_store"),
        })
    })
}

fn latency(r: &Recorder, ph: usize) -> Value {
    let h = r.phase(ph);
    json!({ "requests": h.len(), "p50_ms": p(&h, 0.5), "p99_ms": p(&h, 0.99), "p999_ms": p(&h, 0.999), "max_ms": p(&h, 1.0) })
}

fn sum(v: &[Seen], f: fn(&Seen) -> u64) -> u64 {
    v.iter().map(f).sum::<u64>()
}

/// What the honest clients of one kind saw.
fn seen(v: &[Seen]) -> Value {
    let samples: Vec<String> = v.iter().flat_map(|s| s.samples.clone()).take(5).collect();
    json!({ "allowed": sum(v, |s| s.allowed), "denied": sum(v, |s| s.denied), "errors": sum(v, |s| s.errors), "samples": samples })
}

/// What the server did to each kind of attacker.
fn attacks(st: &attack::Stats) -> Vec<Value> {
    st.kinds
        .iter()
        .filter(|(_, k)| k.tasks.load(Ordering::Relaxed) > 0)
        .map(|(kind, k)| {
            json!({
                "kind": kind.name(),
                "flag": kind.flag(),
                "tasks": k.tasks.load(Ordering::Relaxed),
                "connections": k.connections.load(Ordering::Relaxed),
                "ops": k.ops.load(Ordering::Relaxed),
                "longest_connection_s": k.longest_ms.load(Ordering::Relaxed) as f64 / 1e3,
                "sent_mib": mib(k.bytes_sent.load(Ordering::Relaxed)),
                "outcomes": *k.outcomes.lock().expect("not poisoned"),
                "unexpected": k.unexpected.load(Ordering::Relaxed),
                "connect_errors": k.connect_errors.load(Ordering::Relaxed),
                "samples": *k.samples.lock().expect("not poisoned"),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(t: f64, phase: usize, cpu: f64, commands: Option<f64>) -> Sample {
        Sample {
            t,
            phase,
            rss: None,
            buffers: None,
            deferred: None,
            resp_connections: None,
            kernel_tcp: None,
            server_queues: None,
            p99_resp_ms: None,
            p99_http_ms: None,
            p99_grpc_ms: None,
            fds: None,
            log_lines_per_s: None,
            attack_open: 0,
            cpu: Some(cpu),
            commands,
        }
    }

    #[test]
    fn a_phase_rate_skips_the_samples_without_the_figure() {
        let v = vec![
            sample(0.0, 1, 0.0, None),
            sample(1.0, 1, 0.5, Some(100.0)),
            sample(3.0, 1, 1.5, Some(500.0)),
            sample(4.0, 1, 2.0, None),
        ];
        let out = per_phase(&v);
        assert_eq!(out[1]["server_cpu"], json!(0.5));
        assert_eq!(out[1]["resp_commands_per_s"], json!(200.0));
        // One sample with it: no rate.
        let one = vec![sample(0.0, 2, 0.0, Some(1.0)), sample(1.0, 2, 1.0, None)];
        assert_eq!(per_phase(&one)[2]["resp_commands_per_s"], Value::Null);
    }
}
