//! The explanation of a `ShouldRateLimit` answer ([`Envoy::explain`]): per descriptor, the
//! limit it matched, its mode, its counter key (and the key id the store hashes it to), the
//! counter before and after the request's hits, what remains, the reset, its status; overall,
//! the code and which descriptor decides. From peeks of the counters: nothing is counted.
//! The gRPC service sends it as JSON in the response's `x-turnstile-explain` metadata when
//! the request's metadata asks for it (`x-turnstile-explain: 1`), and `POST /json` in the
//! response header of that name when the request's header asks for it.
//!
//! [`Envoy::explain`]: super::Envoy::explain

use serde::Serialize;

/// One descriptor's explanation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DescriptorExplanation {
    /// The descriptor's entries, `key=value` joined by `,`.
    pub entries: String,
    /// What it matched: the limit's full key (`domain.key_value.subkey`), `override` (the
    /// request's own limit), `unlimited: <full key>`, or `none`.
    pub matched: String,
    /// The limit's name, requests per unit and unit, when one applies.
    pub limit: Option<(String, u32, &'static str)>,
    /// `hard`, `shadow` (over-limit reported, OK answered) or `quota` (over only when every
    /// quota descriptor is); `none` without a limit.
    pub mode: &'static str,
    /// The counter key, its parts (the domain for an override, the matched entries' keys and
    /// values) joined by `|`, invalid UTF-8 replaced.
    pub key: String,
    /// The key id the counter's store keeps it under (text: a u64).
    pub key_id: Option<String>,
    /// The request's hits for this descriptor.
    pub hits: u64,
    /// The counter before the hits.
    pub counter: u64,
    /// The counter after them (as the answer counts them: hits past the limit count too).
    pub counter_after: u64,
    /// What the answer reports as remaining.
    pub remaining: u32,
    /// Seconds until the counter resets.
    pub reset_after_s: i64,
    /// Whether the hits put it over its limit.
    pub over: bool,
    /// The status code the answer gives it: `OK` or `OVER_LIMIT`.
    pub code: &'static str,
}

/// A `ShouldRateLimit` answer's explanation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct EnvoyExplanation {
    /// The overall code: `OK` or `OVER_LIMIT` (after the global shadow mode).
    pub overall_code: &'static str,
    /// `SHADOW_MODE`: an over-limit answer is turned into OK.
    pub global_shadow_mode: bool,
    /// The index of the descriptor the answer's headers describe: the over-limit one that
    /// decides, or the one with the least remaining.
    pub decided_by: Option<usize>,
    /// Every descriptor, in request order.
    pub descriptors: Vec<DescriptorExplanation>,
}

/// A counter key (length-prefixed parts, `matcher::push_part`) as text: its parts joined by
/// `|`.
pub(crate) fn key_text(mut k: &[u8]) -> String {
    let mut parts = Vec::new();
    while let [a, b, c, d, rest @ ..] = k {
        let n = u32::from_le_bytes([*a, *b, *c, *d]) as usize;
        let Some(p) = rest.get(..n) else { break };
        parts.push(String::from_utf8_lossy(p));
        k = &rest[n..];
    }
    parts.join("|")
}

/// The metadata (gRPC) or header (`POST /json`) that asks for an explanation of the answer
/// (`1` or `true`), and that carries it back, as JSON.
pub const EXPLAIN: &str = "x-turnstile-explain";

/// Whether the request's [`EXPLAIN`] value (`None`: absent; `Err`: not text) asks for an
/// explanation; a value other than `1`, `true`, `0` or `false` is refused with the reason.
pub(crate) fn asks(value: Option<Result<&str, ()>>) -> Result<bool, String> {
    match value {
        None | Some(Ok("0" | "false")) => Ok(false),
        Some(Ok("1" | "true")) => Ok(true),
        Some(_) => Err(format!(
            "{EXPLAIN}: expected 1 (or true) to explain the answer in the response's {EXPLAIN}, 0 (or false) not to"
        )),
    }
}

/// A status code's name.
pub(crate) fn code_name(code: i32) -> &'static str {
    match code {
        super::response::CODE_OVER_LIMIT => "OVER_LIMIT",
        super::response::CODE_OK => "OK",
        _ => "UNKNOWN",
    }
}

impl EnvoyExplanation {
    /// As JSON in ASCII (a gRPC metadata value is printable ASCII): characters past it
    /// escaped as JSON escapes them (`\uXXXX`, surrogate pairs beyond the BMP).
    pub fn to_ascii_json(&self) -> String {
        // Writing plain data to a string cannot fail.
        let json = serde_json::to_string(self).unwrap_or_default();
        let mut out = String::with_capacity(json.len());
        for ch in json.chars() {
            if ch.is_ascii() && !ch.is_ascii_control() {
                out.push(ch);
            } else {
                let mut units = [0u16; 2];
                for u in ch.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{u:04x}"));
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_as_text() {
        let mut k = Vec::new();
        for p in ["d", "user", "al|ice"] {
            super::super::matcher::push_part(&mut k, p);
        }
        assert_eq!(key_text(&k), "d|user|al|ice");
        assert_eq!(key_text(&k[..k.len() - 1]), "d|user");
    }

    #[test]
    fn metadata_json_is_printable_ascii_and_still_json() {
        let x = EnvoyExplanation {
            overall_code: "OK",
            global_shadow_mode: false,
            decided_by: None,
            descriptors: vec![DescriptorExplanation {
                entries: "k=vé😀\"\t".into(),
                matched: "none".into(),
                limit: None,
                mode: "none",
                key: String::new(),
                key_id: None,
                hits: 1,
                counter: 0,
                counter_after: 0,
                remaining: 0,
                reset_after_s: 0,
                over: false,
                code: "OK",
            }],
        };
        let s = x.to_ascii_json();
        assert!(s.bytes().all(|b| (0x20..0x7f).contains(&b)), "{s}");
        let v: serde_json::Value = serde_json::from_str(&s).unwrap();
        assert_eq!(v["descriptors"][0]["entries"], "k=vé😀\"\t");
    }
}
