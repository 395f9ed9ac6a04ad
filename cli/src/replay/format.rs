//! The log formats: their names, the parser each one uses (a template, CSV or JSON Lines),
//! and detection from a file's first line.

use super::fields::{Mapping, Target};
use super::structured::{Csv, Json};
use super::template::{self, Spans, Template};

/// `--format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Detected from each file's first line (an error when it could be more than one).
    Auto,
    /// nginx and Apache `combined`.
    Combined,
    /// The common log format (combined without referer and user agent).
    Common,
    /// Envoy's default access log format.
    Envoy,
    /// Envoy's JSON access logs (JSON Lines with Envoy's usual names).
    EnvoyJson,
    /// AWS Application Load Balancer access logs.
    Alb,
    /// CSV with a header line naming the columns.
    Csv,
    /// JSON Lines: one object per line.
    Jsonl,
}

impl Format {
    pub fn name(self) -> &'static str {
        match self {
            Format::Auto => "auto",
            Format::Combined => "combined",
            Format::Common => "common",
            Format::Envoy => "envoy",
            Format::EnvoyJson => "envoy-json",
            Format::Alb => "alb",
            Format::Csv => "csv",
            Format::Jsonl => "jsonl",
        }
    }

    fn template(self) -> Option<&'static str> {
        match self {
            Format::Combined => Some(template::COMBINED),
            Format::Common => Some(template::COMMON),
            Format::Envoy => Some(template::ENVOY),
            Format::Alb => Some(template::ALB),
            _ => None,
        }
    }
}

/// How one file's lines are split into fields.
#[derive(Clone, Debug)]
pub enum Parser {
    Template(Template),
    Csv(Csv),
    Json(Json),
}

impl Parser {
    /// The fields' names (`$name` in mappings).
    pub fn names(&self) -> &[String] {
        match self {
            Parser::Template(t) => t.names(),
            Parser::Csv(c) => &c.names,
            Parser::Json(j) => &j.names,
        }
    }

    /// Splits `line` into `spans`.
    #[inline]
    pub fn parse(
        &self,
        line: &[u8],
        spans: &mut Spans,
        scratch: &mut Vec<u8>,
    ) -> Result<(), &'static str> {
        match self {
            Parser::Template(t) => t.parse(line, spans),
            Parser::Csv(c) => c.parse(line, spans, scratch),
            Parser::Json(j) => j.parse(line, spans, scratch),
        }
    }

    /// Whether the first line is a header the parser takes (CSV).
    pub fn takes_header(format: Format) -> bool {
        format == Format::Csv
    }

    /// The parser of `format` (`custom`: a `--log-format` template), and its mapping with
    /// `given` (`--key`). `header`: a CSV file's first line.
    pub fn new(
        format: Format,
        custom: Option<&Template>,
        given: &[(Target, String)],
        header: Option<&[u8]>,
    ) -> crate::Result<(Parser, Mapping)> {
        let p = match (custom, format) {
            (Some(t), _) => Parser::Template(t.clone()),
            (None, Format::Csv) => Parser::Csv(Csv::from_header(header.unwrap_or_default())?),
            (None, Format::Jsonl | Format::EnvoyJson) => {
                let mut names: Vec<String> = Vec::new();
                for t in Target::ALL {
                    for n in t.json_names() {
                        if !names.iter().any(|x| x == n) {
                            names.push(n.to_string());
                        }
                    }
                }
                for (_, f) in given {
                    let f = f.trim_start_matches('$').to_string();
                    if !names.contains(&f) {
                        names.push(f);
                    }
                }
                Parser::Json(Json { names })
            }
            (None, f) => Parser::Template(Template::compile(
                f.template().expect("every other format is a template"),
            )?),
        };
        let strict = matches!(p, Parser::Json(_));
        let m = Mapping::new(p.names(), given, strict)?;
        Ok((p, m))
    }
}

/// The format of a file whose first non-empty line is `line`: the only one of combined
/// (or common), Envoy's and ALB's that reads it with a timestamp, else JSON Lines for an
/// object, else CSV for a header with commas.
pub fn detect(line: &[u8]) -> crate::Result<Format> {
    let t = line.trim_ascii();
    if t.starts_with(b"{") {
        return Ok(Format::Jsonl);
    }
    let mut found = Vec::new();
    for f in [Format::Combined, Format::Common, Format::Envoy, Format::Alb] {
        if f == Format::Common && found.contains(&Format::Combined) {
            continue;
        }
        if reads(f, line) {
            found.push(f);
        }
    }
    match found[..] {
        [f] => Ok(f),
        [] if t.contains(&b',') => Ok(Format::Csv),
        [] => Err(format!(
            "no known format reads its first line ({}); pass --format, or --log-format with \
             the nginx or Envoy format string that wrote it",
            excerpt(line)
        )
        .into()),
        _ => Err(format!(
            "its first line reads as more than one format ({}); pass --format",
            found
                .iter()
                .map(|f| f.name())
                .collect::<Vec<_>>()
                .join(", ")
        )
        .into()),
    }
}

