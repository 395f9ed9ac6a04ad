//! Timestamps as access logs write them, to nanoseconds since the Unix epoch (UTC): the
//! common log format's `10/Oct/2000:13:55:36 -0700` (nginx `$time_local`, Apache `%t`),
//! ISO 8601 / RFC 3339 (`2018-07-02T22:23:00.186641Z`, nginx `$time_iso8601`, Envoy's
//! `START_TIME`, AWS ALB), and epoch numbers (`1700000000.123`: seconds, milliseconds,
//! microseconds or nanoseconds by magnitude, nginx `$msec`). Byte-level, no allocation.

/// Why a timestamp was refused.
pub const BAD_TIME: &str = "timestamp not understood (expected 10/Oct/2000:13:55:36 -0700, \
     2000-10-10T13:55:36Z or epoch seconds)";

/// Nanoseconds since the Unix epoch of `b`, in any of the module's forms.
#[inline]
pub fn parse(b: &[u8]) -> Option<u64> {
    let b = trim(b);
    match b {
        [d0, d1, b'/', ..] if d0.is_ascii_digit() && d1.is_ascii_digit() => clf(b),
        [y, _, _, _, b'-', ..] if y.is_ascii_digit() => iso(b),
        [c, ..] if c.is_ascii_digit() => epoch(b),
        _ => None,
    }
}

fn trim(mut b: &[u8]) -> &[u8] {
    if let [b'[', rest @ .., b']'] = b {
        b = rest;
    }
    b.trim_ascii()
}

