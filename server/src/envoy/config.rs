//! envoyproxy/ratelimit's YAML configuration, read as it is, validated as upstream validates it.
//!
//! ```yaml
//! domain: edge
//! descriptors:
//!   - key: remote_address          # nested descriptors; value optional
//!     rate_limit: { unit: second, requests_per_unit: 10 }
//!   - key: path
//!     value: "/api/*"              # a value ending in `*` matches by prefix
//!     share_threshold: true        # every matching value shares one counter
//!     rate_limit:
//!       unit: minute               # second minute hour day week month year
//!       requests_per_unit: 100
//!       unit_multiplier: 5         # a window of 5 minutes
//!       name: api                  # other limits may `replaces: [{name: api}]` it
//!       algorithm: sliding_window  # our extension; fixed_window by default, as upstream
//!     shadow_mode: true            # count and report, never deny
//! ```
//!
//! [`load`] reads a file or every `*.yaml`/`*.yml` file of a directory (in name order), one
//! domain per file. Each error names file, line and column. Upstream's rules are kept: a key
//! outside upstream's set is an error (`unknown key`), a known key in the wrong place is
//! ignored as upstream ignores it; keys must be strings; lists hold mappings; an empty domain,
//! an empty descriptor key, a duplicate domain or duplicate `key_value` at one level, an
//! unknown unit, a unit beside `unlimited: true`, an empty `replaces` entry or one naming its
//! own limit are refused.

use super::yaml::{self, Kind, Node, Pos};
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;
use turnstile::{Algorithm, LimitSpec};

/// Keys upstream accepts anywhere in a file, plus our `algorithm`.
pub const VALID_KEYS: &[&str] = &[
    "domain",
    "key",
    "value",
    "descriptors",
    "rate_limit",
    "unit",
    "requests_per_unit",
    "unlimited",
    "shadow_mode",
    "name",
    "replaces",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "unit_multiplier",
    "algorithm",
];

/// The longest window, unit × multiplier: 100 years.
pub const MAX_WINDOW_SECS: u64 = 100 * 31_536_000;

/// The largest file read (larger ones are refused, not truncated).
pub const MAX_FILE_BYTES: u64 = 16 << 20;

/// A unit of time, as in the protocol (`RateLimitResponse.RateLimit.Unit`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Unit {
    /// 1 s.
    Second,
    /// 60 s.
    Minute,
    /// 3600 s.
    Hour,
    /// 86 400 s.
    Day,
    /// 7 days.
    Week,
    /// 30 days, as upstream counts it.
    Month,
    /// 365 days, as upstream counts it.
    Year,
}

impl Unit {
    /// All units.
    pub const ALL: [Unit; 7] = [
        Unit::Second,
        Unit::Minute,
        Unit::Hour,
        Unit::Day,
        Unit::Week,
        Unit::Month,
        Unit::Year,
    ];
    /// Seconds in one unit (upstream's `UnitToDivider`).
    pub fn seconds(self) -> u64 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3600,
            Unit::Day => 86_400,
            Unit::Week => 604_800,
            Unit::Month => 2_592_000,
            Unit::Year => 31_536_000,
        }
    }
    /// The protocol's enum value.
    pub fn proto(self) -> i32 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 2,
            Unit::Hour => 3,
            Unit::Day => 4,
            Unit::Month => 5,
            Unit::Year => 6,
            Unit::Week => 7,
        }
    }
    /// From the protocol's enum value (0, UNKNOWN, and others are `None`).
    pub fn from_proto(v: i32) -> Option<Unit> {
        Unit::ALL.into_iter().find(|u| u.proto() == v)
    }
    /// The lower-case name (`second`).
    pub fn name(self) -> &'static str {
        match self {
            Unit::Second => "second",
            Unit::Minute => "minute",
            Unit::Hour => "hour",
            Unit::Day => "day",
            Unit::Week => "week",
            Unit::Month => "month",
            Unit::Year => "year",
        }
    }
    /// Parses a unit name in any case, as upstream does.
    pub fn parse(s: &str) -> Option<Unit> {
        Unit::ALL
            .into_iter()
            .find(|u| u.name().eq_ignore_ascii_case(s))
    }
}

