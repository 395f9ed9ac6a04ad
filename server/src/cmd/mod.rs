//! RESP commands, parsed once into types that borrow the connection's input buffer, then
//! applied by a `match` (in the shape of mini-redis's `cmd/`): [`Command::parse`] looks the name
//! up in [`COMMANDS`] (which also answers `COMMAND`, so a command's arity lives in one place),
//! checks the arity, and lets the command's family read its arguments through an [`ArgCursor`].
//! Nothing here allocates but an error's text (and `TURNSTILE.LIMITS`, an admin command off the
//! check path, which owns its request to run it on another thread).
//!
//! * `throttle`: `CL.THROTTLE`.
//! * `rules`: `TURNSTILE.CHECK`, `TURNSTILE.PEEK`, `TURNSTILE.REFUND`.
//! * `explain`: `TURNSTILE.EXPLAIN`, why a check would be answered as it would.
//! * `settle`: `TURNSTILE.SETTLE`, a reserved cost settled at the actual one.
//! * `limits`: `TURNSTILE.LIMITS SET|GET|DEL`, keys' own limits.
//! * `session`: `AUTH`, `HELLO`, `CLIENT`, `SELECT`, `PING`, `ECHO`, `QUIT`, `RESET`.
//! * `introspect`: `COMMAND`, `INFO` (its text in `info`), `ROLE`, `CONFIG`.
//! * `MULTI`, `EXEC`, `DISCARD`, `WATCH`, `UNWATCH` are the connection's own
//!   ([`crate::conn`]).

pub(crate) mod client;
pub(crate) mod explain;
pub(crate) mod info;
pub(crate) mod introspect;
pub(crate) mod limits;
pub(crate) mod remote;
pub(crate) mod rules;
pub(crate) mod session;
pub(crate) mod settle;
pub(crate) mod throttle;

/// The Redis version whose protocol the server speaks, for `INFO` (clients read it to pick
/// features).
pub(crate) const REDIS_VERSION: &str = "7.0.0";

use std::fmt;
use std::ops::Range;

/// The arguments of one command: ranges into the buffer they were parsed from.
#[derive(Clone, Copy)]
pub(crate) struct Args<'a> {
    pub(crate) buf: &'a [u8],
    pub(crate) ranges: &'a [Range<usize>],
}

impl<'a> Args<'a> {
    pub(crate) fn len(&self) -> usize {
        self.ranges.len()
    }
    pub(crate) fn get(&self, i: usize) -> &'a [u8] {
        &self.buf[self.ranges[i].clone()]
    }
    /// The command's name (the first argument; a command has at least one).
    pub(crate) fn name(&self) -> &'a [u8] {
        self.get(0)
    }
}

/// Reads a command's arguments after its name, in order (mini-redis's `Parse`).
pub(crate) struct ArgCursor<'a> {
    args: Args<'a>,
    next: usize,
}

impl<'a> ArgCursor<'a> {
    fn new(args: Args<'a>) -> Self {
        Self { args, next: 1 }
    }
    /// The next argument, if any.
    pub(crate) fn next(&mut self) -> Option<&'a [u8]> {
        let a = (self.next < self.args.len()).then(|| self.args.get(self.next))?;
        self.next += 1;
        Some(a)
    }
    /// The next argument, which must be there (arity was checked).
    pub(crate) fn bytes(&mut self) -> Result<&'a [u8], CmdError> {
        self.next().ok_or(CmdError::WrongArgs)
    }
    /// The next argument as an integer, Redis's way ([`parse_i64`]).
    pub(crate) fn i64(&mut self) -> Result<i64, CmdError> {
        parse_i64(self.bytes()?)
    }
    /// The next argument as UTF-8.
    pub(crate) fn str(&mut self, what: &'static str) -> Result<&'a str, CmdError> {
        std::str::from_utf8(self.bytes()?).map_err(|_| CmdError::NotUtf8(what))
    }
    /// Whether arguments are left.
    pub(crate) fn has_more(&self) -> bool {
        self.next < self.args.len()
    }
    /// Whether the next argument is `word` (any case), consuming it if so.
    pub(crate) fn eat(&mut self, word: &str) -> bool {
        let yes = self.next < self.args.len() && named(self.args.get(self.next), word);
        self.next += usize::from(yes);
        yes
    }
    /// The command must end here.
    pub(crate) fn finish(&self) -> Result<(), CmdError> {
        if self.has_more() {
            Err(CmdError::WrongArgs)
        } else {
            Ok(())
        }
    }
}

