//! A class's entries in a file, one key per line: CSV or JSON Lines (by the file's extension:
//! `.jsonl`, `.ndjson` or `.json` for JSON Lines, anything else CSV).
//!
//! ```text
//! # CSV: key,plan or key,limits (a header line `key,...` and `#` comments are skipped)
//! user:241531,pro
//! 42,5/1s burst=10
//! ```
//!
//! ```text
//! {"key": "user:241531", "plan": "pro"}
//! {"key": 42, "limit": 5, "window": "1s", "burst": 10}
//! {"key": "user:7", "capacity": 5, "time_window_sec": 1}
//! ```
//!
//! A CSV line is split at its last comma (a limit has none; a key may). JSON takes the rules
//! file's names for a limit's fields, and the notes' `capacity` and `time_window_sec`. Keys
//! are read as the class's key class reads them (a customer id, an address, an API key).
//! Every line is checked: the first bad one refuses the file with `file:line: message`.

use super::super::keys::resolve;
use super::super::model::{KeyClass, OverrideKey};
use super::super::raw::parse_duration;
use super::entry::LimitsClass;
use super::LimitsError;
use crate::algo::LimitSpec;
use crate::keyed::KeyHasher;
use std::io::BufRead;
use std::path::Path;
use std::time::{Duration, SystemTime};

/// How a file's entries are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileFormat {
    /// `key,plan` or `key,limits` lines.
    Csv,
    /// One JSON object per line.
    JsonLines,
}

impl FileFormat {
    /// The format of a file by its extension.
    pub fn of(path: &Path) -> FileFormat {
        match path.extension().and_then(|e| e.to_str()) {
            Some("jsonl" | "ndjson" | "json") => FileFormat::JsonLines,
            _ => FileFormat::Csv,
        }
    }
}

/// What a load of a class's file did.
#[derive(Clone, Debug, PartialEq)]
pub struct LoadReport {
    /// Keys with an entry.
    pub entries: u64,
    /// Wall-clock seconds the read and the build took.
    pub seconds: f64,
}

/// A line's entry: a plan's name or a limit, as the file gave it.
pub(crate) enum Value<'a> {
    /// Text (CSV): a plan's name or a limit (`5/1s burst=10`), parsed by the class.
    Text(&'a str),
    /// A plan's name (JSON).
    Plan(String),
    /// A limit field by field (JSON), of the class's algorithm; a window class's window if
    /// none is given.
    Fields {
        limit: u64,
        window: Option<Duration>,
        burst: Option<u64>,
        delay: Option<u64>,
        count_denied: bool,
    },
}

impl Value<'_> {
    /// The limit this value gives under `class` (`None` for a plan's name: the caller looks
    /// it up).
    pub(crate) fn spec(&self, class: &LimitsClass) -> Result<Option<LimitSpec>, LimitsError> {
        match self {
            Value::Text(t) => match class.parse(t)? {
                super::KeyLimit::Plan(_) => Ok(None),
                super::KeyLimit::Limit(s) => Ok(Some(s)),
            },
            Value::Plan(_) => Ok(None),
            Value::Fields {
                limit,
                window,
                burst,
                delay,
                count_denied,
            } => {
                let Some(w) = window.or(class.window) else {
                    return Err(LimitsError::new(
                        "this entry has no `window`: add e.g. \"window\": \"1m\"",
                    ));
                };
                let mut s = LimitSpec::new(class.algorithm, *limit, w);
                (s.burst, s.delay, s.count_denied) = (*burst, *delay, *count_denied);
                Ok(Some(s))
            }
        }
    }

    /// The plan's name, if the value names one.
    pub(crate) fn plan(&self) -> Option<&str> {
        match self {
            Value::Text(t) if t.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_') => {
                Some(t)
            }
            Value::Plan(p) => Some(p),
            _ => None,
        }
    }
}

