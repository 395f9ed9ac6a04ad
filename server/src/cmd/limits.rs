//! `TURNSTILE.LIMITS SET class key spec`, `TURNSTILE.LIMITS GET class key`,
//! `TURNSTILE.LIMITS DEL class key`: a key's own limit in a limits class ([`crate::limits`]).
//! `SET` and `DEL` change the server and need admin (`AUTH admin PASSWORD`, or a loopback
//! listener with no `--admin-pass`); `GET` what a check needs. The operation runs on a
//! blocking thread: the connection hands it to its driver as a [`RemoteCall`] and answers
//! when it is done.

use super::{ArgCursor, CmdError};
use crate::config::Access;
use crate::limits::{Done, Op, Request};
use crate::resp::Out;

/// A parsed `TURNSTILE.LIMITS`.
pub(crate) struct LimitsCommand {
    req: Request,
}

/// The text of the subcommands, for errors.
const USAGE: &str = "TURNSTILE.LIMITS SET class key spec | GET class key | DEL class key";

impl LimitsCommand {
    pub(crate) fn parse(c: &mut ArgCursor<'_>) -> Result<Self, CmdError> {
        let sub = c.bytes()?;
        let op = if super::named(sub, "SET") {
            Op::Set(String::new())
        } else if super::named(sub, "GET") {
            Op::Get
        } else if super::named(sub, "DEL") {
            Op::Del
        } else {
            return Err(CmdError::Syntax(format!(
                "unknown subcommand '{}'; expected {USAGE}",
                String::from_utf8_lossy(&sub[..sub.len().min(64)])
            )));
        };
        let class = c.str("class and key")?.to_string();
        let key = c.str("class and key")?.to_string();
        let op = match op {
            Op::Set(_) => {
                // The spec may come as one argument or split at its spaces (`5/1s burst=10`
                // unquoted): its words, joined.
                let mut words = Vec::new();
                while let Some(w) = c.next() {
                    words.push(std::str::from_utf8(w).map_err(|_| CmdError::NotUtf8("spec"))?);
                }
                if words.is_empty() {
                    return Err(CmdError::Syntax(format!(
                        "SET needs a spec: a plan's name (pro) or a limit (5/1s burst=10); {USAGE}"
                    )));
                }
                Op::Set(words.join(" "))
            }
            op => {
                if c.has_more() {
                    return Err(CmdError::Syntax(format!("too many arguments; {USAGE}")));
                }
                op
            }
        };
        Ok(Self {
            req: Request { class, key, op },
        })
    }

    /// The call to run on a blocking thread, or the refusal written to `o`.
    pub(crate) fn apply(self, access: Access, o: &mut Out<'_>) -> Option<LimitsCall> {
        if self.req.op.changes() && access < Access::Admin {
            o.error(
                "NOPERM TURNSTILE.LIMITS SET and DEL change the server: AUTH admin PASSWORD \
                 (--admin-pass) first, or connect to a loopback listener of a server with no \
                 --admin-pass",
            );
            return None;
        }
        Some(LimitsCall(self.req))
    }
}

/// A `TURNSTILE.LIMITS` to run off the I/O worker.
pub(crate) struct LimitsCall(pub(crate) Request);

/// The reply of a `TURNSTILE.LIMITS`: `OK` for SET, 1 or 0 for DEL, and for GET
/// `[entry, limit, decides]` (entry and limit nil when none).
pub(crate) fn reply(r: Result<Done, crate::limits::Refused>, o: &mut Out<'_>) {
    match r {
        Err(e) => o.error_fmt(format_args!("ERR {}", e.message)),
        Ok(Done::Set(_)) => o.simple("OK"),
        Ok(Done::Del(had)) => o.int(i64::from(had)),
        Ok(Done::Get {
            entry,
            limit,
            decides,
        }) => {
            o.array(3);
            for v in [entry, limit] {
                match v {
                    Some(t) => o.bulk(t.as_bytes()),
                    None => o.null(),
                }
            }
            o.bulk(decides.as_bytes());
        }
    }
}
