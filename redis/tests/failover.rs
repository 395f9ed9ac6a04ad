//! A Redis Cluster failover under load: 3 masters and 3 replicas, one master killed (SIGKILL)
//! while tasks check keys on every master through `RedisStore::check`. Calls during the outage
//! are answered by the failure policy within the timeout, the replica takes over, calls are
//! answered by Redis again, and no admission a caller saw from Redis is missing from the counts
//! afterwards: a count never below what was admitted, a limit never over-admitted.
//!
//! Replication is asynchronous: the second test drops the replica's link before the kill, and
//! the same checks must see the admissions the master answered alone go missing.

mod common;

use common::{slot, wait_for, Cluster, NodeLine};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::time::MissedTickBehavior;
use turnstile::{Limit, Limits, Outcome};
use turnstile_redis::{FailurePolicy, RedisStore};

/// The stores' per-call timeout.
const TIMEOUT: Duration = Duration::from_millis(200);
/// What a loaded 2-core machine may add to a call past its timeout (scheduling).
const SLACK: Duration = Duration::from_millis(300);
const TASKS: usize = 6;
/// Each task's pace: one check of each store per tick (missed ticks are not caught up).
const TICK: Duration = Duration::from_millis(5);
/// Keys of the store whose limit is never reached (any admission Redis answered must be
/// in its count at the end).
const OPEN_KEYS: usize = 256;
/// Keys of the store whose limit is reached after the failover (a lost count would admit
/// more than the limit).
const LIMITED_KEYS: usize = 48;
const LIMIT: u64 = 60;
/// Load before the kill.
const WARM: Duration = Duration::from_millis(1500);
/// Load after the store answers from Redis again (at least; on until every limited key is at
/// its limit).
const AFTER: Duration = Duration::from_secs(2);
/// Bounds: the replica's promotion (after the kill), the store's recovery (after the
/// promotion), the whole load.
const PROMOTION: Duration = Duration::from_secs(20);
const RECOVERY: Duration = Duration::from_secs(15);
const MAX_LOAD: Duration = Duration::from_secs(45);

/// A fixed window of 40 to 50 days (the Redis store allows up to 2^52 ns) whose next boundary
/// is more than 10 minutes away: no count resets during the test.
fn window() -> Duration {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs();
    (40..=50u64)
        .map(|d| d * 86_400)
        .find(|w| w - now % w > 600)
        .map(Duration::from_secs)
        .expect("the boundaries of 40..=50-day windows are not all within 10 minutes")
}

fn open_key(i: usize) -> String {
    format!("k{}", i % OPEN_KEYS)
}

fn limited_key(i: usize) -> String {
    format!("q{}", i % LIMITED_KEYS)
}

/// What the callers saw.
#[derive(Default)]
struct Seen {
    /// Admissions answered by Redis, per key: the open store's and the limited store's.
    open: HashMap<String, u64>,
    limited: HashMap<String, u64>,
    /// Admissions answered by Redis before the kill, per key of either store.
    before_kill: HashMap<String, u64>,
    /// Calls answered by Redis / by the failure policy.
    redis: u64,
    policy: u64,
    /// Policy answers before the kill (a call timed out on a loaded machine).
    policy_before_kill: u64,
    /// The latest policy answer (since the load started).
    last_policy: Option<Duration>,
    /// Calls (and policy answers among them) from 0.5 s after the store answered from Redis
    /// again.
    settled: u64,
    settled_policy: u64,
    /// The slowest call, and the calls slower than the timeout + slack (when, how long).
    slowest: Duration,
    late: Vec<(Duration, Duration)>,
}

/// Times shared by the tasks and the test, in ms since the load started (0: not yet).
#[derive(Default)]
struct Marks {
    /// The master was killed.
    killed: AtomicU64,
    /// The store answers from Redis again (+ 0.5 s): from here calls count as settled.
    settled: AtomicU64,
}