/// A `rate_limit` block. Equal and hashed by its meaning, not its position.
#[derive(Clone, Debug)]
pub struct RateLimit {
    /// Requests per window.
    pub requests_per_unit: u32,
    /// The unit (`None` only when unlimited).
    pub unit: Option<Unit>,
    /// Units per window (upstream's `unit_multiplier`, default 1).
    pub unit_multiplier: u32,
    /// Never limited.
    pub unlimited: bool,
    /// The limit's name, for `replaces`.
    pub name: String,
    /// Names of the limits this one replaces when both apply to one request.
    pub replaces: Vec<String>,
    /// Our extension: the algorithm (upstream has only fixed windows).
    pub algorithm: Algorithm,
    /// Where the block starts.
    pub pos: Pos,
}

impl RateLimit {
    fn meaning(&self) -> impl PartialEq + std::hash::Hash + '_ {
        (
            self.requests_per_unit,
            self.unit,
            self.unit_multiplier,
            self.unlimited,
            &self.name,
            &self.replaces,
            self.algorithm,
        )
    }

    /// The window: unit × multiplier.
    pub fn window(&self) -> Duration {
        let unit = self.unit.map_or(1, Unit::seconds);
        Duration::from_secs(unit * self.unit_multiplier.max(1) as u64)
    }
}

impl PartialEq for RateLimit {
    fn eq(&self, o: &Self) -> bool {
        self.meaning() == o.meaning()
    }
}
impl Eq for RateLimit {}
impl std::hash::Hash for RateLimit {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.meaning().hash(h)
    }
}

/// One configured descriptor (a node of a domain's tree).
#[derive(Clone, Debug, PartialEq)]
pub struct Descriptor {
    /// The entry key.
    pub key: String,
    /// The entry value (empty: any value).
    pub value: String,
    /// The limit, if this node has one.
    pub rate_limit: Option<RateLimit>,
    /// Nested descriptors.
    pub descriptors: Vec<Descriptor>,
    /// Report over-limit but answer OK.
    pub shadow_mode: bool,
    /// Metrics per value seen (accepted; see docs/envoy.md).
    pub detailed_metric: bool,
    /// Metrics name the value instead of the wildcard (accepted; see docs/envoy.md).
    pub value_to_metric: bool,
    /// A wildcard value whose matching values share one counter.
    pub share_threshold: bool,
    /// The full key: `domain.key_value.subkey` (upstream's stats key).
    pub full_key: String,
    /// Where it starts.
    pub pos: Pos,
}

impl Descriptor {
    /// `key_value`, or `key` when there is no value: upstream's map key at one level.
    pub fn composite(&self) -> String {
        if self.value.is_empty() {
            self.key.clone()
        } else {
            format!("{}_{}", self.key, self.value)
        }
    }
    /// Whether this is a wildcard (its composite key ends in `*`).
    pub fn is_wildcard(&self) -> bool {
        self.composite().ends_with('*')
    }
}

/// One domain: its file and its descriptor tree.
#[derive(Clone, Debug, PartialEq)]
pub struct Domain {
    /// The domain name.
    pub name: String,
    /// The file it came from.
    pub origin: String,
    /// Top-level descriptors, in file order.
    pub descriptors: Vec<Descriptor>,
}

/// A whole configuration: domains by name.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct EnvoyConfig {
    /// The domains.
    pub domains: BTreeMap<String, Domain>,
}

impl EnvoyConfig {
    /// Every descriptor with a limit, depth first in file order, with its domain.
    pub fn limits(&self) -> Vec<(&Domain, &Descriptor, &RateLimit)> {
        fn walk<'a>(
            d: &'a Domain,
            ds: &'a [Descriptor],
            out: &mut Vec<(&'a Domain, &'a Descriptor, &'a RateLimit)>,
        ) {
            for x in ds {
                if let Some(rl) = &x.rate_limit {
                    out.push((d, x, rl));
                }
                walk(d, &x.descriptors, out);
            }
        }
        let mut out = Vec::new();
        for d in self.domains.values() {
            walk(d, &d.descriptors, &mut out);
        }
        out
    }
}

