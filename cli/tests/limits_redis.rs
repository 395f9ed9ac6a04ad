//! A limits class in Redis for a fleet, as users run it: `turnstile limits import` into a real
//! redis-server (a bad line refused at `file:line`), two `turnstile serve` sharing that Redis
//! apply each key's limit, a change imported while they run is applied by both within 1 s,
//! and with Redis stopped both keep serving the limits they cached (a key never fetched gets
//! the rule's default).

mod common;
#[path = "../../redis/tests/common/mod.rs"]
mod redis_common;

use std::process::{Command, Output};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_turnstile");

fn turnstile(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().unwrap()
}

/// A `turnstile serve` of the rules, RESP on a free port.
struct Serve {
    _child: common::Running,
    resp: u16,
    http: u16,
}

impl Serve {
    fn start(rules: &str) -> Serve {
        let (resp, http) = (common::free_port(), common::free_port());
        let mut cmd = Command::new(BIN);
        cmd.args(["serve", "--workers", "1", "--throttle-keys", "1000"])
            .args(["--rules", rules])
            .args(["--resp", &format!("127.0.0.1:{resp}")])
            .args(["--http", &format!("127.0.0.1:{http}")])
            .env("RUST_LOG", "warn");
        let child = common::spawn_listening(&mut cmd, &[resp, http]);
        Serve {
            _child: child,
            resp,
            http,
        }
    }