/// A subcommand's wrong number of arguments named as Redis names it (`client|setname`).
pub(crate) fn sub_args<T>(r: Result<T, CmdError>, full_name: &'static str) -> Result<T, CmdError> {
    r.map_err(|e| match e {
        CmdError::WrongArgs => CmdError::SubcommandArgs(full_name),
        e => e,
    })
}

/// A command refused before it ran; its `Display` is the error reply, code first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum CmdError {
    /// Wrong number of arguments (the reply names the command).
    WrongArgs,
    /// Not an integer.
    NotInteger,
    /// Negative where a count is needed.
    NotPositive,
    /// Too large to represent.
    OutOfRange,
    /// An argument that must be UTF-8 text is not.
    NotUtf8(&'static str),
    /// A syntax error, in words.
    Syntax(String),
    /// No such command (the reply names it and its first arguments).
    Unknown,
    /// A subcommand this command does not have.
    UnknownSubcommand,
    /// Wrong number of arguments for a subcommand: its full name as Redis writes it
    /// (`client|setname`).
    SubcommandArgs(&'static str),
    /// Anything else: the whole reply, code first.
    Other(String),
}

impl fmt::Display for CmdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CmdError::WrongArgs => f.write_str("ERR wrong number of arguments"),
            CmdError::NotInteger => f.write_str("ERR value is not an integer or out of range"),
            CmdError::NotPositive => f.write_str("ERR value is out of range, must be positive"),
            CmdError::OutOfRange => f.write_str("ERR value is out of range"),
            CmdError::NotUtf8(what) => write!(f, "ERR {what} must be UTF-8"),
            CmdError::Syntax(m) => write!(f, "ERR {m}"),
            CmdError::Unknown => f.write_str("ERR unknown command"),
            CmdError::UnknownSubcommand => f.write_str("ERR unknown subcommand"),
            CmdError::SubcommandArgs(name) => {
                write!(f, "ERR wrong number of arguments for '{name}' command")
            }
            CmdError::Other(m) => f.write_str(m),
        }
    }
}

impl CmdError {
    /// Writes the reply for `args`, in Redis's words where Redis has words for it (the
    /// command and its first arguments named, at most 128 bytes of each), straight into the
    /// output: a refusal makes no string of its own.
    pub(crate) fn write(&self, args: Args<'_>, o: &mut crate::resp::Out<'_>) {
        struct Lossy<'b>(&'b [u8], bool);
        impl fmt::Display for Lossy<'_> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                for c in self.0[..self.0.len().min(128)].utf8_chunks() {
                    for ch in c.valid().chars() {
                        let ch = match self.1 {
                            true => ch.to_ascii_lowercase(),
                            false => ch,
                        };
                        fmt::Write::write_char(f, ch)?;
                    }
                    if !c.invalid().is_empty() {
                        f.write_str("\u{FFFD}")?;
                    }
                }
                Ok(())
            }
        }
        struct First<'b>(Args<'b>);
        impl fmt::Display for First<'_> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                for i in 1..self.0.len().min(8) {
                    write!(f, "'{}' ", Lossy(self.0.get(i), false))?;
                }
                Ok(())
            }
        }
        match self {
            CmdError::WrongArgs => o.error_fmt(format_args!(
                "ERR wrong number of arguments for '{}' command",
                Lossy(args.name(), true)
            )),
            CmdError::Unknown => o.error_fmt(format_args!(
                "ERR unknown command '{}', with args beginning with: {}",
                Lossy(args.name(), false),
                First(args)
            )),
            CmdError::UnknownSubcommand => {
                let sub: &[u8] = if args.len() > 1 { args.get(1) } else { b"" };
                let name = String::from_utf8_lossy(args.name()).to_uppercase();
                o.error_fmt(format_args!(
                    "ERR unknown subcommand '{}'. Try {name} HELP.",
                    Lossy(sub, false)
                ))
            }
            e => o.error_fmt(format_args!("{e}")),
        }
    }

    /// [`CmdError::write`] as a string (tests).
    #[cfg(test)]
    pub(crate) fn reply(&self, args: Args<'_>) -> String {
        let mut buf = Vec::new();
        self.write(
            args,
            &mut crate::resp::Out {
                buf: &mut buf,
                proto: crate::resp::Proto::Resp2,
            },
        );
        String::from_utf8_lossy(&buf[1..buf.len() - 2]).into_owned()
    }
}

