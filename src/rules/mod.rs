//! Rules: who gets which limit (not yet implemented).

use std::fmt;

/// A parsed, validated rules file.
#[derive(Debug)]
pub struct Rules {
    _private: (),
}

/// Why a rules file was refused: where, what, how to fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RulesError {
    /// The file (or origin label) it came from.
    pub origin: String,
    /// 1-based line, 0 if unknown.
    pub line: usize,
    /// 1-based column, 0 if unknown.
    pub column: usize,
    /// What is wrong and how to fix it.
    pub message: String,
}

impl fmt::Display for RulesError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}: {}", self.origin, self.line, self.column, self.message)
    }
}

impl std::error::Error for RulesError {}

impl Rules {
    /// Parses and validates rules from TOML text; `origin` names the source in errors.
    pub fn parse(_text: &str, origin: &str) -> Result<Rules, RulesError> {
        Err(RulesError { origin: origin.to_string(), line: 0, column: 0, message: "rules are not implemented yet".into() })
    }
}
