//! A limits class (`[limits.NAME]`) and one key's entry in it (a plan's name, or a limit), with
//! their text form: `pro`, or `LIMIT/WINDOW` with options, e.g. `5000/1h burst=200`.

use super::super::model::KeyClass;
use super::super::raw::parse_duration;
use super::LimitsError;
use crate::algo::{Algorithm, Limit, LimitSpec};
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

/// Default [`LimitsClass::capacity`]: keys with an entry a class holds.
pub const DEFAULT_LIMITS_CAPACITY: u64 = 1_000_000;

/// A limits class: whose keys, by which algorithm, with which plans (see the module docs).
#[derive(Clone, Debug, PartialEq)]
pub struct LimitsClass {
    /// Its name (`[limits.NAME]`; a rule's `limits_from`).
    pub name: String,
    /// The keys it holds entries for: the key class of the rules that use it.
    pub key: KeyClass,
    /// The algorithm of every limit of the class (one packed algorithm).
    pub algorithm: Algorithm,
    /// The window every limit counts in, for fixed_window and sliding_window (the window is
    /// their record's layout); `None` for the buckets, whose limits give their own.
    pub window: Option<Duration>,
    /// Plans by name, each a limit of the class's algorithm.
    pub plans: Vec<(String, LimitSpec)>,
    /// Entries loaded from this file (CSV or JSON Lines), if any.
    pub file: Option<PathBuf>,
    /// Most keys with an entry (live changes included); a file with more raises it.
    pub capacity: u64,
    /// The Redis holding the entries (`redis = "redis://..."`), for a fleet: read as text
    /// here; `turnstile serve` (or [`EngineBuilder::limits_source`] with turnstile-redis's
    /// `RedisLimits`) gives the class its source. Without one the engine keeps the class
    /// in memory.
    ///
    /// [`EngineBuilder::limits_source`]: crate::rules::EngineBuilder::limits_source
    pub redis: Option<String>,
}

impl LimitsClass {
    /// A class of `key` keys limited by `algorithm`, without plans, file or window.
    pub fn new(name: impl Into<String>, key: KeyClass, algorithm: Algorithm) -> Self {
        Self {
            name: name.into(),
            key,
            algorithm,
            window: None,
            plans: Vec::new(),
            file: None,
            capacity: DEFAULT_LIMITS_CAPACITY,
            redis: None,
        }
    }

    /// Adds a plan.
    pub fn plan(mut self, name: impl Into<String>, spec: LimitSpec) -> Self {
        self.plans.push((name.into(), spec));
        self
    }

    /// Sets the window of a window algorithm's class.
    pub fn window(mut self, window: Duration) -> Self {
        self.window = Some(window);
        self
    }

    /// Loads entries from `path`.
    pub fn file(mut self, path: impl Into<PathBuf>) -> Self {
        self.file = Some(path.into());
        self
    }

    /// Sets the most keys with an entry.
    pub fn capacity(mut self, keys: u64) -> Self {
        self.capacity = keys;
        self
    }

    /// Whether the class's limits count in windows (and so share the class's window).
    fn windowed(&self) -> bool {
        matches!(
            self.algorithm,
            Algorithm::FixedWindow | Algorithm::SlidingWindow
        )
    }

    /// What is wrong with the class itself (not its plans), if anything.
    pub(crate) fn check(&self) -> Result<(), LimitsError> {
        if !self.algorithm.is_packed() {
            return Err(LimitsError::of(
                "algorithm",
                format!(
                    "a limits class holds one packed limit per key (fixed_window, \
                     sliding_window, token_bucket or leaky_bucket), not {}",
                    self.algorithm
                ),
            ));
        }
        Err(match (self.windowed(), self.window) {
            (true, None) => LimitsError::of(
                "window",
                format!(
                    "a {} class counts every key in one window: add e.g. window = \"1m\"",
                    self.algorithm
                ),
            ),
            (false, Some(_)) => LimitsError::of(
                "window",
                format!(
                    "`window` is for fixed_window and sliding_window classes; a {}'s limits \
                     give their own period: remove it",
                    self.algorithm
                ),
            ),
            _ if self.key.is_global() => LimitsError::of(
                "key",
                "a global key has no keys of its own to give limits to",
            ),
            _ if self.capacity == 0 || self.capacity > super::super::MAX_CAPACITY => {
                LimitsError::of(
                    "capacity",
                    format!(
                        "capacity {} is out of range: give 1..={} keys",
                        self.capacity,
                        super::super::MAX_CAPACITY
                    ),
                )
            }
            _ => return Ok(()),
        })
    }

