//! `turnstile serve` with the rules' counts in Redis (`[backend] redis` in the rules file),
//! against a real `redis-server` (the harness of turnstile-redis's tests): two servers sharing
//! one Redis enforce one limit together over RESP (the `redis` crate as the client) and HTTP;
//! shadow and soft rules; Redis killed mid-run (the policy answers, fallbacks counted, no
//! panic); a broken `[backend]` refused at start and on reload, with `file:line:column`, an
//! unreachable one at start starting not ready, and reloads while it connects; a reload that
//! switches memory to Redis; settles over RESP and HTTP.

#[path = "../../redis/tests/common/mod.rs"]
mod common;
#[path = "common/mod.rs"]
mod web;
use web::curl;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use turnstile_server::{start, Running, ServeArgs, ServeError};

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("turnstile-rb-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn serve(rules: &Path) -> Result<Running, ServeError> {
    let mut a = ServeArgs::new();
    a.resp = "127.0.0.1:0".parse().unwrap();
    a.http = "127.0.0.1:0".parse().unwrap();
    a.workers = Some(2);
    a.throttle_keys = 10_000;
    a.rules = Some(rules.to_path_buf());
    a.watch_every = Duration::ZERO;
    start(a)
}

fn stop(r: Running) {
    r.stop();
    r.join().unwrap();
}

/// The six fields of a TURNSTILE.CHECK reply: allowed, limit, remaining, retry_after_ms,
/// reset_after_ms, rule.
type Reply = (i64, i64, i64, i64, i64, Option<String>);

fn check(con: &mut redis::Connection, args: &[&str]) -> Reply {
    let mut c = redis::cmd("TURNSTILE.CHECK");
    for a in args {
        c.arg(*a);
    }
    c.query(con).unwrap()
}

fn resp(r: &Running) -> redis::Connection {
    let c = redis::Client::open(format!("redis://{}/", r.resp)).unwrap();
    let con = c.get_connection().unwrap();
    con.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    con
}

