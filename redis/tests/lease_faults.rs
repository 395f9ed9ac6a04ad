//! Leases under faults, against real redis-servers: a node SIGKILLed holding a lease (a child
//! process), Redis restarted mid-run, a Cluster master failover, a rolling restart of every
//! node. Reserve mode: never over the limit; what a dead node held comes back when its lease
//! ends; what live nodes held is given back.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use turnstile::{Limit, Limits, Outcome};
use turnstile_redis::{FailurePolicy, Leases, RedisStore};

/// The nodes' per-call timeout, and what a loaded 2-core machine may add to a call past it.
const TIMEOUT: Duration = Duration::from_millis(200);
const SLACK: Duration = Duration::from_millis(300);

/// The tests start servers and timed loads: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// A fixed window of 40 to 50 days whose next boundary is more than 10 minutes away.
fn long_window() -> Duration {
    let now = unix_ns() / 1_000_000_000;
    (40..=50u64)
        .map(|d| d * 86_400)
        .find(|w| w - now % w > 600)
        .map(Duration::from_secs)
        .expect("the boundaries of 40..=50-day windows are not all within 10 minutes")
}

fn unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_nanos() as u64
}

async fn node(limit: Limit, urls: &[String], policy: FailurePolicy) -> RedisStore {
    let b = RedisStore::builder(Limits::new(vec![limit]).unwrap())
        .timeout(TIMEOUT)
        .policy(policy)
        .leases(Leases::auto());
    match urls {
        [one] => b.connect(one).await,
        many => {
            let u: Vec<&str> = many.iter().map(String::as_str).collect();
            b.connect_cluster(&u).await
        }
    }
    .expect("connect")
}

/// Checks `key` on `n` until `until`; admissions, and the slowest call.
async fn hammer(n: &RedisStore, key: &str, until: Instant) -> (u64, Duration) {
    let (mut admitted, mut slowest) = (0, Duration::ZERO);
    while Instant::now() < until {
        let t = Instant::now();
        admitted += n.check(key, 1).await.allowed() as u64;
        slowest = slowest.max(t.elapsed());
    }
    (admitted, slowest)
}

/// The child of `a_node_killed_holding_a_lease_strands_it_until_its_window_ends`: a node that
/// leases `hot` for 300 ms, says what it admitted and holds, and waits to be killed.
#[test]
fn lease_child() {
    let Ok(url) = std::env::var("LEASE_CHILD_URL") else {
        return;
    };
    let window: u64 = std::env::var("LEASE_CHILD_WINDOW")
        .unwrap()
        .parse()
        .unwrap();
    let rt = common::runtime();
    rt.block_on(async {
        let l = Limit::fixed_window(1000, Duration::from_nanos(window)).unwrap();
        let n = node(l, std::slice::from_ref(&url), FailurePolicy::Closed).await;
        // 300 checks over 300 ms: leased at its rate, holding what it has not spent yet.
        let mut admitted = 0;
        for _ in 0..300 {
            admitted += n.check("hot", 1).await.allowed() as u64;
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let plain = RedisStore::builder(Limits::new(vec![l]).unwrap())
            .connect(&url)
            .await
            .unwrap();
        let held =
            n.peek("hot").await.unwrap().remaining - plain.peek("hot").await.unwrap().remaining;
        println!("HELD {admitted} {held}");
        std::thread::sleep(Duration::from_secs(60));
    });
}

#[test]
fn a_node_killed_holding_a_lease_strands_it_until_its_window_ends() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let server = common::Server::start();
    let w = Duration::from_secs(6);
    let wn = w.as_nanos() as u64;
    let l = Limit::fixed_window(1000, w).unwrap();
    let rt = common::runtime();
    // Start just after a window begins (Redis's clock is this machine's).
    let into = unix_ns() % wn;
    std::thread::sleep(Duration::from_nanos(wn - into + 50_000_000));
    let window_end = Instant::now() + Duration::from_nanos(wn - 50_000_000);
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["lease_child", "--exact", "--nocapture", "--test-threads=1"])
        .env("LEASE_CHILD_URL", server.url())
        .env("LEASE_CHILD_WINDOW", wn.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let out = BufReader::new(child.stdout.take().unwrap());
    let line = out
        .lines()
        .map_while(Result::ok)
        .find_map(|l| l.find("HELD").map(|i| l[i..].to_string()))
        .expect("the child's HELD line");
    child.kill().unwrap(); // SIGKILL: nothing given back.
    child.wait().unwrap();
    let f: Vec<u64> = line
        .split(' ')
        .skip(1)
        .map(|x| x.parse().unwrap())
        .collect();
    let (child_admitted, held) = (f[0], f[1]);
    eprintln!("the child admitted {child_admitted} and held {held} when killed");
    assert!(held > 0, "the child held a lease: {line}");
    let url = server.url();
    let (this, next) = rt.block_on(async {
        let a = node(l, std::slice::from_ref(&url), FailurePolicy::Closed).await;
        let b = node(l, std::slice::from_ref(&url), FailurePolicy::Closed).await;
        let until = window_end - Duration::from_millis(500);
        let (x, y) = tokio::join!(hammer(&a, "hot", until), hammer(&b, "hot", until));
        tokio::time::sleep_until((window_end + Duration::from_millis(200)).into()).await;
        let until = Instant::now() + Duration::from_secs(2);
        let (p, q) = tokio::join!(hammer(&a, "hot", until), hammer(&b, "hot", until));
        (x.0 + y.0, p.0 + q.0)
    });
    eprintln!("the others admitted {this} in that window and {next} in the next");
    assert!(child_admitted + held + this <= 1000, "never over");
    assert!(
        this + 20 >= 1000 - child_admitted - held,
        "the others got what the dead node did not hold: {this}"
    );
    assert_eq!(next, 1000, "what it held came back when its window ended");
}

