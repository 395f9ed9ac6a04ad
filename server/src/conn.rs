//! A RESP connection: fill the input buffer, run every whole command in it (a pipeline is
//! answered in one write), and close on a protocol error after replying it, as Redis does.

use crate::metrics::{Tally, C};
use crate::resp::{parse_command, Out, Parsed, Proto};
use crate::throttle::{ArgError, LastStore};
use crate::Shared;
use std::net::IpAddr;
use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use turnstile::rules::{Priority, Request, Verdict};
use turnstile::{Clock, Decision, DefaultClock};
use turnstile_redis::RedisRules;

/// The arguments of one command: ranges into the input buffer.
struct Args<'a> {
    buf: &'a [u8],
    ranges: &'a [Range<usize>],
}

impl<'a> Args<'a> {
    fn len(&self) -> usize {
        self.ranges.len()
    }
    fn get(&self, i: usize) -> &'a [u8] {
        &self.buf[self.ranges[i].clone()]
    }
    fn is(&self, i: usize, name: &str) -> bool {
        i < self.len() && self.get(i).eq_ignore_ascii_case(name.as_bytes())
    }
}

/// What a connection remembers between commands.
struct State {
    proto: Proto,
    authed: bool,
    name: Vec<u8>,
    id: u64,
    last: LastStore,
    /// Counts since the last flush to the shared metrics (one per pipeline).
    tally: Tally,
}

/// Whether to keep the connection after a command.
#[derive(PartialEq, Eq)]
enum Flow {
    Go,
    Close,
}

