//! The rules as data: what a rules file says, or what the builder API builds, before any store
//! exists. `validate` checks them.

use super::request::Priority;
use crate::algo::LimitSpec;
use crate::keyed::FullPolicy;
use std::fmt;
use std::time::Duration;

/// Most rules in one file.
pub const MAX_RULES: usize = 1024;
/// Most limits in one rule or override.
pub const MAX_LIMITS: usize = 8;
/// Most overrides in one rule.
pub const MAX_OVERRIDES: usize = 10_000;
/// Largest key capacity of one rule's store.
pub const MAX_CAPACITY: u64 = 1 << 30;
/// Default key capacity of a rule's store.
pub const DEFAULT_CAPACITY: u64 = 100_000;

/// A part of a request that a rule's key is made of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KeyPart {
    /// [`Request::customer`](super::Request::customer), a numeric id.
    Customer,
    /// [`Request::ip`](super::Request::ip), grouped by the class's IPv4 / IPv6 prefix.
    Ip,
    /// [`Request::api_key`](super::Request::api_key), hashed.
    ApiKey,
    /// [`Request::route`](super::Request::route), hashed.
    Route,
    /// [`Request::method`](super::Request::method).
    Method,
}

impl KeyPart {
    /// All, in the canonical order of a composite key.
    pub const ALL: [KeyPart; 5] = [
        KeyPart::Customer,
        KeyPart::Ip,
        KeyPart::ApiKey,
        KeyPart::Route,
        KeyPart::Method,
    ];

    /// The name used in rules files.
    pub const fn name(self) -> &'static str {
        match self {
            KeyPart::Customer => "customer",
            KeyPart::Ip => "ip",
            KeyPart::ApiKey => "api_key",
            KeyPart::Route => "route",
            KeyPart::Method => "method",
        }
    }

    pub(crate) const fn bit(self) -> u8 {
        1 << self as u8
    }

    /// By name.
    pub fn from_name(s: &str) -> Option<KeyPart> {
        KeyPart::ALL.into_iter().find(|p| p.name() == s)
    }
}

/// What a rule counts per: one part of the request, several (a composite key such as
/// customer + route), or nothing (`global`: one counter for every matching request).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KeyClass {
    parts: u8,
    ipv4_prefix: u8,
    ipv6_prefix: u8,
}

impl KeyClass {
    /// One key for everything the rule matches.
    pub const fn global() -> Self {
        Self {
            parts: 0,
            ipv4_prefix: 32,
            ipv6_prefix: 64,
        }
    }
    /// Keyed by one part.
    pub const fn of(part: KeyPart) -> Self {
        Self::global().and(part)
    }
    /// Per customer id.
    pub const fn customer() -> Self {
        Self::of(KeyPart::Customer)
    }
    /// Per IP address (IPv4 /32, IPv6 /64 unless [`KeyClass::ip_prefix`] says otherwise).
    pub const fn ip() -> Self {
        Self::of(KeyPart::Ip)
    }
    /// Per API key.
    pub const fn api_key() -> Self {
        Self::of(KeyPart::ApiKey)
    }
    /// Per route.
    pub const fn route() -> Self {
        Self::of(KeyPart::Route)
    }
    /// This class with `part` added (a composite key).
    pub const fn and(mut self, part: KeyPart) -> Self {
        self.parts |= part.bit();
        self
    }
    /// Groups IP addresses: IPv4 by their first `v4` bits (0..=32), IPv6 by `v6` (0..=128).
    pub const fn ip_prefix(mut self, v4: u8, v6: u8) -> Self {
        self.ipv4_prefix = v4;
        self.ipv6_prefix = v6;
        self
    }
    /// Whether the key includes `part`.
    pub const fn has(self, part: KeyPart) -> bool {
        self.parts & part.bit() != 0
    }
    /// The parts, in canonical order.
    pub fn parts(self) -> impl Iterator<Item = KeyPart> {
        KeyPart::ALL.into_iter().filter(move |p| self.has(*p))
    }
    /// Number of parts (0 for global).
    pub const fn part_count(self) -> u32 {
        self.parts.count_ones()
    }
    /// Whether this is the global class.
    pub const fn is_global(self) -> bool {
        self.parts == 0
    }
    /// IPv4 grouping prefix.
    pub const fn ipv4_prefix(self) -> u8 {
        self.ipv4_prefix
    }
    /// IPv6 grouping prefix.
    pub const fn ipv6_prefix(self) -> u8 {
        self.ipv6_prefix
    }
    pub(crate) const fn bits(self) -> u8 {
        self.parts
    }
}

