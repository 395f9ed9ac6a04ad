//! The rules file's shape for serde: `Raw*` structs whose fields are `toml::Spanned`, and the
//! value types that parse themselves (durations, names, string-or-array lists), so that `toml`
//! reports their errors at the value's line and column.

use crate::algo::Algorithm;
use crate::keyed::FullPolicy;
use crate::UnknownName;
use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::Deserialize;
use std::fmt;
use std::marker::PhantomData;
use std::str::FromStr;
use std::time::Duration;
use toml::Spanned;

/// Parses a duration: one or more `<integer><unit>` terms, units ns, us (µs), ms, s, m, h, d;
/// e.g. `"1s"`, `"500ms"`, `"1h30m"`.
pub fn parse_duration(s: &str) -> Result<Duration, DurationError> {
    let bad = || DurationError::Syntax(s.to_string());
    let t = s.trim();
    if t.is_empty() {
        return Err(bad());
    }
    let mut total: u128 = 0;
    let mut rest = t;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 || digits > 20 {
            return Err(bad());
        }
        let n: u128 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let unit_len = rest
            .char_indices()
            .find(|(_, c)| c.is_ascii_digit())
            .map_or(rest.len(), |(i, _)| i);
        let ns: u128 = match &rest[..unit_len] {
            "ns" => 1,
            "us" | "µs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            "d" => 86_400_000_000_000,
            _ => return Err(bad()),
        };
        total = total.saturating_add(n.saturating_mul(ns));
        rest = &rest[unit_len..];
    }
    const MAX: u128 = 100 * 365 * 86_400_000_000_000;
    if total > MAX {
        return Err(DurationError::TooLong(s.to_string()));
    }
    Ok(Duration::from_nanos(total as u64))
}

/// A duration [`parse_duration`] refused; the text given, and how to write it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DurationError {
    /// Not one or more `<integer><unit>` terms.
    Syntax(String),
    /// Longer than 100 years.
    TooLong(String),
}

impl fmt::Display for DurationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DurationError::Syntax(s) => write!(
                f,
                "`{s}` is not a duration: write a number and a unit (ns, us, ms, s, m, h, d), e.g. \"1s\", \"500ms\", \"1h\" or \"1h30m\""
            ),
            DurationError::TooLong(s) => write!(f, "`{s}` is longer than 100 years"),
        }
    }
}

impl std::error::Error for DurationError {}

pub(crate) struct Dur(pub(crate) Duration);

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Dur;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration such as \"1s\", \"500ms\" or \"1h\"")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Dur, E> {
                parse_duration(s).map(Dur).map_err(E::custom)
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Dur, E> {
                Err(E::custom(format!(
                    "a duration needs a unit: write \"{v}s\" (or ms, m, h, ...) in quotes"
                )))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Dur, E> {
                self.visit_i64(v as i64)
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Dur, E> {
                Err(E::custom(format!(
                    "a duration is a string with a unit, e.g. \"{}ms\"",
                    (v * 1000.0).round()
                )))
            }
        }
        d.deserialize_any(V)
    }
}

/// A value parsed from a string by its `FromStr` (algorithm, policy, priority, mode names).
pub(crate) struct Named<T>(pub(crate) T);

impl<'de, T: FromStr> Deserialize<'de> for Named<T>
where
    T::Err: fmt::Display,
{
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(PhantomData<T>);
        impl<T: FromStr> Visitor<'_> for V<T>
        where
            T::Err: fmt::Display,
        {
            type Value = Named<T>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a name in quotes")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Named<T>, E> {
                s.parse().map(Named).map_err(E::custom)
            }
        }
        d.deserialize_str(V(PhantomData))
    }
}

/// A string, or an array of strings.
pub(crate) enum List {
    One(String),
    Many(Vec<Spanned<String>>),
}

impl<'de> Deserialize<'de> for List {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = List;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string or an array of strings")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<List, E> {
                Ok(List::One(s.to_string()))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<List, A::Error> {
                let mut v = Vec::new();
                while let Some(s) = a.next_element::<Spanned<String>>()? {
                    v.push(s);
                }
                Ok(List::Many(v))
            }
        }
        d.deserialize_any(V)
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum ModeName {
    Hard,
    Soft,
    Elastic,
    Shadow,
}

impl FromStr for ModeName {
    type Err = UnknownName;
    fn from_str(s: &str) -> Result<Self, UnknownName> {
        Ok(match s {
            "hard" => ModeName::Hard,
            "soft" => ModeName::Soft,
            "elastic" => ModeName::Elastic,
            "shadow" => ModeName::Shadow,
            _ => return Err(UnknownName::new("mode", s, "hard, soft, elastic or shadow")),
        })
    }
}

pub(crate) type S<T> = Option<Spanned<T>>;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawFile {
    pub(crate) settings: S<RawSettings>,
    pub(crate) load: S<RawLoad>,
    pub(crate) shedding: S<RawShedding>,
    pub(crate) backend: S<RawBackend>,
    #[serde(default, rename = "rule")]
    pub(crate) rules: Vec<Spanned<RawRule>>,
    #[serde(default)]
    pub(crate) limits: std::collections::BTreeMap<String, Spanned<RawClass>>,
}