/// Serves one connection until the client leaves, an error, idleness or shutdown.
pub(crate) async fn serve(shared: Arc<Shared>, mut sock: TcpStream, id: u64) {
    let n = shared.connections.fetch_add(1, Ordering::Relaxed) + 1;
    struct Dec<'a>(&'a Shared);
    impl Drop for Dec<'_> {
        fn drop(&mut self) {
            self.0.connections.fetch_sub(1, Ordering::Relaxed);
        }
    }
    let _dec = Dec(&shared);
    if n > shared.args.max_connections {
        shared.metrics.add(C::RejectedConnections, 1);
        let _ = sock
            .write_all(b"-ERR max number of clients reached\r\n")
            .await;
        return;
    }
    shared.metrics.add(C::Connections, 1);
    let _ = sock.set_nodelay(true);
    let mut shutdown = shared.shutdown.subscribe();
    let mut inb: Vec<u8> = Vec::with_capacity(16 * 1024);
    let mut out: Vec<u8> = Vec::with_capacity(16 * 1024);
    let mut ranges: Vec<Range<usize>> = Vec::new();
    let mut ahead = Ahead::default();
    let mut st = State {
        proto: Proto::Resp2,
        authed: shared.args.requirepass.is_none(),
        name: Vec::new(),
        id,
        last: LastStore::default(),
        tally: Tally::default(),
    };
    let clock = DefaultClock::new();
    let idle = shared.args.idle_timeout;
    // The client stopped reading its replies.
    let mut gone = false;
    // Reads made since the shutdown signal.
    let mut draining = 0u32;
    loop {
        // Run every whole command buffered: those parsed ahead (a pipeline) first.
        look_ahead(&shared, &st, &inb, &mut ranges, &mut ahead);
        // Time has passed since the last pipeline: its last clock reading is not this one's.
        st.last.unmark();
        let mut next = 0;
        let mut start = 0;
        let mut flow = Flow::Go;
        while start < inb.len() {
            let parsed = match ahead.commands.get(next) {
                Some(&(consumed, ref r, id)) => {
                    next += 1;
                    Ok((consumed, &ahead.ranges[r.clone()], id))
                }
                None => {
                    parse_command(&inb[start..], &shared.bounds, &mut ranges).map(|p| match p {
                        Parsed::Incomplete => (0, &ranges[..0], None),
                        Parsed::Command { consumed } => (consumed, &ranges[..], None),
                    })
                }
            };
            match parsed {
                Ok((0, _, _)) => break,
                Ok((consumed, ranges, id)) => {
                    let args = Args {
                        buf: &inb[start..],
                        ranges,
                    };
                    start += consumed;
                    if args.len() == 0 {
                        continue;
                    }
                    st.tally.add(C::Commands, 1);
                    let mut o = Out {
                        buf: &mut out,
                        proto: st.proto,
                    };
                    // The rules commands with the counts in Redis: awaited here, on this
                    // worker's runtime (the other commands run without an await).
                    if let Some((redis, what)) = remote(&shared, &st, &args) {
                        st.last.unmark();
                        let t0 = clock.now();
                        rules_on_redis(&shared, &redis, &args, &mut o, what).await;
                        shared.metrics.latency(clock.now().saturating_sub(t0));
                        continue;
                    }
                    flow = command(&shared, &mut st, &args, id, &mut o, &clock);
                    if flow == Flow::Close {
                        break;
                    }
                }
                Err(e) => {
                    shared.metrics.add(C::ProtocolErrors, 1);
                    tracing::debug!(conn = id, error = %e, "protocol error; closing");
                    Out {
                        buf: &mut out,
                        proto: st.proto,
                    }
                    .error(&format!("ERR {e}"));
                    flow = Flow::Close;
                    break;
                }
            }
        }
        inb.drain(..start);
        // Counted before the replies go out: a client that read one sees it counted.
        shared.metrics.flush(&mut st.tally);
        if !out.is_empty() {
            // A client that stopped reading (closed or reset) does not stop its commands: every
            // command received in full is run and counted, as if its reply had been read.
            if !gone && sock.write_all(&out).await.is_err() {
                gone = true;
                tracing::debug!(
                    conn = id,
                    "client gone; running what it sent, replies dropped"
                );
            }
            out.clear();
        }
        if flow == Flow::Close {
            return;
        }
        if inb.capacity() - inb.len() < 4096 {
            inb.reserve(16 * 1024);
        }
        if draining > 0 || *shutdown.borrow() {
            // Shutdown: what the client sent before it is answered too — what the socket
            // already holds is read without waiting (bounded: a client that keeps sending
            // is cut after DRAIN_ROUNDS reads).
            draining += 1;
            match sock.try_read_buf(&mut inb) {
                Ok(n) if n > 0 && draining <= DRAIN_ROUNDS => continue,
                _ => return,
            }
        }
        let read = async {
            if idle.is_zero() {
                Ok(sock.read_buf(&mut inb).await)
            } else {
                tokio::time::timeout(idle, sock.read_buf(&mut inb)).await
            }
        };
        tokio::select! {
            r = read => match r {
                Ok(Ok(0)) | Ok(Err(_)) => return,
                Ok(Ok(_)) => {}
                Err(_) => {
                    tracing::debug!(conn = id, "idle; closing");
                    return;
                }
            },
            // Shutdown: stop waiting; what was read is answered above, then what is buffered.
            _ = shutdown.changed() => {}
        }
    }
}

/// Commands parsed ahead per read: beyond this, the first lines fetched could be evicted again
/// before their commands run.
const AHEAD: usize = 32;

/// The commands of a pipeline parsed ahead of running them: each one's length in bytes, its
/// arguments' ranges (relative to its own start) in `ranges`, and for a `CL.THROTTLE` whose key
/// was prefetched, the key's id.
#[derive(Default)]
struct Ahead {
    commands: Vec<(usize, Range<usize>, Option<u64>)>,
    ranges: Vec<Range<usize>>,
}