impl fmt::Display for KeyClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_global() {
            return f.write_str("global");
        }
        for (i, p) in self.parts().enumerate() {
            if i > 0 {
                f.write_str("+")?;
            }
            f.write_str(p.name())?;
            if p == KeyPart::Ip && (self.ipv4_prefix, self.ipv6_prefix) != (32, 64) {
                write!(f, "/{}/{}", self.ipv4_prefix, self.ipv6_prefix)?;
            }
        }
        Ok(())
    }
}

/// How a rule enforces its limits.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Mode {
    /// Deny at the limit.
    Hard,
    /// Allow up to `percent` % over the limit (500/h + 10 % = 550), reporting the nominal limit.
    Soft {
        /// Tolerance, 1..=1000 %.
        percent: u32,
    },
    /// Past the limit, draw from an extra pool of `percent` % of each limit while the load is
    /// under `below`.
    Elastic {
        /// Size of the extra pool, 1..=1000 % of each limit.
        percent: u32,
        /// Load (0..=1) under which the extra pool may be drawn.
        below: f64,
    },
    /// Decide and count, but always allow: would-be denials are counted.
    Shadow,
}

impl Mode {
    /// The name used in rules files.
    pub fn name(&self) -> &'static str {
        match self {
            Mode::Hard => "hard",
            Mode::Soft { .. } => "soft",
            Mode::Elastic { .. } => "elastic",
            Mode::Shadow => "shadow",
        }
    }
}

/// Conditions a request must meet for a rule to apply. Empty lists match everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Match {
    /// The route starts with one of these (byte prefixes: `/v1/` does not match `/v1`).
    pub route_prefixes: Vec<String>,
    /// The method is one of these (GET, HEAD, POST, PUT, DELETE, CONNECT, OPTIONS, TRACE, PATCH).
    pub methods: Vec<String>,
    /// The request's priority is one of these.
    pub priorities: Vec<Priority>,
}

/// Which key an override is for: text for a one-part class (`"241531"`, `"10.0.0.0/24"`,
/// an API key), or one value per part for a composite class.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OverrideKey {
    /// A one-part key as text.
    Text(String),
    /// A composite key: each part's value as text.
    Parts(Vec<(KeyPart, String)>),
}

/// Other limits for one key of a rule (the notes' config store: customer 241531 → 5 per 1 s).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Override {
    /// The key.
    pub key: OverrideKey,
    /// Its limits, instead of the rule's (same mode).
    pub limits: Vec<LimitSpec>,
}

/// A named rule: which requests, keyed how, limited how.
#[derive(Clone, Debug, PartialEq)]
pub struct Rule {
    /// Unique name; reload keeps a rule's state by its name.
    pub name: String,
    /// What it counts per.
    pub key: KeyClass,
    /// Which requests it applies to.
    pub when: Match,
    /// How it enforces.
    pub mode: Mode,
    /// Its limits, all-or-nothing.
    pub limits: Vec<LimitSpec>,
    /// Units each matching request takes (multiplied by the request's own cost).
    pub cost: u64,
    /// Keys its store holds (default: the file's `settings.capacity`).
    pub capacity: Option<u64>,
    /// What its store does when full (default: the file's `settings.when_full`).
    pub when_full: Option<FullPolicy>,
    /// Per-key limits.
    pub overrides: Vec<Override>,
    /// The limits class whose entries give keys their own limits (`limits_from`), ahead of
    /// the overrides and the rule's limits.
    pub limits_from: Option<String>,
}

