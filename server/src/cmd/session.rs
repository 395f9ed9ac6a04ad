//! The connection's own commands: `AUTH`, `HELLO`, `CLIENT`, `SELECT`, `PING`, `ECHO`, `QUIT`,
//! `RESET`, answered as Redis 7 answers them.

use super::{ArgCursor, CmdError, Kind};
use crate::cmd::client::Session;
use crate::config::{Access, Auth};
use crate::listen::Guard;
use crate::resp::{Out, Proto};

/// What a password is checked against: the passwords, whether the listener grants admin
/// without the admin password, and the guard that slows wrong ones per source address.
#[derive(Clone, Copy)]
pub(crate) struct Gate<'a> {
    pub(crate) auth: &'a Auth,
    pub(crate) trusted: bool,
    pub(crate) guard: &'a Guard,
}

/// The longest client name, library name or version kept (Redis keeps any; a name is for
/// `CLIENT INFO` and logs).
const MAX_NAME: usize = 128;

/// A parsed connection command.
#[derive(Debug)]
pub(crate) enum SessionCommand<'a> {
    Ping(Option<&'a [u8]>),
    Echo(&'a [u8]),
    Hello {
        proto: Option<i64>,
        auth: Option<(&'a [u8], &'a [u8])>,
        name: Option<&'a [u8]>,
    },
    Auth {
        user: Option<&'a [u8]>,
        password: &'a [u8],
    },
    ClientId,
    ClientInfo,
    ClientSetName(&'a [u8]),
    ClientGetName,
    ClientSetInfo(&'a [u8], &'a [u8]),
    ClientNoOp,
    Select(&'a [u8]),
    Quit,
    Reset,
}

/// What a connection command asks of the connection.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Effect {
    /// Nothing more.
    None,
    /// Close once the reply is written.
    Close,
    /// Forget the transaction and everything the connection was told (`RESET`).
    Reset,
}

impl<'a> SessionCommand<'a> {
    pub(crate) fn parse(kind: Kind, c: &mut ArgCursor<'a>) -> Result<Self, CmdError> {
        let cmd = match kind {
            Kind::Ping => SessionCommand::Ping(c.next()),
            Kind::Echo => SessionCommand::Echo(c.bytes()?),
            Kind::Hello => return hello(c),
            Kind::Auth => {
                let a = c.bytes()?;
                match c.next() {
                    Some(p) => SessionCommand::Auth {
                        user: Some(a),
                        password: p,
                    },
                    None => SessionCommand::Auth {
                        user: None,
                        password: a,
                    },
                }
            }
            Kind::Client => return client(c),
            Kind::Select => SessionCommand::Select(c.bytes()?),
            Kind::Quit => SessionCommand::Quit,
            _ => SessionCommand::Reset,
        };
        c.finish()?;
        Ok(cmd)
    }

    /// Runs it.
    pub(crate) fn apply(&self, gate: Gate<'_>, s: &mut Session, o: &mut Out<'_>) -> Effect {
        let failures = s.auth_failures;
        let effect = self.apply_inner(gate, s, o);
        // Too many wrong passwords on one connection: it is closed (each source is slowed
        // apart from this, crate::listen::AuthThrottle).
        if s.auth_failures > failures && s.auth_failures >= crate::listen::MAX_AUTH_FAILURES {
            return Effect::Close;
        }
        effect
    }

    fn apply_inner(&self, gate: Gate<'_>, s: &mut Session, o: &mut Out<'_>) -> Effect {
        match *self {
            SessionCommand::Ping(None) => o.simple("PONG"),
            SessionCommand::Ping(Some(m)) | SessionCommand::Echo(m) => o.bulk(m),
            SessionCommand::Hello {
                proto,
                auth: a,
                name,
            } => hello_apply(gate, s, o, proto, a, name),
            SessionCommand::Auth { user, password } => {
                let _ = authenticate(gate, s, o, user, password);
            }
            SessionCommand::ClientId => o.int(s.id as i64),
            SessionCommand::ClientInfo => o.verbatim(s.info_line().as_bytes()),
            SessionCommand::ClientSetName(n) => {
                if !printable(n) {
                    o.error(
                        "ERR Client names cannot contain spaces, newlines or special characters.",
                    );
                } else {
                    set(&mut s.name, n);
                    o.simple("OK");
                }
            }
            SessionCommand::ClientGetName => {
                if s.name.is_empty() {
                    o.null();
                } else {
                    o.bulk(&s.name);
                }
            }
            SessionCommand::ClientSetInfo(attr, v) => {
                let to = if attr.eq_ignore_ascii_case(b"lib-name") {
                    &mut s.lib_name
                } else if attr.eq_ignore_ascii_case(b"lib-ver") {
                    &mut s.lib_ver
                } else {
                    o.error_fmt(format_args!(
                        "ERR Unrecognized option '{}'",
                        String::from_utf8_lossy(&attr[..attr.len().min(64)])
                    ));
                    return Effect::None;
                };
                // As Redis 7.2 refuses them: `CLIENT INFO` is split at spaces.
                if !printable(v) {
                    o.error_fmt(format_args!(
                        "ERR {} cannot contain spaces, newlines or special characters.",
                        String::from_utf8_lossy(attr)
                    ));
                } else {
                    set(to, v);
                    o.simple("OK");
                }
            }
            SessionCommand::ClientNoOp => o.simple("OK"),
            SessionCommand::Select(db) => {
                if db == b"0" {
                    o.simple("OK");
                } else {
                    o.error("ERR DB index is out of range");
                }
            }
            SessionCommand::Quit => {
                o.simple("OK");
                return Effect::Close;
            }
            SessionCommand::Reset => {
                s.reset(gate.auth.initial(gate.trusted));
                o.proto = s.proto;
                o.simple("RESET");
                return Effect::Reset;
            }
        }
        Effect::None
    }
}

/// Whether a client name, library name or version is what Redis keeps: printable ASCII, no
/// space (`CLIENT INFO` is split at spaces).
fn printable(v: &[u8]) -> bool {
    v.iter().all(|&b| (b'!'..=b'~').contains(&b))
}

fn set(to: &mut Vec<u8>, v: &[u8]) {
    to.clear();
    to.extend_from_slice(&v[..v.len().min(MAX_NAME)]);
}

fn hello<'a>(c: &mut ArgCursor<'a>) -> Result<SessionCommand<'a>, CmdError> {
    let proto = match c.next() {
        None => None,
        Some(v) => Some(super::parse_i64(v).map_err(|_| {
            CmdError::Other("ERR Protocol version is not an integer or out of range".into())
        })?),
    };
    let (mut auth, mut name) = (None, None);
    while let Some(opt) = c.next() {
        if super::named(opt, "AUTH") {
            let (Some(u), Some(p)) = (c.next(), c.next()) else {
                return Err(hello_syntax(opt));
            };
            auth = Some((u, p));
        } else if super::named(opt, "SETNAME") {
            name = Some(c.next().ok_or_else(|| hello_syntax(opt))?);
        } else {
            return Err(hello_syntax(opt));
        }
    }
    Ok(SessionCommand::Hello { proto, auth, name })
}