    /// `spec` as a limit of this class: its algorithm (and window), built.
    pub fn build(&self, spec: &LimitSpec) -> Result<Limit, LimitsError> {
        if spec.algorithm != self.algorithm {
            return Err(LimitsError::new(format!(
                "class `{}` limits keys by {}, not {}",
                self.name, self.algorithm, spec.algorithm
            )));
        }
        if let Some(w) = self.window.filter(|w| *w != spec.window) {
            return Err(LimitsError::of(
                "window",
                format!(
                    "class `{}` counts in windows of {}, not {} (a {} record is laid out by its \
                 window)",
                    self.name,
                    fmt_duration(w),
                    fmt_duration(spec.window),
                    self.algorithm
                ),
            ));
        }
        spec.build().map_err(LimitsError::from)
    }

    /// The plans, built; the first error names its plan.
    pub(crate) fn built_plans(&self) -> Result<Vec<(String, Limit)>, LimitsError> {
        self.plans
            .iter()
            .map(|(n, s)| {
                self.build(s)
                    .map(|l| (n.clone(), l))
                    .map_err(|e| LimitsError {
                        message: format!("plan `{n}`: {}", e.message),
                        ..e
                    })
            })
            .collect()
    }

    /// The text form of an entry parsed for this class.
    pub fn parse(&self, text: &str) -> Result<KeyLimit, LimitsError> {
        KeyLimit::parse(text, self.algorithm, self.window)
    }
}

/// One key's entry: a plan of its class, or a limit of its own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyLimit {
    /// The class's plan of this name.
    Plan(String),
    /// A limit of the class's algorithm.
    Limit(LimitSpec),
}

impl KeyLimit {
    /// Parses `pro` (a plan) or `LIMIT/WINDOW` followed by any of `burst=N`, `delay=N` and
    /// `count_denied`, separated by spaces, for a class of `algorithm`: `5/1s`,
    /// `1000/1m burst=2000`. A window class's limit may leave its window out (`500`).
    pub fn parse(
        text: &str,
        algorithm: Algorithm,
        window: Option<Duration>,
    ) -> Result<KeyLimit, LimitsError> {
        let t = text.trim();
        let mut words = t.split_ascii_whitespace();
        let Some(first) = words.next() else {
            return Err(LimitsError::new(
                "empty: give a plan's name or a limit such as 100/1m",
            ));
        };
        if first.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_') {
            if let Some(w) = words.next() {
                return Err(LimitsError::new(format!(
                    "`{t}`: a plan is one name; `{w}` is one word too many"
                )));
            }
            if !first
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            {
                return Err(LimitsError::new(format!(
                    "`{first}` is not a plan name (letters, digits, _ and -)"
                )));
            }
            return Ok(KeyLimit::Plan(first.to_string()));
        }
        let bad_number =
            |s: &str| LimitsError::new(format!("`{s}` is not a whole number, in `{t}`"));
        let (limit, w) = match first.split_once('/') {
            Some((l, w)) => (l, Some(w)),
            None => (first, None),
        };
        let limit: u64 = limit.parse().map_err(|_| bad_number(limit))?;
        let window = match (w, window) {
            (Some(w), _) => parse_duration(w)?,
            (None, Some(w)) => w,
            (None, None) => {
                return Err(LimitsError::new(format!(
                    "`{t}` has no window: write it as LIMIT/WINDOW, e.g. {limit}/1m"
                )))
            }
        };
        let mut spec = LimitSpec::new(algorithm, limit, window);
        for w in words {
            match w.split_once('=') {
                Some(("burst", n)) => spec.burst = Some(n.parse().map_err(|_| bad_number(n))?),
                Some(("delay", n)) => spec.delay = Some(n.parse().map_err(|_| bad_number(n))?),
                None if w == "count_denied" => spec.count_denied = true,
                _ => {
                    return Err(LimitsError::new(format!(
                        "unknown option `{w}` in `{t}`; expected burst=N, delay=N or count_denied"
                    )))
                }
            }
        }
        Ok(KeyLimit::Limit(spec))
    }
}

