//! `turnstile bench serve` and `turnstile bench ab` with the real programs they drive
//! (redis-server, redis-benchmark, wrk; installed by .ci/run), on a tiny bounded workload: the
//! figures are read back from those programs' real output, every row is there, and a wrong
//! option is a clear error before anything starts.

use serde_json::Value;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_turnstile");

/// Runs `turnstile bench ARGS --json` and returns its rows.
fn rows(args: &[&str]) -> Vec<Value> {
    let out = Command::new(BIN)
        .arg("bench")
        .args(args)
        .args([
            "--keys",
            "1k",
            "--requests",
            "20k",
            "--requests-p1",
            "500",
            "--rounds",
            "1",
        ])
        .arg("--json")
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .output()
        .expect("turnstile runs");
    assert!(
        out.status.success(),
        "turnstile bench {args:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
    doc["results"].as_array().expect("results").clone()
}

fn labels(rows: &[Value]) -> Vec<(String, Option<u64>)> {
    rows.iter()
        .map(|r| {
            (
                r["label"].as_str().unwrap().to_string(),
                r["pipeline"].as_u64(),
            )
        })
        .collect()
}

#[test]
fn serve_measures_turnstile_beside_redis_over_resp_and_http() {
    let rows = rows(&["serve", "--runtime", "per-core", "--http-seconds", "1"]);
    assert_eq!(
        labels(&rows),
        [
            ("redis-server INCR".into(), Some(1)),
            ("turnstile CL.THROTTLE (per-core)".into(), Some(1)),
            ("redis-server INCR".into(), Some(16)),
            ("turnstile CL.THROTTLE (per-core)".into(), Some(16)),
            ("turnstile POST /v1/check (per-core)".into(), None),
        ]
    );
    for r in &rows {
        for field in ["requests_per_sec", "p99_ms", "per_server_cpu_sec"] {
            let v = r[field].as_f64().unwrap();
            assert!(v.is_finite() && v > 0.0, "{field} of {r}");
        }
    }
}

#[test]
fn ab_compares_builds_with_redis_in_every_round() {
    let rows = rows(&["ab", BIN, BIN]);
    let l = labels(&rows);
    assert_eq!(l.len(), 3, "{l:?}");
    assert_eq!(l[0], ("redis-server INCR".into(), Some(16)));
    assert!(
        l[1].0.starts_with("A ") && l[2].0.starts_with("B "),
        "{l:?}"
    );
}

#[test]
fn wrong_options_are_refused_before_anything_starts() {
    for (args, says) in [
        (&["serve", "--pipeline", "0"][..], "--pipeline"),
        (&["serve", "--server-core", "1"][..], "two different cores"),
        (&["serve", "--rules", "/nonexistent.toml"][..], "--rules"),
        (
            &[
                "serve",
                "--http-seconds",
                "0",
                "--runtime",
                "uring,uring:20ms",
            ][..],
            "`uring:20ms`: invalid value '20ms' for '--coalesce",
        ),
        (&["ab", "/nonexistent/turnstile"][..], "no such build"),
    ] {
        let out = Command::new(BIN).arg("bench").args(args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
}
