//! Logs with named fields: CSV with a header line (RFC 4180 quoting) and JSON Lines (one
//! object per line, Envoy's JSON access logs among them; a field may be a dotted path into
//! nested objects). Both fill the same spans as a template does, so the mapping and the
//! check are shared.

use super::fields::SCRATCH;
use std::ops::Range;

/// CSV with a header: its column names.
#[derive(Clone, Debug)]
pub struct Csv {
    pub names: Vec<String>,
}

/// The most columns a CSV header may name.
pub const MAX_COLUMNS: usize = super::template::MAX_VARS;

impl Csv {
    /// From the header line.
    pub fn from_header(line: &[u8]) -> crate::Result<Csv> {
        let mut spans = vec![0..0; MAX_COLUMNS];
        let mut scratch = Vec::new();
        let n =
            split(line, &mut spans, &mut scratch).map_err(|e| format!("the CSV header: {e}"))?;
        let names: Vec<String> = spans[..n]
            .iter()
            .map(|r| {
                let b = super::fields::slice(line, &scratch, r);
                String::from_utf8_lossy(b.trim_ascii()).into_owned()
            })
            .collect();
        if names.len() < 2 {
            return Err("a CSV header names at least two columns, separated by commas".into());
        }
        Ok(Csv { names })
    }

    /// Splits a data line into `spans`.
    #[inline]
    pub fn parse(
        &self,
        line: &[u8],
        spans: &mut [Range<u32>],
        scratch: &mut Vec<u8>,
    ) -> Result<(), &'static str> {
        scratch.clear();
        let n = split(line, spans, scratch)?;
        if n != self.names.len() {
            return Err("not as many columns as the header");
        }
        Ok(())
    }
}

/// Splits a CSV line at commas, quotes removed (a field with a doubled quote is unescaped
/// into `scratch`); returns the field count.
fn split(
    line: &[u8],
    spans: &mut [Range<u32>],
    scratch: &mut Vec<u8>,
) -> Result<usize, &'static str> {
    let mut at = 0usize;
    let mut n = 0usize;
    loop {
        if n == spans.len() {
            return Err("more columns than the header");
        }
        if line.get(at) == Some(&b'"') {
            // Quoted: up to a quote not doubled.
            let mut i = at + 1;
            let mut doubled = false;
            loop {
                let q = memchr::memchr(b'"', &line[i..]).ok_or("an unclosed quote")? + i;
                if line.get(q + 1) == Some(&b'"') {
                    doubled = true;
                    i = q + 2;
                    continue;
                }
                spans[n] = if doubled {
                    let s = scratch.len();
                    let mut k = at + 1;
                    while k < q {
                        scratch.push(line[k]);
                        k += if line[k] == b'"' { 2 } else { 1 };
                    }
                    (s as u32 | SCRATCH)..(scratch.len() as u32 | SCRATCH)
                } else {
                    (at + 1) as u32..q as u32
                };
                at = q + 1;
                break;
            }
            n += 1;
            match line.get(at) {
                None => return Ok(n),
                Some(b',') => at += 1,
                Some(_) => return Err("text after a closing quote"),
            }
        } else {
            let end = memchr::memchr(b',', &line[at..]).map_or(line.len(), |i| at + i);
            spans[n] = at as u32..end as u32;
            n += 1;
            if end == line.len() {
                return Ok(n);
            }
            at = end + 1;
        }
    }
}

/// JSON Lines: the names looked up in each object.
#[derive(Clone, Debug)]
pub struct Json {
    pub names: Vec<String>,
}

impl Json {
    /// Parses one object, copying the value of each name it has into `scratch` (strings as
    /// they are, numbers and booleans as JSON writes them; null and absent: empty).
    pub fn parse(
        &self,
        line: &[u8],
        spans: &mut [Range<u32>],
        scratch: &mut Vec<u8>,
    ) -> Result<(), &'static str> {
        use serde_json::Value;
        scratch.clear();
        let obj: serde_json::Map<String, Value> =
            serde_json::from_slice(line).map_err(|_| "not a JSON object")?;
        for (i, name) in self.names.iter().enumerate() {
            let mut v = obj.get(name);
            if v.is_none() && name.contains('.') {
                let mut parts = name.split('.');
                v = obj.get(parts.next().unwrap_or(""));
                for p in parts {
                    v = v.and_then(|x| x.get(p));
                }
            }
            let s = scratch.len();
            match v {
                Some(Value::String(t)) => scratch.extend_from_slice(t.as_bytes()),
                Some(Value::Number(x)) => scratch.extend_from_slice(x.to_string().as_bytes()),
                Some(Value::Bool(b)) => {
                    scratch.extend_from_slice(if *b { b"true" } else { b"false" })
                }
                _ => {}
            }
            spans[i] = (s as u32 | SCRATCH)..(scratch.len() as u32 | SCRATCH);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::fields::slice;

    #[test]
    fn csv() {
        let c = Csv::from_header(b"time,ip,\"route\"").unwrap();
        assert_eq!(c.names, ["time", "ip", "route"]);
        let mut spans = vec![0..0; MAX_COLUMNS];
        let mut scratch = Vec::new();
        let line = b"1,\"a,b\",\"x\"\"y\"";
        c.parse(line, &mut spans, &mut scratch).unwrap();
        let f: Vec<&[u8]> = (0..3).map(|i| slice(line, &scratch, &spans[i])).collect();
        assert_eq!(f, [&b"1"[..], b"a,b", b"x\"y"]);
        assert!(c.parse(b"1,2", &mut spans, &mut scratch).is_err());
        assert!(c.parse(b"1,\"2,3", &mut spans, &mut scratch).is_err());
        assert!(c.parse(b"1,\"2\"x,3", &mut spans, &mut scratch).is_err());
        assert!(Csv::from_header(b"justone").is_err());
    }

    #[test]
    fn json() {
        let j = Json {
            names: vec!["a".into(), "b.c".into(), "n".into(), "missing".into()],
        };
        let mut spans = vec![0..0; 4];
        let mut scratch = Vec::new();
        let line = br#"{"a":"x\"y","b":{"c":7},"n":null}"#;
        j.parse(line, &mut spans, &mut scratch).unwrap();
        let f: Vec<&[u8]> = (0..4).map(|i| slice(line, &scratch, &spans[i])).collect();
        assert_eq!(f, [&b"x\"y"[..], b"7", b"", b""]);
        assert!(j.parse(b"[1]", &mut spans, &mut scratch).is_err());
        assert!(j.parse(b"{", &mut spans, &mut scratch).is_err());
    }
}