/// An integer argument as Redis reads one.
///
/// An optional `-`, then decimal digits (leading zeros allowed), within `i64`: what
/// `str::parse::<i64>` accepts, without a `+`. A byte loop rather than UTF-8 validation and
/// `str::parse` (a `CL.THROTTLE` parses four: measured with callgrind, docs/service.md).
pub(crate) fn parse_i64(b: &[u8]) -> Result<i64, CmdError> {
    let (neg, digits) = match b.split_first() {
        Some((b'-', d)) => (true, d),
        _ => (false, b),
    };
    if digits.is_empty() {
        return Err(CmdError::NotInteger);
    }
    let mut n: u64 = 0;
    for &c in digits {
        let d = c.wrapping_sub(b'0');
        if d > 9 {
            return Err(CmdError::NotInteger);
        }
        n = n
            .checked_mul(10)
            .and_then(|n| n.checked_add(u64::from(d)))
            .ok_or(CmdError::NotInteger)?;
    }
    match (neg, n) {
        (false, n) if n <= i64::MAX as u64 => Ok(n as i64),
        // -2^63 included: its magnitude as i64 wraps to i64::MIN, which negates to itself.
        (true, n) if n <= 1 << 63 => Ok((n as i64).wrapping_neg()),
        _ => Err(CmdError::NotInteger),
    }
}

/// Whether the command name `name` is `upper` (an upper-case constant), in any case. A byte
/// loop over the constant: `eq_ignore_ascii_case` folds both sides (measured with callgrind,
/// docs/service.md).
#[inline]
pub(crate) fn named(name: &[u8], upper: &str) -> bool {
    name.len() == upper.len()
        && name
            .iter()
            .zip(upper.bytes())
            .all(|(&a, b)| a == b || (b.is_ascii_uppercase() && a == b | 0x20))
}

/// Which command a name is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Throttle,
    Check,
    Peek,
    Explain,
    Refund,
    Settle,
    Limits,
    Ping,
    Echo,
    Hello,
    Auth,
    Client,
    Select,
    Quit,
    Reset,
    Command,
    Info,
    Role,
    Config,
    Multi,
    Exec,
    Discard,
    Watch,
    Unwatch,
}

/// A command's entry in the table: its name (upper case), arity as Redis writes it (N:
/// exactly N arguments with the name; -N: at least N), its most arguments, and its flags.
pub(crate) struct Spec {
    pub(crate) name: &'static str,
    pub(crate) kind: Kind,
    pub(crate) arity: i64,
    pub(crate) max_args: usize,
    pub(crate) flags: &'static [&'static str],
    /// Whether its second argument is a key (COMMAND's first/last/step).
    pub(crate) keyed: bool,
    /// One line for `COMMAND DOCS`.
    pub(crate) summary: &'static str,
}

impl Spec {
    /// Whether a client may send it before it has authenticated (flag `noauth`, as Redis's
    /// `COMMAND` shows it).
    pub(crate) fn noauth(&self) -> bool {
        self.flags.contains(&"noauth")
    }

    /// Whether it runs at once inside a `MULTI` instead of being queued, as in Redis.
    pub(crate) fn runs_in_multi(&self) -> bool {
        matches!(
            self.kind,
            Kind::Exec | Kind::Discard | Kind::Multi | Kind::Watch | Kind::Quit | Kind::Reset
        )
    }
}

const fn spec(
    name: &'static str,
    kind: Kind,
    arity: i64,
    max_args: usize,
    flags: &'static [&'static str],
    keyed: bool,
    summary: &'static str,
) -> Spec {
    Spec {
        name,
        kind,
        arity,
        max_args,
        flags,
        keyed,
        summary,
    }
}