/// Why a configuration was refused: file, line, column and what to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// The file (or origin label).
    pub origin: String,
    /// 1-based line, 0 when the error is not about one place.
    pub line: usize,
    /// 1-based column, 0 when unknown.
    pub column: usize,
    /// What is wrong and how to fix it.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(f, "{}: {}", self.origin, self.message)
        } else {
            write!(
                f,
                "{}:{}:{}: {}",
                self.origin, self.line, self.column, self.message
            )
        }
    }
}

impl std::error::Error for ConfigError {}

/// Loads a file, or every `*.yaml` and `*.yml` file of a directory (name order).
pub fn load(path: impl AsRef<Path>) -> Result<EnvoyConfig, ConfigError> {
    let path = path.as_ref();
    let at = |m: String| ConfigError {
        origin: path.display().to_string(),
        line: 0,
        column: 0,
        message: m,
    };
    let meta = std::fs::metadata(path).map_err(|e| at(format!("cannot read: {e}")))?;
    let files: Vec<PathBuf> = if meta.is_dir() {
        let mut v: Vec<PathBuf> = std::fs::read_dir(path)
            .map_err(|e| at(format!("cannot list the directory: {e}")))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.is_file()
                    && matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml"))
            })
            .collect();
        v.sort();
        if v.is_empty() {
            return Err(at("no *.yaml or *.yml file in the directory".into()));
        }
        v
    } else {
        vec![path.to_path_buf()]
    };
    let mut texts = Vec::with_capacity(files.len());
    for f in &files {
        let origin = f.display().to_string();
        let len = std::fs::metadata(f).map(|m| m.len()).unwrap_or(0);
        if len > MAX_FILE_BYTES {
            return Err(ConfigError {
                origin,
                line: 0,
                column: 0,
                message: format!("the file is {len} bytes; at most {MAX_FILE_BYTES} are read"),
            });
        }
        let text = std::fs::read_to_string(f).map_err(|e| ConfigError {
            origin: origin.clone(),
            line: 0,
            column: 0,
            message: format!("cannot read: {e}"),
        })?;
        texts.push((origin, text));
    }
    parse_many(texts.iter().map(|(o, t)| (o.as_str(), t.as_str())))
}

/// Parses several files' texts, `(origin, text)`, into one configuration.
pub fn parse_many<'a>(
    files: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Result<EnvoyConfig, ConfigError> {
    let mut cfg = EnvoyConfig::default();
    for (origin, text) in files {
        let domain = parse_domain(origin, text)?;
        if cfg.domains.contains_key(&domain.name) {
            return Err(ConfigError {
                origin: origin.to_string(),
                line: 0,
                column: 0,
                message: format!(
                    "duplicate domain '{}' in config file (also in {})",
                    domain.name, cfg.domains[&domain.name].origin
                ),
            });
        }
        cfg.domains.insert(domain.name.clone(), domain);
    }
    Ok(cfg)
}

/// Parses one file's text (one domain).
pub fn parse(origin: &str, text: &str) -> Result<EnvoyConfig, ConfigError> {
    parse_many([(origin, text)])
}

struct Ctx<'a> {
    origin: &'a str,
}

