//! The soak's report as text (the JSON report read back, so that both say the same).

use super::PHASES;
use serde_json::{json, Value};

fn f(v: &Value) -> String {
    v.as_f64().map_or("?".to_string(), |x| format!("{x:.1}"))
}

fn f2(v: &Value) -> String {
    v.as_f64().map_or("?".to_string(), |x| format!("{x:.2}"))
}

/// Prints the report `r` (as built by `report::build`).
pub(super) fn print(r: &Value) {
    println!(
        "turnstile soak: {} (pid {}), {} attacking connections for {} s; load average {} at the start, {} at the end",
        r["target"].as_str().unwrap_or("?"),
        r["pid"],
        r["connections"],
        r["seconds"],
        f2(&r["load_average"]["start"]),
        f2(&r["load_average"]["end"]),
    );
    println!();
    memory(r);
    descriptors_and_log(r);
    println!();
    latency(r);
    println!();
    attacks(r);
    println!();
    checks(r);
    println!();
    targets(r);
}

/// The server's memory against the bound, its CPU and commands per phase.
fn memory(r: &Value) {
    let m = &r["memory"];
    println!(
        "server RSS: idle {} MiB, peak {} MiB (+{} MiB{}), {} MiB after the {} s settle ({})",
        f(&m["idle_rss_mib"]),
        f(&m["peak_rss_mib"]),
        f(&m["growth_mib"]),
        if m["peak_from_vmhwm"] == json!(true) {
            ", VmHWM"
        } else {
            ", sampled"
        },
        f(&m["after_settle_rss_mib"]),
        r["settle_seconds"],
        m["after_settle_vs_idle"]
            .as_f64()
            .map_or("?".into(), |x| format!("{:+.1} % of idle", x * 100.0)),
    );
    let b = &m["bound"];
    println!(
        "bound: {} RESP connections x {} KiB + {} MiB deferred + {} HTTP connections x {} KiB + {} HTTP/2 and gRPC connections x {} KiB ({} streams) + {} MiB of bodies = {} MiB, + CL.THROTTLE store {} MiB",
        b["resp_connections"], f(&b["per_resp_connection_kib"]), f(&b["deferred_mib"]), b["http_connections"], f(&b["per_http_connection_kib"]), b["http2_connections"], f(&b["per_http2_connection_kib"]), b["http2_max_streams"], f(&b["bodies_mib"]), f(&b["connections_mib"]), f(&b["stores_mib"]),
    );
    let sb = &m["server_stated_bound_mib"];
    if !sb.is_null() {
        println!(
            "the server's own bound (turnstile_memory_bound_bytes): RESP connections {} MiB (at --max-connections), deferred {} MiB, CL.THROTTLE store {} MiB",
            f(&sb["resp_connections"]),
            f(&sb["deferred"]),
            f(&sb["throttle_store"]),
        );
    }
    println!(
        "RESP buffers at peak {} MiB, deferred {} MiB, {} RESP connections",
        f(&m["peak_resp_buffer_mib"]),
        f(&m["peak_resp_deferred_mib"]),
        m["peak_resp_connections"],
    );
    println!(
        "kernel: the server's sockets queue at most {} MiB to send, {} MiB received; all TCP buffers of the machine (attackers' ends included) {} MiB idle, {} MiB peak",
        f(&m["server_send_queues_peak_mib"]),
        f(&m["server_receive_queues_peak_mib"]),
        f(&m["kernel_tcp_idle_mib"]),
        f(&m["kernel_tcp_peak_mib"]),
    );
    for ph in r["server"].as_array().into_iter().flatten() {
        println!(
            "server {}: CPU {} of a core, {} RESP commands/s",
            ph["phase"].as_str().unwrap_or("?"),
            ph["server_cpu"]
                .as_f64()
                .map_or("?".into(), |c| format!("{:.0} %", c * 100.0)),
            ph["resp_commands_per_s"]
                .as_f64()
                .map_or("?".into(), |c| format!("{c:.0}")),
        );
    }
}

/// The server's descriptors and its log's busiest kinds of message.
fn descriptors_and_log(r: &Value) {
    let d = &r["descriptors"];
    println!(
        "server descriptors: {} idle, {} at the attack's peak, {} after the settle",
        d["idle"], d["peak"], d["after_settle"]
    );
    let l = &r["log"];
    if l.is_null() {
        return;
    }
    println!(
        "server log: {} lines of {} kinds while the soak ran; the most in one second:",
        l["lines"], l["kinds"]
    );
    for k in l["worst"].as_array().into_iter().flatten().take(5) {
        println!(
            "  {:>7}/s {:>9} lines  {}",
            k["max_per_second"],
            k["lines"],
            k["kind"]
                .as_str()
                .unwrap_or("?")
                .chars()
                .take(110)
                .collect::<String>()
        );
    }
}

