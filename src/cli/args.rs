//! A small, strict option parser: `--name value` or `--name=value`, flags, positionals.
//! Unknown or malformed options are errors that name the option and say what was expected.

use std::str::FromStr;

/// Remaining command-line words.
pub struct Args {
    words: Vec<String>,
}

impl Args {
    /// Wraps the words after the subcommand.
    pub fn new(words: Vec<String>) -> Self {
        Self { words }
    }

    /// Whether `--help` or `-h` was given (consumed).
    pub fn help(&mut self) -> bool {
        self.flag("help") || self.take_exact("-h")
    }

    fn take_exact(&mut self, w: &str) -> bool {
        if let Some(i) = self.words.iter().position(|x| x == w) {
            self.words.remove(i);
            true
        } else {
            false
        }
    }

    /// Consumes `--name` if present.
    pub fn flag(&mut self, name: &str) -> bool {
        self.take_exact(&format!("--{name}"))
    }

    /// Consumes `--name V` / `--name=V` and parses V.
    pub fn opt<T: FromStr>(&mut self, name: &str) -> Result<Option<T>, String>
    where
        T::Err: std::fmt::Display,
    {
        let long = format!("--{name}");
        let eq = format!("--{name}=");
        let Some(i) = self
            .words
            .iter()
            .position(|w| *w == long || w.starts_with(&eq))
        else {
            return Ok(None);
        };
        let w = self.words.remove(i);
        let v = if let Some(v) = w.strip_prefix(&eq) {
            v.to_string()
        } else if i < self.words.len() && !self.words[i].starts_with("--") {
            self.words.remove(i)
        } else {
            return Err(format!("option --{name} needs a value"));
        };
        v.parse::<T>()
            .map(Some)
            .map_err(|e| format!("option --{name}: cannot use `{v}`: {e}"))
    }

    /// Consumes the next positional word.
    pub fn positional(&mut self) -> Option<String> {
        let i = self.words.iter().position(|w| !w.starts_with("--"))?;
        Some(self.words.remove(i))
    }

    /// Errors if anything is left over.
    pub fn finish(self) -> Result<(), String> {
        match self.words.first() {
            None => Ok(()),
            Some(w) => Err(format!("unexpected argument `{w}` (see --help)")),
        }
    }
}

/// Parses counts like `1000000`, `1_000_000`, `1M`, `10k`, `1e6`.
pub fn parse_count(s: &str) -> Result<u64, String> {
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
            .ok_or_else(|| format!("`{s}` is too large"));
    }
    match num.parse::<f64>() {
        Ok(f) if f.is_finite() && f >= 0.0 && f * (mul as f64) < 1.8e19 => {
            Ok((f * mul as f64) as u64)
        }
        _ => Err(format!(
            "`{s}` is not a count (examples: 1000000, 1M, 10k, 1e6)"
        )),
    }
}

/// A count option.
pub fn opt_count(a: &mut Args, name: &str) -> Result<Option<u64>, String> {
    match a.opt::<String>(name)? {
        None => Ok(None),
        Some(v) => parse_count(&v)
            .map(Some)
            .map_err(|e| format!("option --{name}: {e}")),
    }
}
