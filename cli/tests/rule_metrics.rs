//! `/metrics` per limit of each rule and per Envoy descriptor, its bound on the number of
//! series, and `GET /v1/top-denied`, against the built binary: `turnstile serve` as a child
//! process on free loopback ports, spoken to over RESP (pipelined, by hand) and with curl.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_turnstile");

struct Server {
    _child: common::Running,
    resp: u16,
    http: u16,
}

/// `turnstile serve` with `extra` flags, once both listeners accept.
fn serve(extra: &[&str]) -> Server {
    let mut args = vec!["--workers", "1", "--throttle-keys", "262144"];
    args.extend_from_slice(&["--snapshot-every", "0", "--watch-every", "0"]);
    args.extend_from_slice(extra);
    let (child, resp, http) = common::serve::with_args(BIN, &args);
    Server {
        _child: child,
        resp,
        http,
    }
}

impl Server {
    /// curl on the HTTP listener: (status, body).
    fn curl(&self, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
        let mut c = Command::new("curl");
        c.args(["-s", "-m", "30", "-w", "\n%{http_code}", "-X", method]);
        if let Some(b) = body {
            c.args(["-H", "content-type: application/json", "-d", b]);
        }
        let o = c
            .arg(format!("http://127.0.0.1:{}{path}", self.http))
            .output()
            .expect("curl runs");
        let text = String::from_utf8(o.stdout).unwrap();
        let (body, code) = text.rsplit_once('\n').unwrap();
        (code.parse().unwrap(), body.to_string())
    }

    /// The samples of /metrics: (name with labels, value).
    fn samples(&self) -> Vec<(String, f64)> {
        let (code, body) = self.curl("GET", "/metrics", None);
        assert_eq!(code, 200, "{body}");
        body.lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .map(|l| {
                let (k, v) = l.rsplit_once(' ').unwrap();
                (k.to_string(), v.parse().unwrap())
            })
            .collect()
    }

    /// The value of the sample written exactly `series` (name and labels), if present.
    fn sample(&self, series: &str) -> Option<f64> {
        self.samples()
            .into_iter()
            .find_map(|(k, v)| (k == series).then_some(v))
    }

    fn connect(&self) -> Resp {
        let s = TcpStream::connect(("127.0.0.1", self.resp)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        Resp {
            r: BufReader::new(s.try_clone().unwrap()),
            w: s,
        }
    }
}

/// A raw RESP client.
struct Resp {
    r: BufReader<TcpStream>,
    w: TcpStream,
}

/// One command in RESP.
fn command(parts: &[&str]) -> Vec<u8> {
    let mut v = format!("*{}\r\n", parts.len()).into_bytes();
    for p in parts {
        v.extend_from_slice(format!("${}\r\n{p}\r\n", p.len()).as_bytes());
    }
    v
}

impl Resp {
    fn line(&mut self) -> String {
        let mut l = String::new();
        assert!(self.r.read_line(&mut l).unwrap() > 0, "connection closed");
        l.truncate(l.trim_end().len());
        l
    }

    /// One reply: integers, a null as -1, a bulk string as 0; an error panics.
    fn reply(&mut self) -> Vec<i64> {
        let l = self.line();
        match l.as_bytes()[0] {
            b':' => vec![l[1..].parse().unwrap()],
            b'*' => (0..l[1..].parse::<usize>().unwrap())
                .flat_map(|_| self.reply())
                .collect(),
            b'$' if l == "$-1" => vec![-1],
            b'$' => {
                self.line();
                vec![0]
            }
            _ => panic!("reply {l}"),
        }
    }

    fn call(&mut self, parts: &[&str]) -> Vec<i64> {
        self.w.write_all(&command(parts)).unwrap();
        self.reply()
    }

