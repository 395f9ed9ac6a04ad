//! `turnstile replay` against the binary: a generated log with known answers in every format
//! (the expected figures computed here by a naive model of the rules, not by the replay),
//! malformed lines, the merge of files in time order, and gzip input.

use serde_json::Value;
use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_turnstile");

/// Two enforcing rules and a shadow rule, all fixed windows (their boundaries are multiples
/// of the window since the Unix epoch: the model below needs nothing else).
const RULES: &str = r#"
[[rule]]
name = "per-customer"
key = "customer"
limits = [{ algorithm = "fixed_window", limit = 3, window = "1m" }]

[[rule]]
name = "search-per-ip"
key = "ip"
match = { route_prefix = "/v1/search" }
limits = [{ algorithm = "fixed_window", limit = 2, window = "10s" }]

[[rule]]
name = "route-shadow"
key = "route"
mode = "shadow"
limits = [{ algorithm = "fixed_window", limit = 6, window = "1m" }]
"#;

/// 2024-03-04T00:00:00Z.
const T0: u64 = 1_709_510_400;

#[derive(Clone, Debug)]
struct Event {
    secs: u64,
    ip: String,
    customer: Option<u64>,
    method: &'static str,
    route: &'static str,
}

/// A deterministic stream: 3 000 requests over about 25 minutes, 20 customers (some requests
/// without one), 8 addresses, three routes.
fn events() -> Vec<Event> {
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut t = T0;
    (0..3000)
        .map(|_| {
            t += next() % 2;
            let r = next();
            Event {
                secs: t,
                ip: format!("203.0.113.{}", 1 + r % 8),
                customer: ((r >> 8) % 10 != 0).then_some(1 + (r >> 16) % 20),
                method: if (r >> 24) % 3 == 0 { "POST" } else { "GET" },
                route: ["/v1/search", "/v1/charges", "/v1/items"][((r >> 32) % 3) as usize],
            }
        })
        .collect()
}

/// What a rule is expected to report.
#[derive(Debug, Default, PartialEq, Eq)]
struct Want {
    requests: u64,
    admitted: u64,
    denied: u64,
    shadow_denied: u64,
    keys: u64,
    keys_limited: u64,
}

/// The rules above, applied request by request as docs/rules.md describes the engine: the
/// enforcing rules in order, each taking the request if it fits; at the first denial the
/// rules before give it back; shadow rules only when every enforcing rule admitted.
fn model(ev: &[Event]) -> (Vec<Want>, u64, u64) {
    let mut want: Vec<Want> = (0..3).map(|_| Want::default()).collect();
    let mut counts: [HashMap<(String, u64), u64>; 3] = Default::default();
    let mut keys: [HashSet<String>; 3] = Default::default();
    let mut limited: [HashSet<String>; 3] = Default::default();
    let mut denied = 0;
    for e in ev {
        // (rule, key, window, limit)
        let mut enforcing = Vec::new();
        if let Some(c) = e.customer {
            enforcing.push((0, c.to_string(), e.secs / 60, 3));
        }
        if e.route.starts_with("/v1/search") {
            enforcing.push((1, e.ip.clone(), e.secs / 10, 2));
        }
        let mut taken = Vec::new();
        let mut deny = false;
        for (rule, key, w, limit) in enforcing {
            want[rule].requests += 1;
            keys[rule].insert(key.clone());
            let n = counts[rule].entry((key.clone(), w)).or_default();
            if *n < limit {
                *n += 1;
                want[rule].admitted += 1;
                taken.push((rule, key, w));
            } else {
                want[rule].denied += 1;
                limited[rule].insert(key);
                deny = true;
                break;
            }
        }
        if deny {
            denied += 1;
            for (rule, key, w) in taken {
                *counts[rule].get_mut(&(key, w)).unwrap() -= 1;
            }
            continue;
        }
        // The shadow rule (every request has a route).
        let (key, w) = (e.route.to_string(), e.secs / 60);
        want[2].requests += 1;
        keys[2].insert(key.clone());
        let n = counts[2].entry((key.clone(), w)).or_default();
        if *n < 6 {
            *n += 1;
        } else {
            want[2].shadow_denied += 1;
            limited[2].insert(key);
        }
    }
    for i in 0..3 {
        want[i].keys = keys[i].len() as u64;
        want[i].keys_limited = limited[i].len() as u64;
    }
    // Every request has a route, so the shadow rule or an enforcing one decides each.
    (want, denied, 0)
}

