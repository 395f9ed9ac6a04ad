//! Value parsers shared by the subcommands' options.

/// Parses counts like `1000000`, `1_000_000`, `1M`, `10k`, `1e6` (a clap value parser).
pub fn parse_count(s: &str) -> crate::Result<u64> {
    let t = s.replace('_', "");
    let (num, mul) = match t.chars().last() {
        Some('k' | 'K') => (&t[..t.len() - 1], 1_000u64),
        Some('m' | 'M') => (&t[..t.len() - 1], 1_000_000),
        Some('g' | 'G') => (&t[..t.len() - 1], 1_000_000_000),
        _ => (&t[..], 1),
    };
    if let Ok(v) = num.parse::<u64>() {
        return v
            .checked_mul(mul)
            .ok_or_else(|| format!("`{s}` is too large").into());
    }
    match num.parse::<f64>() {
        Ok(f) if f.is_finite() && f >= 0.0 && f * (mul as f64) < 1.8e19 => {
            Ok((f * mul as f64) as u64)
        }
        _ => Err(format!("`{s}` is not a count (examples: 1000000, 1M, 10k, 1e6)").into()),
    }
}

#[cfg(test)]
mod tests {
    use super::parse_count;

    #[test]
    fn counts() {
        assert_eq!(parse_count("1M").ok(), Some(1_000_000));
        assert_eq!(parse_count("10k").ok(), Some(10_000));
        assert_eq!(parse_count("1_000").ok(), Some(1_000));
        assert_eq!(parse_count("1e6").ok(), Some(1_000_000));
        assert!(parse_count("banana").is_err());
        assert!(parse_count("-1").is_err());
        assert!(parse_count("1e30").is_err());
    }
}
