//! Validation of the rules as data, shared by the TOML front end and the builder API.
//!
//! [`validate`] checks everything a store build or a check could trip on and names the field
//! at fault with a [`Loc`]; the TOML front end (`parse`) turns it into a line and column, the
//! builder into a field path (`rule \`api\`, limits[1].window`). The same limit compilation
//! ([`compile_limits`]: soft scaling, the elastic pool) and override key resolution
//! (`rules::keys::resolve`) are used by the engine, so what validates is what runs.

mod modes;

pub(crate) use modes::{compile_limits, effective};

use super::keys::{resolve, KeyValues};
use super::limits::LimitsClass;
use super::model::{
    Backend, BackendPolicy, KeyClass, Mode, RedisBackend, RedisNodes, Rule, Shedding, MAX_CAPACITY,
    MAX_OVERRIDES, MAX_RULES,
};
use super::request::{method_code, Priority, METHODS};
use crate::keyed::key::MAX_KEY_LEN;
use std::collections::HashMap;
use std::time::Duration;

/// Where in the rules a problem is: a file front end maps it to a line, the builder to a path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Loc {
    Top,
    Settings(&'static str),
    Load(&'static str),
    Shedding(&'static str),
    /// `[backend]` and a field of it (`""`: the table).
    Backend(&'static str),
    /// The `k`-th URL of `[backend] redis_cluster`.
    BackendUrl(usize),
    Rule(usize, Rf),
    /// The `c`-th limits class (`[limits.NAME]`).
    Class(usize, Cf),
}

/// A field of a limits class.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Cf {
    Table,
    Key,
    Algorithm,
    Window,
    File,
    Capacity,
    Redis,
    /// A field of the `j`-th plan (`""`: the plan).
    Plan(usize, &'static str),
}

/// A field of rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Rf {
    Table,
    Name,
    Key,
    Mode,
    Percent,
    Below,
    Cost,
    Capacity,
    WhenFull,
    Route(usize),
    Method(usize),
    Priority(usize),
    Limits,
    Limit(usize, &'static str),
    Override(usize, Of),
    LimitsFrom,
}

/// A field of an override.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Of {
    Table,
    Key,
    Limits,
    Limit(usize, &'static str),
}

impl Loc {
    /// The enclosing location, for fields that were not written (defaults).
    pub(crate) fn parent(self) -> Option<Loc> {
        Some(match self {
            Loc::Top => return None,
            Loc::Settings("") | Loc::Load("") | Loc::Shedding("") | Loc::Backend("") => Loc::Top,
            Loc::Backend(_) => Loc::Backend(""),
            Loc::BackendUrl(_) => Loc::Backend("redis"),
            Loc::Settings(_) => Loc::Settings(""),
            Loc::Load(_) => Loc::Load(""),
            Loc::Shedding(f) => match f.split_once('.') {
                Some((p, _)) => Loc::Shedding(p),
                None => Loc::Shedding(""),
            },
            Loc::Rule(_, Rf::Table) => Loc::Top,
            Loc::Rule(i, Rf::Limit(_, "")) => Loc::Rule(i, Rf::Limits),
            Loc::Rule(i, Rf::Limit(j, _)) => Loc::Rule(i, Rf::Limit(j, "")),
            Loc::Rule(i, Rf::Override(_, Of::Table)) => Loc::Rule(i, Rf::Table),
            Loc::Rule(i, Rf::Override(o, Of::Limit(_, ""))) => {
                Loc::Rule(i, Rf::Override(o, Of::Limits))
            }
            Loc::Rule(i, Rf::Override(o, Of::Limit(j, _))) => {
                Loc::Rule(i, Rf::Override(o, Of::Limit(j, "")))
            }
            Loc::Rule(i, Rf::Override(o, _)) => Loc::Rule(i, Rf::Override(o, Of::Table)),
            Loc::Rule(i, _) => Loc::Rule(i, Rf::Table),
            Loc::Class(_, Cf::Table) => Loc::Top,
            Loc::Class(c, Cf::Plan(j, f)) if !f.is_empty() => Loc::Class(c, Cf::Plan(j, "")),
            Loc::Class(c, _) => Loc::Class(c, Cf::Table),
        })
    }

    /// A path for messages about rules built in code.
    pub(crate) fn describe(self, rules: &[Rule]) -> String {
        let rule = |i: usize| match rules.get(i) {
            Some(r) => format!("rule `{}`", r.name),
            None => format!("rule {i}"),
        };
        let lim = |j: usize, f: &str| {
            if f.is_empty() {
                format!("limits[{j}]")
            } else {
                format!("limits[{j}].{f}")
            }
        };
        match self {
            Loc::Top => "rules".into(),
            Loc::Settings(f) => format!("settings {f}"),
            Loc::Load(f) => format!("load {f}"),
            Loc::Shedding(f) => format!("shedding {f}"),
            Loc::Backend(f) => format!("backend {f}"),
            Loc::BackendUrl(k) => format!("backend redis_cluster[{k}]"),
            Loc::Class(c, f) => {
                let what = match f {
                    Cf::Table => String::new(),
                    Cf::Key => " key".into(),
                    Cf::Algorithm => " algorithm".into(),
                    Cf::Window => " window".into(),
                    Cf::File => " file".into(),
                    Cf::Capacity => " capacity".into(),
                    Cf::Redis => " redis".into(),
                    Cf::Plan(j, "") => format!(" plan #{}", j + 1),
                    Cf::Plan(j, f) => format!(" plan #{} {f}", j + 1),
                };
                format!("limits class #{}{what}", c + 1)
            }
            Loc::Rule(i, f) => {
                let what = match f {
                    Rf::Table => String::new(),
                    Rf::Name => "name".into(),
                    Rf::Key => "key".into(),
                    Rf::Mode => "mode".into(),
                    Rf::Percent => "percent".into(),
                    Rf::Below => "elastic_below".into(),
                    Rf::Cost => "cost".into(),
                    Rf::Capacity => "capacity".into(),
                    Rf::WhenFull => "when_full".into(),
                    Rf::Route(k) => format!("route_prefix[{k}]"),
                    Rf::Method(k) => format!("method[{k}]"),
                    Rf::Priority(k) => format!("priority[{k}]"),
                    Rf::Limits => "limits".into(),
                    Rf::Limit(j, f) => lim(j, f),
                    Rf::Override(o, Of::Table | Of::Key) => format!("override[{o}]"),
                    Rf::Override(o, Of::Limits) => format!("override[{o}].limits"),
                    Rf::Override(o, Of::Limit(j, f)) => format!("override[{o}].{}", lim(j, f)),
                    Rf::LimitsFrom => "limits_from".into(),
                };
                if what.is_empty() {
                    rule(i)
                } else {
                    format!("{}, {what}", rule(i))
                }
            }
        }
    }
}

fn unit(x: f64) -> bool {
    x.is_finite() && (0.0..=1.0).contains(&x)
}

/// Checks everything a store build or a check could trip on, naming the field at fault.
pub(crate) fn validate(r: &super::Rules) -> Result<(), (Loc, String)> {
    let s = &r.settings;
    if s.capacity == 0 || s.capacity > MAX_CAPACITY {
        return Err((
            Loc::Settings("capacity"),
            format!(
                "capacity {} is out of range: give 1..={MAX_CAPACITY} keys per rule",
                s.capacity
            ),
        ));
    }
    if r.load.max_in_flight == Some(0) {
        return Err((
            Loc::Load("max_in_flight"),
            "max_in_flight must be at least 1 (or remove it to use reported utilization only)"
                .into(),
        ));
    }
    if r.load.sample > Duration::from_secs(1) {
        return Err((Loc::Load("sample"), "sample is longer than 1s: load shedding would react too late; use e.g. \"1ms\" or \"0s\"".into()));
    }
    if let Some(sh) = &r.shedding {
        validate_shedding(sh)?;
    }
    if let Backend::Redis(b) = &r.backend {
        validate_backend(b)?;
    }
    if r.rules.len() > MAX_RULES {
        return Err((
            Loc::Rule(MAX_RULES, Rf::Table),
            format!("{} rules; at most {MAX_RULES}", r.rules.len()),
        ));
    }
    for (c, class) in r.classes.iter().enumerate() {
        validate_class(r, c, class)?;
    }
    for (i, rule) in r.rules.iter().enumerate() {
        validate_rule(r, i, rule)?;
    }
    Ok(())
}

/// A class whose entries are in Redis: keyed by customer ids (the same id in every process of
/// a fleet; other keys are hashed under each process's seed), and not also in a file.
fn validate_redis_class(class: &LimitsClass) -> Result<(), String> {
    let url = class.redis.as_deref().unwrap_or("");
    if !(url.starts_with("redis://") || url.starts_with("rediss://") || url.starts_with("unix://"))
    {
        return Err(format!(
            "`{url}` is not a Redis URL: give e.g. redis = \"redis://127.0.0.1:6379\""
        ));
    }
    if class.file.is_some() {
        return Err(
            "a class's entries are in a file or in Redis, not both: remove `file` \
                    (`turnstile limits import FILE` puts a file's entries in Redis)"
                .into(),
        );
    }
    if class.key != KeyClass::customer() {
        return Err(format!(
            "a class in Redis is keyed by customer ids, the same in every process; {} keys \
             are hashed under each process's seed",
            class.key
        ));
    }
    Ok(())
}

/// A limits class: a packed algorithm, its window if it counts in windows, one key part, and
/// plans of its own algorithm and window.
fn validate_class(r: &super::Rules, c: usize, class: &LimitsClass) -> Result<(), (Loc, String)> {
    let at = |f: Cf| Loc::Class(c, f);
    let n = &class.name;
    if n.is_empty() || n.len() > 128 || n.chars().any(|ch| ch.is_control() || ch == '/') {
        return Err((
            at(Cf::Table),
            "a limits class name is 1..=128 printable characters, without `/`".into(),
        ));
    }
    if r.classes[..c].iter().any(|o| o.name == *n) {
        return Err((
            at(Cf::Table),
            format!("limits class `{n}` is defined twice"),
        ));
    }
    if class.key.part_count() != 1 {
        return Err((at(Cf::Key), format!("a limits class is keyed by one part (customer, ip, api_key, route or method), not {}", class.key)));
    }
    class.check().map_err(|e| {
        let f = match e.setting {
            Some("window") => Cf::Window,
            Some("capacity") => Cf::Capacity,
            _ => Cf::Algorithm,
        };
        (at(f), e.message)
    })?;
    if class.redis.is_some() {
        validate_redis_class(class).map_err(|m| (at(Cf::Redis), m))?;
    }
    for (j, (plan, spec)) in class.plans.iter().enumerate() {
        if plan.is_empty()
            || !plan.starts_with(|ch: char| ch.is_ascii_alphabetic() || ch == '_')
            || !plan
                .chars()
                .all(|ch| ch.is_ascii_alphanumeric() || ch == '_' || ch == '-')
        {
            return Err((
                at(Cf::Plan(j, "")),
                format!("`{plan}` is not a plan name: a letter, then letters, digits, _ and -"),
            ));
        }
        class.build(spec).map_err(|e| {
            let f = e.setting.filter(|f| *f == "window").unwrap_or("");
            (at(Cf::Plan(j, f)), format!("plan `{plan}`: {}", e.message))
        })?;
    }
    Ok(())
}

/// A rule's `limits_from`: a class of its key, with its one limit of the class's algorithm and
/// window (its keys' own limits are decided over its store), hard or shadow, in memory.
fn validate_limits_from(
    r: &super::Rules,
    i: usize,
    rule: &Rule,
    name: &str,
) -> Result<(), (Loc, String)> {
    let at = Loc::Rule(i, Rf::LimitsFrom);
    let Some(class) = r.classes.iter().find(|c| c.name == name) else {
        let names: Vec<&str> = r.classes.iter().map(|c| c.name.as_str()).collect();
        return Err((
            at,
            format!(
                "no limits class `{name}`; define it as [limits.{name}]{}",
                if names.is_empty() {
                    String::new()
                } else {
                    format!(" (defined: {})", names.join(", "))
                }
            ),
        ));
    };
    if class.key != rule.key {
        return Err((at, format!("class `{name}` holds {} keys, and this rule is keyed by {}: give them the same key", class.key, rule.key)));
    }
    if !matches!(rule.mode, Mode::Hard | Mode::Shadow) {
        return Err((at, "keys' own limits apply to hard and shadow rules; a soft or elastic rule scales its own limits, which a key's own limit does not have".into()));
    }
    if !matches!(r.backend, Backend::Memory) {
        return Err((at, "keys' own limits are decided in memory; with a Redis [backend], keep them in the rule's overrides for now".into()));
    }
    let [spec] = rule.limits.as_slice() else {
        return Err((Loc::Rule(i, Rf::Limits), format!("a rule with limits_from has one limit, of class `{name}`'s algorithm: the default for keys without an entry")));
    };
    class.build(spec).map_err(|m| {
        (
            Loc::Rule(i, Rf::Limit(0, "")),
            format!("the rule's limit is the default of class `{name}`: {m}"),
        )
    })?;
    Ok(())
}

/// Most URLs in `[backend] redis_cluster`.
const MAX_CLUSTER_URLS: usize = 64;

/// Why `url` is not a Redis URL this build can connect to, if it is not one.
fn bad_url(url: &str, cluster: bool) -> Option<String> {
    let shown = super::model::redact_url(url);
    let how = "write redis://HOST:PORT, e.g. redis://127.0.0.1:6379 (with a password: redis://:PASSWORD@HOST:PORT; TLS and unix sockets are not built in)";
    let Some(rest) = url.strip_prefix("redis://") else {
        return Some(format!("`{shown}` is not a Redis URL: {how}"));
    };
    if url.len() > 2048 || url.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Some(format!(
            "`{shown}` holds spaces or control characters, or is longer than 2048 bytes: {how}"
        ));
    }
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    // An IPv6 host is bracketed: [::1]:6379.
    let (host, port) = match host_port.strip_prefix('[') {
        Some(v6) => match v6.split_once(']') {
            Some((h, "")) => (h, None),
            Some((h, p)) => (h, Some(p.strip_prefix(':').unwrap_or("x"))),
            None => ("", None),
        },
        None => match host_port.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (host_port, None),
        },
    };
    if host.is_empty() {
        return Some(format!("`{shown}` names no host: {how}"));
    }
    if let Some(p) = port {
        if !matches!(p.parse::<u16>(), Ok(1..)) {
            return Some(format!("`{shown}`: the port must be 1..=65535"));
        }
    }
    let db = path.trim_start_matches('/');
    if !db.is_empty() && db.parse::<u16>().is_err() {
        return Some(format!(
            "`{shown}`: the path is a database number (e.g. redis://127.0.0.1:6379/0), got `{db}`"
        ));
    }
    if cluster && !db.is_empty() && db != "0" {
        return Some(format!(
            "`{shown}`: a Redis Cluster has only database 0; drop `/{db}`"
        ));
    }
    None
}

fn validate_backend(b: &RedisBackend) -> Result<(), (Loc, String)> {
    match &b.nodes {
        RedisNodes::Single(u) => {
            if let Some(m) = bad_url(u, false) {
                return Err((Loc::Backend("redis"), m));
            }
        }
        RedisNodes::Cluster(v) => {
            if v.is_empty() || v.len() > MAX_CLUSTER_URLS {
                return Err((Loc::Backend("redis"), format!("redis_cluster lists {} URLs; give 1..={MAX_CLUSTER_URLS} nodes of the cluster (the others are discovered)", v.len())));
            }
            for (k, u) in v.iter().enumerate() {
                if let Some(m) = bad_url(u, true) {
                    return Err((Loc::BackendUrl(k), m));
                }
            }
        }
    }
    if b.timeout < Duration::from_millis(1) || b.timeout > Duration::from_secs(60) {
        return Err((
            Loc::Backend("timeout"),
            format!("timeout {:?} is out of range: give 1ms..=60s (a check waits this long for Redis, then the policy answers)", b.timeout),
        ));
    }
    if let BackendPolicy::Insurance { expected_nodes } = b.policy {
        if !(1..=100_000).contains(&expected_nodes) {
            return Err((
                Loc::Backend("expected_nodes"),
                format!("expected_nodes = {expected_nodes}: give how many processes share the limits, 1..=100000"),
            ));
        }
    }
    if b.prefix.len() > 64
        || b.prefix.contains(['{', '}'])
        || b.prefix
            .chars()
            .any(|c| c.is_control() || c.is_whitespace())
    {
        return Err((Loc::Backend("prefix"), format!("prefix `{}` must be at most 64 bytes, without spaces, control characters or braces (each key's id is its {{hash tag}})", b.prefix.escape_debug())));
    }
    Ok(())
}

fn validate_shedding(sh: &Shedding) -> Result<(), (Loc, String)> {
    const ON: [&str; 4] = ["critical.on", "post.on", "get.on", "test.on"];
    const OFF: [&str; 4] = ["critical.off", "post.off", "get.off", "test.off"];
    if !(0.0..1.0).contains(&sh.critical_reserve) {
        return Err((
            Loc::Shedding("critical_reserve"),
            format!(
                "critical_reserve {} must be in 0 ≤ x < 1 (a share of capacity, e.g. 0.2)",
                sh.critical_reserve
            ),
        ));
    }
    if sh.retry_after.is_zero() || sh.retry_after > Duration::from_secs(3600) {
        return Err((
            Loc::Shedding("retry_after"),
            "retry_after must be in 1ns..=1h, e.g. \"1s\"".into(),
        ));
    }
    let mut prev: Option<(usize, f64)> = None;
    // Least important first: each must start shedding no later than the next more important one.
    for i in (0..4).rev() {
        let Some(t) = sh.thresholds[i] else { continue };
        let p = Priority::ALL[i];
        if !t.on.is_finite() || t.on <= 0.0 || t.on > 10.0 {
            return Err((Loc::Shedding(ON[i]), format!("{}: on = {} must be in 0 < on ≤ 10 (a load; 1.0 = max_in_flight or full utilization)", p.name(), t.on)));
        }
        if !t.off.is_finite() || t.off < 0.0 || t.off >= t.on {
            return Err((Loc::Shedding(OFF[i]), format!("{}: off = {} must be ≥ 0 and below on = {}: shedding stops under `off`, and the gap keeps it from flapping", p.name(), t.off, t.on)));
        }
        if let Some((j, on)) = prev {
            if t.on < on {
                return Err((Loc::Shedding(ON[i]), format!("{} would be shed before {} (on = {} < {}): lower priorities must be shed first; raise {}.on to at least {}", p.name(), Priority::ALL[j].name(), t.on, on, p.name(), on)));
            }
        }
        prev = Some((i, t.on));
    }
    Ok(())
}

fn validate_rule(r: &super::Rules, i: usize, rule: &Rule) -> Result<(), (Loc, String)> {
    let at = |f: Rf| Loc::Rule(i, f);
    let n = &rule.name;
    if n.is_empty() || n.len() > 128 || n.chars().any(char::is_control) {
        return Err((
            at(Rf::Name),
            "a rule name is 1..=128 printable characters".into(),
        ));
    }
    if let Some(j) = r.rules[..i].iter().position(|o| o.name == *n) {
        return Err((at(Rf::Name), format!("rule name `{n}` is already used by rule #{}; names must be unique (reload keeps each rule's state by its name)", j + 1)));
    }
    let k = rule.key;
    if k.ipv4_prefix() > 32 || k.ipv6_prefix() > 128 {
        return Err((
            at(Rf::Key),
            format!(
                "IP prefixes are /0../32 for IPv4 and /0../128 for IPv6, got /{}/{}",
                k.ipv4_prefix(),
                k.ipv6_prefix()
            ),
        ));
    }
    validate_when(i, rule)?;
    match rule.mode {
        Mode::Soft { percent } | Mode::Elastic { percent, .. }
            if !(1..=1000).contains(&percent) =>
        {
            return Err((
                at(Rf::Percent),
                format!("{percent} % is out of range: give 1..=1000"),
            ));
        }
        Mode::Elastic { below, .. } if !unit(below) || below == 0.0 => {
            return Err((
                at(Rf::Below),
                format!("elastic_below = {below} must be a load in 0 < x ≤ 1, e.g. 0.7"),
            ));
        }
        _ => {}
    }
    if rule.cost == 0 {
        return Err((at(Rf::Cost), "cost must be at least 1".into()));
    }
    if let Some(c) = rule.capacity {
        if c == 0 || c > MAX_CAPACITY {
            return Err((
                at(Rf::Capacity),
                format!("capacity {c} is out of range: give 1..={MAX_CAPACITY} keys"),
            ));
        }
    }
    compile_limits(
        &rule.limits,
        rule.mode,
        |j, f| at(Rf::Limit(j, f)),
        at(Rf::Limits),
    )?;
    if let Some(c) = &rule.limits_from {
        validate_limits_from(r, i, rule, c)?;
    }
    if rule.overrides.len() > MAX_OVERRIDES {
        return Err((
            at(Rf::Table),
            format!(
                "{} overrides; at most {MAX_OVERRIDES} per rule",
                rule.overrides.len()
            ),
        ));
    }
    validate_overrides(i, rule)
}

/// Rule `i`'s `when`: route prefixes of printable text, known methods.
fn validate_when(i: usize, rule: &Rule) -> Result<(), (Loc, String)> {
    let at = |f: Rf| Loc::Rule(i, f);
    for (j, p) in rule.when.route_prefixes.iter().enumerate() {
        if p.is_empty() || p.len() > MAX_KEY_LEN || p.chars().any(char::is_control) {
            return Err((at(Rf::Route(j)), format!("a route prefix is 1..={MAX_KEY_LEN} bytes of printable text (to match every route, leave route_prefix out)")));
        }
    }
    for (j, m) in rule.when.methods.iter().enumerate() {
        if method_code(m) == 0 {
            return Err((
                at(Rf::Method(j)),
                format!(
                    "unknown method `{m}`; expected one of {}",
                    METHODS.join(", ")
                ),
            ));
        }
    }
    Ok(())
}

/// Rule `i`'s overrides: keys of its key class, each overridden once, limits that compile.
fn validate_overrides(i: usize, rule: &Rule) -> Result<(), (Loc, String)> {
    let at = |f: Rf| Loc::Rule(i, f);
    let k = rule.key;
    let mut seen: HashMap<KeyValues, usize> = HashMap::new();
    for (o, ov) in rule.overrides.iter().enumerate() {
        let of = |f: Of| at(Rf::Override(o, f));
        let v = resolve(k, &ov.key).map_err(|m| (of(Of::Key), m))?;
        if let Some(first) = seen.get(&v) {
            return Err((of(Of::Key), format!("this key is already overridden by override {} of this rule (after grouping); keep one", first + 1)));
        }
        seen.insert(v, o);
        compile_limits(
            &ov.limits,
            rule.mode,
            |j, f| of(Of::Limit(j, f)),
            of(Of::Limits),
        )?;
    }
    Ok(())
}
