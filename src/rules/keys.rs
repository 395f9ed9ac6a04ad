//! Override keys resolved to typed values, as a request of the rule's key class carries them.

use crate::keyed::key::MAX_KEY_LEN;
use crate::rules::model::{KeyClass, KeyPart, OverrideKey};
use crate::rules::request::{method_code, Request, METHODS};
use std::fmt;
use std::net::IpAddr;

/// An override key resolved to typed values (IP addresses already grouped).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct KeyValues {
    customer: Option<u64>,
    ip: Option<IpAddr>,
    api_key: Option<String>,
    route: Option<String>,
    method: Option<String>,
}

impl KeyValues {
    /// A request carrying exactly these values (its key id is the override's).
    pub(crate) fn request(&self) -> Request<'_> {
        Request {
            customer: self.customer,
            ip: self.ip,
            api_key: self.api_key.as_deref(),
            route: self.route.as_deref(),
            method: self.method.as_deref(),
            ..Request::new()
        }
    }
}

/// A customer id as rules files, `turnstile serve` and its clients write it: a decimal number
/// from 0 to 2^64 − 1, without sign, leading zeros or tag. Anything else is refused rather than
/// read as some number: `user:1` and `org:1` would otherwise share customer 1's counter, and
/// `01` would be customer 1. (String ids are the `api_key` class.)
pub fn parse_customer(s: &str) -> Result<u64, CustomerIdError> {
    let canonical =
        !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) && (s == "0" || !s.starts_with('0'));
    canonical
        .then(|| s.parse::<u64>().ok())
        .flatten()
        .ok_or_else(|| CustomerIdError(s.to_string()))
}

/// A text [`parse_customer`] refused (it holds the text): not a canonical decimal `u64`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CustomerIdError(pub String);

impl fmt::Display for CustomerIdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "`{}` is not a customer id: a customer id is a decimal number from 0 to 18446744073709551615 written without sign, leading zeros or tag (e.g. 241531); give string ids (user:241531, org:7) to a rule keyed by api_key",
            self.0
        )
    }
}

impl std::error::Error for CustomerIdError {}

fn mask_ip(a: IpAddr, v4: u8, v6: u8) -> IpAddr {
    match a {
        IpAddr::V4(x) => {
            let m = if v4 == 0 {
                0
            } else {
                u32::MAX << (32 - v4 as u32)
            };
            IpAddr::V4((u32::from(x) & m).into())
        }
        IpAddr::V6(x) => match x.to_ipv4_mapped() {
            Some(x4) => mask_ip(IpAddr::V4(x4), v4, v6),
            None => {
                let m = if v6 == 0 {
                    0
                } else {
                    u128::MAX << (128 - v6 as u32)
                };
                IpAddr::V6((u128::from(x) & m).into())
            }
        },
    }
}

fn parse_ip(s: &str, class: KeyClass) -> Result<IpAddr, String> {
    let (addr, len) = match s.split_once('/') {
        Some((a, l)) => (a, Some(l)),
        None => (s, None),
    };
    let a: IpAddr = addr.parse().map_err(|_| {
        format!(
            "`{s}` is not an IP address: write e.g. 203.0.113.9, 203.0.113.0/24 or 2001:db8::/64"
        )
    })?;
    let (max, group) = match a {
        IpAddr::V4(_) => (32u8, class.ipv4_prefix()),
        IpAddr::V6(_) => (128u8, class.ipv6_prefix()),
    };
    if let Some(l) = len {
        let l: u8 = l
            .parse()
            .ok()
            .filter(|l| *l <= max)
            .ok_or_else(|| format!("`{s}`: the prefix length must be 0..={max}"))?;
        if l < group {
            return Err(format!("`{s}` is wider than the rule's /{group} grouping: an override names one key; write one /{group} network (or narrower) per override"));
        }
    }
    Ok(mask_ip(a, class.ipv4_prefix(), class.ipv6_prefix()))
}

fn resolve_part(v: &mut KeyValues, part: KeyPart, s: &str, class: KeyClass) -> Result<(), String> {
    if s.is_empty() || s.len() > MAX_KEY_LEN || s.chars().any(char::is_control) {
        return Err(format!(
            "the {} key must be 1..={MAX_KEY_LEN} bytes of printable text",
            part.name()
        ));
    }
    match part {
        KeyPart::Customer => v.customer = Some(parse_customer(s).map_err(|e| e.to_string())?),
        KeyPart::Ip => v.ip = Some(parse_ip(s, class)?),
        KeyPart::ApiKey => v.api_key = Some(s.to_string()),
        KeyPart::Route => v.route = Some(s.to_string()),
        KeyPart::Method => {
            if method_code(s) == 0 {
                return Err(format!(
                    "unknown method `{s}`; expected one of {}",
                    METHODS.join(", ")
                ));
            }
            v.method = Some(s.to_ascii_uppercase());
        }
    }
    Ok(())
}

/// Resolves an override key under `class`.
pub(crate) fn resolve(class: KeyClass, key: &OverrideKey) -> Result<KeyValues, String> {
    let mut v = KeyValues::default();
    if class.is_global() {
        return Err(
            "a global rule has a single key: change the rule's limits instead of overriding".into(),
        );
    }
    match key {
        OverrideKey::Text(s) => {
            let mut parts = class.parts();
            match (parts.next(), parts.next()) {
                (Some(p), None) => resolve_part(&mut v, p, s, class)?,
                _ => return Err(format!("the rule is keyed by {class}: give the override key as a table with one value per part, e.g. key = {{ {} }}", class.parts().map(|p| format!("{} = \"…\"", p.name())).collect::<Vec<_>>().join(", "))),
            }
        }
        OverrideKey::Parts(ps) => {
            let mut seen = 0u8;
            for (p, s) in ps {
                if !class.has(*p) {
                    return Err(format!(
                        "the rule is keyed by {class}, which has no `{}` part",
                        p.name()
                    ));
                }
                if seen & p.bit() != 0 {
                    return Err(format!("`{}` is given twice", p.name()));
                }
                seen |= p.bit();
                resolve_part(&mut v, *p, s, class)?;
            }
            if seen != class.bits() {
                let missing: Vec<_> = class
                    .parts()
                    .filter(|p| seen & p.bit() == 0)
                    .map(|p| p.name())
                    .collect();
                return Err(format!(
                    "the rule is keyed by {class}: add {}",
                    missing.join(", ")
                ));
            }
        }
    }
    Ok(v)
}
