//! A descriptor's `metadata`: any YAML mapping, kept as the `google.protobuf.Struct` the
//! response's `dynamic_metadata` carries.
//!
//! Scalars are typed as upstream's YAML 1.1 reader types them before its conversion to a
//! `Struct`: a plain `~`/`null`/empty scalar is null; `true`/`false`, `yes`/`no`, `on`/`off`
//! and `y`/`n` (in their lower, capitalised and upper case forms) are booleans; integers (also
//! `0x`, `0o` and `0b` forms and `_` separators) and decimals are numbers (a `Struct` number is
//! a double); anything else, and every quoted scalar, is a string. Keys are read as text.

use super::{ConfigError, Ctx};
use crate::envoy::yaml::{Kind, Node};
use envoy_types::pb::google::protobuf::value::Kind as V;
use envoy_types::pb::google::protobuf::{ListValue, NullValue, Struct, Value};

/// `metadata:` of a descriptor: a mapping (or nothing). An empty one is none, as upstream.
pub(super) fn read(cx: &Ctx, v: &Node) -> Result<Option<Struct>, ConfigError> {
    let fields = cx.map(v, "metadata")?;
    if fields.is_empty() {
        return Ok(None);
    }
    Ok(Some(structure(cx, fields)?))
}

fn structure(cx: &Ctx, fields: &[(Node, Node)]) -> Result<Struct, ConfigError> {
    let mut s = Struct::default();
    for (k, v) in fields {
        let Kind::Scalar(key, _) = &k.kind else {
            return Err(cx.err(
                k.pos,
                format!("a `metadata` key must be text, not {}", k.describe()),
            ));
        };
        // A repeated key: the later value, as upstream's reader keeps it.
        s.fields.insert(key.clone(), value(cx, v)?);
    }
    Ok(s)
}

fn value(cx: &Ctx, n: &Node) -> Result<Value, ConfigError> {
    let kind = match &n.kind {
        Kind::Scalar(s, false) => V::StringValue(s.clone()),
        Kind::Scalar(s, true) => scalar(s),
        Kind::Seq(items) => V::ListValue(ListValue {
            values: items
                .iter()
                .map(|i| value(cx, i))
                .collect::<Result<_, _>>()?,
        }),
        Kind::Map(fields) => V::StructValue(structure(cx, fields)?),
    };
    Ok(Value { kind: Some(kind) })
}

/// A plain scalar, typed as YAML 1.1 types it.
fn scalar(s: &str) -> V {
    match s {
        "" | "~" | "null" | "Null" | "NULL" => return V::NullValue(NullValue::NullValue as i32),
        "y" | "Y" | "yes" | "Yes" | "YES" | "on" | "On" | "ON" | "true" | "True" | "TRUE" => {
            return V::BoolValue(true)
        }
        "n" | "N" | "no" | "No" | "NO" | "off" | "Off" | "OFF" | "false" | "False" | "FALSE" => {
            return V::BoolValue(false)
        }
        ".inf" | ".Inf" | ".INF" | "+.inf" | "+.Inf" | "+.INF" => {
            return V::NumberValue(f64::INFINITY)
        }
        "-.inf" | "-.Inf" | "-.INF" => return V::NumberValue(f64::NEG_INFINITY),
        ".nan" | ".NaN" | ".NAN" => return V::NumberValue(f64::NAN),
        _ => {}
    }
    number(s).map_or_else(|| V::StringValue(s.to_string()), V::NumberValue)
}

fn number(s: &str) -> Option<f64> {
    let t = s.replace('_', "");
    let (neg, digits) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t.as_str()),
    };
    let radix = |p: &str, r: u32| {
        digits
            .strip_prefix(p)
            .and_then(|d| u64::from_str_radix(d, r).ok())
    };
    let int = radix("0x", 16)
        .or_else(|| radix("0o", 8))
        .or_else(|| radix("0b", 2))
        .or_else(|| {
            // A leading 0 is octal in YAML 1.1 (`010` is 8).
            (digits.len() > 1 && digits.starts_with('0'))
                .then(|| u64::from_str_radix(&digits[1..], 8).ok())
                .flatten()
        });
    if let Some(i) = int {
        let f = i as f64;
        return Some(if neg { -f } else { f });
    }
    // Decimal numbers: digits with an optional fraction and exponent (not `inf`, `nan` or a
    // lone `.`, which Rust's parser would take).
    let ok = !digits.is_empty()
        && digits.bytes().any(|b| b.is_ascii_digit())
        && digits
            .bytes()
            .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'+' | b'-'));
    if !ok {
        return None;
    }
    t.parse::<f64>().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn num(s: &str) -> Option<f64> {
        match scalar(s) {
            V::NumberValue(f) => Some(f),
            _ => None,
        }
    }

    #[test]
    fn scalars_are_typed_as_yaml_1_1() {
        assert_eq!(num("12"), Some(12.0));
        assert_eq!(num("-1_000"), Some(-1000.0));
        assert_eq!(num("0x1f"), Some(31.0));
        assert_eq!(num("010"), Some(8.0));
        assert_eq!(num("0b101"), Some(5.0));
        assert_eq!(num("1.5e3"), Some(1500.0));
        assert_eq!(num("infinity"), None);
        assert_eq!(num("1.2.3"), None);
        assert_eq!(
            num("09"),
            Some(9.0),
            "not octal: a decimal, as YAML 1.1 floats read it"
        );
        assert_eq!(scalar("on"), V::BoolValue(true));
        assert_eq!(scalar("No"), V::BoolValue(false));
        assert_eq!(scalar("~"), V::NullValue(0));
        assert_eq!(scalar("service_1"), V::StringValue("service_1".into()));
    }
}
