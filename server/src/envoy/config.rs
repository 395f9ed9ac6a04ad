//! envoyproxy/ratelimit's YAML configuration, read as it is, validated as upstream validates it.
//!
//! ```yaml
//! domain: edge
//! descriptors:
//!   - key: remote_address          # nested descriptors; value optional
//!     rate_limit: { unit: second, requests_per_unit: 10 }
//!   - key: path
//!     value: "/api/*/v1"           # `*` matches any run of characters, anywhere in the value
//!     share_threshold: true        # every matching value shares one counter
//!     rate_limit:
//!       unit: minute               # second minute hour day week month year
//!       requests_per_unit: 100
//!       unit_multiplier: 5         # a window of 5 minutes
//!       name: api                  # other limits may `replaces: [{name: api}]` it
//!       algorithm: sliding_window  # our extension; fixed_window by default, as upstream
//!     shadow_mode: true            # count and report, never deny
//!   - key: tenant
//!     value: gold
//!     quota_mode: true             # over only when all the request's quota descriptors are
//!     metadata: { tier: gold }     # returned in dynamic_metadata when the limit passes
//!     rate_limit: { unit: hour, requests_per_unit: 1000 }
//! ```
//!
//! [`load`] reads a file or every `*.yaml`/`*.yml` file of a directory (in name order), one
//! domain per file; [`load_with`] with [`LoadOptions::merge_domains`] merges the files of one
//! domain as upstream's `MERGE_DOMAIN_CONFIG` does. Each error names file, line and column.
//! Upstream's rules are kept: a key outside upstream's set is an error (`unknown key`), a known
//! key in the wrong place is ignored as upstream ignores it, and so is anything inside
//! `metadata`; keys must be strings; lists hold mappings; an empty domain, an empty descriptor
//! key, a duplicate domain (unless merged) or duplicate `key_value` at one level, an unknown
//! unit, a unit beside `unlimited: true`, an empty `replaces` entry or one naming its own
//! limit, and `share_threshold` on a value without `*` are refused.

use super::yaml::Pos;
use envoy_types::pb::google::protobuf::Struct;
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;
use turnstile::Algorithm;

mod metadata;
mod parse;

/// Where the YAML being read came from, for its errors' positions (shared by `parse` and
/// `metadata`).
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
}

/// Keys upstream accepts anywhere in a file, plus `unit_multiplier` and our `algorithm`.
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
    "quota_mode",
    "name",
    "replaces",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "metadata",
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
    /// Over only when every quota descriptor of the request is over (upstream's `quota_mode`).
    pub quota_mode: bool,
    /// Returned in the response's `dynamic_metadata` when this limit passes (upstream's
    /// `metadata`, with `RESPONSE_DYNAMIC_METADATA=true`).
    pub metadata: Option<Struct>,
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
    /// Whether this is a wildcard (its composite key holds a `*`, anywhere).
    pub fn is_wildcard(&self) -> bool {
        self.composite().contains('*')
    }
}

/// One domain: its files and its descriptor tree.
#[derive(Clone, Debug, PartialEq)]
pub struct Domain {
    /// The domain name.
    pub name: String,
    /// The files it came from, in the order read (several when merged).
    pub origins: Vec<Origin>,
    /// Top-level descriptors, in file order (the files' in the order read).
    pub descriptors: Vec<Descriptor>,
}

/// One file of a domain.
#[derive(Clone, Debug, PartialEq)]
pub struct Origin {
    /// The file.
    pub file: String,
    /// Where it names the domain.
    pub pos: Pos,
    /// Its top-level descriptors in [`Domain::descriptors`].
    pub descriptors: std::ops::Range<usize>,
}

impl Domain {
    /// The files it came from, for messages: `a.yaml` or `a.yaml, b.yaml`.
    pub fn files(&self) -> String {
        let names: Vec<&str> = self.origins.iter().map(|o| o.file.as_str()).collect();
        names.join(", ")
    }
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

/// How a configuration is read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoadOptions {
    /// Merge the files of one domain (upstream's `MERGE_DOMAIN_CONFIG`) instead of refusing
    /// the second. The merged domain holds each file's top-level descriptors in the order the
    /// files are read; a `key_value` in two of them is refused.
    pub merge_domains: bool,
}

/// Loads a file, or every `*.yaml` and `*.yml` file of a directory (name order); a domain in
/// two files is refused.
pub fn load(path: impl AsRef<Path>) -> Result<EnvoyConfig, ConfigError> {
    load_with(path, LoadOptions::default())
}

/// [`load`] with options.
pub fn load_with(path: impl AsRef<Path>, opts: LoadOptions) -> Result<EnvoyConfig, ConfigError> {
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
    parse_many_with(texts.iter().map(|(o, t)| (o.as_str(), t.as_str())), opts)
}

/// Parses several files' texts, `(origin, text)`, into one configuration; a domain in two of
/// them is refused.
pub fn parse_many<'a>(
    files: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Result<EnvoyConfig, ConfigError> {
    parse_many_with(files, LoadOptions::default())
}

/// [`parse_many`] with options.
pub fn parse_many_with<'a>(
    files: impl IntoIterator<Item = (&'a str, &'a str)>,
    opts: LoadOptions,
) -> Result<EnvoyConfig, ConfigError> {
    let mut cfg = EnvoyConfig::default();
    for (origin, text) in files {
        let domain = parse::domain(origin, text)?;
        match cfg.domains.get_mut(&domain.name) {
            None => {
                cfg.domains.insert(domain.name.clone(), domain);
            }
            Some(first) if opts.merge_domains => merge(first, domain)?,
            Some(first) => {
                let (this, first) = (&domain.origins[0], &first.origins[0]);
                return Err(ConfigError {
                    origin: this.file.clone(),
                    line: this.pos.line,
                    column: this.pos.column,
                    message: format!(
                        "duplicate domain '{}' in config file (also in {}:{}:{}); \
                         to merge the files of one domain, set MERGE_DOMAIN_CONFIG=true",
                        domain.name, first.file, first.pos.line, first.pos.column
                    ),
                });
            }
        }
    }
    Ok(cfg)
}

/// Adds `more`'s top-level descriptors to `into`, as upstream patches a domain: a `key_value`
/// already there is refused, at its place in the later file.
fn merge(into: &mut Domain, mut more: Domain) -> Result<(), ConfigError> {
    for d in &more.descriptors {
        let composite = d.composite();
        let Some(i) = into
            .descriptors
            .iter()
            .position(|x| x.composite() == composite)
        else {
            continue;
        };
        let first = into
            .origins
            .iter()
            .find(|o| o.descriptors.contains(&i))
            .map_or(String::new(), |o| o.file.clone());
        return Err(ConfigError {
            origin: more.origins[0].file.clone(),
            line: d.pos.line,
            column: d.pos.column,
            message: format!(
                "duplicate descriptor composite key '{}' (also in {first}:{}:{})",
                d.full_key, into.descriptors[i].pos.line, into.descriptors[i].pos.column
            ),
        });
    }
    let base = into.descriptors.len();
    for o in &mut more.origins {
        o.descriptors = base + o.descriptors.start..base + o.descriptors.end;
    }
    into.origins.extend(more.origins);
    into.descriptors.extend(more.descriptors);
    Ok(())
}

/// Parses one file's text (one domain).
pub fn parse(origin: &str, text: &str) -> Result<EnvoyConfig, ConfigError> {
    parse_many([(origin, text)])
}
