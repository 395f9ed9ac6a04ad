//! What a store does with a new key that finds no room: [`FullPolicy`], which the table applies
//! when a probe range is full of live keys (`table::Shard::make_room`), and which the builder
//! and a reload choose.

/// What to do with a new key when its probe range is full of live keys.
///
/// The default is `AllowUntracked`, chosen by measurement (`docs/memory.md`, "A key flood";
/// `tests/store_flood.rs`): under a flood of ten times the capacity in one-shot keys, `Reject`
/// refused 45 % of honest users' requests for a window limit, `EvictStalest` reset every
/// abuser being limited (a window limit's records all become idle at the same instant, so
/// "closest to idle" cannot tell an abuser from a one-shot key), and `AllowUntracked` refused
/// no honest user and kept every abuser it already tracked limited: only keys new while the
/// range is full go untracked, until it has room again.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum FullPolicy {
    /// Refuse it: the check answers [`Outcome::StoreFull`](crate::Outcome::StoreFull) (fail closed), with a retry hint.
    Reject,
    /// Admit it without tracking: [`Outcome::Untracked`](crate::Outcome::Untracked) (fail open).
    #[default]
    AllowUntracked,
    /// Evict the record closest to idle in the probe range and track the new key.
    EvictStalest,
}

impl std::str::FromStr for FullPolicy {
    type Err = crate::UnknownName;
    fn from_str(s: &str) -> Result<Self, crate::UnknownName> {
        match s {
            "reject" => Ok(FullPolicy::Reject),
            "allow" | "allow_untracked" => Ok(FullPolicy::AllowUntracked),
            "evict" | "evict_stalest" => Ok(FullPolicy::EvictStalest),
            _ => Err(crate::UnknownName::new(
                "full-store policy",
                s,
                "reject, allow_untracked or evict_stalest",
            )),
        }
    }
}
