//! The decision: a `RateLimitRequest` in, a `RateLimitResponse` out, from turnstile stores.
//!
//! # Counting as upstream counts
//!
//! Upstream keeps one Redis counter per descriptor and window, adds every hit (denied ones too)
//! and compares: a descriptor is over when `count after the hits > requests_per_unit`. To give
//! the same answers, the default (`fixed_window`) rule is a turnstile [`Store`] of fixed windows
//! of the rule's length whose per-window limit is the counter's maximum (2^24 − 1, so every
//! hit is counted, as a Redis INCRBY would), and the comparison with `requests_per_unit` is
//! made here on the count the store returns. That keeps upstream's exact semantics where a
//! limit-per-window store could not: hits over the limit still count, `hits_addend: 0` asks
//! whether the count is already over without adding, and `near_limit`/`over_limit` metrics
//! split a request's hits as upstream does. Windows are aligned to the Unix epoch (the clock
//! is Unix time), so a minute window is a calendar minute, as upstream's are.
//!
//! A rule with our `algorithm:` extension gets a store of that algorithm with the rule's own
//! limit, and the store decides.
//!
//! A request-level `limit` override (Envoy's `RateLimitDescriptor.limit`) is counted in one
//! shared store per unit, keyed by domain and entries.

use super::config::{EnvoyConfig, Unit};
use super::matcher::{push_part, Matcher, Rule};
use super::metrics::{Counters, Metrics};
use arc_swap::ArcSwap;
use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    DescriptorStatus, RateLimit as PbRateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use std::collections::HashMap;
use std::sync::Arc;
use turnstile::algo::fixed_window::MAX_LIMIT;
use turnstile::clock::{Clock, DefaultClock, Nanos};
use turnstile::keyed::{FullPolicy, Store};
use turnstile::{Algorithm, Limit, LimitSpec, Limits, Outcome};

/// `RateLimitResponse.Code`.
pub const CODE_OK: i32 = 1;
/// `RateLimitResponse.Code`.
pub const CODE_OVER_LIMIT: i32 = 2;

/// The most descriptors one request may carry.
pub const MAX_DESCRIPTORS: usize = 1024;
/// The most entries one descriptor may carry.
pub const MAX_ENTRIES: usize = 64;
/// The longest entry key or value, in bytes.
pub const MAX_ENTRY_BYTES: usize = 64 << 10;

/// A request refused as a whole (gRPC `INVALID_ARGUMENT`, HTTP 400).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvalidRequest(pub String);

impl std::fmt::Display for InvalidRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A clock that reads Unix time in nanoseconds: the default monotonic clock plus the offset
/// to the wall clock taken once when built, so that fixed windows fall on calendar
/// boundaries as upstream's do, while time never goes backwards.
#[derive(Debug)]
pub struct UnixClock {
    inner: DefaultClock,
    offset: u64,
}

impl UnixClock {
    /// Reads the wall clock once.
    pub fn new() -> Self {
        let inner = DefaultClock::new();
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let offset = wall.saturating_sub(inner.now());
        UnixClock { inner, offset }
    }
}

impl Default for UnixClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for UnixClock {
    #[inline]
    fn now(&self) -> Nanos {
        self.inner.now() + self.offset
    }
}

/// Service-wide settings (upstream's environment variables).
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    /// `SHADOW_MODE=true`: the overall code is OK whatever the descriptors say.
    pub shadow_mode: bool,
    /// `LIMIT_RESPONSE_HEADERS_ENABLED=true`: add the RateLimit headers, named here
    /// (`LIMIT_LIMIT_HEADER`, `LIMIT_REMAINING_HEADER`, `LIMIT_RESET_HEADER`).
    pub response_headers: Option<[String; 3]>,
    /// `NEAR_LIMIT_RATIO` (default 0.8): hits past this share of the limit count as near.
    pub near_limit_ratio: f32,
    /// Keys each rule's store holds (default 100 000; the stalest is evicted when full).
    pub capacity: u64,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            shadow_mode: false,
            response_headers: None,
            near_limit_ratio: 0.8,
            capacity: 100_000,
        }
    }
}

