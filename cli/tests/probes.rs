//! `turnstile serve` as the probes around it see it: HAProxy's Redis check (Debian's
//! `haproxy`, a child process on free loopback ports), the gRPC health service, and readiness
//! (`/readyz`) as the Redis of `[backend]` goes and comes back.

mod common;

// The harness's real redis-server, as turnstile-redis's own tests start it.
#[path = "../../redis/tests/common/mod.rs"]
mod redis_harness;

use std::process::Command;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_turnstile");

/// `turnstile serve` with `extra` flags, once its listeners answer: (process, RESP port, HTTP
/// port).
fn serve(extra: &[&str]) -> (common::Running, u16, u16) {
    let mut args = vec!["--workers", "1", "--throttle-keys", "1000"];
    args.extend_from_slice(extra);
    common::serve::with_args(BIN, &args)
}

/// What HAProxy's stats page says of each server: (backend/server, status, check status).
fn haproxy_status(stats: u16) -> Vec<(String, String, String)> {
    let o = Command::new("curl")
        .args(["-s", "-m", "5"])
        .arg(format!("http://127.0.0.1:{stats}/stats;csv"))
        .output()
        .expect("curl runs");
    let csv = String::from_utf8_lossy(&o.stdout).into_owned();
    let header: Vec<&str> = csv.lines().next().unwrap_or("").split(',').collect();
    let col = |name: &str| {
        header
            .iter()
            .position(|h| h.trim_start_matches("# ") == name)
    };
    let cols = [
        col("pxname"),
        col("svname"),
        col("status"),
        col("check_status"),
    ];
    let [Some(px), Some(sv), Some(st), Some(ck)] = cols else {
        return Vec::new();
    };
    csv.lines()
        .skip(1)
        .map(|l| l.split(',').collect::<Vec<_>>())
        .filter(|f| f.len() > st.max(ck) && !["BACKEND", "FRONTEND"].contains(&f[sv]))
        .map(|f| {
            (
                format!("{}/{}", f[px], f[sv]),
                f[st].to_string(),
                f[ck].to_string(),
            )
        })
        .collect()
}