fn metric(r: &Running, line_start: &str) -> Option<f64> {
    let (_, body) = curl("GET", &format!("http://{}/metrics", r.http), None);
    body.lines()
        .find(|l| l.starts_with(line_start))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

fn rules_file(dir: &Path, url: &str, extra: &str) -> PathBuf {
    let p = dir.join("rules.toml");
    std::fs::write(
        &p,
        format!(
            r#"
[backend]
redis = "{url}"
{extra}

[[rule]]
name = "per-customer"
key = "customer"
limits = [{{ algorithm = "fixed_window", limit = 100, window = "1h" }}]

[[rule]]
name = "soft"
key = "api_key"
mode = "soft"
soft_percent = 50
limits = [{{ algorithm = "token_bucket", limit = 4, window = "1h", burst = 4 }}]

[[rule]]
name = "watch"
key = "api_key"
mode = "shadow"
limits = [{{ algorithm = "fixed_window", limit = 2, window = "1h" }}]
"#
        ),
    )
    .unwrap();
    p
}

/// Two servers, one Redis: 8 clients spread over both send 40 checks each for one customer;
/// exactly 100 are admitted in all, over RESP and HTTP alike.
#[test]
fn two_servers_sharing_one_redis_enforce_one_limit() {
    let redis = common::Server::start();
    let dir = tmpdir("two");
    // A long timeout: no fallback on a loaded machine.
    let rules = rules_file(&dir, &redis.url(), "timeout = \"5s\"");
    let a = serve(&rules).unwrap();
    let b = serve(&rules).unwrap();
    let addrs = [a.resp, b.resp];
    let threads: Vec<_> = (0..8)
        .map(|i| {
            let addr = addrs[i % 2];
            std::thread::spawn(move || {
                let c = redis::Client::open(format!("redis://{addr}/")).unwrap();
                let mut con = c.get_connection().unwrap();
                con.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                (0..40)
                    .filter(|_| check(&mut con, &["customer", "7"]).0 == 1)
                    .count()
            })
        })
        .collect();
    let admitted: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
    assert_eq!(admitted, 100);
    // Both servers see the spent limit, over HTTP too.
    for r in [&a, &b] {
        let (status, body) = curl(
            "POST",
            &format!("http://{}/v1/check", r.http),
            Some(r#"{"key_class":"customer","key":"7"}"#),
        );
        assert_eq!(status, 429, "{body}");
        assert!(body.contains(r#""rule":"per-customer""#), "{body}");
        let (status, body) = curl(
            "POST",
            &format!("http://{}/v1/check", r.http),
            Some(r#"{"key_class":"customer","key":"8"}"#),
        );
        assert_eq!(status, 200, "{body}");
    }
    // A refund through one server is seen by the other.
    let mut con = resp(&a);
    let n: i64 = redis::cmd("TURNSTILE.REFUND")
        .arg("customer")
        .arg("7")
        .query(&mut con)
        .unwrap();
    assert_eq!(n, 1);
    assert_eq!(check(&mut resp(&b), &["customer", "7"]).0, 1);
    // The counts are Redis's: its keys, none in the servers' stores.
    let keys = redis.cli(&["--scan", "--pattern", "ts:per-customer:*"]);
    assert_eq!(keys.lines().count(), 2, "{keys}");
    assert_eq!(
        metric(&a, "turnstile_rules_backend{backend=\"redis\"}"),
        Some(1.0)
    );
    let calls = metric(&a, "turnstile_backend_calls_total{result=\"redis\"}").unwrap()
        + metric(&b, "turnstile_backend_calls_total{result=\"redis\"}").unwrap();
    assert!(calls >= 8.0 * 40.0, "{calls}");
    assert_eq!(
        metric(&a, "turnstile_backend_calls_total{result=\"fallback\"}"),
        Some(0.0)
    );
    stop(a);
    stop(b);
}

/// With `[backend] leases = "auto"`, a hot key is answered in the process, /metrics shows
/// each leased rule's figures, and what the leases hold goes back to Redis at shutdown: a
/// server without leases then finds exactly what was admitted counted.
#[test]
fn leases_are_counted_in_metrics_and_given_back_at_shutdown() {
    let redis = common::Server::start();
    let dir = tmpdir("leases");
    let leased = rules_file(
        &dir,
        &redis.url(),
        "timeout = \"5s\"\nleases = \"auto\"\nstrand = \"0%\"",
    );
    let a = serve(&leased).unwrap();
    let mut con = resp(&a);
    let admitted = (0..60)
        .filter(|_| check(&mut con, &["customer", "7"]).0 == 1)
        .count();
    assert_eq!(admitted, 60);
    let line = |m: &str| format!("turnstile_lease_{m}{{rule=\"per-customer\"}}");
    assert_eq!(metric(&a, &line("checks_total")), Some(60.0));
    let local = metric(&a, &line("local_total")).unwrap();
    assert!(local > 0.0, "no check answered in the process");
    assert!(metric(&a, &line("granted_total")).unwrap() > 0.0);
    drop(con);
    stop(a);
    // Another server, without leases, on the same Redis: 100 - 60 left, not less.
    let dir = tmpdir("leases-after");
    let plain = rules_file(&dir, &redis.url(), "timeout = \"5s\"");
    let b = serve(&plain).unwrap();
    let peek: Reply = redis::cmd("TURNSTILE.PEEK")
        .arg("customer")
        .arg("7")
        .query(&mut resp(&b))
        .unwrap();
    assert_eq!(
        peek.2, 40,
        "what the leases held was not given back: {peek:?}"
    );
    stop(b);
}

/// A soft rule admits its tolerance and reports the nominal limit; a shadow rule never
/// denies and counts what it would have denied.
#[test]
fn soft_and_shadow_rules_over_resp() {
    let redis = common::Server::start();
    let dir = tmpdir("modes");
    let rules = rules_file(&dir, &redis.url(), "timeout = \"5s\"");
    let a = serve(&rules).unwrap();
    let mut con = resp(&a);
    let replies: Vec<Reply> = (0..8)
        .map(|_| check(&mut con, &["api_key", "k1"]))
        .collect();
    let admitted: Vec<&Reply> = replies.iter().filter(|r| r.0 == 1).collect();
    assert_eq!(admitted.len(), 6, "4 + 50 %: {replies:?}");
    assert!(
        admitted.iter().all(|r| r.1 == 4),
        "the nominal limit: {replies:?}"
    );
    assert_eq!(replies[7].5.as_deref(), Some("soft"));
    assert_eq!(
        metric(
            &a,
            "turnstile_rule_events_total{rule=\"soft\",event=\"over_nominal\"}"
        ),
        Some(2.0)
    );
    assert_eq!(
        metric(
            &a,
            "turnstile_rule_events_total{rule=\"watch\",event=\"would_deny\"}"
        ),
        Some(4.0)
    );
    // PEEK consumes nothing.
    let p: Reply = redis::cmd("TURNSTILE.PEEK")
        .arg("customer")
        .arg("1")
        .query(&mut con)
        .unwrap();
    assert_eq!((p.0, p.1, p.2), (1, 100, 100));
    stop(a);
}

/// A settle with the counts in Redis, over RESP and HTTP on two servers sharing the Redis:
/// a give-back one server makes is what the other peeks, and a charge past the limit (a
/// debt in Redis) denies the next check on the other.
#[test]
fn settle_with_a_redis_backend() {
    let redis = common::Server::start();
    let dir = tmpdir("settle");
    let rules = rules_file(&dir, &redis.url(), "timeout = \"5s\"");
    let a = serve(&rules).unwrap();
    let b = serve(&rules).unwrap();
    let (mut ca, mut cb) = (resp(&a), resp(&b));
    assert_eq!(check(&mut ca, &["customer", "3", "5"]).2, 95);
    // Reserved 5, used 1: 4 given back.
    let s: (i64, i64, i64, i64, i64, i64) = redis::cmd("TURNSTILE.SETTLE")
        .arg(&["customer", "3", "5", "1"])
        .query(&mut ca)
        .unwrap();
    assert_eq!((s.0, s.1, s.2, s.3, s.4), (1, 0, 4, 100, 99), "{s:?}");
    let p: Reply = redis::cmd("TURNSTILE.PEEK")
        .arg("customer")
        .arg("3")
        .query(&mut cb)
        .unwrap();
    assert_eq!((p.0, p.1, p.2), (1, 100, 99));
    // Reserved 5, used 150: 145 charged, past the limit.
    let (status, body) = curl(
        "POST",
        &format!("http://{}/v1/settle", b.http),
        Some(r#"{"key_class":"customer","key":"3","reserved":5,"actual":150}"#),
    );
    assert_eq!(status, 200, "{body}");
    assert!(
        body.starts_with(r#"{"settled":1,"charged":145,"given_back":0,"limit":100,"remaining":0,"#),
        "{body}"
    );
    let c = check(&mut ca, &["customer", "3"]);
    assert_eq!(
        (c.0, c.2, c.5.as_deref()),
        (0, 0, Some("per-customer")),
        "{c:?}"
    );
    // A key no rule matches: nothing settled.
    let s: (i64, i64, i64, i64, i64, i64) = redis::cmd("TURNSTILE.SETTLE")
        .arg(&["route", "/nowhere", "1", "5"])
        .query(&mut ca)
        .unwrap();
    assert_eq!((s.0, s.1, s.2), (0, 0, 0), "{s:?}");
    stop(a);
    stop(b);
}

/// The log lines of this test binary's servers (a process-wide subscriber: the servers log on
/// their own threads).
fn captured_log() -> &'static std::sync::Mutex<Vec<u8>> {
    static LOG: std::sync::OnceLock<&'static std::sync::Mutex<Vec<u8>>> =
        std::sync::OnceLock::new();
    LOG.get_or_init(|| {
        let log: &'static std::sync::Mutex<Vec<u8>> = Box::leak(Box::default());
        struct W(&'static std::sync::Mutex<Vec<u8>>);
        impl std::io::Write for W {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let _ = tracing_subscriber::fmt()
            .with_env_filter("warn")
            .with_ansi(false)
            .with_writer(move || W(log))
            .try_init();
        log
    })
}

/// Redis killed mid-run: the configured policy answers (closed: denied; open: admitted), no
/// panic, fallbacks counted, and each opening of the circuit is a WARN in the log; after Redis
/// is back, Redis answers again.
#[test]
fn a_killed_redis_is_answered_by_the_policy() {
    let log = captured_log();
    let mut redis = common::Server::start();
    let closed_dir = tmpdir("killed-closed");
    let closed = serve(&rules_file(&closed_dir, &redis.url(), "timeout = \"1s\"")).unwrap();
    let open_dir = tmpdir("killed-open");
    let open = serve(&rules_file(
        &open_dir,
        &redis.url(),
        "timeout = \"1s\"\npolicy = \"open\"",
    ))
    .unwrap();
    let (mut c, mut o) = (resp(&closed), resp(&open));
    assert_eq!(check(&mut c, &["customer", "1"]).0, 1);
    assert_eq!(check(&mut o, &["customer", "1"]).0, 1);
    redis.kill();
    for _ in 0..20 {
        let r = check(&mut c, &["customer", "1"]);
        assert_eq!((r.0, r.5.as_deref()), (0, None), "closed denies: {r:?}");
        assert_eq!(check(&mut o, &["customer", "1"]).0, 1, "open admits");
    }
    let (status, body) = curl(
        "POST",
        &format!("http://{}/v1/check", closed.http),
        Some(r#"{"key_class":"customer","key":"1"}"#),
    );
    assert_eq!(status, 429, "{body}");
    assert!(body.contains("StoreFull"), "{body}");
    let r: redis::RedisResult<i64> = redis::cmd("TURNSTILE.REFUND")
        .arg("customer")
        .arg("1")
        .query(&mut c);
    assert!(
        r.unwrap_err().to_string().contains("did not reach Redis"),
        "a refund Redis did not take is an error"
    );
    for s in [&closed, &open] {
        let f = metric(s, "turnstile_backend_calls_total{result=\"fallback\"}").unwrap();
        assert!(f >= 20.0, "{f}");
        assert_eq!(metric(s, "turnstile_backend_circuit_open "), Some(1.0));
    }
    // The outage is in the log, not only in the metrics: once per opening of the circuit.
    let text = String::from_utf8_lossy(&log.lock().unwrap()).into_owned();
    let opened = text
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("redis backend failing: circuit open"))
        .count();
    assert!((2..=10).contains(&opened), "{opened} lines:\n{text}");
    redis.restart();
    let t0 = Instant::now();
    while check(&mut c, &["customer", "1"]).0 != 1 {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "Redis never used again"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    stop(closed);
    stop(open);
}

/// A broken `[backend]` is refused at start with `file:line:column`; an unreachable Redis
/// starts the server not ready, and is refused on reload (the old rules and backend stay).
#[test]
fn a_broken_backend_is_refused_with_file_line_column() {
    let dir = tmpdir("broken");
    let p = dir.join("rules.toml");
    std::fs::write(
        &p,
        "[backend]\nredis = \"redis://127.0.0.1:6379\"\npolicy = \"insurance\"\n[[rule]]\nname = \"r\"\nkey = \"customer\"\nlimits = [{ limit = 5, window = \"1s\" }]\n",
    )
    .unwrap();
    let e = serve(&p).err().expect("refused").to_string();
    assert_eq!(
        e,
        format!(
            "{}:3:10: policy = \"insurance\" needs expected_nodes = N: how many processes share the limits (while Redis is away, each decides in memory at limit / N)",
            p.display()
        )
    );
    let port = common::free_port();
    let down = format!("[backend]\nredis = \"redis://127.0.0.1:{port}\"\n[[rule]]\nname = \"r\"\nkey = \"customer\"\nlimits = [{{ limit = 5, window = \"1s\" }}]\n");
    std::fs::write(&p, &down).unwrap();
    // Unreachable at start: it starts, not ready, the reason at the [backend] line; its
    // checks answered by the policy (closed, the default: denied).
    let t0 = Instant::now();
    let a = serve(&p).expect("starts with Redis down");
    assert!(t0.elapsed() < Duration::from_secs(15));
    let (status, body) = curl("GET", &format!("http://{}/readyz", a.http), None);
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains("rules.toml:2:9: cannot connect to Redis at redis://127.0.0.1:"),
        "{body}"
    );
    let mut con = resp(&a);
    assert_eq!(check(&mut con, &["customer", "5"]).0, 0, "closed: denied");
    assert_eq!(
        metric(&a, "turnstile_rules_backend{backend=\"redis\"}"),
        Some(1.0)
    );
    assert_eq!(metric(&a, "turnstile_backend_circuit_open "), Some(1.0));
    stop(a);

    // Running on memory; a reload to an unreachable Redis is refused and changes nothing.
    std::fs::write(
        &p,
        "[[rule]]\nname = \"r\"\nkey = \"customer\"\nlimits = [{ limit = 2, window = \"1h\" }]\n",
    )
    .unwrap();
    let a = serve(&p).unwrap();
    std::fs::write(&p, &down).unwrap();
    let (status, body) = curl("POST", &format!("http://{}/v1/reload", a.http), None);
    assert_eq!(status, 422, "{body}");
    assert!(
        body.contains("rules.toml:2:9: cannot connect to Redis"),
        "{body}"
    );
    let mut con = resp(&a);
    let r: Vec<i64> = (0..3)
        .map(|_| check(&mut con, &["customer", "5"]).0)
        .collect();
    assert_eq!(r, [1, 1, 0], "the old rules, in memory");
    assert_eq!(
        metric(&a, "turnstile_rules_backend{backend=\"memory\"}"),
        Some(1.0)
    );
    stop(a);
}

/// A reload can switch the counts from memory to Redis and back.
#[test]
fn a_reload_switches_backends() {
    let redis = common::Server::start();
    let dir = tmpdir("switch");
    let p = dir.join("rules.toml");
    let rule = "[[rule]]\nname = \"r\"\nkey = \"customer\"\nlimits = [{ algorithm = \"fixed_window\", limit = 3, window = \"1h\" }]\n";
    std::fs::write(&p, rule).unwrap();
    let a = serve(&p).unwrap();
    let mut con = resp(&a);
    assert_eq!(check(&mut con, &["customer", "1"]).2, 2, "memory");
    std::fs::write(
        &p,
        format!(
            "[backend]\nredis = \"{}\"\ntimeout = \"5s\"\n{rule}",
            redis.url()
        ),
    )
    .unwrap();
    let (status, body) = curl("POST", &format!("http://{}/v1/reload", a.http), None);
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(r#""backend":"redis""#), "{body}");
    // Redis starts empty: the memory's charge is not there.
    assert_eq!(check(&mut con, &["customer", "1"]).2, 2, "redis");
    assert_eq!(
        redis
            .cli(&["--scan", "--pattern", "ts:r:*"])
            .lines()
            .count(),
        1
    );
    // The same table again keeps the backend and its counts.
    let (status, _) = curl("POST", &format!("http://{}/v1/reload", a.http), None);
    assert_eq!(status, 200);
    assert_eq!(check(&mut con, &["customer", "1"]).2, 1, "kept");
    std::fs::write(&p, rule).unwrap();
    let (status, body) = curl("POST", &format!("http://{}/v1/reload", a.http), None);
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(r#""backend":"memory""#), "{body}");
    assert_eq!(
        check(&mut con, &["customer", "1"]).2,
        1,
        "memory, as it was kept"
    );
    stop(a);
}

/// Reloads while a backend not reached at the start connects: a reload that keeps the table
/// keeps it connecting, and once Redis answers the checks are decided there by the reloaded
/// rules; a reload to memory ends the connecting, and a Redis that answers later is not used.
#[test]
fn reloads_while_the_backend_connects() {
    let mut redis = common::Server::start();
    redis.kill();
    let dir = tmpdir("connecting");
    let p = dir.join("rules.toml");
    let url = redis.url();
    let with = |limit: u64| {
        format!(
            "[backend]\nredis = \"{url}\"\n[[rule]]\nname = \"r\"\nkey = \"customer\"\nlimits = [{{ algorithm = \"fixed_window\", limit = {limit}, window = \"1h\" }}]\n"
        )
    };
    let ready = |r: &Running| curl("GET", &format!("http://{}/readyz", r.http), None).0;
    let reload = |r: &Running| curl("POST", &format!("http://{}/v1/reload", r.http), None);
    std::fs::write(&p, with(3)).unwrap();
    let a = serve(&p).expect("starts with Redis down");
    let mut con = resp(&a);
    assert_eq!(check(&mut con, &["customer", "1"]).0, 0, "closed: denied");
    std::fs::write(&p, with(2)).unwrap();
    let (status, body) = reload(&a);
    assert_eq!(status, 200, "{body}");
    assert_eq!(ready(&a), 503, "still connecting");
    redis.restart();
    let t0 = Instant::now();
    while ready(&a) != 200 {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "not ready after 20 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let r = check(&mut con, &["customer", "1"]);
    assert_eq!(
        (r.0, r.1, r.2),
        (1, 2, 1),
        "decided in Redis by the reloaded rules"
    );
    assert_ne!(redis.cli(&["DBSIZE"]), "0");
    stop(a);

    redis.kill();
    std::fs::write(&p, with(3)).unwrap();
    let b = serve(&p).expect("starts with Redis down");
    std::fs::write(
        &p,
        "[[rule]]\nname = \"r\"\nkey = \"customer\"\nlimits = [{ algorithm = \"fixed_window\", limit = 1, window = \"1h\" }]\n",
    )
    .unwrap();
    let (status, body) = reload(&b);
    assert_eq!(status, 200, "{body}");
    assert_eq!(ready(&b), 200, "in memory: ready");
    redis.restart();
    // Past the retry's longest wait: the connecting ended with the reload.
    std::thread::sleep(Duration::from_secs(6));
    let mut con = resp(&b);
    let r: Vec<i64> = (0..2)
        .map(|_| check(&mut con, &["customer", "9"]).0)
        .collect();
    assert_eq!(r, [1, 0], "in memory, limit 1");
    assert_eq!(
        metric(&b, "turnstile_rules_backend{backend=\"memory\"}"),
        Some(1.0)
    );
    assert_eq!(redis.cli(&["DBSIZE"]), "0", "Redis not used");
    stop(b);
}