impl Settings {
    /// Upstream's environment variables, read from `var`.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        let flag = |name: &str| -> Result<bool, String> {
            match var(name).as_deref().map(str::trim) {
                None | Some("") => Ok(false),
                Some(v) if v.eq_ignore_ascii_case("true") || v == "1" => Ok(true),
                Some(v) if v.eq_ignore_ascii_case("false") || v == "0" => Ok(false),
                Some(v) => Err(format!("{name}={v}: expected true or false")),
            }
        };
        let mut s = Settings {
            shadow_mode: flag("SHADOW_MODE")?,
            ..Settings::default()
        };
        if flag("LIMIT_RESPONSE_HEADERS_ENABLED")? {
            let name = |v: &str, d: &str| var(v).filter(|s| !s.is_empty()).unwrap_or(d.into());
            s.response_headers = Some([
                name("LIMIT_LIMIT_HEADER", "RateLimit-Limit"),
                name("LIMIT_REMAINING_HEADER", "RateLimit-Remaining"),
                name("LIMIT_RESET_HEADER", "RateLimit-Reset"),
            ]);
        }
        if let Some(r) = var("NEAR_LIMIT_RATIO").filter(|s| !s.is_empty()) {
            s.near_limit_ratio = r
                .parse::<f32>()
                .ok()
                .filter(|r| (0.0..=1.0).contains(r))
                .ok_or_else(|| format!("NEAR_LIMIT_RATIO={r}: expected a number from 0 to 1"))?;
        }
        Ok(s)
    }

    /// From the process environment.
    pub fn from_env() -> Result<Self, String> {
        Self::from_vars(|n| std::env::var(n).ok())
    }
}

type DynClock = Arc<dyn Clock>;

enum Counter {
    /// Upstream's counter: a fixed window counting every hit; compared here.
    Upstream {
        store: Store<DynClock>,
        window_s: u64,
    },
    /// Our extension: the store's algorithm decides.
    Algorithm(Store<DynClock>),
}

struct Compiled {
    matcher: Matcher,
    /// Per rule: its counter (`None`: unlimited) and metrics.
    rules: Vec<(Option<Arc<Counter>>, Arc<Counters>)>,
}

/// The Envoy rate limit service: configuration, stores and metrics. Cheap to share (`Arc`).
pub struct Envoy {
    state: ArcSwap<Compiled>,
    overrides: Vec<Counter>,
    override_counters: Arc<Counters>,
    settings: Settings,
    clock: DynClock,
    metrics: Metrics,
}

fn counter(
    limit: &super::config::RateLimit,
    capacity: u64,
    clock: &DynClock,
) -> Result<Counter, String> {
    let window = limit.window();
    let build = |l: Limit| {
        Store::builder(Limits::new(vec![l]).map_err(|e| e.to_string())?)
            .capacity(capacity)
            .policy(FullPolicy::EvictStalest)
            .build_with_clock(clock.clone())
            .map_err(|e| e.to_string())
    };
    if limit.algorithm == Algorithm::FixedWindow {
        let l = Limit::fixed_window(MAX_LIMIT, window).map_err(|e| e.to_string())?;
        Ok(Counter::Upstream {
            store: build(l)?,
            window_s: window.as_secs().max(1),
        })
    } else {
        let l = LimitSpec::new(limit.algorithm, limit.requests_per_unit as u64, window)
            .build()
            .map_err(|e| e.to_string())?;
        Ok(Counter::Algorithm(build(l)?))
    }
}

/// What one descriptor resolved to before counting.
#[derive(Clone, Copy)]
enum Found {
    None,
    Unlimited,
    Rule(usize),
    Override(u32, Unit),
}

impl Envoy {
    /// A service over `cfg` on the Unix clock.
    pub fn new(cfg: &EnvoyConfig, settings: Settings) -> Result<Self, String> {
        Self::with_clock(cfg, settings, Arc::new(UnixClock::new()))
    }