/// `[limits.NAME]`: a limits class.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawClass {
    pub(crate) key: Spanned<List>,
    pub(crate) algorithm: Spanned<Named<Algorithm>>,
    pub(crate) window: S<Dur>,
    pub(crate) file: S<String>,
    pub(crate) capacity: S<u64>,
    pub(crate) redis: S<String>,
    #[serde(default)]
    pub(crate) plans: std::collections::BTreeMap<String, Spanned<RawLimit>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSettings {
    pub(crate) capacity: S<u64>,
    pub(crate) when_full: S<Named<FullPolicy>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawLoad {
    pub(crate) max_in_flight: S<u64>,
    pub(crate) sample: S<Dur>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawShedding {
    pub(crate) retry_after: S<Dur>,
    pub(crate) critical_reserve: S<f64>,
    pub(crate) critical: S<RawThreshold>,
    pub(crate) post: S<RawThreshold>,
    pub(crate) get: S<RawThreshold>,
    pub(crate) test: S<RawThreshold>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawBackend {
    pub(crate) redis: S<String>,
    pub(crate) redis_cluster: S<Vec<Spanned<String>>>,
    pub(crate) timeout: S<Dur>,
    pub(crate) policy: S<Named<PolicyName>>,
    pub(crate) expected_nodes: S<u64>,
    pub(crate) prefix: S<String>,
    pub(crate) seed: S<u64>,
    pub(crate) leases: S<Named<LeasesName>>,
    pub(crate) strand: S<String>,
    pub(crate) mode: S<Named<LeaseModeName>>,
    pub(crate) flush: S<u64>,
}

/// `[backend] leases`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum LeasesName {
    Auto,
    Off,
}

impl FromStr for LeasesName {
    type Err = UnknownName;
    fn from_str(s: &str) -> Result<Self, UnknownName> {
        match s {
            "auto" => Ok(LeasesName::Auto),
            "off" => Ok(LeasesName::Off),
            _ => Err(UnknownName::new(
                "leases",
                s,
                "auto (lease the keys whose rate makes it pay) or off (every check a round trip)",
            )),
        }
    }
}

/// `[backend] mode`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum LeaseModeName {
    Reserve,
    Delayed,
}

impl FromStr for LeaseModeName {
    type Err = UnknownName;
    fn from_str(s: &str) -> Result<Self, UnknownName> {
        match s {
            "reserve" => Ok(LeaseModeName::Reserve),
            "delayed" => Ok(LeaseModeName::Delayed),
            _ => Err(UnknownName::new(
                "lease mode",
                s,
                "reserve (never over the limits) or delayed (over by at most processes x flush)",
            )),
        }
    }
}

/// `[backend] policy`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum PolicyName {
    Open,
    Closed,
    Insurance,
}

impl FromStr for PolicyName {
    type Err = UnknownName;
    fn from_str(s: &str) -> Result<Self, UnknownName> {
        Ok(match s {
            "open" => PolicyName::Open,
            "closed" => PolicyName::Closed,
            "insurance" => PolicyName::Insurance,
            _ => {
                return Err(UnknownName::new(
                    "policy",
                    s,
                    "open (admit while Redis is away), closed (deny) or insurance (decide in memory at each limit / expected_nodes)",
                ))
            }
        })
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawThreshold {
    pub(crate) on: Spanned<f64>,
    pub(crate) off: Spanned<f64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRule {
    pub(crate) name: Spanned<String>,
    pub(crate) key: Spanned<List>,
    #[serde(rename = "match")]
    pub(crate) when: S<RawMatch>,
    pub(crate) mode: S<Named<ModeName>>,
    pub(crate) soft_percent: S<u32>,
    pub(crate) elastic_percent: S<u32>,
    pub(crate) elastic_below: S<f64>,
    pub(crate) cost: S<u64>,
    pub(crate) capacity: S<u64>,
    pub(crate) when_full: S<Named<FullPolicy>>,
    pub(crate) limits: S<Vec<Spanned<RawLimit>>>,
    #[serde(default, rename = "override")]
    pub(crate) overrides: Vec<Spanned<RawOverride>>,
    pub(crate) limits_from: S<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawMatch {
    pub(crate) route_prefix: S<List>,
    pub(crate) method: S<List>,
    pub(crate) priority: S<List>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawLimit {
    pub(crate) algorithm: S<Named<Algorithm>>,
    pub(crate) limit: S<u64>,
    pub(crate) capacity: S<u64>,
    pub(crate) window: S<Dur>,
    pub(crate) time_window_sec: S<u64>,
    pub(crate) burst: S<u64>,
    pub(crate) buckets: S<u64>,
    pub(crate) delay: S<u64>,
    pub(crate) count_denied: S<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawOverride {
    pub(crate) key: Spanned<toml::Value>,
    pub(crate) limits: S<Vec<Spanned<RawLimit>>>,
}