fn iso(secs: u64, ms: bool) -> String {
    let d = (secs - T0) / 86_400;
    assert_eq!(d, 0, "the stream stays within a day");
    let s = secs % 86_400;
    let f = if ms { ".000" } else { "" };
    format!(
        "2024-03-04T{:02}:{:02}:{:02}{f}Z",
        s / 3600,
        s / 60 % 60,
        s % 60
    )
}

fn clf(secs: u64) -> String {
    let s = secs % 86_400;
    format!(
        "04/Mar/2024:{:02}:{:02}:{:02} +0000",
        s / 3600,
        s / 60 % 60,
        s % 60
    )
}

/// The events in `format`, and the `--key`s that map them.
fn write(format: &str, ev: &[Event]) -> (String, Vec<String>) {
    let mut out = String::new();
    let cust = |e: &Event| e.customer.map_or("-".to_string(), |c| c.to_string());
    let keys: Vec<&str> = match format {
        "combined" => {
            for e in ev {
                out += &format!(
                    "{} - {} [{}] \"{} {}?q=1 HTTP/1.1\" 200 12 \"-\" \"test \\\"agent\\\"\"\n",
                    e.ip,
                    cust(e),
                    clf(e.secs),
                    e.method,
                    e.route
                );
            }
            vec!["customer=$remote_user"]
        }
        "envoy" => {
            for e in ev {
                out += &format!(
                    "[{}] \"{} {} HTTP/2\" 200 - 0 12 3 2 \"{}, 10.0.0.1\" \"agent\" \"{}\" \"api\" \"10.0.0.7:80\"\n",
                    iso(e.secs, true), e.method, e.route, e.ip, cust(e)
                );
            }
            vec!["customer=%REQ(X-REQUEST-ID)%"]
        }
        "alb" => {
            for e in ev {
                out += &format!(
                    "https {t} app/x/1 {}:4242 10.0.0.7:80 0.000 0.001 0.000 200 200 10 12 \"{} https://api.example.com:443{}?a=b HTTP/1.1\" \"agent\" - - arn:tg \"{}\" \"api\" \"-\" 0 {t} \"forward\" \"-\" \"-\" \"10.0.0.7:80\" \"200\" \"-\" \"-\"\n",
                    e.ip, e.method, e.route, cust(e), t = iso(e.secs, true)
                );
            }
            vec!["customer=$trace_id"]
        }
        "csv" => {
            out += "when,client,cust,path,verb\n";
            for e in ev {
                let c = e.customer.map_or(String::new(), |c| c.to_string());
                out += &format!(
                    "{},{},{c},\"{}\",{}\n",
                    iso(e.secs, false),
                    e.ip,
                    e.route,
                    e.method
                );
            }
            vec![
                "time=$when",
                "ip=$client",
                "customer=$cust",
                "route=$path",
                "method=$verb",
            ]
        }
        "jsonl" => {
            for e in ev {
                let v = serde_json::json!({
                    "ts": e.secs as f64 + 0.25, "ip": e.ip, "customer": e.customer,
                    "req": {"path": e.route, "method": e.method},
                });
                out += &format!("{v}\n");
            }
            vec!["time=$ts", "route=$req.path", "method=$req.method"]
        }
        "envoy-json" => {
            for e in ev {
                let v = serde_json::json!({
                    "start_time": iso(e.secs, true), "method": e.method, "path": e.route,
                    "x_forwarded_for": e.ip, "customer_id": e.customer, "response_code": 200,
                });
                out += &format!("{v}\n");
            }
            vec![]
        }
        f => panic!("{f}"),
    };
    (
        out,
        keys.into_iter().map(|k| format!("--key={k}")).collect(),
    )
}

