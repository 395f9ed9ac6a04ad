// Over 600 lines: the cache, its refresh worker and the source the engine reads are one protocol (generations, pending reads, invalidation); its parts are only correct together.
//! Keys' own limits in Redis, for a fleet: [`RedisLimits`], a [`LimitsSource`] whose entries
//! live in the Redis the fleet shares, read through a bounded in-memory cache.
//!
//! **Layout.** A class's entries are fields of small hashes, `<prefix>limits:<class>:<bucket>`,
//! the field a customer id in decimal and the value the entry as a file writes it (`pro`,
//! `5/1s burst=10`). A key's bucket is a fixed mix of its id modulo the class's bucket count,
//! which the first process to use the class stores in `<prefix>limits:<class>:buckets`
//! (`capacity / 64`, rounded up) and every other one reads, so that a fleet agrees on it even
//! if their rules' `capacity` differ. About 64 entries per hash keep Redis's compact listpack
//! encoding (up to 128 fields).
//!
//! **Cache.** A bucket is cached whole (one `HGETALL` brings all its entries, and says which
//! keys have none: those answer [`Lookup::Default`]) in a bounded table of slots, one bucket
//! per slot (`cache_entries / 64` slots, the bucket's number modulo the slots: when the slots
//! cover every bucket, as by default, none evicts another). [`LimitsSource::get`] reads its
//! slot with one `ArcSwap` load and a binary search, without a lock or an allocation; a bucket
//! it does not hold answers [`Lookup::Unknown`] and is queued for a background fetch (once: a
//! table of pending buckets; a bounded queue, a full one drops the request, counted). A
//! concurrent cache such as moka was measured first: its per-read bookkeeping (access
//! recorded, its policy applied by the reading thread) made a cached `get` cost 3–4 µs, 30×
//! the in-memory source's; this table reads in about as much as the in-memory source.
//!
//! **Changes.** The connection asks Redis for `CLIENT TRACKING ON BCAST PREFIX <prefix>limits:
//! <class>:` (RESP3; no `CONFIG` rights needed): any write to a bucket, by this process,
//! another one or a hand-typed `HSET`, is pushed as an invalidation, and the bucket is
//! fetched again at once. A bucket older than the TTL is fetched again on its next use (a
//! safety net). After a lost connection every cached bucket is marked stale (invalidations
//! may have been missed) and fetched again on its next use once Redis is back.
//!
//! **Redis away.** Cached buckets keep answering, however old; keys of buckets never fetched
//! answer [`Lookup::Unknown`] (the rule's defaults), counted in [`RedisLimitsStats`] and
//! logged at most once per 10 s.

use arc_swap::ArcSwapOption;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, IntoConnectionInfo, ProtocolVersion, PushInfo, PushKind};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use turnstile::rules::limits::{KeyLimit, LimitsClass, LimitsError, LimitsSource, Lookup};
use turnstile::rules::KeyClass;
use turnstile::Limit;

/// Entries a bucket holds on average (at the class's `capacity`): Redis keeps a hash of up to
/// 128 fields as a listpack.
pub const ENTRIES_PER_BUCKET: u64 = 64;
/// Bucket fetches waiting for the background connection; more are dropped (counted).
const QUEUE: usize = 4096;
/// Buckets fetched in one pipeline.
const BATCH: usize = 128;
/// Invalidation pushes waiting; on overflow every cached bucket is marked stale.
const PUSHES: usize = 4096;

/// The bucket of customer `id` among `buckets`: a fixed mix (the same in every process), so
/// that consecutive ids spread over the buckets.
pub fn bucket_of(id: u64, buckets: u64) -> u64 {
    let mut z = id.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)) % buckets.max(1)
}

/// The names of a class's keys in Redis.
#[derive(Clone, Debug)]
pub struct LimitsKeys {
    /// `<prefix>limits:<class>:`, the tracked prefix.
    pub prefix: String,
}

impl LimitsKeys {
    /// The keys of class `class` under `prefix` (e.g. `turnstile:`).
    pub fn new(prefix: &str, class: &str) -> Self {
        Self {
            prefix: format!("{prefix}limits:{class}:"),
        }
    }
    /// The hash holding bucket `b`.
    pub fn bucket(&self, b: u64) -> String {
        format!("{}{b}", self.prefix)
    }
    /// The string holding the class's bucket count.
    pub fn buckets(&self) -> String {
        format!("{}buckets", self.prefix)
    }
    /// The bucket a key name holds, if it is one.
    fn parse(&self, key: &[u8]) -> Option<u64> {
        std::str::from_utf8(key.strip_prefix(self.prefix.as_bytes())?)
            .ok()?
            .parse()
            .ok()
    }
}

