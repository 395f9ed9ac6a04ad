//! `turnstile serve` behind a gRPC client nobody here wrote: Python's grpcio with stubs compiled
//! at test time from Envoy's own `rls.proto` (server/tests/clients/envoy_rls.py), against
//! envoyproxy/ratelimit's own configuration files (server/tests/clients/envoy/), each answer
//! checked against what upstream answers.
//!
//! The interpreter is `TURNSTILE_TEST_PYTHON` (default `python3`); it needs grpcio and
//! grpcio-tools. Without them these tests fail and say how to install them. The protos are the
//! ones the envoy-types crate ships (found with `cargo metadata`), or `TURNSTILE_TEST_ENVOY_PROTOS`.

use serde_json::{json, Value};
mod common;
use common::free_port;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const BIN: &str = env!("CARGO_BIN_EXE_turnstile");

const INSTALL: &str = "The Envoy client tests need Python 3 with grpcio and grpcio-tools: \
     `cargo xtask test` installs them (xtask/src/deps.rs) and runs the tests with \
     TURNSTILE_TEST_PYTHON set; by hand: python3 -m venv target/test-venv && \
     target/test-venv/bin/pip install grpcio grpcio-tools, then run them with \
     TURNSTILE_TEST_PYTHON=target/test-venv/bin/python (a relative path is taken from the \
     workspace root)";

/// The settings upstream reads from the environment: cleared for each server, then set.
const SETTINGS: &[&str] = &[
    "SHADOW_MODE",
    "QUOTA_MODE",
    "RESPONSE_DYNAMIC_METADATA",
    "MERGE_DOMAIN_CONFIG",
    "LIMIT_RESPONSE_HEADERS_ENABLED",
    "LIMIT_LIMIT_HEADER",
    "LIMIT_REMAINING_HEADER",
    "LIMIT_RESET_HEADER",
    "NEAR_LIMIT_RATIO",
];

fn clients() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../server/tests/clients")
}

/// `TURNSTILE_TEST_PYTHON` (a relative path from the workspace root), else `python3`.
fn python() -> PathBuf {
    match std::env::var_os("TURNSTILE_TEST_PYTHON") {
        None => "python3".into(),
        Some(p) => {
            let p = PathBuf::from(p);
            if p.is_relative() && p.components().count() > 1 {
                Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(p)
            } else {
                p
            }
        }
    }
}

