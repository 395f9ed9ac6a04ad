//! `turnstile bench scale` and `turnstile bench report` end to end with the real binary and
//! the programs they drive (redis-server, redis-benchmark, wrk, taskset), on their smallest
//! bounded workloads: the tables are printed and written, the plots drawn, every part of the
//! page is there.

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_turnstile");

fn root() -> &'static str {
    concat!(env!("CARGO_MANIFEST_DIR"), "/..")
}

#[test]
fn scale_prints_every_size_beside_governor_and_the_floor() {
    let dir = std::env::temp_dir().join(format!("turnstile-scale-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let svg = dir.join("scale.svg");
    let out = Command::new(BIN)
        .args(["bench", "scale", "--max-keys", "10k", "--quick", "--plot"])
        .arg(&svg)
        .output()
        .expect("turnstile runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}\n{text}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    for size in ["1k", "10k"] {
        for d in ["uniform", "zipf"] {
            let line = text
                .lines()
                .find(|l| l.starts_with(&format!("{size:<6} {d:<8}")))
                .unwrap_or_else(|| panic!("no {size} {d} line in:\n{text}"));
            // turnstile, batch, governor, both floors and the bytes per key are figures.
            let cols: Vec<&str> = line.split_whitespace().collect();
            assert_eq!(cols.len(), 12, "{line}");
            for c in [2, 3, 4, 5, 6, 10, 11] {
                assert!(
                    cols[c].parse::<f64>().is_ok_and(|x| x > 0.0),
                    "column {c} of {line}"
                );
            }
        }
    }
    assert!(text.contains("knee:"), "{text}");
    assert!(text.contains("L2 cache"), "{text}");
    let plot = std::fs::read_to_string(&svg).expect("the plot is written");
    assert!(
        plot.contains("<svg") && plot.contains("floor dependent"),
        "{plot}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn scale_refuses_a_size_it_does_not_sweep() {
    let out = Command::new(BIN)
        .args(["bench", "scale", "--max-keys", "5k"])
        .output()
        .expect("turnstile runs");
    assert!(!out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("--max-keys") && e.contains("1k, 10k"), "{e}");
}

#[test]
fn report_writes_every_part_with_its_tables_and_plots() {
    let dir = std::env::temp_dir().join(format!("turnstile-report-test-{}", std::process::id()));
    let out = Command::new(BIN)
        .args([
            "bench",
            "report",
            "--quick",
            "--hello",
            "/nonexistent/hello",
            "--out",
        ])
        .arg(&dir)
        .current_dir(root())
        .output()
        .expect("turnstile runs");
    assert!(
        out.status.success(),
        "{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let page = std::fs::read_to_string(dir.join("benchmarks.md")).expect("the page is written");
    for part in [
        "## Engine: keyed and keyless checks beside governor",
        "## Engine: cost from 1k to 100M keys",
        "## Service: turnstile serve beside redis-server",
        "## Layer: turnstile-tower under wrk",
        "## Redis: the Redis store beside INCR",
        "## Redis: a fleet of nodes sharing limits",
        "## The machine",
    ] {
        assert!(page.contains(part), "no `{part}` in:\n{page}");
    }
    // The tables as the commands print them.
    for table in [
        "× floor",
        "knee:",
        "redis-server INCR",
        "turnstile CL.THROTTLE",
    ] {
        assert!(page.contains(table), "no `{table}` in:\n{page}");
    }
    // The layer's part says why it did not run; every command is shown, none is run by the
    // docs test.
    assert!(
        page.contains("Not run here: /nonexistent/hello is not built"),
        "{page}"
    );
    assert!(
        page.contains("turnstile bench scale --max-keys 10k"),
        "{page}"
    );
    assert!(
        !page.contains("```sh\n"),
        "a fence the docs test would run:\n{page}"
    );
    for svg in ["perf/scale.svg", "perf/serve.svg"] {
        let s = std::fs::read_to_string(dir.join(svg)).expect("the plot is written");
        assert!(s.contains("<svg"), "{svg}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