/// A pipeline read at once: parses up to [`AHEAD`] whole commands and fetches the keys of its
/// `CL.THROTTLE` commands into the cache before any of them runs, so that their misses to
/// memory overlap instead of being paid one after another (at 1M keys, about 40 % of a
/// pipelined command's time was the store's table missing the cache; docs/service.md). The
/// run then takes the commands parsed here without parsing them again. Only a hint: nothing
/// is run, created or answered here; parsing stops at the first incomplete or malformed
/// command (the run parses it and answers the error); a lone command is left to the run.
fn look_ahead(
    shared: &Shared,
    st: &State,
    inb: &[u8],
    scratch: &mut Vec<Range<usize>>,
    ahead: &mut Ahead,
) {
    ahead.commands.clear();
    ahead.ranges.clear();
    let mut start = 0;
    while ahead.commands.len() < AHEAD && start < inb.len() {
        let Ok(Parsed::Command { consumed }) =
            parse_command(&inb[start..], &shared.bounds, scratch)
        else {
            break;
        };
        if start == 0 && consumed >= inb.len() {
            // One command and nothing after it: nothing to overlap.
            return;
        }
        let from = ahead.ranges.len();
        ahead.ranges.extend_from_slice(scratch);
        ahead
            .commands
            .push((consumed, from..ahead.ranges.len(), None));
        start += consumed;
    }
    if !st.authed {
        return;
    }
    let mut start = 0;
    for (consumed, r, id) in &mut ahead.commands {
        let a = Args {
            buf: &inb[start..],
            ranges: &ahead.ranges[r.clone()],
        };
        if a.len() >= 5 && named(a.get(0), "CL.THROTTLE") {
            *id = st.last.prefetch(&[a.get(1), a.get(2), a.get(3), a.get(4)]);
        }
        start += *consumed;
    }
}

/// Reads of already-buffered input at shutdown, at most.
const DRAIN_ROUNDS: u32 = 64;

/// Whether the command name `name` is `upper` (an upper-case constant), in any case. A byte
/// loop over the constant: `eq_ignore_ascii_case` folds both sides (measured with callgrind,
/// docs/service.md).
#[inline]
fn named(name: &[u8], upper: &str) -> bool {
    name.len() == upper.len()
        && name
            .iter()
            .zip(upper.bytes())
            .all(|(&a, b)| a == b || (b.is_ascii_uppercase() && a == b | 0x20))
}

fn wrong_args(o: &mut Out<'_>, name: &[u8]) {
    o.error(&format!(
        "ERR wrong number of arguments for '{}' command",
        String::from_utf8_lossy(name).to_lowercase()
    ));
}

/// Commands a client may send before AUTH.
fn allowed_unauthenticated(a: &Args<'_>) -> bool {
    a.is(0, "AUTH") || a.is(0, "HELLO") || a.is(0, "QUIT")
}

