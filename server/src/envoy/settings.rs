//! Service-wide settings, read from upstream's environment variables, and the Unix clock the
//! fixed windows are aligned to.

use super::config::LoadOptions;
use turnstile::clock::{Clock, DefaultClock, Nanos};

/// Service-wide settings (upstream's environment variables).
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    /// `SHADOW_MODE=true`: the overall code is OK whatever the descriptors say.
    pub shadow_mode: bool,
    /// `QUOTA_MODE=true`: every descriptor is in quota mode (see `quota_mode` in
    /// docs/envoy.md): the request is over only when all its quota descriptors are.
    pub quota_mode: bool,
    /// `RESPONSE_DYNAMIC_METADATA=true`: answer with `dynamic_metadata` (the request's domain,
    /// descriptors and hits, and the `metadata` of the limits that passed).
    pub dynamic_metadata: bool,
    /// `MERGE_DOMAIN_CONFIG=true`: files of one domain are merged instead of refused.
    pub merge_domains: bool,
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
            quota_mode: false,
            dynamic_metadata: false,
            merge_domains: false,
            response_headers: None,
            near_limit_ratio: 0.8,
            capacity: 100_000,
        }
    }
}

impl Settings {
    /// Upstream's environment variables, read from `var`.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        // The values upstream's envconfig accepts for a bool (Go's strconv.ParseBool).
        let flag = |name: &str| -> Result<bool, String> {
            match var(name).as_deref().map(str::trim) {
                None | Some("") => Ok(false),
                Some("1" | "t" | "T" | "true" | "TRUE" | "True") => Ok(true),
                Some("0" | "f" | "F" | "false" | "FALSE" | "False") => Ok(false),
                Some(v) => Err(format!("{name}={v}: expected true or false")),
            }
        };
        let mut s = Settings {
            shadow_mode: flag("SHADOW_MODE")?,
            quota_mode: flag("QUOTA_MODE")?,
            dynamic_metadata: flag("RESPONSE_DYNAMIC_METADATA")?,
            merge_domains: flag("MERGE_DOMAIN_CONFIG")?,
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

    /// How the configuration files are read ([`super::load_with`]).
    pub fn load_options(&self) -> LoadOptions {
        LoadOptions {
            merge_domains: self.merge_domains,
        }
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