impl Seen {
    fn merge(&mut self, o: Seen) {
        for (k, n) in o.open {
            *self.open.entry(k).or_default() += n;
        }
        for (k, n) in o.limited {
            *self.limited.entry(k).or_default() += n;
        }
        for (k, n) in o.before_kill {
            *self.before_kill.entry(k).or_default() += n;
        }
        self.redis += o.redis;
        self.policy += o.policy;
        self.policy_before_kill += o.policy_before_kill;
        self.last_policy = self.last_policy.max(o.last_policy);
        self.settled += o.settled;
        self.settled_policy += o.settled_policy;
        self.slowest = self.slowest.max(o.slowest);
        self.late.extend(o.late);
    }

    /// One call: `key`'s decision by `store` (the open store's if `open`, else the limited
    /// store's), timed and sorted into Redis's answers and the policy's.
    async fn call(
        &mut self,
        store: &RedisStore,
        key: String,
        t0: Instant,
        marks: &Marks,
        open: bool,
    ) {
        let start = Instant::now();
        let d = store.check(&key, 1).await;
        let took = start.elapsed();
        let at = t0.elapsed();
        self.slowest = self.slowest.max(took);
        if took > TIMEOUT + SLACK {
            self.late.push((at, took));
        }
        let ms = at.as_millis() as u64;
        let settled = marks.settled.load(Ordering::Relaxed);
        let settled = settled != 0 && ms >= settled;
        self.settled += settled as u64;
        let killed = marks.killed.load(Ordering::Relaxed);
        let before_kill = killed == 0 || ms < killed;
        if before_kill && d.outcome == Outcome::Allowed {
            *self.before_kill.entry(key.clone()).or_default() += 1;
        }
        let by_policy = match (open, d.outcome) {
            (true, Outcome::Allowed) => {
                *self.open.entry(key).or_default() += 1;
                false
            }
            (false, Outcome::Allowed) => {
                *self.limited.entry(key).or_default() += 1;
                false
            }
            (false, Outcome::Limited) => false,
            (true, Outcome::Untracked) | (false, Outcome::StoreFull) => true,
            (_, o) => panic!("unexpected outcome {o:?} for {key} ({d:?})"),
        };
        if by_policy {
            self.policy += 1;
            self.last_policy = Some(at);
            self.policy_before_kill += before_kill as u64;
            self.settled_policy += settled as u64;
        } else {
            self.redis += 1;
        }
    }
}

/// One task's load: a check of each store per tick, over every key in turn, until `stop` (or
/// `MAX_LOAD`).
async fn load(
    stores: Arc<(RedisStore, RedisStore)>,
    task: usize,
    t0: Instant,
    marks: Arc<Marks>,
    stop: Arc<AtomicBool>,
) -> Seen {
    let mut seen = Seen::default();
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut i = task;
    while !stop.load(Ordering::Relaxed) && t0.elapsed() < MAX_LOAD {
        tick.tick().await;
        seen.call(&stores.0, open_key(i), t0, &marks, true).await;
        seen.call(&stores.1, limited_key(i), t0, &marks, false)
            .await;
        i += TASKS;
    }
    seen
}

async fn store(limit: u64, prefix: &str, policy: FailurePolicy, urls: &[&str]) -> RedisStore {
    let limits = Limits::new(vec![Limit::fixed_window(limit, window()).unwrap()]).unwrap();
    RedisStore::builder(limits)
        .prefix(prefix)
        .timeout(TIMEOUT)
        .policy(policy)
        .connect_cluster(urls)
        .await
        .expect("connect to the cluster")
}

/// How the master fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    /// SIGKILL, its replica in sync.
    Kill,
    /// The replica stopped (SIGSTOP) and its link dropped by the master (`CLIENT KILL TYPE
    /// replica`), `LINK_DOWN` of writes acknowledged by the master alone, then SIGKILL and the
    /// replica resumed (SIGCONT): a partition between a master and its replica, on loopback.
    LinkDownThenKill,
}

/// How long the master acknowledges writes alone in [`Fault::LinkDownThenKill`] (well within
/// the node timeout: the stopped replica is not marked as failing).
const LINK_DOWN: Duration = Duration::from_millis(300);