/// Runs one command, appending its reply; `id` is the key id [`look_ahead`] computed for a
/// `CL.THROTTLE`.
fn command(
    shared: &Shared,
    st: &mut State,
    a: &Args<'_>,
    id: Option<u64>,
    o: &mut Out<'_>,
    clock: &DefaultClock,
) -> Flow {
    if !st.authed && !allowed_unauthenticated(a) {
        o.error("NOAUTH Authentication required.");
        return Flow::Go;
    }
    let name = a.get(0);
    let n = a.len();
    let up = |s: &str| named(name, s);
    let throttle = up("CL.THROTTLE");
    if !throttle {
        st.last.unmark();
    }
    if throttle {
        if n != 5 && n != 6 {
            wrong_args(o, name);
            return Flow::Go;
        }
        let args: [&[u8]; 5] = [
            a.get(1),
            a.get(2),
            a.get(3),
            a.get(4),
            if n == 6 { a.get(5) } else { b"1" },
        ];
        match st.last.throttle(&shared.throttles, &args, id) {
            Ok((c, t0)) => {
                st.tally.add(
                    if c.limited == 1 {
                        C::ThrottleLimited
                    } else {
                        C::ThrottleAllowed
                    },
                    1,
                );
                o.ints(&c.as_array());
                let ns = st.last.stop(t0);
                st.tally.latency(ns);
            }
            // Refused before reaching a store: nothing was checked, nothing timed.
            Err(e) => o.error(&e.to_string()),
        }
    } else if up("TURNSTILE.CHECK") || up("TURNSTILE.PEEK") || up("TURNSTILE.REFUND") {
        let what = if up("TURNSTILE.PEEK") {
            Rules::Peek
        } else if up("TURNSTILE.REFUND") {
            Rules::Refund
        } else {
            Rules::Check
        };
        if n < 3 || n > if what == Rules::Peek { 4 } else { 5 } {
            wrong_args(o, name);
            return Flow::Go;
        }
        let t0 = clock.now();
        turnstile_rules(shared, a, o, what);
        shared.metrics.latency(clock.now().saturating_sub(t0));
    } else if up("PING") {
        match n {
            1 => o.simple("PONG"),
            2 => o.bulk(a.get(1)),
            _ => wrong_args(o, name),
        }
    } else if up("ECHO") {
        if n != 2 {
            wrong_args(o, name);
        } else {
            o.bulk(a.get(1));
        }
    } else if up("HELLO") {
        hello(shared, st, a, o);
    } else if up("AUTH") {
        match n {
            2 | 3 => {
                auth(
                    shared,
                    st,
                    a.get(n - 1),
                    if n == 3 { Some(a.get(1)) } else { None },
                    o,
                );
            }
            _ => wrong_args(o, name),
        }
    } else if up("CLIENT") {
        client(st, a, o);
    } else if up("COMMAND") {
        if a.is(1, "COUNT") {
            o.int(COMMANDS.len() as i64);
        } else if a.is(1, "DOCS") {
            // No docs: an empty map, which clients read as "no hints".
            o.map(0);
        } else if n == 1 || a.is(1, "INFO") {
            o.array(COMMANDS.len());
            for (c, arity, flags) in COMMANDS {
                o.array(6);
                o.bulk(c.as_bytes());
                o.int(*arity);
                o.array(flags.len());
                for f in flags.iter() {
                    o.simple(f);
                }
                let key = i64::from(c.starts_with("cl.") || c.starts_with("turnstile."));
                o.int(key);
                o.int(key);
                o.int(key);
            }
        } else {
            o.error("ERR unknown subcommand for 'command'");
        }
    } else if up("SELECT") {
        match n {
            2 if a.get(1) == b"0" => o.simple("OK"),
            2 => o.error("ERR DB index is out of range"),
            _ => wrong_args(o, name),
        }
    } else if up("INFO") {
        let text = info(shared);
        o.bulk(text.as_bytes());
    } else if up("CONFIG") {
        // redis-benchmark asks CONFIG GET save / appendonly on start: nothing is persisted
        // the Redis way, so as Redis without persistence answers; other names are unknown.
        if a.is(1, "GET") && n == 3 {
            if a.is(2, "save") {
                o.map(1);
                o.bulk(b"save");
                o.bulk(b"");
            } else if a.is(2, "appendonly") {
                o.map(1);
                o.bulk(b"appendonly");
                o.bulk(b"no");
            } else {
                o.map(0);
            }
        } else if a.is(1, "GET") {
            o.map(0);
        } else {
            o.error("ERR CONFIG: only GET is supported, and it reports nothing");
        }
    } else if up("QUIT") {
        o.simple("OK");
        return Flow::Close;
    } else {
        let mut m = format!(
            "ERR unknown command '{}', with args beginning with: ",
            String::from_utf8_lossy(&name[..name.len().min(128)])
        );
        for i in 1..n.min(8) {
            let s = a.get(i);
            m.push_str(&format!(
                "'{}' ",
                String::from_utf8_lossy(&s[..s.len().min(128)])
            ));
        }
        o.error(&m);
    }
    let _ = st.id;
    Flow::Go
}