fn replay(args: &[String]) -> Value {
    let out = Command::new(BIN)
        .arg("replay")
        .args(args)
        .arg("--json")
        .output()
        .expect("turnstile runs");
    assert!(
        out.status.success(),
        "turnstile replay {args:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON document")
}

fn file(dir: &Path, name: &str, text: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

fn got(rule: &Value) -> Want {
    let n = |k: &str| rule[k].as_u64().unwrap_or_else(|| panic!("{k} in {rule}"));
    Want {
        requests: n("requests"),
        admitted: n("admitted"),
        denied: n("denied"),
        shadow_denied: n("shadow_denied"),
        keys: n("keys"),
        keys_limited: n("keys_limited"),
    }
}

fn check(doc: &Value, want: &(Vec<Want>, u64, u64), lines: u64, what: &str) {
    assert_eq!(doc["malformed"], 0, "{what}: {}", doc["malformed_examples"]);
    assert_eq!(doc["records"], lines, "{what}");
    let r = &doc["replay"];
    assert_eq!(r["requests"], lines, "{what}");
    assert_eq!(r["denied"], want.1, "{what}");
    assert_eq!(r["unmatched"], want.2, "{what}");
    for (i, w) in want.0.iter().enumerate() {
        assert_eq!(
            &got(&r["rules"][i]),
            w,
            "{what}: rule {}",
            r["rules"][i]["name"]
        );
    }
}

#[test]
fn every_format_replays_to_the_models_counts() {
    let dir = tempfile::tempdir().unwrap();
    let rules = file(dir.path(), "rules.toml", RULES.as_bytes());
    let ev = events();
    let want = model(&ev);
    // The model exercises every path: each rule denies, and the shadow rule would.
    assert!(
        want.0.iter().all(|w| w.denied + w.shadow_denied > 0),
        "{want:?}"
    );
    assert!(want.0[1].requests < want.0[1].requests + want.0[0].denied);
    for format in ["combined", "envoy", "alb", "csv", "jsonl", "envoy-json"] {
        let (text, keys) = write(format, &ev);
        let log = file(dir.path(), &format!("log.{format}"), text.as_bytes());
        let mut args = vec!["--rules".to_string(), rules.display().to_string()];
        args.extend(keys.iter().cloned());
        args.push(log.display().to_string());
        // Detected, then named.
        let auto = replay(&args);
        let detected = auto["files"][0]["format"].as_str().unwrap().to_string();
        let expect = if format == "envoy-json" {
            "jsonl"
        } else {
            format
        };
        assert_eq!(detected, expect);
        check(&auto, &want, ev.len() as u64, format);
        args.insert(0, format!("--format={format}"));
        check(&replay(&args), &want, ev.len() as u64, format);
    }
}

#[test]
fn malformed_lines_are_counted_with_examples_never_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let rules = file(dir.path(), "rules.toml", RULES.as_bytes());
    let good = |s: u64| {
        format!(
            "203.0.113.1 - 7 [{}] \"GET /v1/items HTTP/1.1\" 200 1 \"-\" \"a\"\n",
            clf(T0 + s)
        )
    };
    let mut text = good(0);
    text += "garbage\n";
    text += "\n";
    text += "203.0.113.1 - 7 [99/Foo/2024:00:00:00 +0000] \"GET / HTTP/1.1\" 200 1 \"-\" \"a\"\n";
    text += "nope.addr - 7 [04/Mar/2024:00:00:01 +0000] \"GET / HTTP/1.1\" 200 1 \"-\" \"a\"\n";
    text += &format!(
        "203.0.113.1 - 7 [{}] \"GET /{} HTTP/1.1\" 200 1 \"-\" \"a\"\n",
        clf(T0 + 2),
        "x".repeat(300)
    );
    text += "203.0.113.1 - 7 [04/Mar/2024:00:00:03 +0000] \"GET /unterminated\n";
    text += &good(4);
    let mut bytes = text.into_bytes();
    bytes.extend_from_slice(b"203.0.113.1 - \xff\xfe [04/Mar/2024:00:00:05 +0000] \"GET /\xff HTTP/1.1\" 200 1 \"-\" \"a\"\n");
    bytes.extend_from_slice(good(6).as_bytes());
    let log = file(dir.path(), "bad.log", &bytes);
    let doc = replay(&[
        "--rules".into(),
        rules.display().to_string(),
        "--format=combined".into(),
        "--key=customer=$remote_user".into(),
        "--max-line=200".into(),
        log.display().to_string(),
    ]);
    assert_eq!(doc["records"], 3, "{doc}");
    assert_eq!(doc["skipped"], 1);
    assert_eq!(doc["malformed"], 6, "{doc}");
    let ex: Vec<&str> = doc["malformed_examples"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect();
    assert_eq!(ex.len(), 5);
    let at = |n: u32| format!("{}:{n}: ", log.display());
    assert!(
        ex[0].starts_with(&at(2)) && ex[0].contains("format"),
        "{ex:?}"
    );
    assert!(
        ex[1].starts_with(&at(4)) && ex[1].contains("timestamp"),
        "{ex:?}"
    );
    assert!(
        ex[2].starts_with(&at(5)) && ex[2].contains("client address"),
        "{ex:?}"
    );
    assert!(
        ex[3].starts_with(&at(6)) && ex[3].contains("longer than --max-line 200"),
        "{ex:?}"
    );
    assert!(
        ex[4].starts_with(&at(7)) && ex[4].contains("ends before"),
        "{ex:?}"
    );
}

#[test]
fn files_are_merged_in_time_order_and_gzip_is_read() {
    let dir = tempfile::tempdir().unwrap();
    // One counter for everything, one admission per 2 s window: the request with the earlier
    // time in each window is admitted. File a has the odd seconds, b the even ones: merged,
    // every request of b is admitted and every one of a denied (read one file after the
    // other, a would be admitted throughout).
    let rules = file(
        dir.path(),
        "rules.toml",
        br#"
[[rule]]
name = "global"
key = "global"
limits = [{ algorithm = "fixed_window", limit = 1, window = "2s" }]
[[rule]]
name = "who"
key = "customer"
mode = "shadow"
limits = [{ algorithm = "fixed_window", limit = 1000000, window = "1h" }]
"#,
    );
    let line = |s: u64, c: u32| {
        format!(
            "203.0.113.1 - {c} [{}] \"GET /x HTTP/1.1\" 200 1 \"-\" \"a\"\n",
            clf(T0 + s)
        )
    };
    let a: String = (0..100).map(|i| line(2 * i + 1, 1)).collect();
    let b: String = (0..100).map(|i| line(2 * i, 2)).collect();
    // b gzip-compressed in two members, as `cat x.gz y.gz` makes.
    let (b1, b2) = b.split_at(b.len() / 2);
    let mut gz = Vec::new();
    for part in [b1, b2] {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(part.as_bytes()).unwrap();
        gz.extend(e.finish().unwrap());
    }
    let fa = file(dir.path(), "a.log", a.as_bytes());
    let fb = file(dir.path(), "b.log.gz", &gz);
    let doc = replay(&[
        "--rules".into(),
        rules.display().to_string(),
        "--key=customer=$remote_user".into(),
        fa.display().to_string(),
        fb.display().to_string(),
    ]);
    assert_eq!(doc["files"][1]["format"], "combined, gzip");
    assert_eq!(doc["records"], 200);
    assert_eq!(doc["late_lines"], 0);
    let r = &doc["replay"];
    assert_eq!(r["rules"][0]["denied"], 100, "{r}");
    // Only customer 2 (file b) got through to the shadow rule.
    assert_eq!(r["rules"][1]["requests"], 100);
    assert_eq!(r["rules"][1]["keys"], 1);
    assert_eq!(doc["first"], "2024-03-04T00:00:00.000Z");
    assert_eq!(doc["last"], "2024-03-04T00:03:19.000Z");
    // The top denied key of the global rule, and when it was first denied (at 00:00:01).
    let top = &r["rules"][0]["top_denied"][0];
    assert_eq!(top["key"], "(global)");
    assert_eq!(top["denied"], 100);
    assert_eq!(top["first_denied"], "2024-03-04T00:00:01.000Z");
}

#[test]
fn compare_names_the_requests_and_keys_that_change() {
    let dir = tempfile::tempdir().unwrap();
    let rules = file(dir.path(), "a.toml", RULES.as_bytes());
    let looser = RULES.replace("limit = 3, window = \"1m\"", "limit = 4, window = \"1m\"");
    let other = file(dir.path(), "b.toml", looser.as_bytes());
    let ev = events();
    let (text, keys) = write("combined", &ev);
    let log = file(dir.path(), "log", text.as_bytes());
    let mut args = vec![
        "--rules".to_string(),
        rules.display().to_string(),
        "--compare".into(),
        other.display().to_string(),
    ];
    args.extend(keys);
    args.push(log.display().to_string());
    let doc = replay(&args);
    let a = doc["replay"]["denied"].as_u64().unwrap();
    let b = doc["compare"]["replay"]["denied"].as_u64().unwrap();
    let c = &doc["compare"];
    let (plus, minus) = (
        c["newly_denied"].as_u64().unwrap(),
        c["newly_allowed"].as_u64().unwrap(),
    );
    assert_eq!(b + minus - plus, a, "{c}");
    assert!(minus > 0, "a looser limit lets some through: {c}");
    assert!(c["top_newly_allowed"][0]["key"]
        .as_str()
        .unwrap()
        .ends_with("(per-customer)"));
}

#[test]
fn a_line_earlier_than_the_one_before_is_replayed_at_that_time_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    // One admission per 10 s window: the late line (00:00:05 after 00:00:12) is replayed at
    // 00:00:12, in the second window, where it is denied; at its own time it would have been
    // denied in the first window too, but the third line (00:00:21) is admitted either way.
    let rules = file(
        dir.path(),
        "rules.toml",
        br#"
[[rule]]
name = "g"
key = "global"
limits = [{ algorithm = "fixed_window", limit = 1, window = "10s" }]
"#,
    );
    let line = |s: u64| {
        format!(
            "203.0.113.1 - - [{}] \"GET /x HTTP/1.1\" 200 1 \"-\" \"a\"\n",
            clf(T0 + s)
        )
    };
    let text = [line(1), line(12), line(5), line(21)].concat();
    let log = file(dir.path(), "late.log", text.as_bytes());
    let doc = replay(&[
        "--rules".into(),
        rules.display().to_string(),
        log.display().to_string(),
    ]);
    assert_eq!(doc["late_lines"], 1, "{doc}");
    assert_eq!(doc["max_late_seconds"], 7.0);
    assert_eq!(doc["replay"]["denied"], 1);
    // With --reorder 10s the lines are replayed at their own times, in order (1, 5, 12, 21):
    // 5 is denied in the first window, 12 and 21 admitted in theirs.
    let doc = replay(&[
        "--rules".into(),
        rules.display().to_string(),
        "--reorder=10s".into(),
        log.display().to_string(),
    ]);
    assert_eq!(doc["late_lines"], 0, "{doc}");
    assert_eq!(doc["records"], 4);
    assert_eq!(doc["replay"]["denied"], 1);
    let top = &doc["replay"]["rules"][0]["top_denied"][0];
    assert_eq!(top["first_denied"], "2024-03-04T00:00:05.000Z", "{doc}");
    assert_eq!(doc["last"], "2024-03-04T00:00:21.000Z");
    // A window shorter than the lateness: 12 is released once 15 is read (2 s newer), and 5,
    // read after it, is late by 7 s.
    let text = [line(1), line(12), line(15), line(5), line(21)].concat();
    let log = file(dir.path(), "later.log", text.as_bytes());
    let doc = replay(&[
        "--rules".into(),
        rules.display().to_string(),
        "--reorder=2s".into(),
        log.display().to_string(),
    ]);
    assert_eq!(doc["late_lines"], 1, "{doc}");
    assert_eq!(doc["max_late_seconds"], 7.0);
    assert_eq!(
        doc["replay"]["rules"][0]["top_denied"][0]["first_denied"],
        "2024-03-04T00:00:12.000Z"
    );
}