#[test]
fn redis_restarted_leases_run_out_then_the_policy_answers() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let mut server = common::Server::start();
    let rt = common::runtime();
    // Not reached in a run (the counts restart empty with the server: no persistence).
    let l = Limit::fixed_window(turnstile::algo::fixed_window::MAX_LIMIT, long_window()).unwrap();
    let n = Arc::new(rt.block_on(node(l, &[server.url()], FailurePolicy::Closed)));
    let stop = Arc::new(AtomicBool::new(false));
    let slowest = Arc::new(AtomicU64::new(0));
    let by_policy = Arc::new(AtomicU64::new(0));
    let load = {
        let (n, stop, slowest, by_policy) =
            (n.clone(), stop.clone(), slowest.clone(), by_policy.clone());
        rt.spawn(async move {
            let mut admitted = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                let d = n.check("k", 1).await;
                slowest.fetch_max(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
                match d.outcome {
                    Outcome::Allowed => admitted += 1,
                    Outcome::StoreFull => {
                        by_policy.fetch_add(1, Ordering::Relaxed);
                    }
                    o => panic!("{o:?}"),
                }
                tokio::task::yield_now().await;
            }
            admitted
        })
    };
    std::thread::sleep(Duration::from_millis(500));
    let before = n.lease_stats().unwrap();
    assert!(before.local > before.round_trips * 10, "leased: {before:?}");
    server.kill();
    // Longer than a lease (sized for at most a second of the node's rate).
    std::thread::sleep(Duration::from_secs(3));
    let during = n.stats();
    server.restart();
    let restarted = n.stats().redis;
    common::wait_for(
        "the node answered from Redis again",
        Duration::from_secs(15),
        || n.stats().redis > restarted,
        || format!("{:?} {:?}", n.stats(), n.lease_stats()),
    );
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    let admitted = rt.block_on(load).unwrap();
    let after = n.lease_stats().unwrap();
    eprintln!(
        "admitted {admitted}, policy {}, slowest {:?}; {during:?}; {after:?}",
        by_policy.load(Ordering::Relaxed),
        Duration::from_nanos(slowest.load(Ordering::Relaxed))
    );
    assert!(
        during.fallbacks > 0,
        "the policy answered once the lease ran out"
    );
    assert!(
        Duration::from_nanos(slowest.load(Ordering::Relaxed)) <= TIMEOUT + SLACK,
        "every check within the timeout"
    );
    assert!(
        after.lease_calls > before.lease_calls,
        "leased again after the restart"
    );
    assert!(after.local > before.local + 1000, "answered locally again");
}