    /// A sample of `GET /metrics` for the class `customers`.
    fn metric(&self, name: &str) -> u64 {
        let o = Command::new("curl")
            .args(["-s", "-m", "10"])
            .arg(format!("http://127.0.0.1:{}/metrics", self.http))
            .output()
            .expect("curl runs");
        let text = String::from_utf8_lossy(&o.stdout);
        let want = format!("{name}{{class=\"customers\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&want))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {want} in the metrics"))
    }

    /// What redis-cli prints for `args`.
    fn cli(&self, args: &[&str]) -> String {
        let o = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &self.resp.to_string()])
            .args(args)
            .output()
            .expect("redis-cli runs");
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    }

    /// The limit `TURNSTILE.PEEK customer id` reports (consumes nothing).
    fn limit(&self, id: u64) -> i64 {
        let out = self.cli(&["TURNSTILE.PEEK", "customer", &id.to_string()]);
        out.lines()
            .nth(1)
            .and_then(|l| l.trim().parse().ok())
            .unwrap_or_else(|| panic!("not a PEEK reply: {out:?}"))
    }

    /// Polls until customer `id`'s limit is `want`; how long it took, if within `limit`.
    fn until(&self, id: u64, want: i64, limit: Duration) -> Option<Duration> {
        let t = Instant::now();
        while t.elapsed() < limit {
            if self.limit(id) == want {
                return Some(t.elapsed());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        None
    }
}

#[test]
fn a_fleet_shares_its_keys_limits_through_redis() {
    let mut redis = redis_common::Server::start();
    let url = redis.url();
    let dir = std::env::temp_dir().join(format!("turnstile-limits-redis-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let rules = dir.join("rules.toml");
    std::fs::write(
        &rules,
        format!(
            r#"
[limits.customers]
key = "customer"
algorithm = "token_bucket"
redis = "{url}"

[limits.customers.plans]
free = {{ limit = 2, window = "1s", burst = 2 }}
pro = {{ limit = 100, window = "1s", burst = 100 }}

[[rule]]
name = "per-customer"
key = "customer"
limits_from = "customers"
limits = [{{ algorithm = "token_bucket", limit = 5, window = "1s", burst = 5 }}]
"#
        ),
    )
    .unwrap();
    let r = rules.to_str().unwrap();
    let file = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p.to_str().unwrap().to_string()
    };

    // A bad line: refused at its line, nothing written.
    let bad = file("bad.csv", "1,pro\n2,gold\n");
    let o = turnstile(&["limits", "import", r, &bad]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("bad.csv:2:") && err.contains("gold"), "{err}");
    assert_eq!(redis.cli(&["DBSIZE"]), "0", "nothing written");

    let good = file("good.csv", "key,limits\n1,pro\n2,free\n3,7/1s burst=7\n");
    let o = turnstile(&["limits", "import", r, &good]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        out.contains("3 entries into") && out.contains("entries/s"),
        "{out}"
    );

    // Read back from Redis, in the file format.
    let o = turnstile(&["limits", "export", r]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "key,entry\n1,pro\n2,free\n3,7/1s burst=7\n"
    );

    let a = Serve::start(r);
    let b = Serve::start(r);
    for s in [&a, &b] {
        // The first request may get the rule's 5 while the entry is fetched.
        s.until(1, 100, Duration::from_secs(2)).expect("pro");
        s.until(2, 2, Duration::from_secs(2)).expect("free");
        s.until(3, 7, Duration::from_secs(2)).expect("own limit");
        s.until(4, 5, Duration::from_secs(2))
            .expect("no entry: default");
    }

    // A change imported while both run: applied by both within 1 s.
    let change = file("change.csv", "1,free\n4,pro\n");
    let t = Instant::now();
    let o = turnstile(&["limits", "import", r, &change]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for s in [&a, &b] {
        s.until(1, 2, Duration::from_secs(1))
            .expect("the change applied within 1 s");
        s.until(4, 100, Duration::from_secs(1))
            .expect("the new entry applied within 1 s");
    }
    eprintln!(
        "both applied the change {:?} after the import began",
        t.elapsed()
    );

    // A change made through one server (TURNSTILE.LIMITS SET, loopback: no admin password
    // needed) is applied by the other within 1 s.
    let t = Instant::now();
    assert_eq!(
        a.cli(&["TURNSTILE.LIMITS", "SET", "customers", "2", "pro"]),
        "OK"
    );
    b.until(2, 100, Duration::from_secs(1))
        .expect("a SET through the other server applied within 1 s");
    eprintln!(
        "a SET through one server applied by the other after {:?}",
        t.elapsed()
    );
    assert_eq!(
        a.limit(2),
        100,
        "and by the server it went through, at once"
    );

    // Redis stopped: the cached limits keep serving; a key never fetched gets the default.
    redis.kill();
    let t = Instant::now();
    while t.elapsed() < Duration::from_millis(1500) {
        for s in [&a, &b] {
            assert_eq!(s.limit(1), 2);
            assert_eq!(s.limit(3), 7);
            assert_eq!(s.limit(4), 100);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // 15 625 buckets (the default capacity, 1M, / 64): a bucket none of 1..=4 is in.
    let of = |id: u64| turnstile_redis::limits::bucket_of(id, 15_625);
    let never = (1000..).find(|i| (1..=4).all(|k| of(k) != of(*i))).unwrap();
    for s in [&a, &b] {
        let before = s.metric("turnstile_limits_redis_unknown_total");
        assert_eq!(
            s.limit(never),
            5,
            "not cached, Redis away: the rule's default"
        );
        assert!(
            s.metric("turnstile_limits_redis_unknown_total") > before,
            "counted"
        );
        assert!(s.metric("turnstile_limits_redis_invalidations_total") >= 1);
        assert!(s.metric("turnstile_limits_redis_cached_entries") >= 4);
    }
    let refused = a.cli(&["TURNSTILE.LIMITS", "SET", "customers", "3", "pro"]);
    assert!(refused.contains("Redis"), "a change needs Redis: {refused}");
    assert_eq!(a.limit(3), 7, "and changes nothing");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_import_far_past_the_classs_buckets_is_refused_before_writing() {
    let redis = redis_common::Server::start();
    let url = redis.url();
    let dir = std::env::temp_dir().join(format!("turnstile-limits-size-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // Sized for 64 entries: one bucket.
    let rules = dir.join("rules.toml");
    std::fs::write(
        &rules,
        format!(
            "[limits.c]\nkey = \"customer\"\nalgorithm = \"token_bucket\"\nredis = \"{url}\"\ncapacity = 64\n\n[limits.c.plans]\npro = {{ limit = 100, window = \"1s\", burst = 100 }}\n\n[[rule]]\nname = \"r\"\nkey = \"customer\"\nlimits_from = \"c\"\nlimits = [{{ algorithm = \"token_bucket\", limit = 5, window = \"1s\", burst = 5 }}]\n"
        ),
    )
    .unwrap();
    let r = rules.to_str().unwrap();
    let write = |name: &str, n: u64| {
        let p = dir.join(name);
        let body: String = (1..=n).map(|i| format!("{i},pro\n")).collect();
        std::fs::write(&p, format!("key,limits\n{body}")).unwrap();
        p.to_str().unwrap().to_string()
    };
    let small = write("small.csv", 10);
    let o = turnstile(&["limits", "import", r, &small]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let keys = redis.cli(&["DBSIZE"]);
    // 1 000 entries into the first writer's one bucket: refused, nothing more written.
    let big = write("big.csv", 1000);
    let o = turnstile(&["limits", "import", r, &big]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(
        err.contains("past the 128") && err.contains("Nothing was written"),
        "{err}"
    );
    assert_eq!(redis.cli(&["DBSIZE"]), keys, "nothing written");
    let _ = std::fs::remove_dir_all(&dir);
}