/// The proto/ folder of the envoy-types crate this workspace builds with.
fn protos() -> PathBuf {
    if let Some(p) = std::env::var_os("TURNSTILE_TEST_ENVOY_PROTOS") {
        return p.into();
    }
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let v = Command::new(&rustc).arg("-vV").output().expect("rustc -vV");
    let info = String::from_utf8_lossy(&v.stdout);
    let host = info
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .expect("rustc -vV names the host");
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml");
    let metadata = |offline: bool| {
        let mut c = Command::new(env!("CARGO"));
        c.args([
            "metadata",
            "--format-version",
            "1",
            "--filter-platform",
            host,
        ])
        .arg("--manifest-path")
        .arg(&manifest);
        if offline {
            c.arg("--offline");
        }
        c.output().expect("cargo metadata runs")
    };
    let mut o = metadata(true);
    if !o.status.success() {
        o = metadata(false);
    }
    assert!(
        o.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let m: Value = serde_json::from_slice(&o.stdout).unwrap();
    let pkg = m["packages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "envoy-types")
        .expect("envoy-types is a dependency");
    let dir = Path::new(pkg["manifest_path"].as_str().unwrap())
        .parent()
        .unwrap()
        .join("proto");
    assert!(
        dir.join("data-plane-api/envoy/service/ratelimit/v3/rls.proto")
            .is_file(),
        "no rls.proto under {}",
        dir.display()
    );
    dir
}

/// `turnstile serve` with the Envoy service; killed when dropped (also on a failed assertion).
struct Server {
    _child: common::Running,
    grpc: u16,
}

fn serve(config: &Path, env: &[(&str, &str)]) -> Command {
    let mut c = Command::new(BIN);
    c.args(["serve", "--workers", "1", "--throttle-keys", "1000"]);
    for (flag, port) in [("--resp", free_port()), ("--http", free_port())] {
        c.args([flag, &format!("127.0.0.1:{port}")]);
    }
    c.arg("--envoy-config").arg(config);
    for k in SETTINGS {
        c.env_remove(k);
    }
    c.envs(env.iter().copied()).env("RUST_LOG", "warn");
    c
}

impl Server {
    /// Starts the server on `config` and waits (at most 30 s) until gRPC accepts.
    fn start(config: &Path, env: &[(&str, &str)]) -> Server {
        Self::start_with(config, env, &[])
    }

    /// [`Server::start`] with more flags.
    fn start_with(config: &Path, env: &[(&str, &str)], extra: &[&std::ffi::OsStr]) -> Server {
        let grpc = free_port();
        let mut cmd = serve(config, env);
        cmd.args(["--grpc", &format!("127.0.0.1:{grpc}")])
            .args(extra);
        let child = common::spawn_listening(&mut cmd, &[grpc]);
        Server {
            _child: child,
            grpc,
        }
    }

    /// Sends `requests` (proto3 JSON) with the Python client; one answer per request.
    fn rls(&self, requests: &Value) -> Vec<Value> {
        let out = client(&["--target", &format!("127.0.0.1:{}", self.grpc)], requests);
        assert!(
            out.status.success(),
            "{} envoy_rls.py: {}\n{}\n{INSTALL}",
            python().display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let answers: Vec<Value> = String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(answers.len(), requests.as_array().unwrap().len());
        answers
    }
}

/// Runs the client script with `args`, `requests` on its standard input.
fn client(args: &[&str], requests: &Value) -> std::process::Output {
    let script = clients().join("envoy_rls.py");
    let mut child = Command::new(python())
        .arg(&script)
        .arg("--protos")
        .arg(protos())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}. {INSTALL}", python().display()));
    let body = requests.to_string();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(body.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// Waits, if needed, until at least 15 s are left in the current calendar minute: upstream's
/// minute windows are calendar minutes, and a batch that crossed one would start counting anew.
fn fresh_minute() {
    let s = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis()
        % 60_000;
    if s > 45_000 {
        std::thread::sleep(Duration::from_millis(60_000 - s as u64 + 200));
    }
}

fn entries(pairs: &[(&str, &str)]) -> Value {
    json!({ "entries": pairs.iter().map(|(k, v)| json!({"key": k, "value": v})).collect::<Vec<_>>() })
}

fn request(domain: &str, descriptors: &[&[(&str, &str)]]) -> Value {
    json!({ "domain": domain, "descriptors": descriptors.iter().map(|d| entries(d)).collect::<Vec<_>>() })
}

/// (overall code, each status's code).
fn codes(answer: &Value) -> (String, Vec<String>) {
    let r = &answer["response"];
    assert!(r.is_object(), "an answer, not {answer}");
    let code = |v: &Value| v.as_str().unwrap_or("UNKNOWN").to_string();
    (
        code(&r["overallCode"]),
        r["statuses"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| code(&s["code"]))
            .collect(),
    )
}

/// Each status's limit: (requests per unit, unit), or None.
fn limits(answer: &Value) -> Vec<Option<(u64, String)>> {
    answer["response"]["statuses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let l = s.get("currentLimit")?;
            Some((
                l["requestsPerUnit"].as_u64().unwrap_or(0),
                l["unit"].as_str().unwrap_or("UNKNOWN").to_string(),
            ))
        })
        .collect()
}

fn remaining(answer: &Value, i: usize) -> u64 {
    answer["response"]["statuses"][i]["limitRemaining"]
        .as_u64()
        .unwrap_or(0)
}

fn headers(answer: &Value) -> Vec<(String, String)> {
    answer["response"]["responseHeadersToAdd"]
        .as_array()
        .map_or(Vec::new(), |hs| {
            hs.iter()
                .map(|h| {
                    (
                        h["key"].as_str().unwrap().to_string(),
                        h["value"].as_str().unwrap().to_string(),
                    )
                })
                .collect()
        })
}

fn strings(v: &[(&str, &str)]) -> Vec<(String, String)> {
    v.iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

const OK: &str = "OK";
const OVER: &str = "OVER_LIMIT";

fn c(overall: &str, each: &[&str]) -> (String, Vec<String>) {
    (
        overall.to_string(),
        each.iter().map(|s| s.to_string()).collect(),
    )
}

fn l(rpu: u64, unit: &str) -> Option<(u64, String)> {
    Some((rpu, unit.to_string()))
}

/// examples/ratelimit/config/example.yaml, test/config/wildcard.yaml and metadata.yaml (the
/// latter two one domain, merged), served with MERGE_DOMAIN_CONFIG, RESPONSE_DYNAMIC_METADATA
/// and LIMIT_RESPONSE_HEADERS_ENABLED; every answer as upstream's service gives it.
#[test]
fn upstream_configs_over_grpc_with_envoys_protos() {
    let s = Server::start(
        &clients().join("envoy/merged"),
        &[
            ("MERGE_DOMAIN_CONFIG", "true"),
            ("RESPONSE_DYNAMIC_METADATA", "true"),
            ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
        ],
    );
    let quota = request(
        "rl",
        &[&[("service", "service_1")], &[("service", "service_2")]],
    );
    let mut over_hits = request("rl", &[&[("foo", "y")]]);
    over_hits["hitsAddend"] = json!(2);
    let mut override_limit = request("rl", &[&[("unknown", "o")]]);
    override_limit["descriptors"][0]["limit"] = json!({"requestsPerUnit": 1, "unit": "HOUR"});
    let requests = json!([
        // 0-2: quota_mode: over only when both quota descriptors are.
        quota,
        quota,
        quota,
        // 3: `replaces`: category=account replaces the limit named bkthomps.
        request(
            "rl",
            &[
                &[("foo", "x"), ("bar", "bkthomps")],
                &[("category", "account")]
            ]
        ),
        // 4, 5: requests_per_unit 0 is always over, unless another limit replaces it.
        request("rl", &[&[("foo", "x"), ("bar", "banned")]]),
        request(
            "rl",
            &[
                &[("foo", "x"), ("bar", "banned")],
                &[
                    ("source_cluster", "proxy"),
                    ("destination_cluster", "override")
                ]
            ]
        ),
        // 6-9: shadow_mode: the 4th hit of 3 per minute is over but OK.
        request("rl", &[&[("foo", "x"), ("baz", "shady")]]),
        request("rl", &[&[("foo", "x"), ("baz", "shady")]]),
        request("rl", &[&[("foo", "x"), ("baz", "shady")]]),
        request("rl", &[&[("foo", "x"), ("baz", "shady")]]),
        // 10: unlimited.
        request("rl", &[&[("foo", "x"), ("bay", "y")]]),
        // 11-13: wildcards in the middle, several, nested (TestWildcardConfig).
        request(
            "test-domain",
            &[
                &[("midWild", "barab")],
                &[("midWild", "bar123b")],
                &[("midWild", "barb")],
                &[("midWild", "bara")],
                &[("midWild", "xbarb")]
            ]
        ),
        request(
            "test-domain",
            &[
                &[("multiWild", "foo123bar456baz")],
                &[("multiWild", "foobarbaz")],
                &[("multiWild", "foo123baz")],
                &[("multiWild", "bar456baz")]
            ]
        ),
        request(
            "test-domain",
            &[
                &[("nestedWild", "val1"), ("wild", "goo2")],
                &[("wild", "foo1")],
                &[("wild", "bar")],
                &[("noWild", "foo1")]
            ]
        ),
        // 14: metadata.yaml, merged into test-domain (TestMetadata).
        request(
            "test-domain",
            &[
                &[("key1", "value1"), ("subkey1", "something")],
                &[("key2", "something")]
            ]
        ),
        // 15, 16: upstream's service errors (TestEmptyDomain, TestEmptyDescriptors).
        request("", &[&[("foo", "x")]]),
        request("rl", &[]),
        // 17, 18: the request's own limit.
        override_limit,
        override_limit,
        // 19, 20: hits_addend.
        over_hits,
        request("rl", &[&[("foo", "y")]]),
    ]);
    fresh_minute();
    let a = s.rls(&requests);

    assert_eq!(codes(&a[0]), c(OK, &[OK, OK]));
    assert_eq!(codes(&a[1]), c(OK, &[OVER, OK]), "some quota over: OK");
    assert_eq!(codes(&a[2]), c(OVER, &[OVER, OVER]), "all quota over");
    assert_eq!(limits(&a[0]), [l(1, "MINUTE"), l(2, "MINUTE")]);
    // Dynamic metadata: the passed limits' `metadata`, first value kept.
    let md = |a: &Value| a["response"]["dynamicMetadata"].clone();
    assert_eq!(md(&a[0])["domain"], "rl");
    assert_eq!(
        md(&a[0])["descriptors"][1]["entries"],
        json!(["service=service_2"])
    );
    assert_eq!(
        md(&a[0])["metadata"],
        json!({"service_with_quota": {"name": "service_1"}})
    );
    assert_eq!(
        md(&a[1])["metadata"],
        json!({"service_with_quota": {"name": "service_2"}})
    );
    assert!(md(&a[2]).get("metadata").is_none(), "{}", a[2]);
    // Headers: the least remaining (service_1, the first of equals).
    assert_eq!(
        headers(&a[2])[..2],
        strings(&[("RateLimit-Limit", "1"), ("RateLimit-Remaining", "0")])
    );
    let reset: u64 = headers(&a[2])[2].1.parse().unwrap();
    assert!((1..=60).contains(&reset), "{reset}");

    assert_eq!(codes(&a[3]), c(OK, &[OK, OK]));
    assert_eq!(limits(&a[3]), [None, l(4, "MINUTE")], "bkthomps replaced");
    assert_eq!(remaining(&a[3], 1), 3);
    assert_eq!(codes(&a[4]), c(OVER, &[OVER]));
    assert_eq!(limits(&a[4]), [l(0, "MINUTE")]);
    assert_eq!(
        headers(&a[4])[..2],
        strings(&[("RateLimit-Limit", "0"), ("RateLimit-Remaining", "0")])
    );
    assert_eq!(codes(&a[5]), c(OK, &[OK, OK]), "banned_limit replaced");
    assert_eq!(limits(&a[5]), [None, l(2, "MINUTE")]);

    for (i, left) in [(6, 2), (7, 1), (8, 0)] {
        assert_eq!(codes(&a[i]), c(OK, &[OK]));
        assert_eq!(remaining(&a[i], 0), left);
    }
    assert_eq!(codes(&a[9]), c(OK, &[OK]), "shadow mode: over, answered OK");
    assert_eq!(limits(&a[9]), [l(3, "MINUTE")]);
    assert_eq!(remaining(&a[9], 0), 0);

    assert_eq!(codes(&a[10]), c(OK, &[OK]));
    assert_eq!(limits(&a[10]), [None]);
    assert_eq!(remaining(&a[10], 0), u32::MAX as u64, "unlimited");

    let twenty = l(20, "MINUTE");
    assert_eq!(
        limits(&a[11]),
        [twenty.clone(), twenty.clone(), twenty.clone(), None, None]
    );
    assert_eq!(
        limits(&a[12]),
        [l(10, "MINUTE"), l(10, "MINUTE"), None, None]
    );
    assert_eq!(limits(&a[13]), [twenty.clone(), twenty.clone(), None, None]);

    assert_eq!(limits(&a[14]), [l(5, "SECOND"), twenty]);
    assert_eq!(
        md(&a[14])["metadata"],
        json!({"name": "service_1", "service_with_quota": {"name": "service_2"}})
    );

    for (i, msg) in [
        (15, "rate limit domain must not be empty"),
        (16, "rate limit descriptor list must not be empty"),
    ] {
        assert_eq!(
            a[i],
            json!({"error": {"code": "UNKNOWN", "details": msg}}),
            "gRPC UNKNOWN, as grpc-go sends upstream's error"
        );
    }

    assert_eq!(codes(&a[17]), c(OK, &[OK]));
    assert_eq!(codes(&a[18]), c(OVER, &[OVER]));
    assert_eq!(limits(&a[18]), [l(1, "HOUR")]);
    assert_eq!(
        md(&a[18])["descriptors"][0]["limit"],
        "requests_per_unit:1 unit:HOUR"
    );

    assert_eq!(codes(&a[19]), c(OK, &[OK]));
    assert_eq!(remaining(&a[19], 0), 0, "2 hits of 2");
    assert_eq!(md(&a[19])["hitsAddend"], 2.0);
    assert_eq!(codes(&a[20]), c(OVER, &[OVER]));
}

/// test/config/merge_domain_key1.yaml and merge_domain_key2.yaml: one domain in two files is
/// refused at the start (both files named, with line and column), and merged with
/// MERGE_DOMAIN_CONFIG=true (TestDuplicateDomain, TestDomainMerge).
#[test]
fn merge_domain_config() {
    let dir = clients().join("envoy/split");
    let out = serve(&dir, &[]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let file = |n: &str| dir.join(n).display().to_string();
    let want = format!(
        "{}:3:9: duplicate domain 'test-domain' in config file (also in {}:3:9); \
         to merge the files of one domain, set MERGE_DOMAIN_CONFIG=true",
        file("merge_domain_key2.yaml"),
        file("merge_domain_key1.yaml")
    );
    assert!(err.contains(&want), "{err}");
    let out = serve(&dir, &[("MERGE_DOMAIN_CONFIG", "maybe")])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("MERGE_DOMAIN_CONFIG=maybe: expected true or false"),
        "{out:?}"
    );

    let s = Server::start(&dir, &[("MERGE_DOMAIN_CONFIG", "true")]);
    fresh_minute();
    let a = s.rls(&json!([request(
        "test-domain",
        &[
            &[("key1", "value1")],
            &[("key2", "value2")],
            &[("key1", "other")]
        ]
    ),]));
    assert_eq!(limits(&a[0]), [l(10, "MINUTE"), l(20, "MINUTE"), None]);

    // `rules import-envoy` reads the setting too.
    let out = Command::new(BIN)
        .args(["rules", "import-envoy"])
        .arg(&dir)
        .env("MERGE_DOMAIN_CONFIG", "true")
        .output()
        .unwrap();
    let rules = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(
        rules.contains("test-domain.key1_value1") && rules.contains("test-domain.key2_value2"),
        "{rules}"
    );
}

/// Over TLS with a password: the client trusts the server's certificate (made here) and sends
/// `authorization: Bearer PASSWORD`; without the password the call is UNAUTHENTICATED.
#[test]
fn tls_and_a_password_over_grpc() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = common::self_signed(dir.path());
    let config = clients().join("envoy/merged/metadata.yaml");
    let flags: Vec<&std::ffi::OsStr> = vec![
        "--tls-cert".as_ref(),
        cert.as_os_str(),
        "--tls-key".as_ref(),
        key.as_os_str(),
        "--requirepass".as_ref(),
        "s3cret".as_ref(),
    ];
    let s = Server::start_with(&config, &[], &flags);
    let target = format!("127.0.0.1:{}", s.grpc);
    let ask = |extra: &[&str]| {
        let mut args = vec!["--target", &target, "--ca", cert.to_str().unwrap()];
        args.extend_from_slice(extra);
        let out = client(&args, &json!([request("nope", &[&[("k", "v")]])]));
        assert!(out.status.success(), "{out:?}");
        serde_json::from_slice::<Value>(&out.stdout).unwrap()
    };
    // An unknown domain is answered OK: the call went through.
    let a = ask(&["--token", "s3cret"]);
    assert_eq!(a["response"]["overallCode"], "OK", "{a}");
    let a = ask(&[]);
    assert_eq!(a["error"]["code"], "UNAUTHENTICATED", "{a}");
    let a = ask(&["--token", "wrong"]);
    assert_eq!(a["error"]["code"], "UNAUTHENTICATED", "{a}");
}

/// The client fails, saying how to install what it needs, when grpcio is not importable
/// (`-S`: the interpreter without its site-packages).
#[test]
fn a_missing_client_library_is_an_error_that_says_how_to_install_it() {
    let script = clients().join("envoy_rls.py");
    let out = Command::new(python())
        .arg("-S")
        .arg(&script)
        .args(["--protos", "/nonexistent", "--target", "127.0.0.1:1"])
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}. {INSTALL}", python().display()));
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("pip install grpcio grpcio-tools") && err.contains("TURNSTILE_TEST_PYTHON"),
        "{err}"
    );
}
