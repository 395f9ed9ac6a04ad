//! The error of reading a name from a fixed set: an algorithm, a full-store policy, a priority,
//! a rules file's modes and policies. One type for all of them, so that a caller (a
//! configuration loader, a command-line parser) can tell "not one of these names" from other
//! errors and show the names accepted.

use std::borrow::Cow;
use std::fmt;

/// A name that is not one of those accepted: which kind of name, what was given, and what to
/// write instead. Displays as ``unknown algorithm `x`; expected one of fixed_window, …``.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct UnknownName {
    /// What the name names (`algorithm`, `full-store policy`, `priority`, ...).
    pub what: &'static str,
    /// The text given.
    pub given: String,
    /// The names accepted, as the message lists them (with what each means where that helps).
    pub expected: Cow<'static, str>,
}

impl UnknownName {
    /// `given` is not a name of `what`; `expected` lists those that are.
    pub fn new(what: &'static str, given: &str, expected: impl Into<Cow<'static, str>>) -> Self {
        Self {
            what,
            given: given.to_string(),
            expected: expected.into(),
        }
    }
}

impl fmt::Display for UnknownName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown {} `{}`; expected {}",
            self.what, self.given, self.expected
        )
    }
}

impl std::error::Error for UnknownName {}