/// Reads (or, first, stores) the class's bucket count: `capacity / 64` rounded up.
pub async fn bucket_count(
    conn: &mut MultiplexedConnection,
    keys: &LimitsKeys,
    capacity: u64,
) -> redis::RedisResult<u64> {
    let want = capacity.div_ceil(ENTRIES_PER_BUCKET).max(1);
    let (n,): (Option<u64>,) = redis::pipe()
        .cmd("SET")
        .arg(keys.buckets())
        .arg(want)
        .arg("NX")
        .ignore()
        .cmd("GET")
        .arg(keys.buckets())
        .query_async(conn)
        .await?;
    Ok(n.filter(|n| *n > 0).unwrap_or(want))
}

/// A bucket's fields and values, as `HGETALL` answers.
type Fields = Vec<(Vec<u8>, Vec<u8>)>;

/// Counters of a [`RedisLimits`] (monotonic, relaxed).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RedisLimitsStats {
    /// Lookups answered [`Lookup::Unknown`]: the key's bucket not cached (the rule's defaults
    /// applied).
    pub unknown: u64,
    /// Buckets fetched from Redis.
    pub fetches: u64,
    /// Nanoseconds those fetches took, pipelines included (a bucket's share of its pipeline).
    pub fetch_ns: u64,
    /// Fetch pipelines that failed (Redis away or slow).
    pub fetch_errors: u64,
    /// Fetch requests dropped: the queue was full, or Redis was away.
    pub dropped: u64,
    /// Invalidations received.
    pub invalidations: u64,
    /// Connections made after the first.
    pub reconnects: u64,
    /// Entries in Redis this class cannot read (an unknown plan, another algorithm): skipped,
    /// so their keys answer the rule's defaults.
    pub bad_entries: u64,
    /// Entries in the cached buckets.
    pub cached_entries: u64,
    /// Distinct limits in the cached buckets (each kept once per bucket).
    pub cached_limits: u64,
    /// Buckets cached.
    pub cached_buckets: u64,
}

#[derive(Default)]
struct Counters {
    unknown: AtomicU64,
    fetches: AtomicU64,
    fetch_ns: AtomicU64,
    fetch_errors: AtomicU64,
    dropped: AtomicU64,
    invalidations: AtomicU64,
    reconnects: AtomicU64,
    bad_entries: AtomicU64,
}

/// Buckets cached, one per slot (bucket number modulo the slots).
struct Slots {
    slots: Box<[ArcSwapOption<Bucket>]>,
}

impl Slots {
    fn new(n: u64) -> Self {
        Self {
            slots: (0..n.max(1)).map(|_| ArcSwapOption::empty()).collect(),
        }
    }
    #[inline]
    fn slot(&self, b: u64) -> &ArcSwapOption<Bucket> {
        &self.slots[(b % self.slots.len() as u64) as usize]
    }
    fn get(&self, b: &u64) -> Option<Arc<Bucket>> {
        self.slot(*b).load_full().filter(|x| x.id == *b)
    }
    fn contains_key(&self, b: &u64) -> bool {
        self.slot(*b).load().as_ref().is_some_and(|x| x.id == *b)
    }
    fn insert(&self, b: u64, x: Arc<Bucket>) {
        debug_assert_eq!(x.id, b);
        self.slot(b).store(Some(x));
    }
    fn iter(&self) -> impl Iterator<Item = Arc<Bucket>> + '_ {
        self.slots.iter().filter_map(|s| s.load_full())
    }
    fn invalidate_all(&self) {
        for s in self.slots.iter() {
            s.store(None);
        }
    }
}

/// One bucket's entries, sorted by id.
struct Bucket {
    /// Its number.
    id: u64,
    /// The keys with an entry, sorted (searched apart from the limits: fewer lines read).
    ids: Box<[u64]>,
    /// Their limits, in the same order, as indexes into `limits`: a bucket's entries share a
    /// few plans, so 2 bytes an entry and one copy of each distinct limit.
    entries: Box<[u16]>,
    /// The bucket's distinct limits.
    limits: Box<[Limit]>,
    fetched: Instant,
    /// Changed (or possibly changed) since fetched: served, and fetched again.
    stale: AtomicBool,
    /// A fetch of it is queued.
    queued: AtomicBool,
}

