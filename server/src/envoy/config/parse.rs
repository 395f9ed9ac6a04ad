//! One file's YAML tree into a [`Domain`], with upstream's checks and positions for errors.

use super::{
    metadata, ConfigError, Ctx, Descriptor, Domain, Origin, RateLimit, Unit, MAX_WINDOW_SECS,
    VALID_KEYS,
};
use crate::envoy::yaml::{self, Kind, Node, Pos};
use std::collections::HashMap;
use turnstile::{Algorithm, LimitSpec};

impl Ctx<'_> {
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
                    if name == "metadata" {
                        // Free-form, as upstream leaves it: read where it means something.
                        continue;
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

    pub(super) fn map<'n>(
        &self,
        v: &'n Node,
        what: &str,
    ) -> Result<&'n [(Node, Node)], ConfigError> {
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
            let (mut d, rl, children) = self.descriptor(item)?;
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
            if let Some(v) = rl {
                if !v.is_null() {
                    d.rate_limit = Some(self.rate_limit(v)?);
                }
            }
            if d.share_threshold && !composite.contains('*') {
                return Err(self.err(
                    item.pos,
                    format!(
                        "share_threshold can only be used with wildcard values (containing '*'), but found key '{}'",
                        yaml::shorten(&composite)
                    ),
                ));
            }
            seen.insert(composite, item.pos);
            if let Some(c) = children {
                d.descriptors =
                    self.descriptors(&format!("{}.", d.full_key), self.list(c, "descriptors")?)?;
            }
            out.push(d);
        }
        Ok(out)
    }

    /// One descriptor's own fields, and its `rate_limit` and `descriptors` nodes.
    fn descriptor<'n>(
        &self,
        item: &'n Node,
    ) -> Result<(Descriptor, Option<&'n Node>, Option<&'n Node>), ConfigError> {
        let mut d = Descriptor {
            key: String::new(),
            value: String::new(),
            rate_limit: None,
            descriptors: Vec::new(),
            shadow_mode: false,
            quota_mode: false,
            metadata: None,
            detailed_metric: false,
            value_to_metric: false,
            share_threshold: false,
            full_key: String::new(),
            pos: item.pos,
        };
        let (mut rl, mut children) = (None, None);
        for (k, v) in self.map(item, "descriptors[]")? {
            let Kind::Scalar(name, _) = &k.kind else {
                continue;
            };
            match name.as_str() {
                "key" => d.key = self.string(v, "key")?,
                "value" => d.value = self.string(v, "value")?,
                "descriptors" => children = Some(v),
                "rate_limit" => rl = Some(v),
                "shadow_mode" => d.shadow_mode = self.boolean(v, "shadow_mode")?,
                "quota_mode" => d.quota_mode = self.boolean(v, "quota_mode")?,
                "metadata" => d.metadata = metadata::read(self, v)?,
                "detailed_metric" => d.detailed_metric = self.boolean(v, "detailed_metric")?,
                "value_to_metric" => d.value_to_metric = self.boolean(v, "value_to_metric")?,
                "share_threshold" => d.share_threshold = self.boolean(v, "share_threshold")?,
                // Upstream accepts a known key out of place and ignores it.
                _ => {}
            }
        }
        Ok((d, rl, children))
    }

    fn rate_limit(&self, v: &Node) -> Result<RateLimit, ConfigError> {
        let Fields {
            mut rl,
            unit,
            replaces,
            multiplier_pos,
            algorithm_pos,
        } = self.rate_limit_fields(v)?;
        let parsed = match &unit {
            Some((s, _)) if !s.is_empty() => Unit::parse(s),
            _ => None,
        };
        if rl.unlimited {
            if parsed.is_some() {
                let pos = unit.as_ref().map_or(v.pos, |u| u.1);
                return Err(self.err(pos, "should not specify rate limit unit when unlimited"));
            }
        } else if parsed.is_none() {
            let (s, pos) = unit.unwrap_or((String::new(), v.pos));
            return Err(self.err(
                pos,
                format!("invalid rate limit unit '{}'; expected second, minute, hour, day, week, month or year", yaml::shorten(&s)),
            ));
        }
        rl.unit = parsed;
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
        self.fits(&rl, v.pos, algorithm_pos)?;
        Ok(rl)
    }

    /// A `rate_limit` block's fields as written, before they are checked together.
    fn rate_limit_fields(&self, v: &Node) -> Result<Fields, ConfigError> {
        let mut f = Fields {
            rl: RateLimit {
                requests_per_unit: 0,
                unit: None,
                unit_multiplier: 1,
                unlimited: false,
                name: String::new(),
                replaces: Vec::new(),
                algorithm: Algorithm::FixedWindow,
                pos: v.pos,
            },
            unit: None,
            replaces: Vec::new(),
            multiplier_pos: v.pos,
            algorithm_pos: v.pos,
        };
        let rl = &mut f.rl;
        for (k, val) in self.map(v, "rate_limit")? {
            let Kind::Scalar(name, _) = &k.kind else {
                continue;
            };
            match name.as_str() {
                "requests_per_unit" => rl.requests_per_unit = self.u32(val, "requests_per_unit")?,
                "unit" => f.unit = Some((self.string(val, "unit")?, val.pos)),
                "unlimited" => rl.unlimited = self.boolean(val, "unlimited")?,
                "name" => rl.name = self.string(val, "name")?,
                "unit_multiplier" => {
                    rl.unit_multiplier = self.u32(val, "unit_multiplier")?;
                    f.multiplier_pos = val.pos;
                }
                "algorithm" => {
                    let s = self.string(val, "algorithm")?;
                    rl.algorithm = s
                        .parse::<Algorithm>()
                        .map_err(|e| self.err(val.pos, e.to_string()))?;
                    f.algorithm_pos = val.pos;
                }
                "replaces" => {
                    for r in self.list(val, "replaces")? {
                        let mut n = String::new();
                        for (rk, rv) in self.map(r, "replaces[]")? {
                            if matches!(&rk.kind, Kind::Scalar(s, _) if s == "name") {
                                n = self.string(rv, "name")?;
                            }
                        }
                        f.replaces.push((n, r.pos));
                    }
                }
                _ => {}
            }
        }
        Ok(f)
    }

    /// Whether the limit can be counted: below the fixed window's counter, or valid for its
    /// algorithm.
    fn fits(&self, rl: &RateLimit, pos: Pos, algorithm_pos: Pos) -> Result<(), ConfigError> {
        if rl.unlimited || rl.requests_per_unit == 0 {
            return Ok(());
        }
        if rl.algorithm == Algorithm::FixedWindow {
            // Counted in a fixed window of 2^24 - 1 (counter.rs): a limit must be below it.
            let max = turnstile::algo::fixed_window::MAX_LIMIT;
            if rl.requests_per_unit as u64 >= max {
                return Err(self.err(
                    pos,
                    format!(
                        "requests_per_unit {} is too large for a fixed window (at most {}); use `algorithm: token_bucket`",
                        rl.requests_per_unit,
                        max - 1
                    ),
                ));
            }
            return Ok(());
        }
        LimitSpec::new(rl.algorithm, rl.requests_per_unit as u64, rl.window())
            .build()
            .map(|_| ())
            .map_err(|e| self.err(algorithm_pos, format!("{e}")))
    }
}

/// A `rate_limit` block as read: the limit, and what is checked with positions.
struct Fields {
    rl: RateLimit,
    /// `unit` as written, and where.
    unit: Option<(String, Pos)>,
    /// Each `replaces` entry's name, and where.
    replaces: Vec<(String, Pos)>,
    multiplier_pos: Pos,
    algorithm_pos: Pos,
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

/// Parses one file: one domain.
pub(super) fn domain(origin: &str, text: &str) -> Result<Domain, ConfigError> {
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
    let mut name_pos = root.pos;
    let mut descriptors: &[Node] = &[];
    for (k, v) in fields {
        let Kind::Scalar(key, _) = &k.kind else {
            continue;
        };
        match key.as_str() {
            "domain" => {
                name = cx.string(v, "domain")?;
                name_pos = v.pos;
            }
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
        origins: vec![Origin {
            file: origin.to_string(),
            pos: name_pos,
            descriptors: 0..descriptors.len(),
        }],
        descriptors,
    })
}
