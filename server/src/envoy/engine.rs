//! The service: a `RateLimitRequest` in, a `RateLimitResponse` out, from turnstile stores.
//!
//! [`Envoy::should_rate_limit`] follows upstream's `shouldRateLimitWorker`: the request is
//! checked ([`limits::validate`]), each descriptor gets its limit
//! ([`limits::limits_to_check`], upstream's `constructLimitsToCheck`), each limit is counted
//! and decided ([`counter`], upstream's limiter), and the statuses make the answer
//! ([`response`]: overall code with quota and shadow mode, headers, dynamic metadata).
//!
//! One counter per configured limit; a request-level `limit` override (Envoy's
//! `RateLimitDescriptor.limit`) is counted in one shared counter per unit, keyed by domain and
//! entries.
//!
//! [`limits::validate`]: super::limits::validate
//! [`limits::limits_to_check`]: super::limits::limits_to_check
//! [`counter`]: super::counter
//! [`response`]: super::response

use super::config::{EnvoyConfig, Unit};
use super::counter::{Applied, Counter, DynClock};
use super::explain::{code_name, key_text, DescriptorExplanation, EnvoyExplanation};
use super::limits::{self, Found, InvalidRequest, ToCheck};
use super::matcher::Matcher;
use super::metrics::{Counters, Metrics};
use super::response;
use super::settings::{Settings, UnixClock};
use arc_swap::ArcSwap;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::DescriptorStatus;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use std::collections::HashMap;
use std::sync::Arc;
use turnstile::clock::{Clock, Nanos};

pub use super::response::{CODE_OK, CODE_OVER_LIMIT};

struct Compiled {
    matcher: Matcher,
    /// Per rule: its counter (`None`: unlimited) and metrics.
    rules: Vec<(Option<Arc<Counter>>, Arc<Counters>)>,
}

/// The Envoy rate limit service: configuration, stores and metrics. Cheap to share (`Arc`).
pub struct Envoy {
    state: ArcSwap<Compiled>,
    /// One counter per unit, in [`Unit::ALL`] order.
    overrides: Vec<Counter>,
    override_counters: Arc<Counters>,
    settings: Settings,
    clock: DynClock,
    metrics: Metrics,
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
            .map(|&u| Counter::per_unit(u, settings.capacity, &clock))
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

    /// The configured descriptors' hits in turnstile's names (`domain`, `key`, `value` labels).
    pub fn render_descriptor_metrics(&self) -> String {
        self.metrics.render_descriptors()
    }

    /// The counters of the rule with this full key (`domain.key_value.subkey`), if any.
    pub fn counters(&self, full_key: &str) -> Option<[u64; 5]> {
        self.metrics.get(full_key)
    }

    /// Answers one request (upstream's `shouldRateLimitWorker`).
    pub fn should_rate_limit(
        &self,
        req: &RateLimitRequest,
    ) -> Result<RateLimitResponse, InvalidRequest> {
        limits::validate(req)?;
        let state = self.state.load();
        let m = &state.matcher;
        let checks = limits::limits_to_check(m, req);
        let statuses = self.do_limit(&state, req, &checks);
        for (st, c) in statuses.iter().zip(&checks) {
            if st.code == CODE_OVER_LIMIT {
                // A rule's counter key is its entries; an override's starts with the domain.
                let entries = match c.found {
                    Found::Override(..) => after_first_part(&c.key),
                    _ => &c.key,
                };
                crate::denied::record_envoy(&req.domain, entries);
            }
        }
        let rule = |i: usize| match checks[i].found {
            Found::Rule(r) => Some(&m.rules()[r]),
            _ => None,
        };
        let unlimited = |i: usize| matches!(checks[i].found, Found::Unlimited(_));
        let summary = response::summarise(&statuses, unlimited, |i| {
            self.settings.quota_mode || rule(i).is_some_and(|r| r.quota_mode)
        });
        let mut resp = RateLimitResponse {
            overall_code: summary.overall_code,
            ..Default::default()
        };
        if let (Some(names), Some(j)) = (&self.settings.response_headers, summary.headers_from) {
            resp.response_headers_to_add = response::headers(names, &statuses[j]);
        }
        if resp.overall_code == CODE_OVER_LIMIT && self.settings.shadow_mode {
            resp.overall_code = CODE_OK;
            self.metrics.global_shadow_mode();
        }
        if self.settings.dynamic_metadata {
            let passed = (0..statuses.len())
                .filter(|&i| response::passed(&statuses[i], unlimited(i)))
                .map(|i| rule(i).and_then(|r| r.metadata.as_ref()));
            resp.dynamic_metadata = Some(response::dynamic_metadata(req, passed));
        }
        resp.statuses = statuses;
        Ok(resp)
    }