impl Bucket {
    fn new(id: u64, mut rows: Vec<(u64, Limit)>) -> Self {
        rows.sort_unstable_by_key(|r| r.0);
        rows.dedup_by_key(|r| r.0);
        // A bucket keeps at most 65 536 entries (so its indexes fit 16 bits): ~64 are written
        // per bucket; a hash made bigger by hand is cut there, the rest at the defaults.
        rows.truncate(1 << 16);
        let mut limits: Vec<Limit> = Vec::new();
        let entries = rows
            .iter()
            .map(|r| match limits.iter().position(|l| *l == r.1) {
                Some(i) => i as u16,
                None => {
                    limits.push(r.1);
                    (limits.len() - 1) as u16
                }
            })
            .collect();
        Self {
            id,
            ids: rows.iter().map(|r| r.0).collect(),
            entries,
            limits: limits.into(),
            fetched: Instant::now(),
            stale: AtomicBool::new(false),
            queued: AtomicBool::new(false),
        }
    }

    fn lookup(&self, id: u64) -> Lookup {
        match self.ids.binary_search(&id) {
            Ok(i) => Lookup::Own(self.limits[self.entries[i] as usize]),
            Err(_) => Lookup::Default,
        }
    }

    /// This bucket with `id`'s entry replaced (or removed).
    fn with(&self, id: u64, entry: Option<Limit>) -> Self {
        let mut rows: Vec<_> = (0..self.ids.len())
            .filter(|&i| self.ids[i] != id)
            .map(|i| (self.ids[i], self.limits[self.entries[i] as usize]))
            .collect();
        if let Some(l) = entry {
            rows.push((id, l));
        }
        let b = Bucket::new(self.id, rows);
        b.stale.store(self.stale.load(Relaxed), Relaxed);
        b
    }
}

/// The class and its plans, built.
struct Resolved {
    class: LimitsClass,
    plans: HashMap<String, Limit>,
}

impl Resolved {
    fn new(class: &LimitsClass) -> Result<Self, LimitsError> {
        if class.key != KeyClass::customer() {
            return Err(err(format!(
                "a class in Redis is keyed by customer ids (the same in every process), not {}",
                class.key
            )));
        }
        let mut plans = HashMap::new();
        for (n, s) in &class.plans {
            let l = class
                .build(s)
                .map_err(|m| err(format!("plan `{n}`: {m}")))?;
            plans.insert(n.clone(), l);
        }
        Ok(Self {
            class: class.clone(),
            plans,
        })
    }

    /// The limit of an entry under the class.
    fn limit(&self, e: &KeyLimit) -> Result<Limit, LimitsError> {
        match e {
            KeyLimit::Plan(p) => self.plans.get(p).copied().ok_or_else(|| {
                err(format!(
                    "class `{}` has no plan `{p}` (its plans: {})",
                    self.class.name,
                    self.plan_names()
                ))
            }),
            KeyLimit::Limit(s) => self.class.build(s),
        }
    }

    fn plan_names(&self) -> String {
        let mut v: Vec<&str> = self.plans.keys().map(String::as_str).collect();
        v.sort_unstable();
        if v.is_empty() {
            "none".into()
        } else {
            v.join(", ")
        }
    }
}

fn err(message: String) -> LimitsError {
    LimitsError::new(message)
}

struct Shared {
    keys: LimitsKeys,
    buckets: u64,
    ttl: Duration,
    timeout: Duration,
    resolved: RwLock<Resolved>,
    cache: Slots,
    /// Buckets queued and not fetched yet, by bucket number modulo its length (bucket + 1;
    /// 0: none), so that a missing bucket is queued once however often it is asked for.
    pending: Box<[AtomicU64]>,
    queue: mpsc::Sender<u64>,
    counters: Counters,
    /// The connection the background task made (for `set`, `remove`, `entry`, `export`).
    conn: Mutex<Option<MultiplexedConnection>>,
    runtime: tokio::runtime::Handle,
    /// Seconds (since `start`) of the last warning, to log at most once per 10 s.
    warned: AtomicU64,
    start: Instant,
}

impl Shared {
    fn warn(&self, what: &str, e: &dyn std::fmt::Display) {
        let now = self.start.elapsed().as_secs() + 10;
        let last = self.warned.load(Relaxed);
        if now >= last + 10
            && self
                .warned
                .compare_exchange(last, now, Relaxed, Relaxed)
                .is_ok()
        {
            tracing::warn!(class = %self.keys.prefix, error = %e, "limits in Redis: {what}");
        }
    }

    /// Queues a fetch of bucket `b` (never waits).
    fn enqueue(&self, b: u64) {
        if self.queue.try_send(b).is_err() {
            self.counters.dropped.fetch_add(1, Relaxed);
            self.done(b);
        }
    }