impl Ctx<'_> {
    fn err(&self, pos: Pos, message: impl Into<String>) -> ConfigError {
        ConfigError {
            origin: self.origin.to_string(),
            line: pos.line,
            column: pos.column,
            message: message.into(),
        }
    }

    /// Upstream's key check over the whole tree: string keys from the valid set; lists of maps.
    fn check_keys(&self, n: &Node) -> Result<(), ConfigError> {
        match &n.kind {
            Kind::Map(entries) => {
                for (k, v) in entries {
                    let name = match &k.kind {
                        Kind::Scalar(s, plain) if !*plain || !looks_non_string(s) => s,
                        _ => {
                            return Err(self.err(
                                k.pos,
                                format!(
                                    "config error, key is not of type string: {}",
                                    k.describe()
                                ),
                            ))
                        }
                    };
                    if !VALID_KEYS.contains(&name.as_str()) {
                        return Err(self.err(
                            k.pos,
                            format!(
                                "config error, unknown key '{}'{}",
                                yaml::shorten(name),
                                suggest(name)
                            ),
                        ));
                    }
                    if let Kind::Seq(items) = &v.kind {
                        for e in items {
                            if !matches!(e.kind, Kind::Map(_)) {
                                return Err(self.err(
                                    e.pos,
                                    format!("config error, yaml file contains list of type other than map: {}", e.describe()),
                                ));
                            }
                        }
                    }
                    self.check_keys(v)?;
                }
            }
            Kind::Seq(items) => {
                for e in items {
                    self.check_keys(e)?;
                }
            }
            Kind::Scalar(..) => {}
        }
        Ok(())
    }

    fn string(&self, v: &Node, what: &str) -> Result<String, ConfigError> {
        match &v.kind {
            _ if v.is_null() => Ok(String::new()),
            Kind::Scalar(s, _) => Ok(s.clone()),
            _ => Err(self.err(
                v.pos,
                format!("`{what}` must be a string, not {}", v.describe()),
            )),
        }
    }

    fn boolean(&self, v: &Node, what: &str) -> Result<bool, ConfigError> {
        match &v.kind {
            _ if v.is_null() => Ok(false),
            Kind::Scalar(s, true) => match s.as_str() {
                "true" | "True" | "TRUE" => Ok(true),
                "false" | "False" | "FALSE" => Ok(false),
                _ => Err(self.err(
                    v.pos,
                    format!("`{what}` must be true or false, not {}", v.describe()),
                )),
            },
            _ => Err(self.err(
                v.pos,
                format!("`{what}` must be true or false, not {}", v.describe()),
            )),
        }
    }

    fn u32(&self, v: &Node, what: &str) -> Result<u32, ConfigError> {
        match &v.kind {
            _ if v.is_null() => Ok(0),
            Kind::Scalar(s, true) => s.parse::<u32>().map_err(|_| {
                self.err(
                    v.pos,
                    format!(
                        "`{what}` must be a whole number from 0 to {}, not {}",
                        u32::MAX,
                        v.describe()
                    ),
                )
            }),
            _ => Err(self.err(
                v.pos,
                format!(
                    "`{what}` must be a whole number from 0 to {}, not {}",
                    u32::MAX,
                    v.describe()
                ),
            )),
        }
    }

    fn list<'n>(&self, v: &'n Node, what: &str) -> Result<&'n [Node], ConfigError> {
        match &v.kind {
            _ if v.is_null() => Ok(&[]),
            Kind::Seq(items) => Ok(items),
            _ => Err(self.err(
                v.pos,
                format!("`{what}` must be a list, not {}", v.describe()),
            )),
        }
    }

    fn map<'n>(&self, v: &'n Node, what: &str) -> Result<&'n [(Node, Node)], ConfigError> {
        match &v.kind {
            _ if v.is_null() => Ok(&[]),
            Kind::Map(m) => Ok(m),
            _ => Err(self.err(
                v.pos,
                format!("`{what}` must be a mapping, not {}", v.describe()),
            )),
        }
    }

    fn descriptors(
        &self,
        parent_key: &str,
        items: &[Node],
    ) -> Result<Vec<Descriptor>, ConfigError> {
        let mut out: Vec<Descriptor> = Vec::with_capacity(items.len());
        let mut seen: HashMap<String, Pos> = HashMap::new();
        for item in items {
            let fields = self.map(item, "descriptors[]")?;
            let mut d = Descriptor {
                key: String::new(),
                value: String::new(),
                rate_limit: None,
                descriptors: Vec::new(),
                shadow_mode: false,
                detailed_metric: false,
                value_to_metric: false,
                share_threshold: false,
                full_key: String::new(),
                pos: item.pos,
            };
            let mut children: Option<&Node> = None;
            let mut rl: Option<&Node> = None;
            for (k, v) in fields {
                let Kind::Scalar(name, _) = &k.kind else {
                    continue;
                };
                match name.as_str() {
                    "key" => d.key = self.string(v, "key")?,
                    "value" => d.value = self.string(v, "value")?,
                    "descriptors" => children = Some(v),
                    "rate_limit" => rl = Some(v),
                    "shadow_mode" => d.shadow_mode = self.boolean(v, "shadow_mode")?,
                    "detailed_metric" => d.detailed_metric = self.boolean(v, "detailed_metric")?,
                    "value_to_metric" => d.value_to_metric = self.boolean(v, "value_to_metric")?,
                    "share_threshold" => d.share_threshold = self.boolean(v, "share_threshold")?,
                    // Upstream accepts a known key out of place and ignores it.
                    _ => {}
                }
            }
            if d.key.is_empty() {
                return Err(self.err(item.pos, "descriptor has empty key; give it `key: NAME`"));
            }
            let composite = d.composite();
            d.full_key = format!("{parent_key}{composite}");
            if let Some(first) = seen.get(&composite) {
                return Err(self.err(
                    item.pos,
                    format!(
                        "duplicate descriptor composite key '{}' (first at line {})",
                        d.full_key, first.line
                    ),
                ));
            }
            seen.insert(composite, item.pos);
            if let Some(v) = rl {
                if !v.is_null() {
                    d.rate_limit = Some(self.rate_limit(v)?);
                }
            }
            if let Some(c) = children {
                d.descriptors =
                    self.descriptors(&format!("{}.", d.full_key), self.list(c, "descriptors")?)?;
            }
            out.push(d);
        }
        Ok(out)
    }

    fn rate_limit(&self, v: &Node) -> Result<RateLimit, ConfigError> {
        let fields = self.map(v, "rate_limit")?;
        let mut unit_text: Option<(String, Pos)> = None;
        let mut rl = RateLimit {
            requests_per_unit: 0,
            unit: None,
            unit_multiplier: 1,
            unlimited: false,
            name: String::new(),
            replaces: Vec::new(),
            algorithm: Algorithm::FixedWindow,
            pos: v.pos,
        };
        let mut replaces: Vec<(String, Pos)> = Vec::new();
        let mut multiplier_pos = v.pos;
        let mut algorithm_pos = v.pos;
        for (k, val) in fields {
            let Kind::Scalar(name, _) = &k.kind else {
                continue;
            };
            match name.as_str() {
                "requests_per_unit" => rl.requests_per_unit = self.u32(val, "requests_per_unit")?,
                "unit" => unit_text = Some((self.string(val, "unit")?, val.pos)),
                "unlimited" => rl.unlimited = self.boolean(val, "unlimited")?,
                "name" => rl.name = self.string(val, "name")?,
                "unit_multiplier" => {
                    rl.unit_multiplier = self.u32(val, "unit_multiplier")?;
                    multiplier_pos = val.pos;
                }
                "algorithm" => {
                    let s = self.string(val, "algorithm")?;
                    rl.algorithm = s.parse::<Algorithm>().map_err(|e| self.err(val.pos, e))?;
                    algorithm_pos = val.pos;
                }
                "replaces" => {
                    for r in self.list(val, "replaces")? {
                        let mut n = String::new();
                        for (rk, rv) in self.map(r, "replaces[]")? {
                            if matches!(&rk.kind, Kind::Scalar(s, _) if s == "name") {
                                n = self.string(rv, "name")?;
                            }
                        }
                        replaces.push((n, r.pos));
                    }
                }
                _ => {}
            }
        }
        let unit = match &unit_text {
            Some((s, _)) if !s.is_empty() => Unit::parse(s),
            _ => None,
        };
        if rl.unlimited {
            if unit.is_some() {
                let pos = unit_text.as_ref().map_or(v.pos, |u| u.1);
                return Err(self.err(pos, "should not specify rate limit unit when unlimited"));
            }
        } else if unit.is_none() {
            let (s, pos) = unit_text.unwrap_or((String::new(), v.pos));
            return Err(self.err(
                pos,
                format!("invalid rate limit unit '{}'; expected second, minute, hour, day, week, month or year", yaml::shorten(&s)),
            ));
        }
        rl.unit = unit;
        if rl.unit_multiplier == 0 {
            return Err(self.err(multiplier_pos, "unit_multiplier must be at least 1"));
        }
        if rl.window().as_secs() > MAX_WINDOW_SECS {
            return Err(self.err(
                multiplier_pos,
                format!(
                    "a window of {} s is too long; at most 100 years ({MAX_WINDOW_SECS} s)",
                    rl.window().as_secs()
                ),
            ));
        }
        for (n, pos) in replaces {
            if n.is_empty() {
                return Err(self.err(pos, "should not have an empty replaces entry"));
            }
            if n == rl.name {
                return Err(self.err(pos, "replaces should not contain name of same descriptor"));
            }
            rl.replaces.push(n);
        }
        if !rl.unlimited && rl.requests_per_unit > 0 {
            let spec = LimitSpec::new(rl.algorithm, rl.requests_per_unit as u64, rl.window());
            if rl.algorithm == Algorithm::FixedWindow {
                // Counted in a fixed window of 2^24 - 1 (see engine.rs): a limit must be below it.
                if rl.requests_per_unit as u64 >= turnstile::algo::fixed_window::MAX_LIMIT {
                    return Err(self.err(
                        v.pos,
                        format!(
                            "requests_per_unit {} is too large for a fixed window (at most {}); use `algorithm: token_bucket`",
                            rl.requests_per_unit,
                            turnstile::algo::fixed_window::MAX_LIMIT - 1
                        ),
                    ));
                }
            } else if let Err(e) = spec.build() {
                return Err(self.err(algorithm_pos, format!("{e}")));
            }
        }
        Ok(rl)
    }
}

