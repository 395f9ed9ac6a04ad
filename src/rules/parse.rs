//! The TOML front end: text → [`Rules`], every error with a line and column.
//!
//! Three stages, each reporting at the right place:
//!
//! 1. `toml` + serde into the `Raw*` structs (`raw`), whose fields are `Spanned`. Syntax errors,
//!    unknown or missing fields, wrong types, bad durations and unknown names (algorithms,
//!    priorities, policies) fail here, at the span `toml` reports.
//! 2. Conversion to the model, recording each field's span under its [`Loc`]; conflicts between
//!    fields (`limit` and `capacity` both given, `soft_percent` on a hard rule) fail here.
//! 3. [`validate`](super::validate::validate) on the model, the same code the builder API runs;
//!    its [`Loc`] is looked up in the recorded spans (falling back to the enclosing table).

use super::limits::LimitsClass;
use super::model::{
    Backend, BackendLeaseMode, BackendLeases, BackendPolicy, KeyClass, KeyPart, LoadSettings,
    Match, Mode, Override, OverrideKey, RedisBackend, RedisNodes, Rule, Settings, Shedding,
    Threshold,
};
pub use super::raw::{parse_duration, DurationError};
use super::raw::{
    LeaseModeName, LeasesName, List, ModeName, Named, PolicyName, RawBackend, RawClass, RawFile,
    RawLimit, RawMatch, RawOverride, RawRule, RawShedding, S,
};
use super::validate::{Cf, Loc, Of, Rf};
use super::{Rules, RulesError};
use crate::algo::{Algorithm, LimitSpec};
use std::ops::Range;
use std::time::Duration;
use toml::Spanned;

/// 1-based line and column (in characters) of byte offset `off`.
pub(crate) fn line_col(text: &str, off: usize) -> (usize, usize) {
    let b = &text.as_bytes()[..off.min(text.len())];
    let line = 1 + b.iter().filter(|&&c| c == b'\n').count();
    let start = b.iter().rposition(|&c| c == b'\n').map_or(0, |i| i + 1);
    let col = 1 + b[start..].iter().filter(|&&c| c & 0xC0 != 0x80).count();
    (line, col)
}

/// A hint appended to `toml`'s own messages.
fn hint(msg: &str) -> &'static str {
    if msg.starts_with("unknown field") {
        "; remove it or fix its spelling (docs/rules.md lists every field)"
    } else if msg.contains("missing field `key`") {
        "; add e.g. key = \"customer\" (or ip, ip/24, api_key, route, method, global, customer+route)"
    } else if msg.contains("missing field `name`") {
        "; add name = \"...\", unique in the file"
    } else if msg.contains("missing field `on`") || msg.contains("missing field `off`") {
        "; a threshold is { on = 0.8, off = 0.7 }: shed from `on`, stop below `off`"
    } else if msg.contains("expected u64") || msg.contains("expected u32") {
        "; give a whole number, not negative and without a fraction"
    } else if msg.contains("expected a sequence") {
        "; rules and overrides are arrays of tables: write [[rule]] and [[rule.override]] with double brackets, and limits = [ { ... } ]"
    } else if msg.contains("duplicate key") {
        "; each key may appear once per table"
    } else {
        ""
    }
}

struct Cx<'t> {
    text: &'t str,
    origin: &'t str,
    index: Vec<(Loc, usize, usize)>,
}