/// Every command, the most frequent first. The one place their arity is written.
pub(crate) const COMMANDS: &[Spec] = &[
    spec("CL.THROTTLE", Kind::Throttle, -5, 6, &["write", "fast"], true,
        "Rate-limits a key with GCRA, as redis-cell: limited, limit, remaining, retry after, reset after."),
    spec("TURNSTILE.CHECK", Kind::Check, -3, 5, &["write", "fast"], true,
        "Checks a request against the rules: allowed, limit, remaining, retry ms, reset ms, rule."),
    spec("TURNSTILE.PEEK", Kind::Peek, -3, 4, &["readonly", "fast"], true,
        "What TURNSTILE.CHECK would answer, without counting the request."),
    spec("TURNSTILE.EXPLAIN", Kind::Explain, -3, 5, &["readonly"], true,
        "Why TURNSTILE.CHECK would answer as it would: every matching rule, each limit's counter, remaining and reset, the key id, the mode, who decides; counting nothing."),
    spec("TURNSTILE.REFUND", Kind::Refund, -3, 5, &["write", "fast"], true,
        "Gives back what an admitted request took, where its algorithm can."),
    spec("TURNSTILE.SETTLE", Kind::Settle, -5, 6, &["write", "fast"], true,
        "Settles a checked request's reserved cost at its actual cost: rules settled, charged, given back, then what TURNSTILE.PEEK answers."),
    spec("TURNSTILE.LIMITS", Kind::Limits, -4, 16, &["admin"], false,
        "A key's own limit in a limits class: SET class key spec (admin), GET class key, DEL class key (admin)."),
    spec("PING", Kind::Ping, -1, 2, &["fast", "stale"], false, "Returns PONG, or the message."),
    spec("ECHO", Kind::Echo, 2, 2, &["fast"], false, "Returns the message."),
    spec("HELLO", Kind::Hello, -1, 7, &["noauth", "fast"], false,
        "Handshakes: protocol version, authentication, client name."),
    spec("AUTH", Kind::Auth, -2, 3, &["noauth", "fast"], false, "Authenticates the connection."),
    // Any number: a subcommand checks its own (an unknown one is named whatever follows it).
    spec("CLIENT", Kind::Client, -2, usize::MAX, &["fast"], false,
        "The connection: ID, INFO, SETNAME, GETNAME, SETINFO, LIST."),
    spec("SELECT", Kind::Select, 2, 2, &["fast"], false, "Database 0 only."),
    spec("QUIT", Kind::Quit, -1, 1, &["noauth", "fast"], false, "Closes the connection."),
    spec("RESET", Kind::Reset, 1, 1, &["noauth", "fast"], false,
        "Resets the connection: protocol 2, no name, not authenticated, no transaction."),
    spec("COMMAND", Kind::Command, -1, 16, &["loading", "stale"], false,
        "The commands: COUNT, INFO, DOCS, LIST."),
    spec("INFO", Kind::Info, -1, 16, &["stale"], false, "Server information, by section."),
    spec("ROLE", Kind::Role, 1, 1, &["loading", "stale", "fast"], false,
        "The replication role: a master without replicas."),
    spec("CONFIG", Kind::Config, -2, 16, &["admin"], false,
        "CONFIG GET answers what redis-benchmark asks; nothing is set."),
    spec("MULTI", Kind::Multi, 1, 1, &["fast"], false,
        "Starts a transaction: commands are queued until EXEC."),
    spec("EXEC", Kind::Exec, 1, 1, &["slow"], false, "Runs the queued commands, in order."),
    spec("DISCARD", Kind::Discard, 1, 1, &["fast"], false, "Drops the queued commands."),
    spec("WATCH", Kind::Watch, -2, 16, &["fast"], false, "Refused: keys cannot be watched here."),
    spec("UNWATCH", Kind::Unwatch, 1, 1, &["fast"], false, "Nothing is watched: OK."),
];

impl Spec {
    /// Whether `n` arguments (the name included) fit its arity as Redis checks it before a
    /// command runs (or is queued in a `MULTI`): exactly, or at least. Its most arguments
    /// ([`Spec::max_args`]) are the command's own check, as Redis's commands check theirs.
    pub(crate) fn arity_fits(&self, n: usize) -> bool {
        let n = n as i64;
        if self.arity >= 0 {
            n == self.arity
        } else {
            n >= -self.arity
        }
    }
}

/// The entry of the command named `name`, in any case.
#[inline]
pub(crate) fn lookup(name: &[u8]) -> Option<&'static Spec> {
    COMMANDS.iter().find(|s| named(name, s.name))
}

/// What a command may use of the server: the `CL.THROTTLE` stores, the rules and where their
/// counts live, the RESP listener's settings, the guard (passwords), the counters and the
/// buffers' gauge. The connection makes one from the server's state for each turn; a command
/// sees nothing else of it.
pub(crate) struct Ctx<'a> {
    pub(crate) throttles: &'a crate::throttle::Throttles,
    pub(crate) checks: &'a crate::check::Checks,
    pub(crate) resp: &'a crate::config::RespConfig,
    pub(crate) guard: &'a crate::listen::Guard,
    pub(crate) metrics: &'a crate::metrics::Metrics,
    pub(crate) buffers: &'a crate::listen::Buffers,
    /// The last readiness check's answer (crate::ready), for `INFO`.
    pub(crate) ready: &'a std::sync::atomic::AtomicBool,
}