    /// Sends `n` commands made by `cmd(i)` pipelined, 5 000 at a time (the replies read before
    /// the next batch, so that the unread output stays under --client-output-limit), and
    /// returns how many replies were denials (the first integer of the reply equal to
    /// `denied_when`: 0 for TURNSTILE.CHECK's `allowed`, 1 for CL.THROTTLE's `limited`).
    fn pipeline(&mut self, n: usize, cmd: impl Fn(usize) -> Vec<u8>, denied_when: i64) -> usize {
        const BATCH: usize = 5_000;
        let mut denied = 0;
        let mut buf = Vec::with_capacity(1 << 18);
        for start in (0..n).step_by(BATCH) {
            let end = (start + BATCH).min(n);
            buf.clear();
            for i in start..end {
                buf.extend_from_slice(&cmd(i));
            }
            self.w.write_all(&buf).unwrap();
            for _ in start..end {
                if self.reply()[0] == denied_when {
                    denied += 1;
                }
            }
        }
        denied
    }
}

fn write_file(dir: &std::path::Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.display().to_string()
}

/// A hard rule of two limits (the second counts denials, so that it can bind) and a shadow
/// rule: after a known sequence of checks, each limit's five series hold what it decided.
#[test]
fn per_limit_series_count_a_known_sequence() {
    let dir = tempfile::tempdir().unwrap();
    let rules = write_file(
        dir.path(),
        "rules.toml",
        r#"
[[rule]]
name = "two"
key = "customer"
limits = [
  { algorithm = "fixed_window", limit = 4, window = "1h" },
  { algorithm = "fixed_window", limit = 5, window = "1h", count_denied = true },
]

[[rule]]
name = "watch"
key = "customer"
mode = "shadow"
limits = [{ algorithm = "fixed_window", limit = 2, window = "1h" }]
"#,
    );
    let s = serve(&["--rules", &rules, "--near-limit", "0.5"]);
    let mut c = s.connect();
    let check = |c: &mut Resp, cost: &str| c.call(&["TURNSTILE.CHECK", "customer", "1", cost])[0];
    // 1: two admits (4-1=3 left of the 1st limit, 5-1=4 of the 2nd: the 1st binds, 3 is not
    //    under 0.5 x 4); watch admits (1 left of 2: not under 1).
    assert_eq!(check(&mut c, "1"), 1);
    // 2: two admits, 1 left of 4: near; watch would deny (1 left, cost 2).
    assert_eq!(check(&mut c, "2"), 1);
    // 3: the 1st limit denies (1 left, cost 2); the 2nd counts the denial (0 left): it binds.
    assert_eq!(check(&mut c, "2"), 0);
    // 4: the 2nd limit denies (0 left) and binds; shadow rules are not asked after a denial.
    assert_eq!(check(&mut c, "1"), 0);
    // A peek is not counted.
    c.call(&["TURNSTILE.PEEK", "customer", "1"]);
    // The same engine over HTTP: another customer, admitted (3 left of 4).
    let (code, body) = s.curl(
        "POST",
        "/v1/check",
        Some(r#"{"key_class":"customer","key":"2"}"#),
    );
    assert_eq!(code, 200, "{body}");
    let ev = |rule: &str, limit: &str, event: &str| {
        s.sample(&format!(
            "turnstile_rule_limit_events_total{{rule=\"{rule}\",limit=\"{limit}\",event=\"{event}\"}}"
        ))
        .unwrap_or_else(|| panic!("no series for {rule} {limit} {event}"))
    };
    let want = [
        ("two", "0", [3.0, 3.0, 0.0, 0.0, 1.0]),
        ("two", "1", [2.0, 0.0, 2.0, 0.0, 0.0]),
        ("watch", "0", [3.0, 2.0, 0.0, 1.0, 0.0]),
    ];
    for (rule, limit, v) in want {
        let got = [
            "checks",
            "admitted",
            "denied",
            "shadow_denied",
            "near_limit",
        ]
        .map(|e| ev(rule, limit, e));
        assert_eq!(got, v, "{rule} limit {limit}");
    }
    // The rule-level events agree.
    let rule_event = |rule: &str, e: &str| {
        s.sample(&format!(
            "turnstile_rule_events_total{{rule=\"{rule}\",event=\"{e}\"}}"
        ))
        .unwrap()
    };
    assert_eq!(rule_event("two", "denied"), 2.0);
    assert_eq!(rule_event("watch", "would_deny"), 1.0);
    // The top denied keys: customer 1, by rule two, twice.
    let (code, body) = s.curl("GET", "/v1/top-denied", None);
    assert_eq!(code, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["k"], 10);
    assert_eq!(v["denied"][0]["source"], "rules");
    assert_eq!(v["denied"][0]["rule"], "two");
    assert_eq!(v["denied"][0]["key_class"], "customer");
    assert_eq!(v["denied"][0]["key"], "1");
    assert_eq!(v["denied"][0]["count"], 2);
    assert_eq!(v["denied"].as_array().unwrap().len(), 1, "{body}");
}

/// An Envoy configuration naming some values: a value the configuration names is a label; a
/// value it does not name is counted under its key with no value label, and never appears.
#[test]
fn per_descriptor_series_name_only_configured_values() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("config");
    std::fs::create_dir(&cfg).unwrap();
    write_file(
        &cfg,
        "edge.yaml",
        r#"
domain: edge
descriptors:
  - key: client
    value: gold
    rate_limit: { unit: hour, requests_per_unit: 2 }
  - key: client
    rate_limit: { unit: hour, requests_per_unit: 10 }
  - key: route
    value: api
    descriptors:
      - key: user
        rate_limit: { unit: hour, requests_per_unit: 5 }
"#,
    );
    let s = serve(&["--envoy-config", &cfg.display().to_string()]);
    let ask = |entries: &str| {
        let body = format!(r#"{{"domain":"edge","descriptors":[{{"entries":[{entries}]}}]}}"#);
        s.curl("POST", "/json", Some(&body)).0
    };
    let client = |v: &str| format!(r#"{{"key":"client","value":"{v}"}}"#);
    for _ in 0..3 {
        ask(&client("gold"));
    }
    for i in 0..4 {
        assert_eq!(ask(&client(&format!("free-value-{i}"))), 200);
    }
    assert_eq!(
        ask(r#"{"key":"route","value":"api"},{"key":"user","value":"u-77"}"#),
        200
    );
    let hits = |labels: &str, result: &str| {
        s.sample(&format!(
            "turnstile_envoy_descriptor_hits_total{{domain=\"edge\",{labels}result=\"{result}\"}}"
        ))
        .unwrap_or_else(|| panic!("no series {labels} {result}"))
    };
    let gold = "key=\"client\",value=\"gold\",";
    assert_eq!(hits(gold, "total"), 3.0);
    assert_eq!(hits(gold, "over_limit"), 1.0);
    assert_eq!(hits(gold, "shadow_mode"), 0.0);
    assert_eq!(hits("key=\"client\",", "total"), 4.0);
    assert_eq!(hits("key=\"client\",", "over_limit"), 0.0);
    assert_eq!(hits("key=\"route_api.user\",", "total"), 1.0);
    // The one denial is among the top denied keys, by domain and entries.
    let (code, body) = s.curl("GET", "/v1/top-denied", None);
    assert_eq!(code, 200, "{body}");
    let top: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        top["denied"],
        serde_json::json!([{"source": "envoy", "domain": "edge", "key": "client_gold",
            "count": 1, "error": 0}]),
        "{body}"
    );
    let all = s.samples();
    let ours: Vec<&String> = all
        .iter()
        .map(|(k, _)| k)
        .filter(|k| k.starts_with("turnstile_envoy_descriptor_hits_total"))
        .collect();
    // Three configured descriptors, four series each.
    assert_eq!(ours.len(), 12, "{ours:?}");
    assert!(
        !all.iter()
            .any(|(k, _)| k.contains("free-value") || k.contains("u-77")),
        "a value the configuration does not name became a label"
    );
}

/// A million distinct keys through pipelined TURNSTILE.CHECK and CL.THROTTLE do not add one
/// series to /metrics (the bound of docs/service.md), and the sketch behind
/// `GET /v1/top-denied` finds the hot denied keys of a skewed workload among them.
#[test]
fn a_million_keys_stay_under_the_series_bound_and_the_hot_denied_keys_are_found() {
    let dir = tempfile::tempdir().unwrap();
    // Every rules-side series: R rules of L limits (no override, no own limits) take
    // 5 x L + 5 each, and 6 more for the engine (docs/service.md).
    let rules = write_file(
        dir.path(),
        "rules.toml",
        r#"
[[rule]]
name = "per-customer"
key = "customer"
limits = [
  { algorithm = "fixed_window", limit = 1, window = "1h" },
  { algorithm = "sliding_window", limit = 100, window = "1d" },
]

[[rule]]
name = "shadow"
key = "customer"
mode = "shadow"
limits = [{ algorithm = "fixed_window", limit = 1, window = "1h" }]
"#,
    );
    let (r, l) = (2, [2, 1]);
    let rules_bound: usize = l.iter().map(|l| 5 * l + 5).sum::<usize>() + 6;
    assert_eq!(r, l.len());
    // The series of a server without rules: the fixed part.
    let base = serve(&[]).samples().len();
    let s = serve(&["--rules", &rules]);
    let bound = base + rules_bound;
    let first = s.samples().len();
    assert!(first <= bound, "{first} series, bound {bound}");
    let t0 = Instant::now();
    let mut c = s.connect();
    // A million distinct customers, each asking for cost 2 of a limit of 1: each denied (never
    // fits). Among them, three hot customers at 10 %, 5 % and 4 % of the checks: each denied
    // from its second check on.
    const N: usize = 1_000_000;
    let denied = c.pipeline(
        N,
        |i| {
            let (key, cost) = match i {
                _ if i % 10 == 0 => ("1".to_string(), "1"),
                _ if i % 20 == 1 => ("2".to_string(), "1"),
                _ if i % 25 == 2 => ("3".to_string(), "1"),
                _ => ((1_000 + i).to_string(), "2"),
            };
            command(&["TURNSTILE.CHECK", "customer", &key, cost])
        },
        0,
    );
    let hot = [N / 10, N / 20, N / 25];
    assert_eq!(denied, N - 3, "all but each hot key's first check");
    // And through CL.THROTTLE: a million distinct keys (no series per key either).
    c.pipeline(
        N,
        |i| command(&["CL.THROTTLE", &format!("k{i}"), "1", "1", "3600"]),
        1,
    );
    assert!(
        t0.elapsed() < Duration::from_secs(240),
        "{:?}",
        t0.elapsed()
    );
    let after = s.samples();
    assert_eq!(after.len(), first, "series added by keys");
    assert!(after.len() <= bound);
    // The top denied: the three hot customers, in order, each counted within its error bound.
    let (code, body) = s.curl("GET", "/v1/top-denied", None);
    assert_eq!(code, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let top = v["denied"].as_array().unwrap();
    assert!(top.len() <= 10);
    for (i, key) in ["1", "2", "3"].iter().enumerate() {
        assert_eq!(top[i]["key"], *key, "{body}");
        assert_eq!(top[i]["rule"], "per-customer");
        let (count, err) = (
            top[i]["count"].as_u64().unwrap(),
            top[i]["error"].as_u64().unwrap(),
        );
        let truth = hot[i] as u64 - 1;
        assert!(
            count >= truth && count - err <= truth,
            "{key}: {count} ± {err}, truth {truth}"
        );
    }
}