/// HAProxy's usual Redis check (`tcp-check send info replication`, `expect string
/// role:master`) marks the server up, its check passed (`L7OK`). The same check against a port
/// that is not Redis (the server's HTTP listener), and a check that expects `role:slave` of
/// it, mark those down: the check reads the reply.
#[test]
fn haproxy_marks_it_up_with_its_redis_check() {
    let (_serve, resp, http) = serve(&[]);
    let stats = common::free_port();
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("haproxy.cfg");
    let backend = |name: &str, role: &str, port: u16| {
        format!(
            "backend {name}\n  option tcp-check\n  tcp-check connect\n\
             \x20 tcp-check send PING\\r\\n\n  tcp-check expect string +PONG\n\
             \x20 tcp-check send info\\ replication\\r\\n\n  tcp-check expect string role:{role}\n\
             \x20 tcp-check send QUIT\\r\\n\n  tcp-check expect string +OK\n\
             \x20 server s 127.0.0.1:{port} check inter 100ms fall 1 rise 1\n\n"
        )
    };
    std::fs::write(
        &cfg,
        format!(
            "defaults\n  mode tcp\n  timeout connect 1s\n  timeout client 5s\n  timeout server 5s\n\n\
             {}{}{}\
             listen stats\n  mode http\n  bind 127.0.0.1:{stats}\n  stats enable\n  stats uri /stats\n",
            backend("turnstile", "master", resp),
            backend("not-redis", "master", http),
            backend("replica", "slave", resp),
        ),
    )
    .unwrap();
    let child = Command::new("haproxy")
        .arg("-f")
        .arg(&cfg)
        .arg("-db")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("haproxy on PATH (cargo xtask test installs Debian's haproxy)");
    let _haproxy = common::Running(child);
    let t0 = Instant::now();
    let mut last = Vec::new();
    while t0.elapsed() < Duration::from_secs(20) {
        last = haproxy_status(stats);
        let of = |name: &str| {
            last.iter()
                .find(|(n, _, _)| n == name)
                .map(|(_, st, ck)| (st.clone(), ck.clone()))
                .unwrap_or_default()
        };
        let (up, passed) = of("turnstile/s");
        if up == "UP"
            && passed == "L7OK"
            && of("not-redis/s").0.starts_with("DOWN")
            && of("replica/s").0.starts_with("DOWN")
        {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("HAProxy's Redis check after 20 s: {last:?} (turnstile UP L7OK, not-redis and replica DOWN expected)");
}

/// An envoyproxy/ratelimit configuration of one limit, in `dir`.
fn envoy_config(dir: &std::path::Path) -> std::path::PathBuf {
    let p = dir.join("ratelimit.yaml");
    std::fs::write(
        &p,
        "domain: probes\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 10\n",
    )
    .unwrap();
    p
}

/// `grpc.health.v1.Health/Check` as a `grpc_health_probe` asks it: `SERVING` for the server
/// (`""`) and for the rate limit service by name, `NOT_FOUND` for another name; without
/// credentials even when the server has a password (probes carry none).
#[test]
fn grpc_health_answers_serving_for_the_server_and_the_rate_limit_service() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;
    let dir = tempfile::tempdir().unwrap();
    let config = envoy_config(dir.path());
    let grpc = common::free_port();
    let (_serve, _, _) = serve(&[
        "--grpc",
        &format!("127.0.0.1:{grpc}"),
        "--envoy-config",
        config.to_str().unwrap(),
        "--requirepass",
        "secret",
    ]);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let url = format!("http://127.0.0.1:{grpc}");
        let ch = tonic::transport::Channel::from_shared(url)
            .unwrap()
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(10))
            .connect()
            .await
            .expect("connects");
        let mut c = HealthClient::new(ch);
        for service in ["", "envoy.service.ratelimit.v3.RateLimitService"] {
            let r = c
                .check(HealthCheckRequest {
                    service: service.into(),
                })
                .await
                .unwrap_or_else(|e| panic!("Check({service:?}): {e}"));
            assert_eq!(r.get_ref().status(), ServingStatus::Serving, "{service:?}");
        }
        let e = c
            .check(HealthCheckRequest {
                service: "nope".into(),
            })
            .await
            .expect_err("an unknown service");
        assert_eq!(e.code(), tonic::Code::NotFound, "{e}");
    });
}

/// `turnstile serve` with one rule counted in the Redis at `url` (`[backend]` with a 200 ms
/// timeout and `backend_extra` lines) and a gRPC listener: (process, RESP, HTTP, gRPC port).
fn serve_on_redis(
    dir: &std::path::Path,
    url: &str,
    backend_extra: &str,
) -> (common::Running, u16, u16, u16) {
    let rules = dir.join("rules.toml");
    std::fs::write(
        &rules,
        format!(
            "[backend]\nredis = \"{url}\"\ntimeout = \"200ms\"\n{backend_extra}\n[[rule]]\nname = \"per-customer\"\nkey = \"customer\"\n\
             limits = [{{ algorithm = \"fixed_window\", limit = 100, window = \"1h\" }}]\n"
        ),
    )
    .unwrap();
    let config = envoy_config(dir);
    let grpc = common::free_port();
    let (serve, resp, http) = serve(&[
        "--rules",
        rules.to_str().unwrap(),
        "--grpc",
        &format!("127.0.0.1:{grpc}"),
        "--envoy-config",
        config.to_str().unwrap(),
    ]);
    (serve, resp, http, grpc)
}

/// `grpc.health.v1.Health/Check` of `service` at 127.0.0.1:`grpc`, on one connection: each
/// call the status it answers.
fn health_of(
    grpc: u16,
    service: &'static str,
) -> impl FnMut() -> tonic_health::pb::health_check_response::ServingStatus {
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut c = rt.block_on(async {
        let ch = tonic::transport::Channel::from_shared(format!("http://127.0.0.1:{grpc}"))
            .unwrap()
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(10))
            .connect()
            .await
            .expect("connects");
        HealthClient::new(ch)
    });
    move || {
        rt.block_on(c.check(HealthCheckRequest {
            service: service.into(),
        }))
        .expect("Check answers")
        .get_ref()
        .status()
    }
}

