//! What a log line gives a check: the request's parts (time, client address, customer,
//! API key, route, method, priority, cost), each taken from a field of the line's format by a
//! mapping — defaults per format, or `--key PART=$field` — and checked once per line.

use super::time;
use std::net::IpAddr;
use std::ops::Range;
use turnstile::rules::Priority;

/// A request part a mapping fills.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    Time,
    Ip,
    Customer,
    ApiKey,
    Route,
    Method,
    Priority,
    Cost,
}

impl Target {
    pub const ALL: [Target; 8] = [
        Target::Time,
        Target::Ip,
        Target::Customer,
        Target::ApiKey,
        Target::Route,
        Target::Method,
        Target::Priority,
        Target::Cost,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Target::Time => "time",
            Target::Ip => "ip",
            Target::Customer => "customer",
            Target::ApiKey => "api_key",
            Target::Route => "route",
            Target::Method => "method",
            Target::Priority => "priority",
            Target::Cost => "cost",
        }
    }

    /// The fields tried, in order, when no `--key` names one: the first a line has (and that
    /// is not `-`) is used.
    fn defaults(self) -> &'static [&'static str] {
        match self {
            Target::Time => &[
                "time_local",
                "time_iso8601",
                "msec",
                "start_time",
                "request_creation_time",
                "timestamp",
                "@timestamp",
                "time",
                "ts",
            ],
            Target::Ip => &[
                "remote_addr",
                "client_port",
                "downstream_remote_address",
                "http_x_forwarded_for",
                "x_forwarded_for",
                "client_ip",
                "ip",
            ],
            Target::Customer => &["customer", "customer_id"],
            Target::ApiKey => &["api_key", "http_x_api_key"],
            Target::Route => &["uri", "route", "path", "url", "request_uri"],
            Target::Method => &["request_method", "method"],
            Target::Priority => &["priority"],
            Target::Cost => &["cost"],
        }
    }
}

impl Target {
    /// The names a JSON line is searched for, when no `--key` names the part: the defaults,
    /// and Envoy's usual JSON names.
    pub fn json_names(self) -> Vec<&'static str> {
        let extra: &[&str] = match self {
            Target::Ip => &["remote_address", "client"],
            Target::Route => &[],
            _ => &[],
        };
        self.defaults().iter().chain(extra).copied().collect()
    }
}

/// How a part is cut from a field's value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// The whole value.
    Whole,
    /// The method of a request line (`GET /a?b HTTP/1.1`).
    ReqMethod,
    /// The URI of a request line, as written.
    ReqUri,
    /// The path of a request line's URI: without query, scheme or host.
    ReqPath,
    /// The path of a URI: without query, scheme or host.
    UriPath,
}

/// Where a part comes from: variable `var` of the format, cut by `part`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FieldRef {
    pub var: u16,
    pub part: Part,
}

/// Finds field `name` among a format's variable `names`, directly or derived: `$header_x`
/// is `$http_x`; `$request_method`, `$request_uri` and `$uri` come from `$request` (nginx's
/// request line) when the format has no such variable; `$uri` from `$request_uri` or `$path`.
pub fn resolve(names: &[String], name: &str) -> Option<FieldRef> {
    let name = name.strip_prefix('$').unwrap_or(name);
    let name = name.trim_start_matches('{').trim_end_matches('}');
    let aliased;
    let name = match name.strip_prefix("header_") {
        Some(h) => {
            aliased = format!("http_{h}");
            &aliased
        }
        None => name,
    };
    let var = |n: &str| names.iter().position(|x| x == n).map(|i| i as u16);
    if let Some(v) = var(name) {
        let part = if matches!(name, "path" | "url" | "request_uri" | "route" | "uri") {
            // A route is a path: a query string or an absolute URL's host would make every
            // URL its own route.
            Part::UriPath
        } else {
            Part::Whole
        };
        return Some(FieldRef { var: v, part });
    }
    let from_request = |part| var("request").map(|v| FieldRef { var: v, part });
    match name {
        "request_method" | "method" => from_request(Part::ReqMethod),
        "request_uri" => from_request(Part::ReqUri),
        "uri" | "path" | "route" => ["request_uri", "path", "url"]
            .iter()
            .find_map(|n| var(n))
            .map(|v| FieldRef {
                var: v,
                part: Part::UriPath,
            })
            .or_else(|| from_request(Part::ReqPath)),
        _ => None,
    }
}