/// Every node checks every key once per ms until `until`; admissions per key.
async fn paced(nodes: &[RedisStore], admitted: &mut [u64], until: Instant) {
    while Instant::now() < until {
        for n in nodes {
            for (k, a) in admitted.iter_mut().enumerate() {
                *a += n.check(&format!("k{k}"), 1).await.allowed() as u64;
            }
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

#[test]
fn a_rolling_restart_gives_back_what_nodes_held() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let server = common::Server::start();
    let rt = common::runtime();
    const KEYS: usize = 8;
    const LIMIT: u64 = 2000;
    let l = Limit::fixed_window(LIMIT, long_window()).unwrap();
    let url = [server.url()];
    let (admitted, returned, stranded) = rt.block_on(async {
        let mut nodes = Vec::new();
        for _ in 0..4 {
            nodes.push(node(l, &url, FailurePolicy::Closed).await);
        }
        let mut admitted = [0u64; KEYS];
        let (mut returned, mut stranded) = (0, 0);
        // Each round the nodes check every key at their pace (leases sized for a second of it,
        // most of them unspent), then one node restarts: its leases given back, a new node in
        // its place.
        for round in 0..4 {
            paced(
                &nodes,
                &mut admitted,
                Instant::now() + Duration::from_millis(150),
            )
            .await;
            let new = node(l, &url, FailurePolicy::Closed).await;
            let old = std::mem::replace(&mut nodes[round], new);
            old.return_leases().await;
            let st = old.lease_stats().unwrap();
            returned += st.returned;
            stranded += st.stranded;
        }
        // The demand goes on until the limits are reached: what was given back is admitted
        // (denied nodes ask again within `recheck`).
        paced(
            &nodes,
            &mut admitted,
            Instant::now() + Duration::from_secs(3),
        )
        .await;
        for n in &nodes {
            n.return_leases().await;
            let st = n.lease_stats().unwrap();
            returned += st.returned;
            stranded += st.stranded;
        }
        (admitted, returned, stranded)
    });
    eprintln!("admitted {admitted:?}; returned {returned}, stranded {stranded}");
    assert!(returned > 0, "the restarted nodes gave back what they held");
    assert_eq!(stranded, 0, "nothing stranded");
    for a in admitted {
        assert_eq!(
            a, LIMIT,
            "never over, and everything held went back and was admitted"
        );
    }
}

#[test]
fn a_cluster_master_failover_admits_nothing_over_the_limit() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let mut cluster = common::Cluster::start_with(1, 1000);
    let rt = common::runtime();
    const KEYS: usize = 48;
    const LIMIT: u64 = 150;
    let l = Limit::fixed_window(LIMIT, long_window()).unwrap();
    let urls = cluster.urls()[..3].to_vec();
    let nodes: Vec<Arc<RedisStore>> = rt.block_on(async {
        let mut v = Vec::new();
        for _ in 0..4 {
            v.push(Arc::new(node(l, &urls, FailurePolicy::Closed).await));
        }
        v
    });
    let stop = Arc::new(AtomicBool::new(false));
    let slowest = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let (n, stop, slowest) = (n.clone(), stop.clone(), slowest.clone());
            rt.spawn(async move {
                // One check per 2 ms per node, over the keys in turn: the limits are reached
                // some seconds after the failover.
                let mut admitted = vec![0u64; KEYS];
                let mut k = i;
                let mut tick = tokio::time::interval(Duration::from_millis(2));
                while !stop.load(Ordering::Relaxed) {
                    tick.tick().await;
                    let t = Instant::now();
                    let d = n.check(&format!("q{}", k % KEYS), 1).await;
                    slowest.fetch_max(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
                    admitted[k % KEYS] += d.allowed() as u64;
                    k += 1;
                }
                admitted
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(1500));
    // The master of q0's slot.
    let topo = cluster.topology(0);
    let victim = topo
        .iter()
        .find(|m| m.is_master() && m.serves(common::slot("{q0}")))
        .expect("a master serves q0")
        .port;
    let v = cluster.index_of(victim).unwrap();
    cluster.nodes[v].kill();
    common::wait_for(
        "a replica promoted",
        Duration::from_secs(20),
        || {
            (0..cluster.nodes.len()).filter(|&i| i != v).all(|i| {
                cluster.nodes[i]
                    .cli(&["cluster", "info"])
                    .contains("cluster_state:ok")
            })
        },
        || cluster.nodes[(v + 1) % 6].cli(&["cluster", "nodes"]),
    );
    std::thread::sleep(Duration::from_secs(12));
    stop.store(true, Ordering::Relaxed);
    let mut admitted = vec![0u64; KEYS];
    for t in tasks {
        for (a, x) in admitted.iter_mut().zip(rt.block_on(t).unwrap()) {
            *a += x;
        }
    }
    let stats: Vec<_> = nodes
        .iter()
        .map(|n| (n.stats(), n.lease_stats().unwrap()))
        .collect();
    eprintln!("admitted {admitted:?}\n{stats:?}");
    let over: Vec<_> = admitted
        .iter()
        .enumerate()
        .filter(|(_, &a)| a > LIMIT)
        .collect();
    assert!(over.is_empty(), "over the limit: {over:?}");
    assert!(
        admitted.iter().filter(|&&a| a == LIMIT).count() > KEYS / 2,
        "the keys reached their limit after the failover: {admitted:?}"
    );
    assert!(
        Duration::from_nanos(slowest.load(Ordering::Relaxed)) <= TIMEOUT + SLACK,
        "the policy answered within the timeout: {:?}",
        Duration::from_nanos(slowest.load(Ordering::Relaxed))
    );
}