    /// What [`Envoy::should_rate_limit`] would answer `req` now and why, counting nothing:
    /// each descriptor's counter is peeked ([`super::explain`]).
    pub fn explain(&self, req: &RateLimitRequest) -> Result<EnvoyExplanation, InvalidRequest> {
        limits::validate(req)?;
        let state = self.state.load();
        let m = &state.matcher;
        let checks = limits::limits_to_check(m, req);
        let now: Nanos = self.clock.now();
        let request_hits = if req.hits_addend == 0 {
            1
        } else {
            req.hits_addend as u64
        };
        let quota = |i: usize| {
            self.settings.quota_mode
                || matches!(checks[i].found, Found::Rule(r) if m.rules()[r].quota_mode)
        };
        let (statuses, descriptors): (Vec<_>, Vec<_>) = req
            .descriptors
            .iter()
            .zip(&checks)
            .enumerate()
            .map(|(i, (d, c))| {
                let hits = d.hits_addend.map_or(request_hits, |h| h.value);
                let entries: Vec<String> = d
                    .entries
                    .iter()
                    .map(|e| format!("{}={}", e.key, e.value))
                    .collect();
                self.peek(&state, c, entries.join(","), hits, now, quota(i))
            })
            .unzip();
        let unlimited = |i: usize| matches!(checks[i].found, Found::Unlimited(_));
        let summary = response::summarise(&statuses, unlimited, quota);
        let mut overall = summary.overall_code;
        if overall == CODE_OVER_LIMIT && self.settings.shadow_mode {
            overall = CODE_OK;
        }
        Ok(EnvoyExplanation {
            overall_code: code_name(overall),
            global_shadow_mode: self.settings.shadow_mode,
            decided_by: summary.headers_from,
            descriptors,
        })
    }

    /// One descriptor's status as [`Envoy::do_limit`] would give it, from a peek of its
    /// counter, and its explanation.
    fn peek(
        &self,
        state: &Compiled,
        c: &ToCheck,
        entries: String,
        hits: u64,
        now: Nanos,
        quota: bool,
    ) -> (DescriptorStatus, DescriptorExplanation) {
        let mut x = unmatched(entries, c, hits);
        let (applied, counter) = match c.found {
            Found::None | Found::Unlimited(_) => {
                let st = DescriptorStatus {
                    code: CODE_OK,
                    limit_remaining: if let Found::Unlimited(r) = c.found {
                        x.matched = format!("unlimited: {}", state.matcher.rules()[r].full_key);
                        u32::MAX
                    } else {
                        0
                    },
                    ..Default::default()
                };
                x.remaining = st.limit_remaining;
                return (st, x);
            }
            Found::Rule(r) => {
                let rule = &state.matcher.rules()[r];
                x.matched = rule.full_key.clone();
                let applied = Applied {
                    name: &rule.limit.name,
                    requests_per_unit: rule.limit.requests_per_unit,
                    unit: rule.limit.unit,
                    shadow_mode: rule.shadow_mode,
                };
                let counter = state.rules[r]
                    .0
                    .as_ref()
                    .expect("limited rules have a counter");
                (applied, &**counter)
            }
            Found::Override(rpu, unit) => {
                x.matched = "override".into();
                let applied = Applied {
                    name: "",
                    requests_per_unit: rpu,
                    unit: Some(unit),
                    shadow_mode: false,
                };
                let idx = Unit::ALL.iter().position(|&u| u == unit).unwrap_or(0);
                (applied, &self.overrides[idx])
            }
        };
        x.mode = match (applied.shadow_mode, quota) {
            (true, _) => "shadow",
            (false, true) => "quota",
            (false, false) => "hard",
        };
        let unit = applied.unit.map_or("", Unit::name);
        x.limit = Some((applied.name.to_string(), applied.requests_per_unit, unit));
        x.key_id = Some(counter.key_id(&c.key).to_string());
        let (st, k) = counter.peek(&c.key, hits, now, &applied);
        (x.counter, x.counter_after, x.over) = (k.before, k.after, k.over);
        x.remaining = st.limit_remaining;
        x.reset_after_s = st.duration_until_reset.as_ref().map_or(0, |d| d.seconds);
        x.code = code_name(st.code);
        (st, x)
    }