/// Which fields fill each part, first present first.
#[derive(Clone, Debug, Default)]
pub struct Mapping {
    pub refs: [Vec<FieldRef>; 8],
    /// The names used, per part, for the report (`time=$time_local`).
    pub described: Vec<String>,
}

impl Mapping {
    /// The mapping over `names`: `given` (`(part, field)` from `--key`) and, for the parts
    /// not given, the format's defaults that `names` has. `strict`: every default that
    /// exists is kept as a candidate (JSON, whose lines differ); otherwise the first.
    pub fn new(
        names: &[String],
        given: &[(Target, String)],
        strict: bool,
    ) -> crate::Result<Mapping> {
        let mut m = Mapping::default();
        for t in Target::ALL {
            let i = t as usize;
            if let Some((_, f)) = given.iter().find(|(g, _)| *g == t) {
                let r = resolve(names, f).ok_or_else(|| {
                    format!(
                        "--key {}={f}: the format has no field `{f}` (its fields: {})",
                        t.name(),
                        names
                            .iter()
                            .map(|n| format!("${n}"))
                            .collect::<Vec<_>>()
                            .join(" ")
                    )
                })?;
                m.refs[i].push(r);
                m.described.push(format!("{}=${f}", t.name()));
                continue;
            }
            for d in t.defaults() {
                if let Some(r) = resolve(names, d) {
                    if !m.refs[i].contains(&r) {
                        m.refs[i].push(r);
                    }
                    if !strict {
                        break;
                    }
                }
            }
            if strict && !m.refs[i].is_empty() {
                continue;
            }
            if let Some(r) = m.refs[i].first() {
                let n = &names[r.var as usize];
                let how = match r.part {
                    Part::Whole => String::new(),
                    Part::ReqMethod => " (its method)".into(),
                    Part::ReqUri => " (its URI)".into(),
                    Part::ReqPath | Part::UriPath => " (its path)".into(),
                };
                m.described.push(format!("{}=${n}{how}", t.name()));
            }
        }
        if strict {
            m.described.push(
                "other parts: the first of their usual names a line has (docs/replay.md)".into(),
            );
        }
        if m.refs[Target::Time as usize].is_empty() {
            return Err(format!(
                "no timestamp field: name one with --key time=$FIELD (the format's fields: {})",
                names
                    .iter()
                    .map(|n| format!("${n}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            )
            .into());
        }
        Ok(m)
    }
}

/// Bit 31 of a span's start: the span is in the scratch buffer, not the line.
pub const SCRATCH: u32 = 1 << 31;

/// The bytes of span `r`.
#[inline]
pub fn slice<'a>(line: &'a [u8], scratch: &'a [u8], r: &Range<u32>) -> &'a [u8] {
    if r.start & SCRATCH != 0 {
        &scratch[(r.start & !SCRATCH) as usize..(r.end & !SCRATCH) as usize]
    } else {
        &line[r.start as usize..r.end as usize]
    }
}

/// One line's request, checked: the parts as values or as spans of the line (or scratch).
#[derive(Clone, Debug, Default)]
pub struct Record {
    pub time: u64,
    pub ip: Option<IpAddr>,
    pub customer: Option<u64>,
    pub customer_text: Range<u32>,
    pub api_key: Range<u32>,
    pub route: Range<u32>,
    pub method: Range<u32>,
    pub priority: Option<Priority>,
    pub cost: u64,
}

/// A part's value: the first of its fields that the line has and that is not `-`.
#[inline]
fn value<'a>(
    refs: &[FieldRef],
    spans: &[Range<u32>],
    line: &'a [u8],
    scratch: &'a [u8],
) -> Option<(&'a [u8], Range<u32>)> {
    for r in refs {
        let s = &spans[r.var as usize];
        let v = slice(line, scratch, s);
        let (a, b) = cut(v, r.part);
        let v = &v[a..b];
        if !v.is_empty() && v != b"-" {
            return Some((v, s.start + a as u32..s.start + b as u32));
        }
    }
    None
}

/// The range of `v` that `part` takes.
#[inline]
fn cut(v: &[u8], part: Part) -> (usize, usize) {
    match part {
        Part::Whole => (0, v.len()),
        Part::ReqMethod => (0, memchr::memchr(b' ', v).unwrap_or(v.len())),
        Part::ReqUri | Part::ReqPath => {
            let Some(a) = memchr::memchr(b' ', v) else {
                return (0, 0);
            };
            let b = memchr::memrchr(b' ', v)
                .filter(|&b| b > a)
                .unwrap_or(v.len());
            if part == Part::ReqUri {
                return (a + 1, b);
            }
            let (x, y) = path(&v[a + 1..b]);
            (a + 1 + x, a + 1 + y)
        }
        Part::UriPath => path(v),
    }
}

/// The path of a URI (`/a` of `/a?b`, of `http://h:80/a?b`).
#[inline]
fn path(u: &[u8]) -> (usize, usize) {
    let mut a = 0;
    if u.first() != Some(&b'/') {
        if let Some(i) = memchr::memmem::find(u, b"://") {
            a = u[i + 3..]
                .iter()
                .position(|&c| c == b'/')
                .map_or(u.len(), |p| i + 3 + p);
        }
    }
    let b = memchr::memchr2(b'?', b'#', &u[a..]).map_or(u.len(), |q| a + q);
    (a, b)
}

impl Record {
    /// Checks the parts of a line whose variables are at `spans`.
    #[inline]
    pub fn fill(
        &mut self,
        m: &Mapping,
        spans: &[Range<u32>],
        line: &[u8],
        scratch: &[u8],
    ) -> Result<(), &'static str> {
        let v = |t: Target| value(&m.refs[t as usize], spans, line, scratch);
        let (t, _) = v(Target::Time).ok_or("no timestamp")?;
        self.time = time::parse(t).ok_or(time::BAD_TIME)?;
        self.ip = match v(Target::Ip) {
            None => None,
            Some((b, _)) => Some(ip(b).ok_or("client address not understood")?),
        };
        (self.customer, self.customer_text) = match v(Target::Customer) {
            None => (None, 0..0),
            Some((b, r)) => {
                if !b.is_ascii() && std::str::from_utf8(b).is_err() {
                    return Err("the customer is not UTF-8");
                }
                (Some(customer_id(b)), r)
            }
        };
        let text = |t: Target, what: &'static str| -> Result<Range<u32>, &'static str> {
            match v(t) {
                None => Ok(0..0),
                Some((b, r)) => std::str::from_utf8(b).map(|_| r).map_err(|_| what),
            }
        };
        self.api_key = text(Target::ApiKey, "the API key is not UTF-8")?;
        self.route = text(Target::Route, "the route is not UTF-8")?;
        self.method = text(Target::Method, "the method is not UTF-8")?;
        self.priority = match v(Target::Priority) {
            None => None,
            Some((b, _)) => Some(
                std::str::from_utf8(b)
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .ok_or("priority is not critical, post, get or test")?,
            ),
        };
        self.cost = match v(Target::Cost) {
            None => 1,
            Some((b, _)) => std::str::from_utf8(b)
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or("cost is not a whole number")?,
        };
        Ok(())
    }
}

/// A customer id: a decimal `u64` as it is, any other text hashed (so that string ids are
/// still counted per customer; overrides can only name decimal ids).
#[inline]
pub fn customer_id(b: &[u8]) -> u64 {
    if b.len() <= 19 && b.iter().all(u8::is_ascii_digit) && (b.len() == 1 || b[0] != b'0') {
        return b.iter().fold(0u64, |v, c| v * 10 + (c - b'0') as u64);
    }
    use std::hash::BuildHasher;
    foldhash::fast::FixedState::with_seed(0x7265_706c_6179).hash_one(b)
}

/// A client address: `203.0.113.9`, `203.0.113.9:5000`, `[2001:db8::1]:443`, `2001:db8::1`,
/// or the first of an `X-Forwarded-For` list.
#[inline]
pub fn ip(b: &[u8]) -> Option<IpAddr> {
    if let Some(a) = ipv4(b) {
        return Some(IpAddr::V4(a));
    }
    let first = b.split(|&c| c == b',').next()?.trim_ascii();
    let s = std::str::from_utf8(first).ok()?;
    if let Ok(a) = s.parse() {
        return Some(a);
    }
    if let Some(rest) = s.strip_prefix('[') {
        return rest.split(']').next()?.parse().ok();
    }
    let (host, port) = s.rsplit_once(':')?;
    (port.bytes().all(|c| c.is_ascii_digit()) && host.contains('.'))
        .then(|| host.parse().ok())
        .flatten()
}

/// A dotted quad alone, or followed by `:port` (the common case, without std's general
/// parser: 5 % of a replay's time with it, measured with perf).
#[inline]
fn ipv4(b: &[u8]) -> Option<std::net::Ipv4Addr> {
    let mut parts = [0u8; 4];
    let mut k = 0;
    let mut v = 0u32;
    let mut digits = 0;
    for (i, &c) in b.iter().enumerate() {
        match c {
            b'0'..=b'9' if digits < 3 => {
                // A leading zero is refused, as std refuses it.
                if digits == 1 && v == 0 {
                    return None;
                }
                v = v * 10 + (c - b'0') as u32;
                digits += 1;
            }
            b'.' | b':' if digits > 0 && v <= 255 => {
                parts[k] = v as u8;
                k += 1;
                (v, digits) = (0, 0);
                if c == b':' || k == 4 {
                    let port = &b[i + 1..];
                    let ok = k == 4
                        && c == b':'
                        && !port.is_empty()
                        && port.iter().all(u8::is_ascii_digit);
                    return ok.then(|| parts.into());
                }
            }
            _ => return None,
        }
    }
    (k == 3 && digits > 0 && v <= 255).then(|| {
        parts[3] = v as u8;
        parts.into()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: &[&str]) -> Vec<String> {
        n.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn cuts() {
        let v = b"GET http://h.example:80/a/b?q=1 HTTP/1.1";
        let at = |p| {
            let (a, b) = cut(v, p);
            std::str::from_utf8(&v[a..b]).unwrap().to_string()
        };
        assert_eq!(at(Part::ReqMethod), "GET");
        assert_eq!(at(Part::ReqUri), "http://h.example:80/a/b?q=1");
        assert_eq!(at(Part::ReqPath), "/a/b");
        let (a, b) = path(b"/x?y");
        assert_eq!((a, b), (0, 2));
        assert_eq!(cut(b"garbage", Part::ReqPath), (0, 0));
    }

    #[test]
    fn resolves() {
        let n = names(&["remote_addr", "request", "http_x_customer_id"]);
        assert_eq!(resolve(&n, "$header_x_customer_id").unwrap().var, 2);
        assert_eq!(resolve(&n, "$uri").unwrap().part, Part::ReqPath);
        assert_eq!(resolve(&n, "request_method").unwrap().part, Part::ReqMethod);
        assert!(resolve(&n, "$nope").is_none());
        let m = Mapping::new(&n, &[], false).unwrap_err().to_string();
        assert!(m.contains("no timestamp"), "{m}");
    }

    #[test]
    fn addresses_and_customers() {
        assert_eq!(ip(b"203.0.113.9:5000"), "203.0.113.9".parse().ok());
        assert_eq!(ip(b"[2001:db8::1]:443"), "2001:db8::1".parse().ok());
        assert_eq!(ip(b"2001:db8::1"), "2001:db8::1".parse().ok());
        assert_eq!(ip(b"10.0.0.1, 10.0.0.2"), "10.0.0.1".parse().ok());
        assert_eq!(ip(b"nope"), None);
        for (s, want) in [
            ("1.2.3.4", Some("1.2.3.4")),
            ("1.2.3.4:80", Some("1.2.3.4")),
            ("255.255.255.255", Some("255.255.255.255")),
            ("256.1.1.1", None),
            ("1.2.3", None),
            ("1.2.3.4.5", None),
            ("1.2.3.4:", None),
            ("01.2.3.4", None),
            ("1..3.4", None),
            ("1.2.3.4:x", None),
        ] {
            assert_eq!(ipv4(s.as_bytes()), want.map(|w| w.parse().unwrap()), "{s}");
        }
        assert_eq!(customer_id(b"42"), 42);
        assert_ne!(customer_id(b"042"), 42);
        assert_ne!(customer_id(b"acme"), customer_id(b"acne"));
    }
}