impl LimitsClass {
    /// One JSON Lines entry as a file of the class gives it (`{"key": "42", "plan": "pro"}`,
    /// `{"key": 42, "limit": 5, "window": "1s", "burst": 10}`): its key's text and its entry.
    /// The entry is not yet checked against the class's plans
    /// ([`LimitsSource::set`](super::LimitsSource::set) does that).
    pub fn parse_json(&self, line: &str) -> Result<(String, super::KeyLimit), LimitsError> {
        let (key, v) = json_line(line.trim())?.ok_or_else(|| LimitsError::new("an empty entry"))?;
        let entry = match v.plan() {
            Some(p) => super::KeyLimit::Plan(p.to_string()),
            None => super::KeyLimit::Limit(
                v.spec(self)?
                    .ok_or_else(|| LimitsError::new("neither a plan nor a limit"))?,
            ),
        };
        Ok((key, entry))
    }
}

/// The key id of `key` (text) under `class`, as a rule of that class computes it.
pub(crate) fn key_id(class: KeyClass, key: &str, h: &KeyHasher) -> Result<u64, LimitsError> {
    if class.part_count() != 1 {
        return Err(LimitsError::new(format!(
            "a limits class is keyed by one part (customer, ip, api_key, route or method), not {class}"
        )));
    }
    let v = resolve(class, &OverrideKey::Text(key.to_string())).map_err(LimitsError::new)?;
    super::super::matcher::key_id(class, &v.request(), h)
        .ok_or_else(|| LimitsError::new(format!("`{key}` is not a {class} key")))
}

/// The file's modified time and length, to tell whether it changed.
pub(crate) fn stamp(path: &Path) -> Result<(SystemTime, u64), LimitsError> {
    let m = std::fs::metadata(path).map_err(|e| at(path, 0, format!("cannot read it: {e}")))?;
    Ok((m.modified().unwrap_or(SystemTime::UNIX_EPOCH), m.len()))
}

fn at(path: &Path, line: usize, message: String) -> LimitsError {
    LimitsError {
        origin: Some(path.display().to_string()),
        line,
        ..LimitsError::new(message)
    }
}

/// `e` (an entry's error, with no place) at `path`'s line `line`.
fn placed(path: &Path, line: usize, e: LimitsError) -> LimitsError {
    LimitsError {
        origin: Some(path.display().to_string()),
        line,
        ..e
    }
}

fn open(path: &Path) -> Result<std::io::BufReader<std::fs::File>, LimitsError> {
    let f = std::fs::File::open(path).map_err(|e| at(path, 0, format!("cannot read it: {e}")))?;
    Ok(std::io::BufReader::with_capacity(1 << 20, f))
}

/// Lines in the file (an upper bound on its entries, to size the map before reading it).
pub(crate) fn count_lines(path: &Path) -> Result<u64, LimitsError> {
    let mut r = open(path)?;
    let mut n = 0u64;
    loop {
        let buf = r
            .fill_buf()
            .map_err(|e| at(path, 0, format!("cannot read it: {e}")))?;
        if buf.is_empty() {
            return Ok(n + 1);
        }
        n += buf.iter().filter(|&&b| b == b'\n').count() as u64;
        let len = buf.len();
        r.consume(len);
    }
}