/// `GET path` on 127.0.0.1:`port`: (status, body).
fn get(port: u16, path: &str) -> (u16, String) {
    let o = Command::new("curl")
        .args(["-s", "-m", "10", "-w", "\n%{http_code}"])
        .arg(format!("http://127.0.0.1:{port}{path}"))
        .output()
        .expect("curl runs");
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.parse().unwrap_or(0), body.to_string())
}

/// Readiness apart from liveness, with the rules' counts in a real redis-server: ready
/// (`/readyz` 200, gRPC health `SERVING`) while Redis answers; once it is killed, `/readyz`
/// is 503 with the reason and gRPC health `NOT_SERVING`, while `/healthz` stays 200; ready
/// again once Redis is back.
#[test]
fn readiness_follows_the_redis_of_the_backend() {
    use tonic_health::pb::health_check_response::ServingStatus;
    let mut redis = redis_harness::Server::start();
    let dir = tempfile::tempdir().unwrap();
    let (_serve, resp, http, grpc) = serve_on_redis(dir.path(), &redis.url(), "");
    let mut health = health_of(grpc, "envoy.service.ratelimit.v3.RateLimitService");
    // Bounded waits: the health service follows readiness once a second.
    until("ready", &mut || get(http, "/readyz").0 == 200);
    assert_eq!(health(), ServingStatus::Serving);
    redis.kill();
    until("/readyz 503", &mut || get(http, "/readyz").0 == 503);
    let (_, body) = get(http, "/readyz");
    assert!(
        body.contains("\"not ready\"") && body.contains("did not answer a PING"),
        "{body}"
    );
    assert_eq!(get(http, "/healthz").0, 200, "alive all along");
    until("NOT_SERVING", &mut || health() == ServingStatus::NotServing);
    // The state in /metrics and INFO, as the last check found it.
    until("turnstile_ready 0", &mut || {
        ready_shown(resp, http) == (0, 0)
    });
    redis.restart();
    until("ready again", &mut || get(http, "/readyz").0 == 200);
    until("SERVING again", &mut || health() == ServingStatus::Serving);
    until("turnstile_ready 1", &mut || {
        ready_shown(resp, http) == (1, 1)
    });
}

/// `turnstile_ready` as /metrics and `INFO server` show it.
fn ready_shown(resp: u16, http: u16) -> (u8, u8) {
    let (_, metrics) = get(http, "/metrics");
    let m = metrics
        .lines()
        .find_map(|l| l.strip_prefix("turnstile_ready ")?.trim().parse().ok())
        .expect("turnstile_ready in /metrics");
    let o = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &resp.to_string(), "INFO", "server"])
        .output()
        .expect("redis-cli runs");
    let info = String::from_utf8_lossy(&o.stdout).into_owned();
    let i = info
        .lines()
        .find_map(|l| l.strip_prefix("turnstile_ready:")?.trim().parse().ok())
        .unwrap_or_else(|| panic!("turnstile_ready in INFO server: {info}"));
    (m, i)
}

/// `TURNSTILE.CHECK`/`REFUND` over RESP with redis-cli: its output, one reply item a line.
fn resp_cli(resp: u16, args: &[&str]) -> String {
    let o = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &resp.to_string()])
        .args(args)
        .output()
        .expect("redis-cli runs");
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