    fn pending(&self, b: u64) -> &AtomicU64 {
        &self.pending[(b % self.pending.len() as u64) as usize]
    }

    /// Queues a fetch of missing bucket `b` unless one is pending.
    fn enqueue_missing(&self, b: u64) {
        let p = self.pending(b);
        if p.load(Relaxed) != b + 1 {
            p.store(b + 1, Relaxed);
            self.enqueue(b);
        }
    }

    /// Bucket `b` was fetched (or its fetch failed): it may be queued again.
    fn done(&self, b: u64) {
        let _ = self.pending(b).compare_exchange(b + 1, 0, Relaxed, Relaxed);
    }

    /// Marks every cached bucket stale: fetched again on its next use.
    fn all_stale(&self) {
        for b in self.cache.iter() {
            b.stale.store(true, Relaxed);
            b.queued.store(false, Relaxed);
        }
    }

    /// A bucket's rows as Redis gave them; bad entries skipped (counted, logged).
    fn rows(&self, fields: Fields) -> Vec<(u64, Limit, KeyLimit)> {
        let r = self.resolved.read().unwrap_or_else(|e| e.into_inner());
        let mut rows = Vec::with_capacity(fields.len());
        for (f, v) in fields {
            let parsed = std::str::from_utf8(&f)
                .ok()
                .and_then(|f| turnstile::rules::parse_customer(f).ok())
                .ok_or_else(|| err("the field is not a customer id".into()))
                .and_then(|id| {
                    let text = String::from_utf8_lossy(&v);
                    let e = r.class.parse(&text)?;
                    Ok((id, r.limit(&e)?, e))
                });
            match parsed {
                Ok(row) => rows.push(row),
                Err(m) => {
                    self.counters.bad_entries.fetch_add(1, Relaxed);
                    let field = String::from_utf8_lossy(&f);
                    self.warn("an entry was skipped", &format!("field `{field}`: {m}"));
                }
            }
        }
        rows
    }

    /// Runs `f` on the background runtime with the connection, waiting at most the timeout.
    fn call<T: Send + 'static>(
        &self,
        f: impl FnOnce(MultiplexedConnection) -> redis::RedisFuture<'static, T> + Send + 'static,
    ) -> Result<T, LimitsError> {
        let conn = self.conn.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let Some(conn) = conn else {
            return Err(err("Redis is not reachable now: try again".into()));
        };
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let timeout = self.timeout;
        self.runtime.spawn(async move {
            let r = tokio::time::timeout(timeout, f(conn)).await;
            let _ = tx.send(r);
        });
        match rx.recv_timeout(self.timeout + Duration::from_millis(100)) {
            Ok(Ok(Ok(v))) => Ok(v),
            Ok(Ok(Err(e))) => Err(err(format!("Redis refused it: {e}"))),
            _ => Err(err(format!(
                "no answer from Redis within {:?}: try again",
                self.timeout
            ))),
        }
    }

    /// Replaces `id`'s entry in its cached bucket, if cached.
    fn update(&self, id: u64, entry: Option<Limit>) {
        let b = bucket_of(id, self.buckets);
        if let Some(old) = self.cache.get(&b) {
            self.cache.insert(b, Arc::new(old.with(id, entry)));
        }
    }
}

/// Builds a [`RedisLimits`].
pub struct RedisLimitsBuilder {
    class: LimitsClass,
    prefix: String,
    cache_entries: Option<u64>,
    ttl: Duration,
    timeout: Duration,
}

impl RedisLimitsBuilder {
    /// Key prefix (default `turnstile:`): the class's hashes are `<prefix>limits:<class>:<n>`.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }
    /// Most entries cached (default: the class's `capacity`, at most 10 million).
    pub fn cache_entries(mut self, n: u64) -> Self {
        self.cache_entries = Some(n.max(1));
        self
    }
    /// Age after which a cached bucket is fetched again on its next use (default 60 s); it
    /// keeps answering meanwhile, and while Redis is away.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }
    /// Timeout of each call to Redis: a connection, a fetch, `set`, `remove` (default 1 s).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// What [`RedisLimitsBuilder::connect`] refuses before it connects: the class's plans, and
    /// `url` if it is not a Redis URL. A source that passes can only fail to connect.
    pub fn check(&self, url: &str) -> Result<(), LimitsError> {
        Resolved::new(&self.class)?;
        url.into_connection_info()
            .map_err(|e| err(format!("`{url}` is not a Redis URL: {e}")))?;
        Ok(())
    }