impl Cx<'_> {
    fn mark(&mut self, loc: Loc, span: Range<usize>) {
        let (l, c) = line_col(self.text, span.start);
        self.index.push((loc, l, c));
    }

    fn err(&self, span: Range<usize>, message: impl Into<String>) -> RulesError {
        let (line, column) = line_col(self.text, span.start);
        RulesError {
            origin: self.origin.to_string(),
            line,
            column,
            message: message.into(),
        }
    }

    fn list(&mut self, l: Spanned<List>, at: impl Fn(usize) -> Loc) -> Vec<(String, Range<usize>)> {
        let span = l.span();
        let items = match l.into_inner() {
            List::One(s) => vec![(s, span)],
            List::Many(v) => v
                .into_iter()
                .map(|s| (s.span(), s.into_inner()))
                .map(|(sp, s)| (s, sp))
                .collect(),
        };
        for (k, (_, sp)) in items.iter().enumerate() {
            self.mark(at(k), sp.clone());
        }
        items
    }

    fn file(&mut self, raw: RawFile) -> Result<Rules, RulesError> {
        let mut out = Rules::default();
        if let Some(s) = raw.settings {
            self.mark(Loc::Settings(""), s.span());
            let s = s.into_inner();
            if let Some(c) = s.capacity {
                self.mark(Loc::Settings("capacity"), c.span());
                out.settings.capacity = c.into_inner();
            }
            if let Some(w) = s.when_full {
                self.mark(Loc::Settings("when_full"), w.span());
                out.settings.when_full = w.into_inner().0;
            }
        }
        if let Some(l) = raw.load {
            self.mark(Loc::Load(""), l.span());
            let l = l.into_inner();
            if let Some(m) = l.max_in_flight {
                self.mark(Loc::Load("max_in_flight"), m.span());
                out.load.max_in_flight = Some(m.into_inner());
            }
            if let Some(s) = l.sample {
                self.mark(Loc::Load("sample"), s.span());
                out.load.sample = s.into_inner().0;
            }
        }
        if let Some(s) = raw.shedding {
            out.shedding = Some(self.shedding(s));
        }
        if let Some(b) = raw.backend {
            out.backend = self.backend(b)?;
        }
        for (i, r) in raw.rules.into_iter().enumerate() {
            let r = self.rule(i, r)?;
            out.rules.push(r);
        }
        for (c, (name, raw)) in raw.limits.into_iter().enumerate() {
            out.classes.push(self.class(c, name, raw)?);
        }
        Ok(out)
    }

    fn shedding(&mut self, s: Spanned<RawShedding>) -> Shedding {
        self.mark(Loc::Shedding(""), s.span());
        let s = s.into_inner();
        let mut out = Shedding::default();
        if let Some(r) = s.retry_after {
            self.mark(Loc::Shedding("retry_after"), r.span());
            out.retry_after = r.into_inner().0;
        }
        if let Some(r) = s.critical_reserve {
            self.mark(Loc::Shedding("critical_reserve"), r.span());
            out.critical_reserve = r.into_inner();
        }
        const NAMES: [[&str; 3]; 4] = [
            ["critical", "critical.on", "critical.off"],
            ["post", "post.on", "post.off"],
            ["get", "get.on", "get.off"],
            ["test", "test.on", "test.off"],
        ];
        for (i, t) in [s.critical, s.post, s.get, s.test].into_iter().enumerate() {
            let Some(t) = t else { continue };
            self.mark(Loc::Shedding(NAMES[i][0]), t.span());
            let t = t.into_inner();
            self.mark(Loc::Shedding(NAMES[i][1]), t.on.span());
            self.mark(Loc::Shedding(NAMES[i][2]), t.off.span());
            out.thresholds[i] = Some(Threshold {
                on: t.on.into_inner(),
                off: t.off.into_inner(),
            });
        }
        out
    }

    fn key_class(&mut self, key: Spanned<List>, loc: Loc) -> Result<KeyClass, RulesError> {
        let span = key.span();
        self.mark(loc, span.clone());
        let words: Vec<String> = match key.into_inner() {
            List::One(s) => s.split('+').map(|w| w.trim().to_string()).collect(),
            List::Many(v) => v.into_iter().map(|s| s.into_inner()).collect(),
        };
        let mut class = KeyClass::global();
        let mut n = 0;
        for w in &words {
            if w == "global" {
                if words.len() > 1 {
                    return Err(self.err(
                        span,
                        "`global` stands alone: it means one key for every matching request",
                    ));
                }
                return Ok(class);
            }
            let mut it = w.split('/');
            let name = it.next().unwrap_or("");
            let Some(part) = KeyPart::from_name(name) else {
                return Err(self.err(span, format!("unknown key part `{w}`; expected customer, ip (or ip/24, ip/24/48: IPv4 and IPv6 grouping prefixes), api_key, route, method, global, or a composite such as customer+route")));
            };
            if class.has(part) {
                return Err(self.err(span, format!("`{name}` appears twice in the key")));
            }
            let prefixes: Vec<&str> = it.collect();
            if !prefixes.is_empty() {
                if part != KeyPart::Ip || prefixes.len() > 2 {
                    return Err(self.err(span, format!("`{w}`: only ip takes prefixes, as ip/V4 or ip/V4/V6, e.g. ip/24 or ip/24/48")));
                }
                let p = |s: &str, max: u8| s.parse::<u8>().ok().filter(|v| *v <= max);
                let v4 = p(prefixes[0], 32);
                let v6 = prefixes.get(1).map_or(Some(64), |s| p(s, 128));
                match (v4, v6) {
                    (Some(a), Some(b)) => class = class.ip_prefix(a, b),
                    _ => return Err(self.err(span, format!("`{w}`: IPv4 prefixes are /0../32 and IPv6 prefixes /0../128, e.g. ip/24 or ip/24/48"))),
                }
            }
            class = class.and(part);
            n += 1;
        }
        if n == 0 {
            return Err(self.err(span, "empty key: give e.g. key = \"customer\""));
        }
        Ok(class)
    }

    fn limits(
        &mut self,
        raw: S<Vec<Spanned<RawLimit>>>,
        table: Range<usize>,
        at: impl Fn(usize, &'static str) -> Loc,
        whole: Loc,
    ) -> Result<Vec<LimitSpec>, RulesError> {
        let Some(raw) = raw else {
            return Err(self.err(table, "no limits: add e.g. limits = [{ algorithm = \"sliding_window\", limit = 100, window = \"1m\" }]"));
        };
        self.mark(whole, raw.span());
        let mut out = Vec::new();
        for (j, l) in raw.into_inner().into_iter().enumerate() {
            out.push(self.limit(l, |f| at(j, f), Algorithm::SlidingWindow, None)?);
        }
        Ok(out)
    }

    /// One limit; `algorithm` if it names none, `window` if it gives none.
    fn limit(
        &mut self,
        l: Spanned<RawLimit>,
        at: impl Fn(&'static str) -> Loc,
        algorithm: Algorithm,
        window: Option<Duration>,
    ) -> Result<LimitSpec, RulesError> {
        let span = l.span();
        self.mark(at(""), span.clone());
        let l = l.into_inner();
        let algorithm = match l.algorithm {
            Some(a) => {
                self.mark(at("algorithm"), a.span());
                a.into_inner().0
            }
            None => algorithm,
        };
        let limit = match (l.limit, l.capacity) {
            (Some(a), None) | (None, Some(a)) => {
                self.mark(at("limit"), a.span());
                a.into_inner()
            }
            (Some(_), Some(c)) => return Err(self.err(c.span(), "`capacity` is another name for `limit` (the notes' config store): give one of them")),
            (None, None) => return Err(self.err(span, "this limit has no `limit`: add e.g. limit = 100")),
        };
        let window = match (l.window, l.time_window_sec, window) {
            (Some(w), None, _) => {
                self.mark(at("window"), w.span());
                w.into_inner().0
            }
            (None, Some(t), _) => {
                self.mark(at("window"), t.span());
                Duration::from_secs(t.into_inner())
            }
            (Some(_), Some(t), _) => return Err(self.err(t.span(), "`time_window_sec` is another name for `window` (the notes' config store): give one of them")),
            (None, None, Some(w)) => w,
            (None, None, None) => return Err(self.err(span, "this limit has no `window`: add e.g. window = \"1s\"")),
        };
        let mut spec = LimitSpec::new(algorithm, limit, window);
        let opt = |v: S<u64>, f: &'static str, cx: &mut Self| {
            v.map(|v| {
                cx.mark(at(f), v.span());
                v.into_inner()
            })
        };
        spec.burst = opt(l.burst, "burst", self);
        spec.buckets = opt(l.buckets, "buckets", self);
        spec.delay = opt(l.delay, "delay", self);
        if let Some(c) = l.count_denied {
            self.mark(at("count_denied"), c.span());
            spec.count_denied = c.into_inner();
        }
        Ok(spec)
    }

    /// `[limits.NAME]`, the `c`-th class.
    fn class(
        &mut self,
        c: usize,
        name: String,
        raw: Spanned<RawClass>,
    ) -> Result<LimitsClass, RulesError> {
        let at = |f: Cf| Loc::Class(c, f);
        self.mark(at(Cf::Table), raw.span());
        let raw = raw.into_inner();
        let key = self.key_class(raw.key, at(Cf::Key))?;
        self.mark(at(Cf::Algorithm), raw.algorithm.span());
        let algorithm = raw.algorithm.into_inner().0;
        let mut class = LimitsClass::new(name, key, algorithm);
        if let Some(w) = raw.window {
            self.mark(at(Cf::Window), w.span());
            class.window = Some(w.into_inner().0);
        }
        if let Some(f) = raw.file {
            self.mark(at(Cf::File), f.span());
            class.file = Some(f.into_inner().into());
        }
        if let Some(n) = raw.capacity {
            self.mark(at(Cf::Capacity), n.span());
            class.capacity = n.into_inner();
        }
        if let Some(u) = raw.redis {
            self.mark(at(Cf::Redis), u.span());
            class.redis = Some(u.into_inner());
        }
        for (j, (plan, l)) in raw.plans.into_iter().enumerate() {
            let spec = self.limit(l, |f| at(Cf::Plan(j, f)), algorithm, class.window)?;
            class.plans.push((plan, spec));
        }
        Ok(class)
    }

    fn rule(&mut self, i: usize, r: Spanned<RawRule>) -> Result<Rule, RulesError> {
        let table = r.span();
        self.mark(Loc::Rule(i, Rf::Table), table.clone());
        let r = r.into_inner();
        self.mark(Loc::Rule(i, Rf::Name), r.name.span());
        let key = self.key_class(r.key, Loc::Rule(i, Rf::Key))?;
        let mut rule = Rule::new(r.name.into_inner(), key);
        if let Some(m) = r.when {
            rule.when = self.when(i, m.into_inner())?;
        }
        let mode_span = r.mode.as_ref().map(|m| m.span());
        let mode = r.mode.map_or(ModeName::Hard, |m| m.into_inner().0);
        if let Some(s) = mode_span.clone() {
            self.mark(Loc::Rule(i, Rf::Mode), s.clone());
            self.mark(Loc::Rule(i, Rf::Percent), s);
        }
        let wrong = |cx: &Self, s: Range<usize>, field: &str, mode: &str| {
            Err(cx.err(
                s,
                format!(
                    "`{field}` applies to mode = \"{mode}\"; remove it, or set mode = \"{mode}\""
                ),
            ))
        };
        if let (Some(p), false) = (&r.soft_percent, mode == ModeName::Soft) {
            return wrong(self, p.span(), "soft_percent", "soft");
        }
        if let (Some(p), false) = (&r.elastic_percent, mode == ModeName::Elastic) {
            return wrong(self, p.span(), "elastic_percent", "elastic");
        }
        if let (Some(p), false) = (&r.elastic_below, mode == ModeName::Elastic) {
            return wrong(self, p.span(), "elastic_below", "elastic");
        }
        let percent = |cx: &mut Self, p: S<u32>| {
            p.map_or(10, |p| {
                cx.mark(Loc::Rule(i, Rf::Percent), p.span());
                p.into_inner()
            })
        };
        rule.mode = match mode {
            ModeName::Hard => Mode::Hard,
            ModeName::Shadow => Mode::Shadow,
            ModeName::Soft => Mode::Soft {
                percent: percent(self, r.soft_percent),
            },
            ModeName::Elastic => Mode::Elastic {
                percent: percent(self, r.elastic_percent),
                below: r.elastic_below.map_or(0.7, |b| {
                    self.mark(Loc::Rule(i, Rf::Below), b.span());
                    b.into_inner()
                }),
            },
        };
        if let Some(c) = r.cost {
            self.mark(Loc::Rule(i, Rf::Cost), c.span());
            rule.cost = c.into_inner();
        }
        if let Some(c) = r.capacity {
            self.mark(Loc::Rule(i, Rf::Capacity), c.span());
            rule.capacity = Some(c.into_inner());
        }
        if let Some(w) = r.when_full {
            self.mark(Loc::Rule(i, Rf::WhenFull), w.span());
            rule.when_full = Some(w.into_inner().0);
        }
        if let Some(c) = r.limits_from {
            self.mark(Loc::Rule(i, Rf::LimitsFrom), c.span());
            rule.limits_from = Some(c.into_inner());
        }
        rule.limits = self.limits(
            r.limits,
            table.clone(),
            |j, f| Loc::Rule(i, Rf::Limit(j, f)),
            Loc::Rule(i, Rf::Limits),
        )?;
        for (o, ov) in r.overrides.into_iter().enumerate() {
            rule.overrides.push(self.override_(i, o, ov)?);
        }
        Ok(rule)
    }

    /// A rule's `when` table: route prefixes, methods, priorities.
    fn when(&mut self, i: usize, m: RawMatch) -> Result<Match, RulesError> {
        let mut when = Match::default();
        if let Some(l) = m.route_prefix {
            when.route_prefixes = self
                .list(l, |k| Loc::Rule(i, Rf::Route(k)))
                .into_iter()
                .map(|x| x.0)
                .collect();
        }
        if let Some(l) = m.method {
            when.methods = self
                .list(l, |k| Loc::Rule(i, Rf::Method(k)))
                .into_iter()
                .map(|x| x.0)
                .collect();
        }
        if let Some(l) = m.priority {
            for (p, sp) in self.list(l, |k| Loc::Rule(i, Rf::Priority(k))) {
                when.priorities.push(
                    p.parse()
                        .map_err(|e: crate::UnknownName| self.err(sp, e.to_string()))?,
                );
            }
        }
        Ok(when)
    }

    /// Override `o` of rule `i`: its key and its limits.
    fn override_(
        &mut self,
        i: usize,
        o: usize,
        ov: Spanned<RawOverride>,
    ) -> Result<Override, RulesError> {
        let ospan = ov.span();
        self.mark(Loc::Rule(i, Rf::Override(o, Of::Table)), ospan.clone());
        let ov = ov.into_inner();
        let kspan = ov.key.span();
        self.mark(Loc::Rule(i, Rf::Override(o, Of::Key)), kspan.clone());
        let key = override_key(ov.key.into_inner()).map_err(|m| self.err(kspan, m))?;
        let limits = self.limits(
            ov.limits,
            ospan,
            |j, f| Loc::Rule(i, Rf::Override(o, Of::Limit(j, f))),
            Loc::Rule(i, Rf::Override(o, Of::Limits)),
        )?;
        Ok(Override { key, limits })
    }
}