    /// Counts and decides each descriptor (upstream's `DoLimit`), in request order.
    fn do_limit(
        &self,
        state: &Compiled,
        req: &RateLimitRequest,
        checks: &[ToCheck],
    ) -> Vec<DescriptorStatus> {
        let now: Nanos = self.clock.now();
        let request_hits = if req.hits_addend == 0 {
            1
        } else {
            req.hits_addend as u64
        };
        let ratio = self.settings.near_limit_ratio;
        req.descriptors
            .iter()
            .zip(checks)
            .map(|(d, c)| {
                let hits = d.hits_addend.map_or(request_hits, |h| h.value);
                match c.found {
                    Found::None => DescriptorStatus {
                        code: CODE_OK,
                        ..Default::default()
                    },
                    Found::Unlimited(_) => DescriptorStatus {
                        code: CODE_OK,
                        limit_remaining: u32::MAX,
                        ..Default::default()
                    },
                    Found::Rule(r) => {
                        let rule = &state.matcher.rules()[r];
                        let applied = Applied {
                            name: &rule.limit.name,
                            requests_per_unit: rule.limit.requests_per_unit,
                            unit: rule.limit.unit,
                            shadow_mode: rule.shadow_mode,
                        };
                        let (counter, stats) = &state.rules[r];
                        let counter = counter.as_ref().expect("limited rules have a counter");
                        counter.check(&c.key, hits, now, &applied, stats, ratio)
                    }
                    Found::Override(rpu, unit) => {
                        // Upstream: an override is never in shadow mode.
                        let applied = Applied {
                            name: "",
                            requests_per_unit: rpu,
                            unit: Some(unit),
                            shadow_mode: false,
                        };
                        let idx = Unit::ALL.iter().position(|&u| u == unit).unwrap_or(0);
                        let stats = &self.override_counters;
                        self.overrides[idx].check(&c.key, hits, now, &applied, stats, ratio)
                    }
                }
            })
            .collect()
    }
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
                Counter::new(&r.limit, settings.capacity, clock)
                    .map_err(|e| format!("{}: {e}", r.full_key))?,
            ))
        };
        metrics.describe(&r.full_key, [&r.domain, &r.metric_key, &r.metric_value]);
        rules.push((c, metrics.counters(&r.full_key)));
    }
    Ok(Compiled { matcher, rules })
}

/// A descriptor's explanation before its limit is known: none matched yet.
fn unmatched(entries: String, c: &ToCheck, hits: u64) -> DescriptorExplanation {
    DescriptorExplanation {
        entries,
        matched: "none".into(),
        limit: None,
        mode: "none",
        key: key_text(&c.key),
        key_id: None,
        hits,
        counter: 0,
        counter_after: 0,
        remaining: 0,
        reset_after_s: 0,
        over: false,
        code: "OK",
    }
}

/// A counter key without its first part (see [`super::matcher::push_part`]).
fn after_first_part(key: &[u8]) -> &[u8] {
    key.split_first_chunk::<4>()
        .and_then(|(len, tail)| tail.get(u32::from_le_bytes(*len) as usize..))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envoy::matcher::push_part;

    #[test]
    fn an_override_key_without_its_domain_is_its_entries() {
        let (mut with, mut entries) = (Vec::new(), Vec::new());
        push_part(&mut with, "edge");
        for part in ["client", "gold"] {
            push_part(&mut with, part);
            push_part(&mut entries, part);
        }
        assert_eq!(after_first_part(&with), &entries[..]);
        assert_eq!(after_first_part(&with[..6]), b"");
        assert_eq!(after_first_part(b"ab"), b"");
    }
}