    /// Connects to `url` (`redis://host:port`) on a thread of its own and enables tracking;
    /// waits for that first connection (so a wrong URL is reported here). Later losses are
    /// reconnected in the background.
    pub fn connect(self, url: &str) -> Result<RedisLimits, LimitsError> {
        let resolved = Resolved::new(&self.class)?;
        let info = url
            .into_connection_info()
            .map_err(|e| err(format!("`{url}` is not a Redis URL: {e}")))?;
        let settings = info
            .redis_settings()
            .clone()
            .set_protocol(ProtocolVersion::RESP3);
        let client = redis::Client::open(info.set_redis_settings(settings))
            .map_err(|e| err(format!("`{url}`: {e}")))?;
        let keys = LimitsKeys::new(&self.prefix, &self.class.name);
        let (pushes_tx, pushes) = mpsc::channel(PUSHES);
        let overflow = Arc::new(AtomicBool::new(false));
        let cx = Connector {
            client,
            keys: keys.clone(),
            timeout: self.timeout,
            pushes_tx,
            overflow: overflow.clone(),
        };
        let (ready, task_tx) = start(cx, keys.clone(), self.class.capacity)?;
        let (conn, buckets, runtime, cx) = ready
            .recv()
            .map_err(|_| err("the Redis thread stopped".into()))?
            .map_err(|e| err(format!("cannot use Redis at `{url}`: {e}")))?;
        let cache_entries = self
            .cache_entries
            .unwrap_or(self.class.capacity.min(10_000_000));
        let (queue, requests) = mpsc::channel(QUEUE);
        let shared = Arc::new(Shared {
            keys,
            buckets,
            ttl: self.ttl,
            timeout: self.timeout,
            resolved: RwLock::new(resolved),
            cache: Slots::new(cache_entries.div_ceil(ENTRIES_PER_BUCKET).min(buckets)),
            pending: (0..QUEUE).map(|_| AtomicU64::new(0)).collect(),
            queue,
            counters: Counters::default(),
            conn: Mutex::new(Some(conn)),
            runtime,
            warned: AtomicU64::new(0),
            start: Instant::now(),
        });
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let _ = task_tx.send(Worker {
            shared: shared.clone(),
            cx,
            requests,
            pushes,
            overflow,
            stopped,
        });
        Ok(RedisLimits { shared, stop })
    }
}

/// What the runtime thread answers once connected: the connection, the bucket count, the
/// runtime's handle, and the connector back.
type Ready = Result<
    (
        MultiplexedConnection,
        u64,
        tokio::runtime::Handle,
        Connector,
    ),
    String,
>;

/// Starts the runtime on a thread of its own (also when the caller is in a runtime): it
/// connects, answers on the first channel, then runs the background task handed to it on the
/// second.
fn start(
    cx: Connector,
    keys: LimitsKeys,
    capacity: u64,
) -> Result<
    (
        std::sync::mpsc::Receiver<Ready>,
        std::sync::mpsc::SyncSender<Worker>,
    ),
    LimitsError,
> {
    let (ready_tx, ready) = std::sync::mpsc::sync_channel::<Ready>(1);
    let (task_tx, task_rx) = std::sync::mpsc::sync_channel::<Worker>(1);
    std::thread::Builder::new()
        .name("turnstile-limits".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => return drop(ready_tx.send(Err(format!("cannot start a runtime: {e}")))),
            };
            let first = rt.block_on(async {
                let mut c = cx.connect().await?;
                let n = bucket_count(&mut c, &keys, capacity).await?;
                Ok::<_, redis::RedisError>((c, n))
            });
            let ok = first.is_ok();
            let _ = ready_tx.send(
                first
                    .map(|(c, n)| (c, n, rt.handle().clone(), cx))
                    .map_err(|e| e.to_string()),
            );
            if let (true, Ok(task)) = (ok, task_rx.recv()) {
                rt.block_on(task.run());
            }
        })
        .map_err(|e| err(format!("cannot start a thread: {e}")))?;
    Ok((ready, task_tx))
}

/// Makes tracked connections.
struct Connector {
    client: redis::Client,
    keys: LimitsKeys,
    timeout: Duration,
    pushes_tx: mpsc::Sender<PushInfo>,
    overflow: Arc<AtomicBool>,
}