impl Rule {
    /// A hard rule with no limits yet, matching every request.
    pub fn new(name: impl Into<String>, key: KeyClass) -> Self {
        Self {
            name: name.into(),
            key,
            when: Match::default(),
            mode: Mode::Hard,
            limits: Vec::new(),
            cost: 1,
            capacity: None,
            when_full: None,
            overrides: Vec::new(),
            limits_from: None,
        }
    }
    /// Adds a limit.
    pub fn limit(mut self, spec: LimitSpec) -> Self {
        self.limits.push(spec);
        self
    }
    /// Sets the mode.
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }
    /// Adds a route prefix condition.
    pub fn route_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.when.route_prefixes.push(prefix.into());
        self
    }
    /// Adds a method condition.
    pub fn method(mut self, method: impl Into<String>) -> Self {
        self.when.methods.push(method.into());
        self
    }
    /// Adds a priority condition.
    pub fn priority(mut self, p: Priority) -> Self {
        self.when.priorities.push(p);
        self
    }
    /// Sets the cost per request.
    pub fn cost(mut self, cost: u64) -> Self {
        self.cost = cost;
        self
    }
    /// Sets the key capacity.
    pub fn capacity(mut self, keys: u64) -> Self {
        self.capacity = Some(keys);
        self
    }
    /// Sets the full-store policy.
    pub fn when_full(mut self, p: FullPolicy) -> Self {
        self.when_full = Some(p);
        self
    }
    /// Adds an override for a one-part key given as text.
    pub fn override_key(mut self, key: impl Into<String>, limits: Vec<LimitSpec>) -> Self {
        self.overrides.push(Override {
            key: OverrideKey::Text(key.into()),
            limits,
        });
        self
    }
    /// Takes each key's own limit from limits class `class`, ahead of the overrides and the
    /// rule's limits (`limits_from`).
    pub fn limits_from(mut self, class: impl Into<String>) -> Self {
        self.limits_from = Some(class.into());
        self
    }
    /// Adds an override for a composite key.
    pub fn override_parts(mut self, parts: &[(KeyPart, &str)], limits: Vec<LimitSpec>) -> Self {
        let parts = parts.iter().map(|(p, v)| (*p, v.to_string())).collect();
        self.overrides.push(Override {
            key: OverrideKey::Parts(parts),
            limits,
        });
        self
    }
}

/// File-wide defaults (`[settings]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    /// Default key capacity per rule.
    pub capacity: u64,
    /// Default full-store policy.
    pub when_full: FullPolicy,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            capacity: DEFAULT_CAPACITY,
            when_full: FullPolicy::EvictStalest,
        }
    }
}

/// How the load is measured (`[load]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct LoadSettings {
    /// In-flight requests that count as a load of 1.0; `None`: only reported utilization counts.
    pub max_in_flight: Option<u64>,
    /// How often the load is re-read on the check path (0: on every check that needs it).
    pub sample: Duration,
}

/// On/off load thresholds of one priority: shed from `on`, stop below `off`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Threshold {
    /// Start shedding at this load.
    pub on: f64,
    /// Stop shedding below this load (< `on`: hysteresis).
    pub off: f64,
}

/// Priority load shedding (`[shedding]`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Shedding {
    /// Thresholds per priority, indexed by [`Priority::index`]; `None`: never shed that one.
    pub thresholds: [Option<Threshold>; 4],
    /// Share of capacity only critical requests may use: the others are shed at a load of
    /// `1 - critical_reserve`.
    pub critical_reserve: f64,
    /// The `retry_after` of a shed request.
    pub retry_after: Duration,
}

impl Default for Shedding {
    fn default() -> Self {
        Self {
            thresholds: [None; 4],
            critical_reserve: 0.0,
            retry_after: Duration::from_secs(1),
        }
    }
}

impl Shedding {
    /// Sets the thresholds of `p`.
    pub fn threshold(mut self, p: Priority, on: f64, off: f64) -> Self {
        self.thresholds[p.index()] = Some(Threshold { on, off });
        self
    }
}

/// Where the rules keep their counts (`[backend]`): in this process's memory (the default),
/// or in Redis, shared by every process that reads the same rules file. The engine itself
/// always decides in memory; a Redis backend (crate `turnstile-redis`) executes the engine's
/// [`Plan`](super::Plan)s against Redis instead (docs/redis.md).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Backend {
    /// Each rule's keyed store in this process.
    #[default]
    Memory,
    /// Redis or a Redis Cluster.
    Redis(RedisBackend),
}

/// Which Redis (`redis = "redis://..."` or `redis_cluster = ["redis://...", ...]`).
#[derive(Clone, PartialEq, Eq)]
pub enum RedisNodes {
    /// One node: its URL.
    Single(String),
    /// A Redis Cluster: the URLs of some of its nodes (the others are discovered).
    Cluster(Vec<String>),
}

impl RedisNodes {
    /// The URLs.
    pub fn urls(&self) -> Vec<&str> {
        match self {
            RedisNodes::Single(u) => vec![u.as_str()],
            RedisNodes::Cluster(v) => v.iter().map(String::as_str).collect(),
        }
    }
}

/// A URL with its password (if any) replaced by `***`, for logs and messages.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let host_end = rest.find('/').unwrap_or(rest.len());
    match rest[..host_end].rfind('@') {
        Some(at) => {
            let user = rest[..at].split(':').next().unwrap_or("");
            format!("{scheme}://{user}:***@{}", &rest[at + 1..])
        }
        None => url.to_string(),
    }
}