/// Whether a plain scalar would be a number, bool or null to a YAML 1.1 reader (upstream's).
fn looks_non_string(s: &str) -> bool {
    s.parse::<f64>().is_ok()
        || matches!(
            s,
            "" | "~"
                | "null"
                | "Null"
                | "NULL"
                | "true"
                | "True"
                | "TRUE"
                | "false"
                | "False"
                | "FALSE"
        )
}

fn suggest(name: &str) -> String {
    let squash = |s: &str| s.replace(['_', '-'], "").to_ascii_lowercase();
    VALID_KEYS
        .iter()
        .find(|k| squash(k) == squash(name))
        .map_or(String::new(), |k| format!("; did you mean '{k}'?"))
}

fn parse_domain(origin: &str, text: &str) -> Result<Domain, ConfigError> {
    let cx = Ctx { origin };
    let docs = yaml::parse(text)
        .map_err(|e| cx.err(e.pos, format!("error loading config file: {}", e.message)))?;
    let root = match docs.len() {
        0 => {
            return Err(cx.err(
                Pos::default(),
                "config file cannot have empty domain (the file is empty)",
            ))
        }
        1 => &docs[0],
        _ => {
            return Err(cx.err(
                docs[1].pos,
                "one YAML document per file; put each domain in its own file",
            ))
        }
    };
    let Kind::Map(fields) = &root.kind else {
        return Err(cx.err(
            root.pos,
            format!(
                "the file must be a mapping with `domain` and `descriptors`, not {}",
                root.describe()
            ),
        ));
    };
    cx.check_keys(root)?;
    let mut name = String::new();
    let mut descriptors: &[Node] = &[];
    for (k, v) in fields {
        let Kind::Scalar(key, _) = &k.kind else {
            continue;
        };
        match key.as_str() {
            "domain" => name = cx.string(v, "domain")?,
            "descriptors" => descriptors = cx.list(v, "descriptors")?,
            _ => {}
        }
    }
    if name.is_empty() {
        return Err(cx.err(
            root.pos,
            "config file cannot have empty domain; add `domain: NAME`",
        ));
    }
    let descriptors = cx.descriptors(&format!("{name}."), descriptors)?;
    Ok(Domain {
        name,
        origin: origin.to_string(),
        descriptors,
    })
}