impl Connector {
    async fn connect(&self) -> redis::RedisResult<MultiplexedConnection> {
        let tx = self.pushes_tx.clone();
        let overflow = self.overflow.clone();
        let cfg = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(Some(self.timeout))
            .set_push_sender(move |p: PushInfo| {
                if tx.try_send(p).is_err() {
                    overflow.store(true, Relaxed);
                }
                Ok::<(), ()>(())
            });
        let mut c = self
            .client
            .get_multiplexed_async_connection_with_config(&cfg)
            .await?;
        redis::cmd("CLIENT")
            .arg("TRACKING")
            .arg("ON")
            .arg("BCAST")
            .arg("PREFIX")
            .arg(&self.keys.prefix)
            .exec_async(&mut c)
            .await?;
        Ok(c)
    }
}

/// The background task: fetches queued buckets, applies invalidations, reconnects.
struct Worker {
    shared: Arc<Shared>,
    cx: Connector,
    requests: mpsc::Receiver<u64>,
    pushes: mpsc::Receiver<PushInfo>,
    overflow: Arc<AtomicBool>,
    stopped: tokio::sync::watch::Receiver<bool>,
}

impl Worker {
    async fn run(mut self) {
        let mut conn = self.shared.conn.lock().unwrap().clone();
        loop {
            if let Some(c) = conn.take() {
                let e = self.serve(c).await;
                if *self.stopped.borrow() {
                    return;
                }
                *self.shared.conn.lock().unwrap_or_else(|e| e.into_inner()) = None;
                self.shared
                    .warn("connection lost, cached limits keep serving", &e);
                self.shared.all_stale();
            }
            // Away: drop what is asked (counted) until a connection is made again.
            let sleep = tokio::time::sleep(Duration::from_millis(200));
            tokio::pin!(sleep);
            loop {
                tokio::select! {
                    _ = &mut sleep => break,
                    r = self.requests.recv() => match r {
                        Some(b) => {
                            self.shared.counters.dropped.fetch_add(1, Relaxed);
                            self.shared.done(b);
                        }
                        None => return,
                    },
                    _ = self.stopped.changed() => return,
                }
            }
            while self.pushes.try_recv().is_ok() {}
            match self.cx.connect().await {
                Ok(c) => {
                    self.shared.counters.reconnects.fetch_add(1, Relaxed);
                    self.shared.all_stale();
                    *self.shared.conn.lock().unwrap_or_else(|e| e.into_inner()) = Some(c.clone());
                    tracing::info!(class = %self.shared.keys.prefix, "limits in Redis: reconnected");
                    conn = Some(c);
                }
                Err(e) => self.shared.warn("cannot reconnect", &e),
            }
        }
    }