fn hello_syntax(opt: &[u8]) -> CmdError {
    CmdError::Syntax(format!(
        "Syntax error in HELLO option '{}'",
        String::from_utf8_lossy(&opt[..opt.len().min(64)])
    ))
}

fn client<'a>(c: &mut ArgCursor<'a>) -> Result<SessionCommand<'a>, CmdError> {
    use super::sub_args;
    let sub = c.bytes()?;
    // (subcommand, its full name as Redis writes it in a wrong-arity error)
    let (cmd, full) = if super::named(sub, "ID") {
        (SessionCommand::ClientId, "client|id")
    } else if super::named(sub, "INFO") {
        (SessionCommand::ClientInfo, "client|info")
    } else if super::named(sub, "SETNAME") {
        let n = sub_args(c.bytes(), "client|setname")?;
        (SessionCommand::ClientSetName(n), "client|setname")
    } else if super::named(sub, "GETNAME") {
        (SessionCommand::ClientGetName, "client|getname")
    } else if super::named(sub, "SETINFO") {
        let full = "client|setinfo";
        let (attr, v) = (sub_args(c.bytes(), full)?, sub_args(c.bytes(), full)?);
        (SessionCommand::ClientSetInfo(attr, v), full)
    } else if super::named(sub, "NO-EVICT") || super::named(sub, "NO-TOUCH") {
        let full = if super::named(sub, "NO-EVICT") {
            "client|no-evict"
        } else {
            "client|no-touch"
        };
        // Nothing is evicted or touched here: both answer OK to ON and OFF, as Redis does.
        let v = sub_args(c.bytes(), full)?;
        sub_args(c.finish(), full)?;
        if !(super::named(v, "ON") || super::named(v, "OFF")) {
            return Err(CmdError::Syntax("syntax error".into()));
        }
        (SessionCommand::ClientNoOp, full)
    } else {
        // Whatever follows it: go-redis sends `CLIENT MAINT_NOTIFICATIONS on ...` and reads
        // Redis's answer to an unknown subcommand.
        return Err(CmdError::UnknownSubcommand);
    };
    sub_args(c.finish(), full)?;
    Ok(cmd)
}