impl fmt::Debug for RedisNodes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let urls: Vec<String> = self.urls().into_iter().map(redact_url).collect();
        match self {
            RedisNodes::Single(_) => f.debug_tuple("Single").field(&urls[0]).finish(),
            RedisNodes::Cluster(_) => f.debug_tuple("Cluster").field(&urls).finish(),
        }
    }
}

/// What a Redis backend answers when Redis does not (a timeout, an error, the circuit open).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendPolicy {
    /// Admit (`Outcome::Untracked`).
    Open,
    /// Deny (`Outcome::StoreFull`, no retry time). The default.
    Closed,
    /// Decide in memory, on every limit divided by `expected_nodes`.
    Insurance {
        /// How many processes share the limits.
        expected_nodes: u64,
    },
}

/// Leases of a Redis backend (`[backend] leases`, `strand`, `mode`, `flush`): whether each
/// process spends the keys' quotas in process between round trips (turnstile-redis
/// `Leases`, docs/redis.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendLeases {
    /// Every check a round trip to Redis (`leases = "off"`, the default).
    Off,
    /// Leases where a key's rate makes them pay (`leases = "auto"`).
    Auto {
        /// The final share of every window in which nothing is leased, in parts per million
        /// (`strand = "5%"`, the default: 50 000).
        strand_ppm: u32,
        /// `mode = "reserve"` (the default) or `"delayed"` (with `flush = N`, default 100).
        mode: BackendLeaseMode,
    },
}

/// How leases spend a key's quota (`[backend] mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendLeaseMode {
    /// Reserve in Redis before admitting: never over the limits.
    Reserve,
    /// Admit, record in Redis every `flush` admissions: over by at most processes × flush
    /// per window.
    Delayed {
        /// Admissions between records.
        flush: u64,
    },
}

impl BackendLeases {
    /// What the configuration guarantees, in words (`turnstile rules check` prints it).
    pub fn bound(&self) -> String {
        match self {
            BackendLeases::Off => "no leases: every check a round trip".into(),
            BackendLeases::Auto { strand_ppm, mode } => {
                let share = *strand_ppm as f64 / 10_000.0;
                match mode {
                    BackendLeaseMode::Reserve => format!(
                        "leases (reserve): never over the limits; nothing leased in the last {share} % of a window, where what processes hold goes back"
                    ),
                    BackendLeaseMode::Delayed { flush } => format!(
                        "leases (delayed, flush {flush}): over by at most processes x {flush} per window"
                    ),
                }
            }
        }
    }
}

/// The default per-call timeout of a Redis backend.
pub const DEFAULT_REDIS_TIMEOUT: Duration = Duration::from_millis(20);

/// The default seed of the key ids a Redis backend stores under (every process that shares a
/// Redis must use the same seed; give your own with `seed` to keep ids unpredictable).
pub const DEFAULT_REDIS_SEED: u64 = 0x7475_726e_7374_696c;

/// A Redis backend's settings (`[backend]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedisBackend {
    /// The node or the cluster.
    pub nodes: RedisNodes,
    /// Per-call timeout (default 20 ms), then the policy answers.
    pub timeout: Duration,
    /// What to answer when Redis does not (default closed).
    pub policy: BackendPolicy,
    /// Prefix of every Redis key (default `"ts:"`; no braces).
    pub prefix: String,
    /// Seed of the key ids hashed from text (API keys, routes, IPv6 groups, composites):
    /// the same in every process sharing the Redis (default [`DEFAULT_REDIS_SEED`]).
    pub seed: u64,
    /// Leases (default off).
    pub leases: BackendLeases,
}

impl RedisBackend {
    /// One Redis node at `url`, with the defaults.
    pub fn single(url: impl Into<String>) -> Self {
        Self::with_nodes(RedisNodes::Single(url.into()))
    }
    /// A Redis Cluster reached through `urls`, with the defaults.
    pub fn cluster(urls: impl IntoIterator<Item = impl Into<String>>) -> Self {
        Self::with_nodes(RedisNodes::Cluster(
            urls.into_iter().map(Into::into).collect(),
        ))
    }
    fn with_nodes(nodes: RedisNodes) -> Self {
        Self {
            nodes,
            timeout: DEFAULT_REDIS_TIMEOUT,
            policy: BackendPolicy::Closed,
            prefix: "ts:".into(),
            seed: DEFAULT_REDIS_SEED,
            leases: BackendLeases::Off,
        }
    }
}