    /// Serves on `c` until it fails (its error) or the source is dropped.
    async fn serve(&mut self, mut c: MultiplexedConnection) -> String {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            let r = tokio::select! {
                r = self.requests.recv() => match r {
                    Some(b) => self.fetch(&mut c, b).await,
                    None => return "stopped".into(),
                },
                p = self.pushes.recv() => match p {
                    Some(p) => self.push(&mut c, p).await,
                    None => return "stopped".into(),
                },
                _ = tick.tick() => self.sweep(&mut c).await,
                _ = self.stopped.changed() => return "stopped".into(),
            };
            if let Err(e) = r {
                return e;
            }
        }
    }

    /// Fetches bucket `first` and whatever else is queued (up to a batch) in one pipeline.
    async fn fetch(&mut self, c: &mut MultiplexedConnection, first: u64) -> Result<(), String> {
        let mut want = HashSet::new();
        let mut next = Some(first);
        while let Some(b) = next {
            let fresh = self
                .shared
                .cache
                .get(&b)
                .is_some_and(|x| !x.stale.load(Relaxed));
            if fresh {
                self.shared.done(b);
            } else {
                want.insert(b);
            }
            next = if want.len() < BATCH {
                self.requests.try_recv().ok()
            } else {
                None
            };
        }
        self.fetch_now(c, want.into_iter().collect()).await
    }

    async fn fetch_now(
        &self,
        c: &mut MultiplexedConnection,
        buckets: Vec<u64>,
    ) -> Result<(), String> {
        if buckets.is_empty() {
            return Ok(());
        }
        let mut p = redis::pipe();
        for b in &buckets {
            p.cmd("HGETALL").arg(self.shared.keys.bucket(*b));
        }
        let t = Instant::now();
        let r: redis::RedisResult<Vec<Fields>> = p.query_async(c).await;
        let counters = &self.shared.counters;
        match r {
            Ok(all) => {
                counters
                    .fetch_ns
                    .fetch_add(t.elapsed().as_nanos() as u64, Relaxed);
                counters.fetches.fetch_add(buckets.len() as u64, Relaxed);
                for (b, fields) in buckets.into_iter().zip(all) {
                    let rows = self
                        .shared
                        .rows(fields)
                        .into_iter()
                        .map(|(id, l, _)| (id, l))
                        .collect();
                    self.shared.cache.insert(b, Arc::new(Bucket::new(b, rows)));
                    self.shared.done(b);
                }
                Ok(())
            }
            Err(e) => {
                counters.fetch_errors.fetch_add(1, Relaxed);
                for b in buckets {
                    self.shared.done(b);
                    if let Some(x) = self.shared.cache.get(&b) {
                        x.queued.store(false, Relaxed);
                    }
                }
                Err(e.to_string())
            }
        }
    }

    /// An invalidation: the buckets named are fetched again at once (all of them if Redis
    /// flushed, or if pushes were lost).
    async fn push(&mut self, c: &mut MultiplexedConnection, p: PushInfo) -> Result<(), String> {
        match p.kind {
            PushKind::Disconnection => return Err("disconnected".into()),
            PushKind::Invalidate => {}
            _ => return Ok(()),
        }
        self.shared.counters.invalidations.fetch_add(1, Relaxed);
        let mut again = Vec::new();
        match p.data.first() {
            Some(redis::Value::Array(keys)) => {
                for k in keys {
                    if let redis::Value::BulkString(k) = k {
                        if let Some(b) = self.shared.keys.parse(k) {
                            if self.shared.cache.contains_key(&b) {
                                again.push(b);
                            }
                        }
                    }
                }
            }
            _ => self.shared.all_stale(),
        }
        for b in &again {
            if let Some(x) = self.shared.cache.get(b) {
                x.stale.store(true, Relaxed);
            }
        }
        again.truncate(BATCH * 8);
        for chunk in again.chunks(BATCH) {
            self.fetch_now(c, chunk.to_vec()).await?;
        }
        Ok(())
    }

    /// Once a second: buckets past the TTL are marked stale; a lost push marks all stale; a
    /// `PING` tells a dead connection.
    async fn sweep(&mut self, c: &mut MultiplexedConnection) -> Result<(), String> {
        if self.overflow.swap(false, Relaxed) {
            self.shared.all_stale();
        }
        let ttl = self.shared.ttl;
        for b in self.shared.cache.iter() {
            if b.fetched.elapsed() > ttl {
                b.stale.store(true, Relaxed);
            }
        }
        redis::cmd("PING")
            .exec_async(c)
            .await
            .map_err(|e| e.to_string())
    }
}

/// A limits class's entries in Redis, through a bounded cache (see the module docs).
pub struct RedisLimits {
    shared: Arc<Shared>,
    stop: tokio::sync::watch::Sender<bool>,
}

impl RedisLimits {
    /// A builder for class `class`'s entries (keyed by customer ids).
    pub fn builder(class: &LimitsClass) -> RedisLimitsBuilder {
        RedisLimitsBuilder {
            class: class.clone(),
            prefix: "turnstile:".into(),
            cache_entries: None,
            ttl: Duration::from_secs(60),
            timeout: Duration::from_secs(1),
        }
    }

    /// The counters.
    pub fn stats(&self) -> RedisLimitsStats {
        let c = &self.shared.counters;
        let (mut buckets, mut entries, mut limits) = (0, 0, 0);
        for b in self.shared.cache.iter() {
            buckets += 1;
            entries += b.entries.len() as u64;
            limits += b.limits.len() as u64;
        }
        RedisLimitsStats {
            unknown: c.unknown.load(Relaxed),
            fetches: c.fetches.load(Relaxed),
            fetch_ns: c.fetch_ns.load(Relaxed),
            fetch_errors: c.fetch_errors.load(Relaxed),
            dropped: c.dropped.load(Relaxed),
            invalidations: c.invalidations.load(Relaxed),
            reconnects: c.reconnects.load(Relaxed),
            bad_entries: c.bad_entries.load(Relaxed),
            cached_entries: entries,
            cached_limits: limits,
            cached_buckets: buckets,
        }
    }

    /// The class's bucket count (as stored in Redis).
    pub fn buckets(&self) -> u64 {
        self.shared.buckets
    }

    /// The names of the class's keys in Redis.
    pub fn keys(&self) -> &LimitsKeys {
        &self.shared.keys
    }
}