/// What the failover did to the counts.
#[derive(Default)]
struct Loss {
    /// Keys of the open store whose count in Redis is below the admissions callers saw from
    /// Redis (key, admitted, counted).
    lost: Vec<(String, u64, u64)>,
    /// Keys of the limited store admitted past the limit (key, admitted).
    over: Vec<(String, u64)>,
    /// The open store's admissions seen from Redis, and its counts at the end.
    admitted: u64,
    counted: u64,
    /// The limited store's admissions seen from Redis.
    limited_admitted: u64,
    /// Admissions (either store) answered on the killed master's slots before the kill.
    at_stake: u64,
}

/// The two tests each start a 6-node cluster and a timed load: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// The master to fail (the one serving `k0`) and its replica.
struct Target {
    victim: NodeLine,
    replica: NodeLine,
    /// Their indices in `cluster.nodes`.
    v: usize,
    r: usize,
}

impl Target {
    /// Picks the master serving `k0` and its replica; checks that both stores have keys on
    /// every master.
    fn pick(cluster: &Cluster) -> Self {
        let topo = cluster.topology(0);
        let masters: Vec<_> = topo.iter().filter(|l| l.is_master()).collect();
        for m in &masters {
            assert!(
                (0..OPEN_KEYS).any(|i| m.serves(slot(&open_key(i))))
                    && (0..LIMITED_KEYS).any(|i| m.serves(slot(&limited_key(i)))),
                "keys on every master: none on {m:?}"
            );
        }
        let victim = (*masters
            .iter()
            .find(|m| m.serves(slot(&open_key(0))))
            .expect("a master serves k0"))
        .clone();
        let replica = topo
            .iter()
            .find(|l| l.master.as_deref() == Some(&victim.id))
            .unwrap_or_else(|| panic!("no replica of {victim:?} in {topo:?}"))
            .clone();
        Target {
            v: cluster.index_of(victim.port).expect("the victim is ours"),
            r: cluster.index_of(replica.port).expect("the replica is ours"),
            victim,
            replica,
        }
    }

    /// Fails the victim as `fault` says. Blocking (redis-cli, sleeps): called from the
    /// `block_on` thread while the load runs on the runtime's workers.
    fn fail(&self, cluster: &mut Cluster, fault: Fault) {
        if fault == Fault::LinkDownThenKill {
            cluster.nodes[self.r].signal("STOP");
            cluster.nodes[self.v].cli(&["client", "kill", "type", "replica"]);
            let info = cluster.nodes[self.v].cli(&["info", "replication"]);
            assert!(info.contains("connected_slaves:0"), "{info}");
            std::thread::sleep(LINK_DOWN);
        }
        cluster.nodes[self.v].kill();
        if fault == Fault::LinkDownThenKill {
            cluster.nodes[self.r].signal("CONT");
        }
    }

    /// Waits until the replica says it is a master serving the victim's slots and every live
    /// node says the cluster is ok (blocking, as `fail`).
    fn wait_promoted(&self, cluster: &Cluster) {
        let live: Vec<usize> = (0..cluster.nodes.len()).filter(|&i| i != self.v).collect();
        wait_for(
            "the replica promoted",
            PROMOTION,
            || {
                cluster
                    .topology(self.r)
                    .iter()
                    .find(|l| l.port == self.replica.port)
                    .is_some_and(|l| l.is_master() && l.slots == self.victim.slots)
                    && live.iter().all(|&i| {
                        cluster.nodes[i]
                            .cli(&["cluster", "info"])
                            .contains("cluster_state:ok")
                    })
            },
            || cluster.nodes[self.r].cli(&["cluster", "nodes"]),
        );
    }
}