/// Reads every entry of the file: `f(id, value)` for each, in order; an error of `f` or of the
/// line refuses the file at that line.
pub(crate) fn read(
    path: &Path,
    class: &LimitsClass,
    hasher: &KeyHasher,
    mut f: impl FnMut(u64, Value<'_>) -> Result<(), LimitsError>,
) -> Result<u64, LimitsError> {
    let format = FileFormat::of(path);
    let mut r = open(path)?;
    let mut line = String::new();
    let (mut no, mut entries) = (0usize, 0u64);
    loop {
        line.clear();
        match r.read_line(&mut line) {
            Ok(0) => return Ok(entries),
            Ok(_) => {}
            Err(e) => return Err(at(path, no + 1, format!("cannot read this line: {e}"))),
        }
        no += 1;
        let t = line.trim();
        if t.is_empty() || t.starts_with('#') {
            continue;
        }
        let parsed = match format {
            FileFormat::Csv => csv_line(t, no),
            FileFormat::JsonLines => json_line(t),
        };
        let (key, value) = match parsed {
            Ok(Some(kv)) => kv,
            Ok(None) => continue,
            Err(e) => return Err(placed(path, no, e)),
        };
        let id = key_id(class.key, &key, hasher).map_err(|e| placed(path, no, e))?;
        f(id, value).map_err(|e| placed(path, no, e))?;
        entries += 1;
    }
}

/// A CSV line's key and value; `None` for the header.
fn csv_line(t: &str, no: usize) -> Result<Option<(String, Value<'_>)>, LimitsError> {
    let Some((key, value)) = t.rsplit_once(',') else {
        return Err(LimitsError::new(format!(
            "`{t}` is not `key,plan` or `key,limits`: e.g. user:241531,pro or 42,5/1s"
        )));
    };
    let (key, value) = (key.trim(), value.trim());
    if key.eq_ignore_ascii_case("key") && no <= 1 + 16 {
        return Ok(None);
    }
    Ok(Some((
        unquote(key).to_string(),
        Value::Text(unquote(value)),
    )))
}

fn unquote(s: &str) -> &str {
    s.strip_prefix('"')
        .and_then(|s| s.strip_suffix('"'))
        .unwrap_or(s)
}

/// A JSON Lines entry.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonEntry {
    key: serde_json::Value,
    plan: Option<String>,
    limit: Option<u64>,
    capacity: Option<u64>,
    window: Option<String>,
    time_window_sec: Option<u64>,
    burst: Option<u64>,
    delay: Option<u64>,
    count_denied: Option<bool>,
}

fn json_line(t: &str) -> Result<Option<(String, Value<'_>)>, LimitsError> {
    let e: JsonEntry = serde_json::from_str(t).map_err(|e| {
        let hint = if e.to_string().contains("unknown field") {
            "; an entry has key and plan, or key and limit, window (or the notes' capacity, time_window_sec), burst, delay, count_denied"
        } else {
            ""
        };
        LimitsError::new(format!("not a JSON entry: {e}{hint}"))
    })?;
    let key = match e.key {
        serde_json::Value::String(s) => s,
        serde_json::Value::Number(n) => n.to_string(),
        other => {
            return Err(LimitsError::new(format!(
                "`key` is a string or a number, not {other}"
            )))
        }
    };
    let limit = match (e.limit, e.capacity) {
        (Some(_), Some(_)) => {
            return Err(LimitsError::new(
                "`capacity` is another name for `limit`: give one of them",
            ))
        }
        (l, c) => l.or(c),
    };
    let window = match (&e.window, e.time_window_sec) {
        (Some(_), Some(_)) => {
            return Err(LimitsError::new(
                "`time_window_sec` is another name for `window`: give one of them",
            ))
        }
        (Some(w), None) => Some(parse_duration(w)?),
        (None, Some(s)) => Some(Duration::from_secs(s)),
        (None, None) => None,
    };
    let has_limit = limit.is_some()
        || window.is_some()
        || e.burst.is_some()
        || e.delay.is_some()
        || e.count_denied.is_some();
    match (e.plan, has_limit) {
        (Some(_), true) => Err(LimitsError::new(
            "give a `plan` or the key's own limit, not both",
        )),
        (Some(p), false) => Ok(Some((key, Value::Plan(p)))),
        (None, false) => Err(LimitsError::new(
            "no `plan` and no limit: add e.g. \"plan\": \"pro\"",
        )),
        (None, true) => Ok(Some((
            key,
            Value::Fields {
                limit: limit.ok_or_else(|| {
                    LimitsError::new("this entry has no `limit`: add e.g. \"limit\": 100")
                })?,
                window,
                burst: e.burst,
                delay: e.delay,
                count_denied: e.count_denied.unwrap_or(false),
            },
        ))),
    }
}