impl Drop for RedisLimits {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

impl LimitsSource for RedisLimits {
    #[inline]
    fn get(&self, id: u64) -> Lookup {
        let s = &*self.shared;
        let b = bucket_of(id, s.buckets);
        let slot = s.cache.slot(b).load();
        match slot.as_ref().filter(|x| x.id == b) {
            Some(x) => {
                if x.stale.load(Relaxed) && !x.queued.swap(true, Relaxed) {
                    s.enqueue(b);
                }
                x.lookup(id)
            }
            None => {
                s.counters.unknown.fetch_add(1, Relaxed);
                s.enqueue_missing(b);
                Lookup::Unknown
            }
        }
    }

    fn prefetch(&self, id: u64) {
        let s = &*self.shared;
        let b = bucket_of(id, s.buckets);
        if !s.cache.contains_key(&b) {
            s.enqueue_missing(b);
        }
    }

    fn entry(&self, id: u64) -> Option<KeyLimit> {
        let s = &*self.shared;
        let b = bucket_of(id, s.buckets);
        if let Some(x) = s.cache.get(&b).filter(|x| !x.stale.load(Relaxed)) {
            x.ids.binary_search(&id).ok()?;
        }
        let key = s.keys.bucket(b);
        let text: Option<String> = s
            .call(move |mut c| {
                Box::pin(async move {
                    redis::cmd("HGET")
                        .arg(key)
                        .arg(id)
                        .query_async(&mut c)
                        .await
                })
            })
            .ok()?;
        let r = s.resolved.read().unwrap_or_else(|e| e.into_inner());
        r.class.parse(&text?).ok()
    }

    fn set(&self, id: u64, limit: &KeyLimit) -> Result<(), LimitsError> {
        let s = &*self.shared;
        let l = {
            let r = s.resolved.read().unwrap_or_else(|e| e.into_inner());
            r.limit(limit)?
        };
        let key = s.keys.bucket(bucket_of(id, s.buckets));
        let text = limit.to_string();
        s.call(move |mut c| {
            Box::pin(async move {
                redis::cmd("HSET")
                    .arg(key)
                    .arg(id)
                    .arg(text)
                    .exec_async(&mut c)
                    .await
            })
        })?;
        s.update(id, Some(l));
        Ok(())
    }

    fn remove(&self, id: u64) -> Result<bool, LimitsError> {
        let s = &*self.shared;
        let key = s.keys.bucket(bucket_of(id, s.buckets));
        let n: u64 = s.call(move |mut c| {
            Box::pin(async move {
                redis::cmd("HDEL")
                    .arg(key)
                    .arg(id)
                    .query_async(&mut c)
                    .await
            })
        })?;
        s.update(id, None);
        Ok(n > 0)
    }

    /// Entries in the cached buckets (not a count over Redis: that is a scan).
    fn len(&self) -> u64 {
        self.stats().cached_entries
    }

    fn bytes(&self) -> usize {
        let st = self.stats();
        st.cached_entries as usize * 10
            + st.cached_limits as usize * std::mem::size_of::<Limit>()
            + st.cached_buckets as usize * (std::mem::size_of::<Bucket>() + 64)
    }

    /// Every entry in Redis, bucket by bucket (a scan, pipelined; buckets that cannot be read
    /// within the timeout are skipped, logged).
    fn export(&self, f: &mut dyn FnMut(u64, &KeyLimit)) {
        let s = &*self.shared;
        let mut b = 0;
        while b < s.buckets {
            let end = (b + 512).min(s.buckets);
            let keys: Vec<String> = (b..end).map(|i| s.keys.bucket(i)).collect();
            let got: Result<Vec<Fields>, _> = s.call(move |mut c| {
                Box::pin(async move {
                    let mut p = redis::pipe();
                    for k in keys {
                        p.cmd("HGETALL").arg(k);
                    }
                    p.query_async(&mut c).await
                })
            });
            match got {
                Ok(all) => {
                    for fields in all {
                        for (id, _, e) in s.rows(fields) {
                            f(id, &e);
                        }
                    }
                }
                Err(e) => s.warn("export skipped buckets", &e),
            }
            b = end;
        }
    }

    fn reclass(&self, class: &LimitsClass) -> Result<(), LimitsError> {
        let new = Resolved::new(class)?;
        let s = &*self.shared;
        let mut r = s.resolved.write().unwrap_or_else(|e| e.into_inner());
        let changed = r.class.plans != class.plans
            || r.class.algorithm != class.algorithm
            || r.class.window != class.window;
        *r = new;
        drop(r);
        if changed {
            // Entries naming a plan decide by its new definition: read them again.
            s.cache.invalidate_all();
        }
        Ok(())
    }
}