/// The recorded position of `loc`, or of its nearest enclosing location.
pub(crate) fn lookup(index: &[(Loc, usize, usize)], loc: Loc) -> Option<(usize, usize)> {
    let mut l = Some(loc);
    while let Some(x) = l {
        if let Some((_, line, col)) = index.iter().rev().find(|(k, _, _)| *k == x) {
            return Some((*line, *col));
        }
        l = x.parent();
    }
    None
}

fn scalar(v: &toml::Value) -> Option<String> {
    match v {
        toml::Value::String(s) => Some(s.clone()),
        toml::Value::Integer(n) => Some(n.to_string()),
        _ => None,
    }
}

fn override_key(v: toml::Value) -> Result<OverrideKey, String> {
    if let Some(s) = scalar(&v) {
        return Ok(OverrideKey::Text(s));
    }
    let toml::Value::Table(t) = v else {
        return Err("an override key is a string (\"241531\", \"203.0.113.0/24\", an API key), a number (a customer id), or for a composite key a table such as { customer = 42, route = \"/v1/search\" }".into());
    };
    let mut parts = Vec::new();
    for (k, v) in &t {
        let Some(p) = KeyPart::from_name(k) else {
            return Err(format!(
                "unknown key part `{k}`; expected customer, ip, api_key, route or method"
            ));
        };
        let Some(s) = scalar(v) else {
            return Err(format!("`{k}` must be a string or a number"));
        };
        parts.push((p, s));
    }
    Ok(OverrideKey::Parts(parts))
}

/// Parses and validates a rules file.
pub(crate) fn parse(text: &str, origin: &str) -> Result<Rules, RulesError> {
    let raw: RawFile = toml::from_str(text).map_err(|e| {
        let (line, column) = e.span().map_or((0, 0), |s| line_col(text, s.start));
        let msg = e.message().trim().replace('\n', " ");
        RulesError {
            origin: origin.to_string(),
            line,
            column,
            message: format!("{msg}{}", hint(&msg)),
        }
    })?;
    let mut cx = Cx {
        text,
        origin,
        index: Vec::new(),
    };
    let mut rules = cx.file(raw)?;
    rules.origin = origin.to_string();
    rules.index = cx.index;
    super::validate::validate(&rules).map_err(|(loc, msg)| rules.error_at(loc, msg))?;
    Ok(rules)
}

impl Default for Rules {
    fn default() -> Self {
        Self {
            settings: Settings::default(),
            load: LoadSettings::default(),
            shedding: None,
            backend: Backend::Memory,
            rules: Vec::new(),
            classes: Vec::new(),
            origin: "builder".into(),
            index: Vec::new(),
        }
    }
}

mod backend;

#[cfg(test)]
mod tests;