/// Name, arity (negative: at least) and flags, for COMMAND.
const COMMANDS: &[(&str, i64, &[&str])] = &[
    ("cl.throttle", -5, &["write", "fast"]),
    ("turnstile.check", -3, &["write", "fast"]),
    ("turnstile.peek", -3, &["readonly", "fast"]),
    ("turnstile.refund", -3, &["write", "fast"]),
    ("ping", -1, &["fast", "stale"]),
    ("echo", 2, &["fast"]),
    ("hello", -1, &["noauth", "fast"]),
    ("auth", -2, &["noauth", "fast"]),
    ("client", -2, &["fast"]),
    ("command", -1, &["loading", "stale"]),
    ("select", 2, &["fast"]),
    ("info", -1, &["stale"]),
    ("config", -2, &["admin"]),
    ("quit", 1, &["noauth", "fast"]),
];

fn auth(
    shared: &Shared,
    st: &mut State,
    pass: &[u8],
    user: Option<&[u8]>,
    o: &mut Out<'_>,
) -> bool {
    match &shared.args.requirepass {
        None => {
            o.error("ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?");
            false
        }
        Some(p) if p.as_bytes() == pass && user.is_none_or(|u| u == b"default") => {
            st.authed = true;
            o.simple("OK");
            true
        }
        Some(_) => {
            o.error("WRONGPASS invalid username-password pair or user is disabled.");
            false
        }
    }
}

fn hello(shared: &Shared, st: &mut State, a: &Args<'_>, o: &mut Out<'_>) {
    let mut proto = st.proto;
    let mut i = 1;
    if a.len() > 1 {
        match crate::throttle::parse_i64(a.get(1)) {
            Ok(2) => proto = Proto::Resp2,
            Ok(3) => proto = Proto::Resp3,
            Ok(_) => {
                o.error("NOPROTO unsupported protocol version");
                return;
            }
            Err(_) => {
                o.error("ERR Protocol version is not an integer or out of range");
                return;
            }
        }
        i = 2;
    }
    while i < a.len() {
        if a.is(i, "AUTH") && i + 2 < a.len() {
            let mut scratch = Vec::new();
            let mut so = Out {
                buf: &mut scratch,
                proto,
            };
            if !auth(shared, st, a.get(i + 2), Some(a.get(i + 1)), &mut so) {
                o.buf.extend_from_slice(&scratch);
                return;
            }
            i += 3;
        } else if a.is(i, "SETNAME") && i + 1 < a.len() {
            st.name = a.get(i + 1).to_vec();
            i += 2;
        } else {
            o.error(&format!(
                "ERR Syntax error in HELLO option '{}'",
                String::from_utf8_lossy(a.get(i))
            ));
            return;
        }
    }
    if !st.authed {
        o.error("NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time");
        return;
    }
    st.proto = proto;
    o.proto = proto;
    o.map(7);
    o.bulk(b"server");
    o.bulk(b"turnstile");
    o.bulk(b"version");
    o.bulk(env!("CARGO_PKG_VERSION").as_bytes());
    o.bulk(b"proto");
    o.int(if proto == Proto::Resp3 { 3 } else { 2 });
    o.bulk(b"id");
    o.int(st.id as i64);
    o.bulk(b"mode");
    o.bulk(b"standalone");
    o.bulk(b"role");
    o.bulk(b"master");
    o.bulk(b"modules");
    o.array(0);
}

fn client(st: &mut State, a: &Args<'_>, o: &mut Out<'_>) {
    if a.is(1, "SETNAME") && a.len() == 3 {
        st.name = a.get(2).to_vec();
        o.simple("OK");
    } else if a.is(1, "SETINFO") && a.len() == 4 {
        o.simple("OK");
    } else if a.is(1, "GETNAME") && a.len() == 2 {
        if st.name.is_empty() {
            o.null();
        } else {
            let name = std::mem::take(&mut st.name);
            o.bulk(&name);
            st.name = name;
        }
    } else if a.is(1, "ID") && a.len() == 2 {
        o.int(st.id as i64);
    } else {
        o.error("ERR unknown subcommand or wrong number of arguments for 'client' command");
    }
}