/// A command parsed from its arguments.
pub(crate) enum Command<'a> {
    Throttle(throttle::Throttle<'a>),
    Rules(rules::RulesCommand<'a>),
    Settle(settle::Settle<'a>),
    Explain(explain::Explain<'a>),
    Limits(limits::LimitsCommand),
    Session(session::SessionCommand<'a>),
    Introspect(introspect::Introspect<'a>),
    Multi,
    Exec,
    Discard,
    Watch,
    Unwatch,
}

impl<'a> Command<'a> {
    /// Parses a command (at least one argument), checking its arity against [`COMMANDS`].
    pub(crate) fn parse(args: Args<'a>) -> Result<Command<'a>, CmdError> {
        let spec = lookup(args.name()).ok_or(CmdError::Unknown)?;
        Self::parse_as(spec, args)
    }

    /// Parses a command whose entry is `spec`.
    pub(crate) fn parse_as(spec: &Spec, args: Args<'a>) -> Result<Command<'a>, CmdError> {
        if !spec.arity_fits(args.len()) || args.len() > spec.max_args {
            return Err(CmdError::WrongArgs);
        }
        let mut c = ArgCursor::new(args);
        Ok(match spec.kind {
            Kind::Throttle => Command::Throttle(throttle::Throttle::parse(&mut c)?),
            Kind::Check | Kind::Peek | Kind::Refund => {
                Command::Rules(rules::RulesCommand::parse(spec.kind, &mut c)?)
            }
            Kind::Settle => Command::Settle(settle::Settle::parse(&mut c)?),
            Kind::Explain => Command::Explain(explain::Explain::parse(&mut c)?),
            Kind::Limits => Command::Limits(limits::LimitsCommand::parse(&mut c)?),
            Kind::Ping
            | Kind::Echo
            | Kind::Hello
            | Kind::Auth
            | Kind::Client
            | Kind::Select
            | Kind::Quit
            | Kind::Reset => Command::Session(session::SessionCommand::parse(spec.kind, &mut c)?),
            Kind::Command | Kind::Info | Kind::Role | Kind::Config => {
                Command::Introspect(introspect::Introspect::parse(spec.kind, &mut c)?)
            }
            Kind::Multi => Command::Multi,
            Kind::Exec => Command::Exec,
            Kind::Discard => Command::Discard,
            Kind::Watch => Command::Watch,
            Kind::Unwatch => Command::Unwatch,
        })
    }
}

impl Command<'_> {
    /// Runs a parsed command (not `MULTI`, `EXEC`, `DISCARD`: the connection's own), its reply
    /// into `o`; returns the call to await when its answer is elsewhere (Redis, a blocking
    /// thread), and what it asks of the connection.
    pub(crate) fn apply(
        self,
        ctx: &Ctx<'_>,
        s: &mut client::Session,
        o: &mut crate::resp::Out<'_>,
    ) -> (Option<remote::RemoteCall>, session::Effect) {
        use session::Effect;
        match self {
            Command::Throttle(t) => t.apply(ctx.throttles, s, None, o),
            Command::Rules(r) => return (r.apply(ctx, o).map(remote::RemoteCall::Rules), Effect::None),
            Command::Settle(r) => {
                return (r.apply(ctx, o).map(remote::RemoteCall::Settle), Effect::None)
            }
            Command::Explain(x) => x.apply(ctx, o),
            Command::Limits(l) => {
                let call = l.apply(s.access, o).map(remote::RemoteCall::Limits);
                return (call, Effect::None);
            }
            Command::Session(sc) => {
                let gate = session::Gate {
                    auth: &ctx.resp.auth,
                    trusted: ctx.resp.trusted,
                    guard: ctx.guard,
                };
                return (None, sc.apply(gate, s, o));
            }
            Command::Introspect(i) => i.apply(ctx, o),
            Command::Watch => o.error(
                "ERR WATCH is not supported: there are no keys to watch; each command is atomic on its own (docs/service.md)",
            ),
            Command::Unwatch => o.simple("OK"),
            Command::Multi | Command::Exec | Command::Discard => {
                debug_assert!(false, "handled by the connection");
            }
        }
        (None, Effect::None)
    }
}

/// A priority argument: `critical`, `post`, `get` or `test`.
pub(crate) fn priority(p: &[u8]) -> Result<turnstile::rules::Priority, CmdError> {
    std::str::from_utf8(p)
        .ok()
        .and_then(|s| s.parse::<turnstile::rules::Priority>().ok())
        .ok_or_else(|| {
            CmdError::Syntax("unknown priority; expected critical, post, get or test".into())
        })
}

#[cfg(test)]
mod tests;