impl fmt::Display for KeyLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyLimit::Plan(p) => f.write_str(p),
            KeyLimit::Limit(s) => {
                write!(f, "{}/{}", s.limit, fmt_duration(s.window))?;
                if let Some(b) = s.burst {
                    write!(f, " burst={b}")?;
                }
                if let Some(d) = s.delay {
                    write!(f, " delay={d}")?;
                }
                if s.count_denied {
                    f.write_str(" count_denied")?;
                }
                Ok(())
            }
        }
    }
}

/// A duration as the rules file writes one: its largest whole units, e.g. `1h30m`, `250ms`.
pub(crate) fn fmt_duration(d: Duration) -> String {
    const UNITS: [(&str, u128); 7] = [
        ("d", 86_400_000_000_000),
        ("h", 3_600_000_000_000),
        ("m", 60_000_000_000),
        ("s", 1_000_000_000),
        ("ms", 1_000_000),
        ("us", 1_000),
        ("ns", 1),
    ];
    let mut ns = d.as_nanos();
    if ns == 0 {
        return "0s".into();
    }
    let mut out = String::new();
    for (u, n) in UNITS {
        if ns >= n {
            out.push_str(&format!("{}{u}", ns / n));
            ns %= n;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_read_back_as_written() {
        let tb = Algorithm::TokenBucket;
        for text in ["pro", "free-2", "5/1s", "1000/1h30m burst=2000", "7/250ms"] {
            let e = KeyLimit::parse(text, tb, None).unwrap();
            assert_eq!(e.to_string(), text);
            assert_eq!(KeyLimit::parse(&e.to_string(), tb, None).unwrap(), e);
        }
        let w = Some(Duration::from_secs(60));
        let e = KeyLimit::parse("500 count_denied", Algorithm::FixedWindow, w).unwrap();
        assert_eq!(e.to_string(), "500/1m count_denied");
    }

    #[test]
    fn bad_entries_say_what_to_write() {
        let tb = Algorithm::TokenBucket;
        let err = |t: &str| KeyLimit::parse(t, tb, None).unwrap_err().to_string();
        assert!(err("").contains("give a plan's name"));
        assert!(err("100").contains("no window"));
        assert!(err("x/1s").contains("not a plan name"));
        assert!(err("10/1q").contains("not a duration"));
        assert!(err("10/1s burst=x").contains("`x` is not a whole number"));
        assert!(err("10/1s fast").contains("unknown option `fast`"));
        assert!(err("pro plus").contains("one word too many"));
    }

    #[test]
    fn a_class_builds_only_its_own_limits() {
        let c = LimitsClass::new("c", KeyClass::customer(), Algorithm::FixedWindow)
            .window(Duration::from_secs(60));
        assert!(c.check().is_ok());
        let ok = LimitSpec::new(Algorithm::FixedWindow, 5, Duration::from_secs(60));
        assert!(c.build(&ok).is_ok());
        let other = LimitSpec::new(Algorithm::FixedWindow, 5, Duration::from_secs(1));
        assert!(c
            .build(&other)
            .unwrap_err()
            .to_string()
            .contains("windows of 1m"));
        let tb = LimitSpec::new(Algorithm::TokenBucket, 5, Duration::from_secs(60));
        assert!(c
            .build(&tb)
            .unwrap_err()
            .to_string()
            .contains("not token_bucket"));
        let no_window = LimitsClass::new("c", KeyClass::customer(), Algorithm::SlidingWindow);
        assert!(no_window
            .check()
            .unwrap_err()
            .to_string()
            .contains("window = "));
        let log = LimitsClass::new("c", KeyClass::customer(), Algorithm::SlidingLog);
        assert!(log.check().unwrap_err().to_string().contains("packed"));
    }
}