fn info(shared: &Shared) -> String {
    format!(
        "# Server\r\nredis_version:7.0.0\r\nturnstile_version:{}\r\nredis_mode:standalone\r\nmultiplexing_api:epoll\r\n\r\n# Clients\r\nconnected_clients:{}\r\n\r\n# Stats\r\ntotal_commands_processed:{}\r\n\r\n# Keyspace\r\n",
        env!("CARGO_PKG_VERSION"),
        shared.connections.load(Ordering::Relaxed),
        shared.metrics.get(C::Commands)
    )
}

/// A request from a key class (`customer`, `ip`, `api_key`, `route`, `method`, or parts joined
/// by `+`) and a key (parts joined by `|`). Errors say what is wrong.
pub(crate) fn request<'a>(class: &str, key: &'a str) -> Result<Request<'a>, String> {
    // Iterators, not vectors: this runs for every check (RESP and HTTP) and allocates nothing
    // unless the request is wrong.
    let n = class.split('+').count();
    let k = if n == 1 { 1 } else { key.split('|').count() };
    if n != k {
        return Err(format!(
            "key class `{class}` has {n} parts but the key `{key}` has {k} (separate them with `|`)"
        ));
    }
    let mut r = Request::new();
    let mut keys = key.split('|');
    for p in class.split('+') {
        let k = if n == 1 {
            key
        } else {
            keys.next().unwrap_or_default()
        };
        match p {
            "customer" => r.customer = Some(customer(k)?),
            "ip" => {
                r.ip = Some(k.parse::<IpAddr>().map_err(|_| format!("`{k}` is not an IP address"))?)
            }
            "api_key" => r.api_key = Some(k),
            "route" => r.route = Some(k),
            "method" => r.method = Some(k),
            _ => {
                return Err(format!(
                    "unknown key class `{p}`; expected customer, ip, api_key, route, method, or parts joined by `+`"
                ))
            }
        }
    }
    Ok(r)
}

/// A customer id: decimal, optionally tagged (`user:241531`), as in rules files.
fn customer(s: &str) -> Result<u64, String> {
    let digits = match s.split_once(':') {
        Some((tag, d))
            if !tag.is_empty() && tag.bytes().all(|b| b.is_ascii_alphabetic() || b == b'_') =>
        {
            d
        }
        _ => s,
    };
    digits
        .parse::<u64>()
        .ok()
        .filter(|_| digits.bytes().all(|b| b.is_ascii_digit()))
        .ok_or_else(|| format!("`{s}` is not a customer id: write a decimal id, optionally tagged, e.g. 241531 or user:241531"))
}

/// A decision's milliseconds, rounded up.
pub(crate) fn ms_up(ns: u64) -> i64 {
    ns.div_ceil(1_000_000).min(i64::MAX as u64) as i64
}

/// A count for a reply: -1 for "no limit" (`u64::MAX`).
pub(crate) fn count(v: u64) -> i64 {
    if v > i64::MAX as u64 {
        -1
    } else {
        v as i64
    }
}

/// Which rules command.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Rules {
    Check,
    Peek,
    Refund,
}

/// Which rules command `name` is, if it is one.
fn rules_command(name: &[u8]) -> Option<Rules> {
    if named(name, "TURNSTILE.CHECK") {
        Some(Rules::Check)
    } else if named(name, "TURNSTILE.PEEK") {
        Some(Rules::Peek)
    } else if named(name, "TURNSTILE.REFUND") {
        Some(Rules::Refund)
    } else {
        None
    }
}

/// The Redis backend and the command, if `a` is a rules command (of the right arity, from
/// an authenticated client) and the rules keep their counts in Redis.
fn remote(shared: &Shared, st: &State, a: &Args<'_>) -> Option<(Arc<RedisRules>, Rules)> {
    if !st.authed || shared.engine.is_none() {
        return None;
    }
    let what = rules_command(a.get(0))?;
    let n = a.len();
    if n < 3 || n > if what == Rules::Peek { 4 } else { 5 } {
        return None;
    }
    Some((shared.backends.redis()?, what))
}