/// Polls `ok` every 100 ms, failing after 20 s (the server retries Redis every 5 s at most
/// and asks itself every second).
fn until(what: &str, ok: &mut dyn FnMut() -> bool) {
    let t0 = Instant::now();
    while !ok() {
        assert!(t0.elapsed() < Duration::from_secs(20), "{what} after 20 s");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A server started while the Redis of `[backend]` is down starts (no crash loop), not ready:
/// `/readyz` 503 with the reason, gRPC health `NOT_SERVING`, `turnstile_ready 0` in /metrics and
/// INFO; its checks answered by the backend's failure policy (`closed`: denied), a refund an
/// error. Once redis-server starts on that port it becomes ready, decides in Redis, and
/// follows Redis going away and coming back.
#[test]
fn a_server_started_with_redis_down_becomes_ready_when_it_answers() {
    use tonic_health::pb::health_check_response::ServingStatus;
    let mut redis = redis_harness::Server::start();
    redis.kill();
    let dir = tempfile::tempdir().unwrap();
    let (_serve, resp, http, grpc) =
        serve_on_redis(dir.path(), &redis.url(), "policy = \"closed\"\n");
    let mut health = health_of(grpc, "");
    // Not ready from the start, and why.
    let (code, body) = get(http, "/readyz");
    assert_eq!(code, 503, "{body}");
    assert!(
        body.contains("has not answered since the start")
            && body.contains(&format!(
                "cannot connect to Redis at redis://127.0.0.1:{}",
                redis.port
            )),
        "{body}"
    );
    assert_eq!(get(http, "/healthz").0, 200, "alive");
    assert_eq!(health(), ServingStatus::NotServing);
    assert_eq!(ready_shown(resp, http), (0, 0));
    // Checks meanwhile: the failure policy (closed: denied, no rule, no retry time).
    let denied = resp_cli(resp, &["TURNSTILE.CHECK", "customer", "7"]);
    assert!(denied.starts_with("0\n"), "{denied}");
    let refund = resp_cli(resp, &["TURNSTILE.REFUND", "customer", "7"]);
    assert!(
        refund.contains("the refund did not reach Redis") && refund.contains("not been reached"),
        "{refund}"
    );
    // Redis comes: ready within the retry bound, the checks decided in Redis.
    redis.restart();
    until("ready", &mut || get(http, "/readyz").0 == 200);
    until("SERVING", &mut || health() == ServingStatus::Serving);
    until("turnstile_ready 1", &mut || {
        ready_shown(resp, http) == (1, 1)
    });
    let allowed = resp_cli(resp, &["TURNSTILE.CHECK", "customer", "7"]);
    assert!(allowed.starts_with("1\n100\n99\n"), "{allowed}");
    assert_ne!(redis.cli(&["DBSIZE"]), "0", "the count is in Redis");
    // Redis goes and comes back: not ready, then ready again.
    redis.kill();
    until("NOT_SERVING", &mut || health() == ServingStatus::NotServing);
    assert_eq!(get(http, "/readyz").0, 503);
    redis.restart();
    until("SERVING again", &mut || health() == ServingStatus::Serving);
    assert_eq!(get(http, "/readyz").0, 200);
}

/// A limits class in Redis that Redis did not answer for at the start: the server starts not
/// ready (the class named in `/readyz`), its keys on the rule's defaults and its entries not
/// settable; once Redis answers the class loads, the server is ready, and entries apply.
#[test]
fn a_limits_class_in_redis_loads_when_redis_answers() {
    let mut redis = redis_harness::Server::start();
    redis.kill();
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules.toml");
    std::fs::write(
        &rules,
        format!(
            "[limits.customers]\nkey = \"customer\"\nalgorithm = \"token_bucket\"\nredis = \"{}\"\n\n\
             [limits.customers.plans]\npro = {{ limit = 100, window = \"1s\", burst = 100 }}\n\n\
             [[rule]]\nname = \"per-customer\"\nkey = \"customer\"\nlimits_from = \"customers\"\n\
             limits = [{{ algorithm = \"token_bucket\", limit = 5, window = \"1s\", burst = 5 }}]\n",
            redis.url()
        ),
    )
    .unwrap();
    let (_serve, resp, http) = serve(&["--rules", rules.to_str().unwrap()]);
    let (code, body) = get(http, "/readyz");
    assert_eq!(code, 503, "{body}");
    assert!(
        body.contains("limits class `customers` not loaded from Redis yet"),
        "{body}"
    );
    // The rule's defaults meanwhile; an entry cannot be set.
    let peek = resp_cli(resp, &["TURNSTILE.PEEK", "customer", "42"]);
    assert!(peek.starts_with("1\n5\n"), "{peek}");
    let set = resp_cli(resp, &["TURNSTILE.LIMITS", "SET", "customers", "42", "pro"]);
    assert!(set.contains("not loaded from Redis yet"), "{set}");
    redis.restart();
    until("ready", &mut || get(http, "/readyz").0 == 200);
    assert_eq!(
        resp_cli(resp, &["TURNSTILE.LIMITS", "SET", "customers", "42", "pro"]),
        "OK"
    );
    until("the entry applies", &mut || {
        resp_cli(resp, &["TURNSTILE.PEEK", "customer", "42"]).starts_with("1\n100\n")
    });
}