    /// A service over `cfg` on `clock` (whose time is read as Unix nanoseconds).
    pub fn with_clock(
        cfg: &EnvoyConfig,
        settings: Settings,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, String> {
        let metrics = Metrics::default();
        let overrides = Unit::ALL
            .iter()
            .map(|&u| {
                let rl = super::config::RateLimit {
                    requests_per_unit: 1,
                    unit: Some(u),
                    unit_multiplier: 1,
                    unlimited: false,
                    name: String::new(),
                    replaces: Vec::new(),
                    algorithm: Algorithm::FixedWindow,
                    pos: Default::default(),
                };
                counter(&rl, settings.capacity, &clock)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let state = compile(cfg, &settings, &clock, None, &metrics)?;
        Ok(Envoy {
            state: ArcSwap::from_pointee(state),
            overrides,
            override_counters: metrics.counters("overrides"),
            settings,
            clock,
            metrics,
        })
    }

    /// Replaces the configuration. Rules whose full key and limit are unchanged keep their
    /// counters. On error nothing changes.
    pub fn reload(&self, cfg: &EnvoyConfig) -> Result<(), String> {
        let old = self.state.load();
        let new = compile(cfg, &self.settings, &self.clock, Some(&old), &self.metrics)?;
        self.state.store(Arc::new(new));
        Ok(())
    }

    /// The settings.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The metrics, in Prometheus text format (upstream's names).
    pub fn render_metrics(&self) -> String {
        self.metrics.render()
    }

    /// The counters of the rule with this full key (`domain.key_value.subkey`), if any.
    pub fn counters(&self, full_key: &str) -> Option<[u64; 5]> {
        self.metrics.get(full_key)
    }

    /// Answers one request.
    pub fn should_rate_limit(
        &self,
        req: &RateLimitRequest,
    ) -> Result<RateLimitResponse, InvalidRequest> {
        if req.domain.is_empty() {
            return Err(InvalidRequest("rate limit domain must not be empty".into()));
        }
        if req.descriptors.is_empty() {
            return Err(InvalidRequest(
                "rate limit descriptor list must not be empty".into(),
            ));
        }
        if req.descriptors.len() > MAX_DESCRIPTORS {
            return Err(InvalidRequest(format!(
                "{} descriptors in one request; at most {MAX_DESCRIPTORS}",
                req.descriptors.len()
            )));
        }
        for (i, d) in req.descriptors.iter().enumerate() {
            validate(i, d)?;
        }
        let state = self.state.load();
        let m = &state.matcher;
        // Scratch buffers: one small allocation each per request, next to the decoding's many.
        let mut buf = String::new();
        let mut keys: Vec<Vec<u8>> = Vec::with_capacity(req.descriptors.len());
        let mut found: Vec<Found> = Vec::with_capacity(req.descriptors.len());
        let known = m.has_domain(&req.domain);
        for d in &req.descriptors {
            let mut key = Vec::new();
            let f = if !known {
                Found::None
            } else if let Some(o) = d.limit {
                push_part(&mut key, &req.domain);
                for e in &d.entries {
                    push_part(&mut key, &e.key);
                    push_part(&mut key, &e.value);
                }
                let unit = Unit::from_proto(o.unit).expect("validated");
                Found::Override(o.requests_per_unit, unit)
            } else {
                let entries: Vec<(&str, &str)> = d
                    .entries
                    .iter()
                    .map(|e| (e.key.as_str(), e.value.as_str()))
                    .collect();
                match m.lookup(&req.domain, &entries, &mut buf, &mut key) {
                    Some(r) if m.rules()[r].limit.unlimited => Found::Unlimited,
                    Some(r) => Found::Rule(r),
                    None => Found::None,
                }
            };
            keys.push(key);
            found.push(f);
        }
        // `replaces`: a named limit is dropped when another limit of the request replaces it.
        let replaced: Vec<&str> = found
            .iter()
            .filter_map(|f| match f {
                Found::Rule(r) => Some(&m.rules()[*r].limit.replaces),
                _ => None,
            })
            .flatten()
            .map(String::as_str)
            .collect();
        if !replaced.is_empty() {
            for f in found.iter_mut() {
                if let Found::Rule(r) = *f {
                    let name = &m.rules()[r].limit.name;
                    if !name.is_empty() && replaced.contains(&name.as_str()) {
                        *f = Found::None;
                    }
                }
            }
        }
        let now = self.clock.now();
        let request_hits = if req.hits_addend == 0 {
            1
        } else {
            req.hits_addend as u64
        };
        let mut resp = RateLimitResponse {
            overall_code: CODE_OK,
            ..Default::default()
        };
        let mut over = false;
        let mut min: Option<usize> = None;
        for (i, (d, f)) in req.descriptors.iter().zip(&found).enumerate() {
            let hits = d.hits_addend.map_or(request_hits, |h| h.value);
            let status = match *f {
                Found::None => DescriptorStatus {
                    code: CODE_OK,
                    ..Default::default()
                },
                Found::Unlimited => DescriptorStatus {
                    code: CODE_OK,
                    limit_remaining: u32::MAX,
                    ..Default::default()
                },
                Found::Rule(r) => {
                    let rule = &m.rules()[r];
                    let (counter, stats) = &state.rules[r];
                    let counter = counter.as_ref().expect("limited rules have a counter");
                    self.check(counter, &keys[i], hits, now, rule, stats)
                }
                Found::Override(rpu, unit) => {
                    let rule = Rule {
                        full_key: String::new(),
                        domain: req.domain.clone(),
                        limit: super::config::RateLimit {
                            requests_per_unit: rpu,
                            unit: Some(unit),
                            unit_multiplier: 1,
                            unlimited: false,
                            name: String::new(),
                            replaces: Vec::new(),
                            algorithm: Algorithm::FixedWindow,
                            pos: Default::default(),
                        },
                        shadow_mode: false,
                        detailed_metric: false,
                    };
                    let idx = Unit::ALL.iter().position(|&u| u == unit).unwrap_or(0);
                    self.check(
                        &self.overrides[idx],
                        &keys[i],
                        hits,
                        now,
                        &rule,
                        &self.override_counters,
                    )
                }
            };
            if status.code == CODE_OVER_LIMIT {
                over = true;
            }
            if status.current_limit.is_some() {
                let better = match min {
                    None => true,
                    Some(j) => {
                        let s: &DescriptorStatus = &resp.statuses[j];
                        (status.code == CODE_OVER_LIMIT && s.code != CODE_OVER_LIMIT)
                            || (status.code == s.code && status.limit_remaining < s.limit_remaining)
                    }
                };
                if better {
                    min = Some(i);
                }
            }
            resp.statuses.push(status);
        }
        if over {
            if self.settings.shadow_mode {
                self.metrics.global_shadow_mode();
            } else {
                resp.overall_code = CODE_OVER_LIMIT;
            }
        }
        if let (Some(names), Some(j)) = (&self.settings.response_headers, min) {
            let s = &resp.statuses[j];
            let limit = s.current_limit.as_ref().map_or(0, |l| l.requests_per_unit);
            let reset = s.duration_until_reset.as_ref().map_or(0, |d| d.seconds);
            resp.response_headers_to_add = vec![
                header(&names[0], limit.to_string()),
                header(&names[1], s.limit_remaining.to_string()),
                header(&names[2], reset.to_string()),
            ];
        }
        Ok(resp)
    }

    fn check(
        &self,
        counter: &Counter,
        key: &[u8],
        hits: u64,
        now: Nanos,
        rule: &Rule,
        stats: &Counters,
    ) -> DescriptorStatus {
        let rpu = rule.limit.requests_per_unit as u64;
        let current_limit = Some(PbRateLimit {
            name: rule.limit.name.clone(),
            requests_per_unit: rule.limit.requests_per_unit,
            unit: rule.limit.unit.map_or(0, Unit::proto),
        });
        let (over, remaining, reset_s, before, after) = match counter {
            Counter::Upstream { store, window_s } => {
                let cost = hits.min(MAX_LIMIT);
                let d = store.check_at(key, cost, now);
                let count = MAX_LIMIT - d.remaining.min(MAX_LIMIT);
                let (before, after) = match d.outcome {
                    Outcome::Allowed => (count - cost, count),
                    // The counter is full (2^24 − 1): every limit is below it, so over.
                    Outcome::Untracked => (0, cost),
                    // Limited, NeverFits, StoreFull, and any outcome added later (the enum is
                    // non_exhaustive): a denial.
                    _ => (count, count.saturating_add(hits)),
                };
                let now_s = now / 1_000_000_000;
                let reset = window_s - now_s % window_s;
                let over = after > rpu;
                (over, rpu.saturating_sub(after), reset, before, after)
            }
            Counter::Algorithm(store) => {
                let d = store.check_at(key, hits, now);
                let remaining = d.remaining.min(rpu);
                let after = rpu - remaining;
                let over = !d.allowed();
                let before = if over {
                    after
                } else {
                    after.saturating_sub(hits)
                };
                let reset = d.reset_after_ns.div_ceil(1_000_000_000);
                (
                    over,
                    if over { 0 } else { remaining },
                    reset,
                    before,
                    if over {
                        after.saturating_add(hits)
                    } else {
                        after
                    },
                )
            }
        };
        stats.record(
            hits,
            before,
            after,
            rpu,
            self.settings.near_limit_ratio,
            over,
            rule.shadow_mode,
        );
        DescriptorStatus {
            code: if over && !rule.shadow_mode {
                CODE_OVER_LIMIT
            } else {
                CODE_OK
            },
            current_limit,
            limit_remaining: if over {
                0
            } else {
                remaining.min(u32::MAX as u64) as u32
            },
            duration_until_reset: Some(PbDuration {
                seconds: reset_s.min(i64::MAX as u64) as i64,
                nanos: 0,
            }),
            quota: None,
        }
    }
}

fn header(k: &str, v: String) -> HeaderValue {
    HeaderValue {
        key: k.to_string(),
        value: v,
        raw_value: Vec::new(),
    }
}

fn validate(i: usize, d: &RateLimitDescriptor) -> Result<(), InvalidRequest> {
    if d.entries.len() > MAX_ENTRIES {
        return Err(InvalidRequest(format!(
            "descriptor {i}: {} entries; at most {MAX_ENTRIES}",
            d.entries.len()
        )));
    }
    for (j, e) in d.entries.iter().enumerate() {
        if e.key.len() > MAX_ENTRY_BYTES || e.value.len() > MAX_ENTRY_BYTES {
            return Err(InvalidRequest(format!(
                "descriptor {i}, entry {j}: a key or value of {} bytes; at most {MAX_ENTRY_BYTES}",
                e.key.len().max(e.value.len())
            )));
        }
    }
    if let Some(o) = d.limit {
        if Unit::from_proto(o.unit).is_none() {
            return Err(InvalidRequest(format!(
                "descriptor {i}: the limit override has unit {}; expected SECOND, MINUTE, HOUR, DAY, WEEK, MONTH or YEAR",
                o.unit
            )));
        }
    }
    Ok(())
}

fn compile(
    cfg: &EnvoyConfig,
    settings: &Settings,
    clock: &DynClock,
    old: Option<&Compiled>,
    metrics: &Metrics,
) -> Result<Compiled, String> {
    let matcher = Matcher::new(cfg);
    let mut reuse: HashMap<(&str, &super::config::RateLimit), &Arc<Counter>> = HashMap::new();
    if let Some(old) = old {
        for (r, (c, _)) in old.matcher.rules().iter().zip(&old.rules) {
            if let Some(c) = c {
                reuse.insert((r.full_key.as_str(), &r.limit), c);
            }
        }
    }
    let mut rules = Vec::with_capacity(matcher.rules().len());
    for r in matcher.rules() {
        let c = if r.limit.unlimited {
            None
        } else if let Some(c) = reuse.get(&(r.full_key.as_str(), &r.limit)) {
            Some(Arc::clone(c))
        } else {
            Some(Arc::new(
                counter(&r.limit, settings.capacity, clock)
                    .map_err(|e| format!("{}: {e}", r.full_key))?,
            ))
        };
        rules.push((c, metrics.counters(&r.full_key)));
    }
    Ok(Compiled { matcher, rules })
}