/// A rules command's request, or its error written to `o`.
fn rules_request<'a>(a: &Args<'a>, o: &mut Out<'_>, what: Rules) -> Option<Request<'a>> {
    let (Ok(class), Ok(key)) = (std::str::from_utf8(a.get(1)), std::str::from_utf8(a.get(2)))
    else {
        o.error("ERR key class and key must be UTF-8");
        return None;
    };
    let mut req = match request(class, key) {
        Ok(r) => r,
        Err(m) => {
            o.error(&format!("ERR {m}"));
            return None;
        }
    };
    let peek = what == Rules::Peek;
    let mut next = 3;
    if !peek && a.len() > 3 {
        match crate::throttle::parse_i64(a.get(3)) {
            Ok(c) if c >= 0 => req.cost = c as u64,
            Ok(_) => {
                o.error(&ArgError::NotPositive.to_string());
                return None;
            }
            Err(e) => {
                o.error(&e.to_string());
                return None;
            }
        }
        next = 4;
    }
    if peek {
        req.cost = 0;
    }
    if a.len() > next {
        match std::str::from_utf8(a.get(next))
            .ok()
            .and_then(|s| s.parse::<Priority>().ok())
        {
            Some(p) => req.priority = Some(p),
            None => {
                o.error("ERR unknown priority; expected critical, post, get or test");
                return None;
            }
        }
    }
    Some(req)
}

/// A check's or peek's reply (and its count in the metrics).
fn rules_reply(shared: &Shared, o: &mut Out<'_>, what: Rules, v: &Verdict) {
    let d: &Decision = &v.decision;
    if what != Rules::Peek {
        shared.metrics.add(
            if d.allowed() {
                C::CheckAllowed
            } else {
                C::CheckDenied
            },
            1,
        );
    }
    o.array(6);
    o.int(i64::from(d.allowed()));
    o.int(count(d.limit));
    o.int(count(d.remaining));
    o.int(d.retry_after_ns.map_or(-1, ms_up));
    o.int(ms_up(d.reset_after_ns));
    match &v.rule {
        Some(r) => o.bulk(r.as_bytes()),
        None => o.null(),
    }
}

/// `TURNSTILE.CHECK|REFUND key_class key [cost] [priority]`, `TURNSTILE.PEEK key_class key
/// [priority]`, with the counts in memory.
fn turnstile_rules(shared: &Shared, a: &Args<'_>, o: &mut Out<'_>, what: Rules) {
    let Some(engine) = &shared.engine else {
        o.error("ERR no rules loaded: start the server with --rules FILE");
        return;
    };
    let Some(req) = rules_request(a, o, what) else {
        return;
    };
    if what == Rules::Refund {
        let n = engine.refund(&req);
        shared.metrics.add(C::Refunds, 1);
        o.int(i64::from(n));
        return;
    }
    rules_reply(shared, o, what, &engine.explain(&req));
}

/// The same commands with the counts in Redis ([`remote`] chose them): the check awaits Redis
/// (the backend's timeout, then its failure policy answers); a refund Redis does not take is an
/// error.
async fn rules_on_redis(
    shared: &Shared,
    redis: &RedisRules,
    a: &Args<'_>,
    o: &mut Out<'_>,
    what: Rules,
) {
    let Some(engine) = &shared.engine else {
        return;
    };
    let Some(req) = rules_request(a, o, what) else {
        return;
    };
    if what == Rules::Refund {
        shared.metrics.add(C::Refunds, 1);
        match redis.refund(engine, &req).await {
            Ok(n) => o.int(i64::from(n)),
            Err(e) => o.error(&format!("ERR the refund did not reach Redis: {e}")),
        }
        return;
    }
    let v = redis.explain(engine, &req).await;
    rules_reply(shared, o, what, &v);
}
