//! The keyed store (see issue: keyed store).
