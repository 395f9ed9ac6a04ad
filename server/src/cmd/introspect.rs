//! What clients ask about the server: `COMMAND` (from the one table of [`super::COMMANDS`]),
//! `INFO` (by section, [`super::info`]), `ROLE` and `CONFIG GET` (what redis-benchmark
//! asks).

use super::{ArgCursor, CmdError, Kind, Spec, COMMANDS};
use crate::resp::Out;

/// A parsed introspection command.
pub(crate) enum Introspect<'a> {
    /// `COMMAND`, `COMMAND INFO [name...]`.
    Info(Option<ArgCursor<'a>>),
    Count,
    /// `COMMAND DOCS [name...]`.
    Docs(Option<ArgCursor<'a>>),
    List,
    /// `INFO [section...]`: the cursor over the sections.
    Server(ArgCursor<'a>),
    ConfigGet(&'a [u8]),
    /// `ROLE`.
    Role,
}

impl<'a> Introspect<'a> {
    pub(crate) fn parse(kind: Kind, c: &mut ArgCursor<'a>) -> Result<Self, CmdError> {
        let rest = |c: &mut ArgCursor<'a>| {
            c.has_more().then_some(ArgCursor {
                args: c.args,
                next: c.next,
            })
        };
        Ok(match kind {
            Kind::Command => match c.next() {
                None => Introspect::Info(None),
                Some(s) if super::named(s, "INFO") => Introspect::Info(rest(c)),
                Some(s) if super::named(s, "DOCS") => Introspect::Docs(rest(c)),
                Some(s) if super::named(s, "COUNT") => {
                    super::sub_args(c.finish(), "command|count")?;
                    Introspect::Count
                }
                Some(s) if super::named(s, "LIST") => {
                    super::sub_args(c.finish(), "command|list")?;
                    Introspect::List
                }
                Some(_) => return Err(CmdError::UnknownSubcommand),
            },
            Kind::Info => Introspect::Server(ArgCursor {
                args: c.args,
                next: c.next,
            }),
            Kind::Role => Introspect::Role,
            _ => {
                if !c.eat("GET") {
                    // Redis's other subcommands are refused in words; anything else is an
                    // unknown subcommand, as Redis answers it.
                    let known = ["SET", "RESETSTAT", "REWRITE", "HELP"];
                    let sub = c.bytes()?;
                    if !known.iter().any(|k| super::named(sub, k)) {
                        return Err(CmdError::UnknownSubcommand);
                    }
                    return Err(CmdError::Other(
                        "ERR CONFIG: only GET is supported; the server is configured by the flags of `turnstile serve`".into(),
                    ));
                }
                let name = super::sub_args(c.bytes(), "config|get")?;
                c.finish()?;
                Introspect::ConfigGet(name)
            }
        })
    }

    pub(crate) fn apply(self, ctx: &super::Ctx<'_>, o: &mut Out<'_>) {
        match self {
            Introspect::Count => o.int(COMMANDS.len() as i64),
            Introspect::List => {
                o.array(COMMANDS.len());
                for s in COMMANDS {
                    o.bulk(s.name.to_ascii_lowercase().as_bytes());
                }
            }
            Introspect::Info(None) => {
                o.array(COMMANDS.len());
                COMMANDS.iter().for_each(|s| command_info(s, o));
            }
            Introspect::Info(Some(mut names)) => {
                let mut v = Vec::new();
                while let Some(n) = names.next() {
                    v.push(super::lookup(n));
                }
                o.array(v.len());
                for s in v {
                    match s {
                        Some(s) => command_info(s, o),
                        None => o.null(),
                    }
                }
            }
            Introspect::Docs(names) => {
                let mut v: Vec<&Spec> = Vec::new();
                match names {
                    None => v.extend(COMMANDS),
                    Some(mut names) => {
                        while let Some(n) = names.next() {
                            v.extend(super::lookup(n));
                        }
                    }
                }
                o.map(v.len());
                for s in v {
                    command_docs(s, o);
                }
            }
            Introspect::Server(sections) => o.verbatim(super::info::info(ctx, sections).as_bytes()),
            Introspect::Role => {
                // A master without replicas, as Redis answers: role, replication offset, replicas.
                o.array(3);
                o.bulk(b"master");
                o.int(0);
                o.array(0);
            }
            Introspect::ConfigGet(name) => {
                // redis-benchmark asks `save` and `appendonly` on start: nothing is persisted the
                // Redis way, so as Redis without persistence answers; other names are unknown.
                let v: Option<&[u8]> = if name.eq_ignore_ascii_case(b"save") {
                    Some(b"")
                } else if name.eq_ignore_ascii_case(b"appendonly") {
                    Some(b"no")
                } else {
                    None
                };
                match v {
                    Some(v) => {
                        o.map(1);
                        o.bulk(&name.to_ascii_lowercase());
                        o.bulk(v);
                    }
                    None => o.map(0),
                }
            }
        }
    }
}

/// One command's `COMMAND INFO` entry, as Redis 7 writes it: name, arity, flags, first key,
/// last key, step, ACL categories, tips, key specifications, subcommands.
fn command_info(s: &Spec, o: &mut Out<'_>) {
    o.array(10);
    o.bulk(s.name.to_ascii_lowercase().as_bytes());
    o.int(s.arity);
    o.set(s.flags.len());
    for f in s.flags {
        o.simple(f);
    }
    let key = i64::from(s.keyed);
    o.int(key);
    o.int(key);
    o.int(key);
    o.set(0);
    o.array(0);
    o.array(0);
    o.array(0);
}

/// One command's `COMMAND DOCS` entry: its summary, group, and arguments (which redis-cli
/// shows as hints while the command is typed).
fn command_docs(s: &Spec, o: &mut Out<'_>) {
    o.bulk(s.name.to_ascii_lowercase().as_bytes());
    let args = arguments(s.kind);
    o.map(if args.is_empty() { 3 } else { 4 });
    o.bulk(b"summary");
    o.bulk(s.summary.as_bytes());
    o.bulk(b"since");
    o.bulk(b"1.0.0");
    o.bulk(b"group");
    o.bulk(
        if s.name.contains('.') {
            "module"
        } else {
            "connection"
        }
        .as_bytes(),
    );
    if args.is_empty() {
        return;
    }
    o.bulk(b"arguments");
    o.array(args.len());
    for &(name, ty, optional) in args {
        o.map(if optional { 4 } else { 3 });
        o.bulk(b"name");
        o.bulk(name.as_bytes());
        o.bulk(b"type");
        o.bulk(ty.as_bytes());
        o.bulk(b"display_text");
        o.bulk(name.as_bytes());
        if optional {
            o.bulk(b"flags");
            o.array(1);
            o.simple("optional");
        }
    }
}

/// A command's arguments for `COMMAND DOCS`: name, type, optional.
fn arguments(kind: Kind) -> &'static [(&'static str, &'static str, bool)] {
    match kind {
        Kind::Throttle => &[
            ("key", "key", false),
            ("max_burst", "integer", false),
            ("count", "integer", false),
            ("period", "integer", false),
            ("quantity", "integer", true),
        ],
        Kind::Check | Kind::Refund | Kind::Explain => &[
            ("key_class", "string", false),
            ("key", "key", false),
            ("cost", "integer", true),
            ("priority", "string", true),
        ],
        Kind::Settle => &[
            ("key_class", "string", false),
            ("key", "key", false),
            ("reserved", "integer", false),
            ("actual", "integer", false),
            ("priority", "string", true),
        ],
        Kind::Peek => &[
            ("key_class", "string", false),
            ("key", "key", false),
            ("priority", "string", true),
        ],
        Kind::Limits => &[
            ("SET|GET|DEL", "string", false),
            ("class", "string", false),
            ("key", "string", false),
            ("spec", "string", true),
        ],
        Kind::Echo => &[("message", "string", false)],
        Kind::Ping => &[("message", "string", true)],
        Kind::Auth => &[("username", "string", true), ("password", "string", false)],
        Kind::Select => &[("index", "integer", false)],
        _ => &[],
    }
}