/// Checks a key of the promoted node with the load's own check (circuit breaker included)
/// every 20 ms until Redis answers it (at most `RECOVERY`).
async fn wait_on_redis(store: &RedisStore, key: &str, seen: &mut Seen, t0: Instant, marks: &Marks) {
    let since = Instant::now();
    loop {
        let before = seen.redis;
        seen.call(store, key.to_string(), t0, marks, true).await;
        if seen.redis > before {
            return;
        }
        assert!(
            since.elapsed() < RECOVERY,
            "the store did not answer from Redis within {RECOVERY:?} of the promotion ({:?})",
            store.stats()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until every limited key is at its limit (at most until `MAX_LOAD` into the load).
async fn wait_limits_reached(store: &RedisStore, t0: Instant) {
    while t0.elapsed() < MAX_LOAD {
        let mut full = true;
        for i in 0..LIMITED_KEYS {
            full &= store
                .peek(&limited_key(i))
                .await
                .is_ok_and(|d| d.remaining == 0);
        }
        if full {
            return;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// What holds whatever the fault: every call answered within the timeout + slack (errors
/// reached the policy), the policy answering after the kill, Redis again after the recovery.
fn check_answers(seen: &Seen) {
    assert!(
        seen.late.is_empty(),
        "calls slower than {TIMEOUT:?} + {SLACK:?} (at, took): {:?}",
        seen.late
    );
    assert!(
        seen.policy > seen.policy_before_kill,
        "no call after the kill was answered by the policy ({} by Redis)",
        seen.redis
    );
    // At most 1 % by the policy once settled: a loaded machine's stray timeout.
    assert!(
        seen.settled >= 100 && seen.settled_policy * 100 <= seen.settled,
        "after the recovery, {} of {} calls were answered by the policy",
        seen.settled_policy,
        seen.settled
    );
}

/// Compares the counts in Redis with what the callers saw: the open store's keys counted
/// below their admissions, the limited store's keys admitted past the limit. Every limited key
/// must be at its limit (else over-admission could not show).
async fn losses(stores: &(RedisStore, RedisStore), seen: &Seen, victim: &NodeLine) -> Loss {
    let mut loss = Loss::default();
    for i in 0..OPEN_KEYS {
        let k = open_key(i);
        let d = stores.0.peek(&k).await.expect("peek after the failover");
        let count = d.limit - d.remaining;
        let saw = seen.open.get(&k).copied().unwrap_or(0);
        loss.counted += count;
        loss.admitted += saw;
        if count < saw {
            loss.lost.push((k, saw, count));
        }
    }
    for i in 0..LIMITED_KEYS {
        let k = limited_key(i);
        let saw = seen.limited.get(&k).copied().unwrap_or(0);
        loss.limited_admitted += saw;
        let d = stores.1.peek(&k).await.expect("peek after the failover");
        assert_eq!(
            d.remaining, 0,
            "{k} did not reach its limit: the check has no teeth"
        );
        if saw > LIMIT {
            loss.over.push((k, saw));
        }
    }
    loss.at_stake = seen
        .before_kill
        .iter()
        .filter(|(k, _)| victim.serves(slot(k)))
        .map(|(_, n)| n)
        .sum();
    loss
}

/// The scenario: a cluster of 3 masters and 3 replicas, the load, the `fault` on the master
/// serving `k0`, its replica promoted, the store back on Redis, every limited key at its
/// limit; asserts what holds whatever the fault ([`check_answers`]) and returns what was lost.
fn failover(fault: Fault) -> Loss {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let wall = Instant::now();
    let mut cluster = Cluster::start_with(1, 1000);
    let started = wall.elapsed();
    let rt = common::runtime();
    let urls = cluster.urls();
    let refs: Vec<&str> = urls.iter().map(String::as_str).collect();
    let target = Target::pick(&cluster);
    let probe = (0..OPEN_KEYS)
        .map(open_key)
        .find(|k| target.victim.serves(slot(k)))
        .expect("a key on the victim");

    rt.block_on(async {
        let stores = Arc::new((
            store(10_000_000, "fo:", FailurePolicy::Open, &refs).await,
            store(LIMIT, "fl:", FailurePolicy::Closed, &refs).await,
        ));
        let t0 = Instant::now();
        let marks = Arc::new(Marks::default());
        let stop = Arc::new(AtomicBool::new(false));
        let tasks: Vec<_> = (0..TASKS)
            .map(|t| tokio::spawn(load(stores.clone(), t, t0, marks.clone(), stop.clone())))
            .collect();

        tokio::time::sleep(WARM).await;
        target.fail(&mut cluster, fault);
        let killed = t0.elapsed();
        marks
            .killed
            .store(killed.as_millis().max(1) as u64, Ordering::Relaxed);
        target.wait_promoted(&cluster);
        let promoted = t0.elapsed() - killed;
        let mut seen = Seen::default();
        wait_on_redis(&stores.0, &probe, &mut seen, t0, &marks).await;
        let recovered = t0.elapsed() - killed;
        marks.settled.store(
            (t0.elapsed() + Duration::from_millis(500)).as_millis() as u64,
            Ordering::Relaxed,
        );
        tokio::time::sleep(AFTER).await;
        wait_limits_reached(&stores.1, t0).await;
        stop.store(true, Ordering::Relaxed);
        for t in tasks {
            seen.merge(t.await.expect("a load task"));
        }
        let load_time = t0.elapsed();

        check_answers(&seen);
        let loss = losses(&stores, &seen, &target.victim).await;
        let missing: u64 = loss.lost.iter().map(|(_, saw, count)| saw - count).sum();
        let over_by: u64 = loss.over.iter().map(|(_, saw)| saw - LIMIT).sum();
        println!(
            "{fault:?}: cluster started in {started:?}; killed {victim} at {killed:?} of the \
             load; promoted {replica} {promoted:?} after the kill; the store answered from \
             Redis {recovered:?} after the kill; load {load_time:?}, wall {wall:?}\n\
             calls: {redis} by Redis, {policy} by the policy ({before} before the kill), the \
             last {last:?} into the load; slowest {slowest:?}\n\
             open store: {admitted} admissions seen from Redis, {counted} counted, {n_lost} keys \
             below (first: {lost_head:?})\n\
             limited store: {limited} admissions over {LIMITED_KEYS} keys (limit {LIMIT}), \
             {n_over} keys over the limit by {over_by} (first: {over_head:?})\n\
             admissions on the killed master before the kill: {at_stake}; missing from the \
             open store's counts after the failover: {missing}\nstats: {stats:?}",
            victim = target.victim.port,
            replica = target.replica.port,
            redis = seen.redis,
            policy = seen.policy,
            before = seen.policy_before_kill,
            last = seen.last_policy,
            slowest = seen.slowest,
            admitted = loss.admitted,
            counted = loss.counted,
            n_lost = loss.lost.len(),
            lost_head = &loss.lost[..loss.lost.len().min(5)],
            limited = loss.limited_admitted,
            n_over = loss.over.len(),
            over_head = &loss.over[..loss.over.len().min(5)],
            at_stake = loss.at_stake,
            stats = (stores.0.stats(), stores.1.stats()),
            wall = wall.elapsed(),
        );
        loss
    })
}

#[test]
fn a_master_killed_under_load_fails_over_and_loses_no_admission() {
    let loss = failover(Fault::Kill);
    assert!(
        loss.lost.is_empty(),
        "admissions seen from Redis missing from its counts after the failover \
         (key, admitted, counted): {:?}",
        loss.lost
    );
    assert!(
        loss.over.is_empty(),
        "keys admitted past their limit of {LIMIT} (a count lost in the failover): {:?}",
        loss.over
    );
}

/// Replication is asynchronous: what a master acknowledged while its replica's link was down
/// is not on the replica promoted after it. The checks above see it (they can fail).
#[test]
fn with_the_replica_link_down_a_failover_loses_acknowledged_admissions() {
    let loss = failover(Fault::LinkDownThenKill);
    assert!(
        !loss.lost.is_empty() && !loss.over.is_empty(),
        "acknowledged admissions lost by the promoted replica not seen: {} keys below their \
         admissions, {} over their limit",
        loss.lost.len(),
        loss.over.len()
    );
}