/// The honest clients' latencies and errors per phase.
fn latency(r: &Value) {
    println!(
        "{:<28} {:>9} {:>8} {:>8} {:>8} {:>8}",
        "honest latency (ms)", "requests", "p50", "p99", "p99.9", "max"
    );
    for (proto, name) in [
        ("resp", "CL.THROTTLE"),
        ("http", "POST /v1/check"),
        ("grpc", "gRPC ShouldRateLimit"),
        ("client_wakeup_late", "soak's own wake-up delay"),
    ] {
        for ph in PHASES {
            let l = &r["latency"][proto][ph];
            if l["requests"] == json!(0) {
                continue;
            }
            println!(
                "{:<28} {:>9} {:>8} {:>8} {:>8} {:>8}",
                format!("{name} {ph}"),
                l["requests"],
                f2(&l["p50_ms"]),
                f2(&l["p99_ms"]),
                f2(&l["p999_ms"]),
                f2(&l["max_ms"]),
            );
        }
    }
    let h = &r["honest"];
    println!(
        "honest errors (all phases): RESP {}, HTTP {}, gRPC {}",
        h["resp"]["errors"], h["http"]["errors"], h["grpc"]["errors"]
    );
}

/// What the server did to each kind of attacker.
fn attacks(r: &Value) {
    println!(
        "{:<28} {:>6} {:>8} {:>8} {:>9} {:>8} {:>6}  outcomes",
        "attack", "tasks", "conns", "ops", "sent MiB", "longest", "unexp"
    );
    for k in r["attacks"].as_array().into_iter().flatten() {
        let outcomes = k["outcomes"]
            .as_object()
            .map(|o| {
                o.iter()
                    .map(|(l, n)| format!("{n} {l}"))
                    .collect::<Vec<_>>()
                    .join("; ")
            })
            .unwrap_or_default();
        println!(
            "{:<28} {:>6} {:>8} {:>8} {:>9} {:>7}s {:>6}  {outcomes}",
            k["kind"].as_str().unwrap_or("?"),
            k["tasks"].to_string(),
            k["connections"].to_string(),
            k["ops"].to_string(),
            f(&k["sent_mib"]),
            f(&k["longest_connection_s"]),
            k["unexpected"].to_string()
        );
        for s in k["samples"].as_array().into_iter().flatten() {
            println!("{:<28} {}", "", s.as_str().unwrap_or("?"));
        }
        if k["connect_errors"] != json!(0) {
            println!(
                "{:<28} {} connections refused or failed",
                "", k["connect_errors"]
            );
        }
    }
}

/// The honest keys and `/metrics` against what the clients saw, and their errors.
fn checks(r: &Value) {
    let k = &r["keys"];
    println!(
        "honest keys: {} checked, {} admissions seen, {} consumed",
        k["checked"], k["admissions_seen"], k["consumed"]
    );
    for m in k["mismatches"].as_array().into_iter().flatten() {
        println!("  MISMATCH {}", m.as_str().unwrap_or("?"));
    }
    for c in r["metrics"].as_array().into_iter().flatten() {
        println!(
            "  {} {}: {} (expected {}..{})",
            if c["ok"] == json!(true) {
                "ok"
            } else if c["ok"] == json!(false) {
                "MISMATCH"
            } else {
                "-"
            },
            c["check"].as_str().unwrap_or("?"),
            c["delta"],
            c["expected_from"],
            c["expected_to"]
        );
    }
    for proto in ["resp", "http", "grpc"] {
        for s in r["honest"][proto]["samples"]
            .as_array()
            .into_iter()
            .flatten()
        {
            println!("  honest {proto} error: {}", s.as_str().unwrap_or("?"));
        }
    }
}

/// Each target, met or missed, with its figure.
fn targets(r: &Value) {
    for t in r["targets"].as_array().into_iter().flatten() {
        let mark = match t["met"].as_bool() {
            Some(true) => "met",
            Some(false) => "MISSED",
            None => "not measured",
        };
        println!(
            "{:<56} {:<13} {}",
            t["target"].as_str().unwrap_or("?"),
            mark,
            t["figure"].as_str().unwrap_or("")
        );
    }
}