/// Whether template format `f` reads `line` with a timestamp.
fn reads(f: Format, line: &[u8]) -> bool {
    let Ok((p, m)) = Parser::new(f, None, &[], None) else {
        return false;
    };
    let mut spans: Spans = std::array::from_fn(|_| 0..0);
    let mut scratch = Vec::new();
    if p.parse(line, &mut spans, &mut scratch).is_err() {
        return false;
    }
    let mut r = super::fields::Record::default();
    r.fill(&m, &spans, line, &scratch).is_ok() && r.time > 0
}

/// At most 80 characters of a line, for messages.
pub fn excerpt(line: &[u8]) -> String {
    let s = String::from_utf8_lossy(line);
    let mut t: String = s.chars().take(80).collect();
    if s.chars().count() > 80 {
        t.push('…');
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects() {
        let combined =
            br#"203.0.113.9 - - [10/Oct/2000:13:55:36 -0700] "GET / HTTP/1.1" 200 1 "-" "x""#;
        assert_eq!(detect(combined).ok(), Some(Format::Combined));
        let common = br#"203.0.113.9 - - [10/Oct/2000:13:55:36 -0700] "GET / HTTP/1.1" 200 1"#;
        assert_eq!(detect(common).ok(), Some(Format::Common));
        let envoy = br#"[2016-04-15T20:17:00.310Z] "POST /a HTTP/2" 204 - 154 0 226 100 "10.0.35.28" "x" "id" "host" "tcp://10.0.2.1:80""#;
        assert_eq!(detect(envoy).ok(), Some(Format::Envoy));
        assert_eq!(detect(br#"{"start_time":"x"}"#).ok(), Some(Format::Jsonl));
        assert_eq!(detect(b"time,ip").ok(), Some(Format::Csv));
        assert!(detect(b"hello world").is_err());
    }
}

#[cfg(test)]
mod fuzz {
    //! Every parser and the request built from its fields, on arbitrary bytes: an error or a
    //! record, never a panic (the parsers are byte-level and index by hand).
    use super::*;
    use crate::replay::fields::Record;
    use proptest::prelude::*;

    /// Bytes that look like log lines often enough to reach deep into the parsers.
    fn line() -> impl Strategy<Value = Vec<u8>> {
        let piece = prop_oneof![
            Just(b"203.0.113.9 - 42 [10/Oct/2000:13:55:36 -0700] \"GET /a?b HTTP/1.1\" 200 1 \"-\" \"x\"".to_vec()),
            Just(b"[2016-04-15T20:17:00.310Z] \"POST /a HTTP/2\" 204 - 1 0 2 1 \"1.2.3.4\" \"x\" \"i\" \"h\" \"u\"".to_vec()),
            Just(b"{\"start_time\":\"2000-10-10T20:55:36Z\",\"path\":\"/x\",\"ip\":\"::1\"}".to_vec()),
            Just(b"\"".to_vec()),
            Just(b" ".to_vec()),
            Just(b",".to_vec()),
            Just(b"\\".to_vec()),
            Just(b"[".to_vec()),
            proptest::collection::vec(any::<u8>(), 0..12),
        ];
        proptest::collection::vec(piece, 0..6).prop_map(|v| v.concat())
    }

    proptest! {
        #[test]
        fn no_line_panics(l in line(), cut in any::<prop::sample::Index>()) {
            let l = &l[..cut.index(l.len() + 1)];
            let _ = detect(l);
            let given = vec![(crate::replay::fields::Target::Customer, "remote_user".to_string())];
            for f in [Format::Combined, Format::Common, Format::Envoy, Format::Alb, Format::Jsonl] {
                let g = if matches!(f, Format::Combined | Format::Common) {
                    given.clone()
                } else {
                    vec![]
                };
                let (p, m) = Parser::new(f, None, &g, None).unwrap();
                let mut spans: Spans = std::array::from_fn(|_| 0..0);
                let mut scratch = Vec::new();
                if p.parse(l, &mut spans, &mut scratch).is_ok() {
                    let _ = Record::default().fill(&m, &spans, l, &scratch);
                }
            }
            if let Ok((p, m)) = Parser::new(Format::Csv, None, &[], Some(b"time,ip,route,method")) {
                let mut spans: Spans = std::array::from_fn(|_| 0..0);
                let mut scratch = Vec::new();
                if p.parse(l, &mut spans, &mut scratch).is_ok() {
                    let _ = Record::default().fill(&m, &spans, l, &scratch);
                }
            }
            let _ = crate::replay::time::parse(l);
            let _ = crate::replay::fields::ip(l);
        }
    }
}