fn digits(b: &[u8]) -> Option<u64> {
    if b.is_empty() || b.len() > 19 {
        return None;
    }
    let mut v = 0u64;
    for &c in b {
        let d = c.wrapping_sub(b'0');
        if d > 9 {
            return None;
        }
        v = v * 10 + d as u64;
    }
    Some(v)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's `days_from_civil`).
pub fn days_from_civil(y: i64, m: u64, d: u64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy as i64;
    era * 146_097 + doe - 719_468
}

/// (year, month, day) of a day count since 1970-01-01 (the inverse, `civil_from_days`).
pub fn civil_from_days(z: i64) -> (i64, u64, u64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u64;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u64;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// Nanoseconds of a date and time `[year, month, day, hour, minute, second]` at `offset_s`
/// seconds east of UTC, plus `frac` ns; `None` before 1970 or for an invalid field.
fn to_ns(f: [u64; 6], frac: u64, offset_s: i64) -> Option<u64> {
    let [y, mo, d, h, mi, s] = f;
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || s > 60 {
        return None;
    }
    let days = days_from_civil(y as i64, mo, d);
    let secs = days * 86_400 + (h * 3600 + mi * 60 + s) as i64 - offset_s;
    u64::try_from(secs)
        .ok()?
        .checked_mul(1_000_000_000)?
        .checked_add(frac)
}

const MONTHS: [&[u8; 3]; 12] = [
    b"Jan", b"Feb", b"Mar", b"Apr", b"May", b"Jun", b"Jul", b"Aug", b"Sep", b"Oct", b"Nov", b"Dec",
];

/// `10/Oct/2000:13:55:36 -0700` (the zone optional: UTC).
fn clf(b: &[u8]) -> Option<u64> {
    if b.len() < 20
        || b[2] != b'/'
        || b[6] != b'/'
        || b[11] != b':'
        || b[14] != b':'
        || b[17] != b':'
    {
        return None;
    }
    let mon = MONTHS.iter().position(|m| m[..] == b[3..6])? as u64 + 1;
    let (frac, rest) = fraction(&b[20..]);
    let off = match rest.trim_ascii_start() {
        [] => 0,
        z => zone(z)?,
    };
    let f = [
        digits(&b[7..11])?,
        mon,
        digits(&b[0..2])?,
        digits(&b[12..14])?,
        digits(&b[15..17])?,
        digits(&b[18..20])?,
    ];
    to_ns(f, frac, off)
}

/// `2018-07-02T22:23:00.186641Z`, `2018-07-02 22:23:00+02:00`, `2018-07-02T22:23:00`.
fn iso(b: &[u8]) -> Option<u64> {
    if b.len() < 19 || b[4] != b'-' || b[7] != b'-' || b[13] != b':' || b[16] != b':' {
        return None;
    }
    if !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    let (frac, rest) = fraction(&b[19..]);
    let off = match rest {
        [] | [b'Z' | b'z'] => 0,
        z => zone(z)?,
    };
    let f = [
        digits(&b[0..4])?,
        digits(&b[5..7])?,
        digits(&b[8..10])?,
        digits(&b[11..13])?,
        digits(&b[14..16])?,
        digits(&b[17..19])?,
    ];
    to_ns(f, frac, off)
}

/// `.123456` or `,123` at the start of `b`: (nanoseconds, the rest).
fn fraction(b: &[u8]) -> (u64, &[u8]) {
    let [b'.' | b',', rest @ ..] = b else {
        return (0, b);
    };
    let n = rest.iter().take_while(|c| c.is_ascii_digit()).count();
    let mut ns = 0u64;
    for i in 0..9 {
        ns = ns * 10
            + rest
                .get(i)
                .filter(|_| i < n)
                .map_or(0, |c| (c - b'0') as u64);
    }
    (ns, &rest[n..])
}

/// `+0200`, `-07:00`, `+02`: seconds east of UTC.
fn zone(z: &[u8]) -> Option<i64> {
    let sign = match z.first()? {
        b'+' => 1,
        b'-' => -1,
        _ => return None,
    };
    let z = &z[1..];
    let (h, m) = match z.len() {
        2 => (digits(z)?, 0),
        4 => (digits(&z[..2])?, digits(&z[2..])?),
        5 if z[2] == b':' => (digits(&z[..2])?, digits(&z[3..])?),
        _ => return None,
    };
    (h <= 23 && m <= 59).then(|| sign * (h * 3600 + m * 60) as i64)
}

/// `1700000000`, `1700000000.123`, `1700000000123` (ms), and µs or ns likewise.
fn epoch(b: &[u8]) -> Option<u64> {
    let dot = b.iter().position(|&c| c == b'.');
    let (int, frac) = match dot {
        Some(i) => (&b[..i], fraction(&b[i..])),
        None => (b, (0, &b[b.len()..])),
    };
    if !frac.1.is_empty() {
        return None;
    }
    let v = digits(int)?;
    // By magnitude: under 10^11 seconds (year 5138), under 10^14 ms, under 10^17 µs.
    let ns = if v < 100_000_000_000 {
        v.checked_mul(1_000_000_000)?.checked_add(frac.0)?
    } else if v < 100_000_000_000_000 {
        v * 1_000_000 + frac.0 / 1000
    } else if v < 100_000_000_000_000_000 {
        v * 1000 + frac.0 / 1_000_000
    } else {
        v
    };
    Some(ns)
}

/// `2000-10-10T13:55:36.123Z` for a report: milliseconds, UTC.
pub fn format_iso(ns: u64) -> String {
    let s = (ns / 1_000_000_000) as i64;
    let (y, m, d) = civil_from_days(s.div_euclid(86_400));
    let r = s.rem_euclid(86_400);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        r / 3600,
        r / 60 % 60,
        r % 60,
        ns / 1_000_000 % 1000
    )
}

/// `10/Oct/2000:13:55:36 +0000` (the common log format), UTC.
pub fn format_clf(secs: u64, out: &mut Vec<u8>) {
    let (y, m, d) = civil_from_days((secs / 86_400) as i64);
    let r = secs % 86_400;
    use std::io::Write;
    let _ = write!(
        out,
        "{d:02}/{}/{y:04}:{:02}:{:02}:{:02} +0000",
        std::str::from_utf8(MONTHS[m as usize - 1]).unwrap_or("Jan"),
        r / 3600,
        r / 60 % 60,
        r % 60
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn forms() {
        // 2000-10-10T20:55:36Z = 971211336.
        assert_eq!(parse(b"10/Oct/2000:13:55:36 -0700"), Some(971_211_336 * S));
        assert_eq!(
            parse(b"[10/Oct/2000:13:55:36 -0700]"),
            Some(971_211_336 * S)
        );
        assert_eq!(parse(b"10/Oct/2000:20:55:36"), Some(971_211_336 * S));
        assert_eq!(parse(b"2000-10-10T20:55:36Z"), Some(971_211_336 * S));
        assert_eq!(parse(b"2000-10-10T22:55:36+02:00"), Some(971_211_336 * S));
        assert_eq!(
            parse(b"2000-10-10 20:55:36.5"),
            Some(971_211_336 * S + S / 2)
        );
        assert_eq!(
            parse(b"2000-10-10T20:55:36.186641Z"),
            Some(971_211_336 * S + 186_641_000)
        );
        assert_eq!(parse(b"971211336"), Some(971_211_336 * S));
        assert_eq!(parse(b"971211336.25"), Some(971_211_336 * S + S / 4));
        assert_eq!(parse(b"971211336250"), Some(971_211_336 * S + S / 4));
        for bad in [
            &b""[..],
            b"-",
            b"10/Foo/2000:13:55:36 -0700",
            b"2000-13-10T20:55:36Z",
            b"2000-10-10T20:55:36Q",
            b"12ab",
            b"1969-12-31T23:59:59Z",
            b"99999999999999999999999",
        ] {
            assert_eq!(parse(bad), None, "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn civil_round_trip() {
        for z in [-1000i64, 0, 1, 11_016, 19_000, 60_000] {
            let (y, m, d) = civil_from_days(z);
            assert_eq!(days_from_civil(y, m, d), z);
        }
        assert_eq!(
            format_iso(971_211_336 * S + 5_000_000),
            "2000-10-10T20:55:36.005Z"
        );
        let mut v = Vec::new();
        format_clf(971_211_336, &mut v);
        assert_eq!(v, b"10/Oct/2000:20:55:36 +0000");
        assert_eq!(parse(&v), Some(971_211_336 * S));
    }
}