/// `AUTH [user] password`: what it grants, replied; whether it succeeded.
fn authenticate(
    gate: Gate<'_>,
    s: &mut Session,
    o: &mut Out<'_>,
    user: Option<&[u8]>,
    password: &[u8],
) -> bool {
    let auth = gate.auth;
    let from = s.peer.map(|p| p.ip());
    let checked = auth.required() || auth.admin.is_some();
    if checked {
        if let Err(t) = gate.guard.throttle.allow(from) {
            gate.guard.auth_failed(true);
            s.auth_failures += 1;
            o.error(&format!(
                "ERR too many wrong passwords from this address: the next is checked in {} s",
                t.retry_after.as_secs_f64().ceil().max(1.0)
            ));
            return false;
        }
    }
    match auth.grant(user, password, gate.trusted) {
        Some(a) => {
            s.access = s.access.max(a);
            o.simple("OK");
            true
        }
        // As Redis answers with the default user on `nopass`: any password for `default`.
        None if !auth.required() && user == Some(b"default") => {
            o.simple("OK");
            true
        }
        None if !auth.required() && auth.admin.is_none() && user.is_none() => {
            o.error("ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?");
            false
        }
        None => {
            if checked {
                gate.guard.throttle.failed(from);
                gate.guard.auth_failed(false);
                s.auth_failures += 1;
            }
            o.error("WRONGPASS invalid username-password pair or user is disabled.");
            false
        }
    }
}

fn hello_apply(
    gate: Gate<'_>,
    s: &mut Session,
    o: &mut Out<'_>,
    proto: Option<i64>,
    creds: Option<(&[u8], &[u8])>,
    name: Option<&[u8]>,
) {
    let want = match proto {
        None => s.proto,
        Some(2) => Proto::Resp2,
        Some(3) => Proto::Resp3,
        Some(_) => {
            o.error("NOPROTO unsupported protocol version");
            return;
        }
    };
    if let Some((u, p)) = creds {
        // The error in the connection's current protocol; nothing else changes.
        let mut scratch = Out {
            buf: &mut Vec::new(),
            proto: s.proto,
        };
        if !authenticate(gate, s, &mut scratch, Some(u), p) {
            o.buf.extend_from_slice(scratch.buf);
            return;
        }
    }
    if s.access == Access::None {
        o.error("NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time");
        return;
    }
    if let Some(n) = name {
        set(&mut s.name, n);
    }
    s.proto = want;
    o.proto = want;
    o.map(7);
    o.bulk(b"server");
    o.bulk(b"turnstile");
    o.bulk(b"version");
    o.bulk(env!("CARGO_PKG_VERSION").as_bytes());
    o.bulk(b"proto");
    o.int(if want == Proto::Resp3 { 3 } else { 2 });
    o.bulk(b"id");
    o.int(s.id as i64);
    o.bulk(b"mode");
    o.bulk(b"standalone");
    o.bulk(b"role");
    o.bulk(b"master");
    o.bulk(b"modules");
    o.array(0);
}
