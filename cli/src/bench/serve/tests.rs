//! The report's rows and ratios.

use super::*;

fn row(label: &str, p: Option<usize>, rps: f64, cpu: f64) -> ServiceRow {
    ServiceRow {
        label: label.into(),
        pipeline: p,
        requests_per_sec: rps,
        p99_ms: 1.0,
        per_server_cpu_sec: cpu,
        server_on_cpu: 1.0,
        client_on_cpu: 1.0,
        rounds: 3,
    }
}

#[test]
fn each_turnstile_row_is_set_against_the_peers_of_its_depth() {
    let rows = [
        row("redis-server INCR", Some(16), 300e3, 400e3),
        row("redis-cell CL.THROTTLE", Some(16), 100e3, 120e3),
        row("turnstile CL.THROTTLE (per-core)", Some(16), 600e3, 800e3),
        row("redis-server INCR", Some(1), 30e3, 90e3),
        row("turnstile CL.THROTTLE (per-core)", Some(1), 33e3, 180e3),
        row("turnstile POST /v1/check (per-core)", None, 80e3, 90e3),
        row("axum hello world (POST /)", None, 100e3, 100e3),
    ];
    let r = ratios(&rows, &[INCR, CELL]);
    assert_eq!(r.len(), 4, "{r:#?}");
    assert!(
        r[0].contains("-P 16 / redis-server INCR: 2.00x req/s, 2.00x"),
        "{}",
        r[0]
    );
    assert!(
        r[1].contains("-P 16 / redis-cell CL.THROTTLE: 6.00x req/s, 6.67x"),
        "{}",
        r[1]
    );
    assert!(
        r[2].contains("-P 1 / redis-server INCR: 1.10x req/s, 2.00x"),
        "{}",
        r[2]
    );
    assert!(
        r[3].contains("/v1/check (per-core) / axum hello world (POST /): 0.80x"),
        "{}",
        r[3]
    );
}

#[test]
fn an_ab_sets_each_build_against_the_first() {
    let rows = [
        row(INCR, Some(16), 300e3, 400e3),
        row("A /tmp/a", Some(16), 600e3, 800e3),
        row("B /tmp/b", Some(16), 660e3, 1000e3),
    ];
    let r = ratios(&rows, &[INCR, "A /tmp/a"]);
    assert_eq!(r.len(), 3, "{r:#?}");
    assert!(
        r[2].contains("B /tmp/b -P 16 / A /tmp/a: 1.10x req/s, 1.25x"),
        "{}",
        r[2]
    );
}

#[test]
fn rounds_fold_into_medians() {
    let s = |rps: f64, cpu: f64| Sample {
        load: Load {
            rps,
            requests: 1000.0,
            p99_us: rps / 10.0,
        },
        server_cpu: cpu,
        client_cpu: 0.5,
        wall: 1.0,
    };
    let r = fold(
        "x",
        Some(16),
        &[s(100.0, 0.5), s(300.0, 0.25), s(200.0, 1.0)],
    );
    assert_eq!(
        (r.requests_per_sec, r.p99_ms, r.per_server_cpu_sec),
        (200.0, 0.02, 2000.0)
    );
    assert_eq!((r.server_on_cpu, r.client_on_cpu, r.rounds), (0.5, 0.5, 3));
}
