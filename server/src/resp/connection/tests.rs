use super::*;
use crate::resp::parse::tests::cmd;

/// Feeds `input` as a client that reads everything would, in reads of `chunk` bytes;
/// returns what the server wrote and whether it closed.
fn talk(c: &mut Connection, input: &[u8], chunk: usize) -> (Vec<u8>, bool) {
    let mut out = Vec::new();
    let mut at = 0;
    loop {
        let step = c.run();
        out.extend_from_slice(c.output());
        let n = c.output().len();
        c.wrote(n);
        match step {
            Step::Close => return (out, true),
            Step::Remote(_) => panic!("no Redis here"),
            Step::Wait | Step::Yield => {}
        }
        if n > 0 {
            continue;
        }
        if at >= input.len() {
            return (out, false);
        }
        let buf = c.read_buf().expect("reads when its output is read");
        let n = buf.len().min(chunk).min(input.len() - at);
        buf[..n].copy_from_slice(&input[at..at + n]);
        c.read(n);
        at += n;
    }
}

fn conn(edit: impl FnOnce(&mut crate::ServeArgs)) -> Connection {
    Connection::new(Server::detached(edit), 1, None, None)
}

/// Bytes of the deferred budget lent out.
fn lent(c: &Connection) -> usize {
    c.srv
        .buffers
        .deferred
        .load(std::sync::atomic::Ordering::Relaxed)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn pipelines_answer_in_order_whatever_the_reads() {
    let mut input = Vec::new();
    for i in 0..100 {
        input.extend(cmd(&[
            b"CL.THROTTLE",
            format!("k{}", i % 3).as_bytes(),
            b"5",
            b"1",
            b"60",
        ]));
        input.extend(cmd(&[b"PING"]));
    }
    input.extend(cmd(&[b"ECHO", b"end"]));
    let want = talk(&mut conn(|_| {}), &input, usize::MAX).0;
    for chunk in [1, 7, 100, 4096] {
        assert_eq!(
            talk(&mut conn(|_| {}), &input, chunk).0,
            want,
            "chunk {chunk}"
        );
    }
    assert!(text(&want).ends_with("$3\r\nend\r\n"));
    assert_eq!(text(&want).matches("+PONG").count(), 100);
}

#[test]
fn nothing_but_a_small_frame_before_auth() {
    // 128 arguments of 512 KiB, or one: refused at the header, before any of it is held.
    for (input, what) in [
        (&b"*128\r\n$524288\r\n"[..], "multibulk length"),
        (b"*2\r\n$4\r\nAUTH\r\n$524288\r\n", "bulk length"),
    ] {
        let mut c = conn(|a| a.requirepass = Some("pw".into()));
        let (out, closed) = talk(&mut c, input, usize::MAX);
        assert_eq!(
            text(&out),
            format!("-ERR Protocol error: unauthenticated {what}\r\n")
        );
        assert!(closed);
    }
    // Every other command is answered NOAUTH; the buffer stays small.
    let mut c = conn(|a| a.requirepass = Some("pw".into()));
    let flood = cmd(&[b"CL.THROTTLE", b"k", b"1", b"1", b"1"]).repeat(10_000);
    let (out, closed) = talk(&mut c, &flood, 65536);
    assert!(!closed);
    assert_eq!(text(&out).matches("-NOAUTH").count(), 10_000);
    assert!(c.input.len() <= INPUT_BUSY, "{}", c.input.len());
    // Then AUTH: commands run.
    let mut input = cmd(&[b"AUTH", b"wrong"]);
    input.extend(cmd(&[b"AUTH", b"pw"]));
    input.extend(cmd(&[b"CL.THROTTLE", b"k", b"1", b"1", b"1"]));
    let (out, _) = talk(&mut c, &input, usize::MAX);
    assert_eq!(
        text(&out),
        "-WRONGPASS invalid username-password pair or user is disabled.\r\n+OK\r\n*5\r\n:0\r\n:2\r\n:1\r\n:-1\r\n:1\r\n"
    );
}

#[test]
fn frames_are_bounded_by_what_commands_take() {
    let mut c = conn(|_| {});
    let (out, closed) = talk(&mut c, b"*17\r\n", usize::MAX);
    assert_eq!(
        text(&out),
        "-ERR Protocol error: invalid multibulk length\r\n"
    );
    assert!(closed);
    let mut c = conn(|_| {});
    let (out, closed) = talk(&mut c, b"*2\r\n$4\r\nECHO\r\n$4097\r\n", usize::MAX);
    assert_eq!(text(&out), "-ERR Protocol error: invalid bulk length\r\n");
    assert!(closed);
    // The longest frame allowed is held, answered, and the buffer shrinks back.
    let mut c = conn(|_| {});
    let arg = vec![b'x'; 4096];
    let mut parts: Vec<&[u8]> = vec![b"COMMAND", b"INFO"];
    parts.extend(std::iter::repeat_n(&arg[..], 14));
    let (out, closed) = talk(&mut c, &cmd(&parts), 1000);
    assert!(!closed);
    assert!(text(&out).starts_with("*14\r\n"), "{}", &text(&out)[..20]);
    assert!(c.input.len() <= INPUT_BUSY);
}

/// A client that never reads: the connection stops running its commands once 16 KiB wait
/// (and the budget is spent), and is closed past its output limit.
#[test]
fn a_client_that_never_reads_holds_a_bounded_output() {
    let mut c = conn(|a| a.client_output_limit = 64 << 10);
    let input = b"COMMAND\r\n".repeat(100_000);
    let mut at = 0;
    let mut closed = false;
    for _ in 0..100_000 {
        // Every write would block: the client reads nothing.
        c.blocked();
        match c.run() {
            Step::Close => {
                closed = true;
                break;
            }
            Step::Remote(_) => unreachable!(),
            Step::Wait | Step::Yield => {}
        }
        assert!(c.pending() <= (64 << 10) + 8192, "{}", c.pending());
        // The memory it holds past its own allowance is what it borrowed, no more.
        assert!(
            c.out.capacity() <= c.out_base() + c.out_reserved,
            "capacity {} borrowed {}",
            c.out.capacity(),
            c.out_reserved
        );
        let Some(buf) = c.read_buf() else { break };
        let n = buf.len().min(input.len() - at);
        buf[..n].copy_from_slice(&input[at..at + n]);
        c.read(n);
        at += n;
    }
    // The server-wide budget (1 MiB here) lends more than the output limit: closed.
    assert!(closed, "pending {}", c.pending());
    assert_eq!(c.pending(), 0, "its output is dropped");
    assert_eq!(c.out.capacity(), 0, "and freed");
    assert_eq!(lent(&c), 0, "the budget is given back");
}

#[test]
fn a_long_pipeline_gives_others_a_turn() {
    let mut c = conn(|_| {});
    let input = b"PING\r\n".repeat(1000);
    let buf = c.read_buf().unwrap();
    let n = buf.len().min(input.len());
    buf[..n].copy_from_slice(&input[..n]);
    c.read(n);
    assert!(matches!(c.run(), Step::Yield));
    assert_eq!(c.output(), b"+PONG\r\n".repeat(RUN_MAX).as_slice());
    // Run again: the next turn, without new input.
    let p = c.pending();
    c.wrote(p);
    assert!(matches!(c.run(), Step::Yield));
    assert_eq!(c.pending(), 7 * RUN_MAX);
}

#[test]
fn output_written_while_more_is_answered_is_let_go() {
    // The io_uring driver's pattern: a copy of the output is out while the connection
    // answers more; the copy completes, and the connection is never all written. What was
    // written must not stay in the buffer (it once grew by everything ever sent).
    let mut c = conn(|_| {});
    let input = b"PING\r\n".repeat(400_000);
    let (mut at, mut sent) = (0, 0);
    while at < input.len() {
        let _ = c.run();
        let out = c.output().len().min(64 << 10);
        // The client's commands come in pieces (a round trip each).
        if let Some(buf) = c.read_buf() {
            let n = buf.len().min(input.len() - at).min(1200);
            buf[..n].copy_from_slice(&input[at..at + n]);
            c.read(n);
            at += n;
        }
        let _ = c.run();
        c.wrote(out);
        sent += out;
        assert!(
            c.out.capacity() <= 4 * (OUTPUT_PAUSE + MAX_REPLY),
            "{} bytes held after {sent} sent",
            c.out.capacity()
        );
    }
    assert!(sent > 2 << 20, "{sent}");
}

#[test]
fn with_the_budget_spent_a_connection_pauses() {
    let srv = Server::detached(|_| {});
    // Another connection holds the whole budget.
    assert!(srv.buffers.reserve(srv.buffers.deferred_max));
    let mut c = Connection::new(srv.clone(), 1, None, None);
    let input = b"COMMAND\r\n".repeat(1000);
    let buf = c.read_buf().unwrap();
    let n = buf.len();
    buf.copy_from_slice(&input[..n]);
    c.read(n);
    assert!(matches!(c.run(), Step::Wait));
    assert!(c.pending() >= OUTPUT_PAUSE && c.pending() < OUTPUT_PAUSE + 8192);
    // Given to the driver first; the client does not read it: paused.
    c.blocked();
    assert!(matches!(c.run(), Step::Wait));
    assert!(c.pending() < OUTPUT_PAUSE + 8192);
    assert!(!c.wants_read() && c.read_buf().is_none());
    // The client reads: it goes on.
    let p = c.pending();
    c.wrote(p);
    assert!(c.wants_read());
    assert!(matches!(c.run(), Step::Wait));
    assert!(c.pending() > 0);
}

#[test]
fn transactions_as_redis_answers_them() {
    let mut input = Vec::new();
    for p in [
        &[&b"MULTI"[..]][..],
        &[b"CL.THROTTLE", b"m", b"2", b"10", b"60"],
        &[b"CL.THROTTLE", b"m", b"x", b"10", b"60"],
        &[b"PING"],
        &[b"EXEC"],
        &[b"EXEC"],
        &[b"MULTI"],
        &[b"NOPE"],
        &[b"PING", b"a", b"b"],
        &[b"PING"],
        &[b"EXEC"],
        &[b"MULTI"],
        &[b"MULTI"],
        &[b"DISCARD"],
        &[b"DISCARD"],
        &[b"WATCH", b"k"],
    ] {
        input.extend(cmd(p));
    }
    let (out, _) = talk(&mut conn(|_| {}), &input, 5);
    assert_eq!(
        text(&out),
        "+OK\r\n+QUEUED\r\n+QUEUED\r\n+QUEUED\r\n*3\r\n*5\r\n:0\r\n:3\r\n:2\r\n:-1\r\n:6\r\n-ERR value is not an integer or out of range\r\n+PONG\r\n\
         -ERR EXEC without MULTI\r\n\
         +OK\r\n-ERR unknown command 'NOPE', with args beginning with: \r\n-ERR wrong number of arguments for 'ping' command\r\n+QUEUED\r\n-EXECABORT Transaction discarded because of previous errors.\r\n\
         +OK\r\n-ERR MULTI calls can not be nested\r\n+OK\r\n-ERR DISCARD without MULTI\r\n\
         -ERR WATCH is not supported: there are no keys to watch; each command is atomic on its own (docs/service.md)\r\n"
    );
}

#[test]
fn a_transaction_is_bounded() {
    let mut c = conn(|a| a.client_output_limit = 64 << 10);
    let mut input = cmd(&[b"MULTI"]);
    let arg = vec![b'k'; 4000];
    for _ in 0..20 {
        input.extend(cmd(&[b"ECHO", &arg]));
    }
    input.extend(cmd(&[b"EXEC"]));
    let (out, _) = talk(&mut c, &input, usize::MAX);
    let t = text(&out);
    assert_eq!(t.matches("+QUEUED").count(), 16, "{}", &t[..200]);
    assert!(t.contains("-ERR the transaction is too large"));
    assert!(t.ends_with("-EXECABORT Transaction discarded because of previous errors.\r\n"));
    assert_eq!(lent(&c), 0, "the budget is given back");
}

/// A queue's bookkeeping counts against its bounds and in the buffers' gauge, not only
/// its arguments: 10 000 PINGs are 40 KB of arguments and 320 KB of ranges.
#[test]
fn a_transaction_counts_its_bookkeeping() {
    let mut c = conn(|_| {});
    let mut input = cmd(&[b"MULTI"]);
    for _ in 0..10_000 {
        input.extend(cmd(&[b"PING"]));
    }
    let (out, _) = talk(&mut c, &input, usize::MAX);
    assert_eq!(text(&out).matches("+QUEUED").count(), 10_000);
    let relaxed = std::sync::atomic::Ordering::Relaxed;
    let held = c.srv.buffers.bytes.load(relaxed);
    assert!(held >= 10_000 * (4 + 2 * RANGE), "{held}");
    let lent = lent(&c);
    assert!(lent >= 10_000 * (4 + 2 * RANGE) - QUEUE_FREE, "{lent}");
    // Past the output limit it is refused, bookkeeping included.
    let mut c = conn(|a| a.client_output_limit = 64 << 10);
    let (out, _) = talk(&mut c, &input, usize::MAX);
    let queued = text(&out).matches("+QUEUED").count();
    assert_eq!(queued, (64 << 10) / (4 + 2 * RANGE), "{queued}");
}

#[test]
fn exec_streams_its_replies_within_the_output_bound() {
    let mut c = conn(|_| {});
    let mut input = cmd(&[b"MULTI"]);
    for _ in 0..2000 {
        input.extend(cmd(&[b"COMMAND"]));
    }
    input.extend(cmd(&[b"EXEC"]));
    let (out, closed) = talk(&mut c, &input, usize::MAX);
    let t = text(&out);
    assert!(!closed, "{}", &t[t.len().saturating_sub(300)..]);
    assert!(text(&out).contains("*2000\r\n"));
    assert_eq!(text(&out).matches("cl.throttle").count(), 2000);
}

#[test]
fn the_longest_replies_fit_max_reply() {
    for p in [
        &[&b"COMMAND"[..]][..],
        &[b"COMMAND", b"DOCS"],
        &[b"COMMAND", b"INFO"],
        &[b"INFO"],
        &[b"CLIENT", b"INFO"],
    ] {
        let (out, _) = talk(&mut conn(|_| {}), &cmd(p), usize::MAX);
        assert!(out.len() <= MAX_REPLY, "{p:?}: {} bytes", out.len());
    }
    // At the defaults: ~66 KiB of input, 16 + 16 KiB of output, 16 KiB of queue, 16 fixed.
    let b = Bounds::default();
    assert_eq!(max_bytes(&b), b.max_frame() + 64 * 1024);
    assert!(max_bytes(&b) < 132 * 1024);
}

#[test]
fn session_commands_answer_as_redis() {
    let mut input = Vec::new();
    for p in [
        &[&b"AUTH"[..], b"default", b"anything"][..],
        &[b"AUTH", b"x"],
        &[b"HELLO", b"3", b"AUTH", b"default", b"x", b"SETNAME", b"me"],
        &[b"CLIENT", b"GETNAME"],
        &[b"CLIENT", b"SETINFO", b"LIB-NAME", b"redis-py"],
        &[b"CLIENT", b"NOPE"],
        &[b"SELECT", b"1"],
        &[b"RESET"],
        &[b"CLIENT", b"GETNAME"],
    ] {
        input.extend(cmd(p));
    }
    let (out, _) = talk(&mut conn(|_| {}), &input, usize::MAX);
    let t = text(&out);
    assert!(
        t.starts_with("+OK\r\n-ERR AUTH <password> called without any password configured"),
        "{t}"
    );
    assert!(t.contains("%7\r\n$6\r\nserver\r\n"), "{t}");
    assert!(t.contains("$2\r\nme\r\n+OK\r\n-ERR unknown subcommand 'NOPE'. Try CLIENT HELP.\r\n-ERR DB index is out of range\r\n+RESET\r\n$-1\r\n"), "{t}");
    // CLIENT INFO names what the connection was told.
    let mut input = cmd(&[b"CLIENT", b"SETNAME", b"worker-1"]);
    input.extend(cmd(&[b"CLIENT", b"INFO"]));
    let (out, _) = talk(&mut conn(|_| {}), &input, usize::MAX);
    assert!(
        text(&out).contains("id=1 addr= laddr= fd=-1 name=worker-1 "),
        "{}",
        text(&out)
    );
}

/// The commands parsed ahead point into the input buffer: a read while some of them wait (the
/// connection waits for its client to read, or yielded its turn) moves nothing under them.
#[test]
fn reads_while_parsed_commands_wait_move_nothing() {
    // Short commands with long replies: the output pauses the connection in the middle of a
    // batch parsed ahead, with its input buffer full.
    let input: Vec<u8> = (0..300)
        .flat_map(|i| {
            let mut v = cmd(&[b"ECHO", format!("{i:05}").as_bytes()]);
            v.extend(cmd(&[b"COMMAND"]));
            v
        })
        .collect();
    let (want, _) = talk(&mut conn(|_| {}), &input, usize::MAX);
    let mut c = conn(|_| {});
    let (mut at, mut out) = (0, Vec::new());
    // A client that reads its replies a little at a time and sends whenever the connection
    // reads.
    for _ in 0..1_000_000 {
        if let Some(buf) = c.read_buf() {
            let n = buf.len().min(input.len() - at);
            buf[..n].copy_from_slice(&input[at..at + n]);
            c.read(n);
            at += n;
        }
        let step = c.run();
        let n = c.output().len().min(5000);
        out.extend_from_slice(&c.output()[..n]);
        c.wrote(n);
        if at == input.len() && c.output().is_empty() && matches!(step, Step::Wait) {
            break;
        }
    }
    assert_eq!(out.len(), want.len());
    assert!(out == want, "replies out of order or corrupt");
}

/// `RESET` ends the session the commands after it were parsed for: with a password they are
/// answered `NOAUTH` (a `CL.THROTTLE` parsed ahead once ran without a look at the access) and
/// held to the bounds before authentication, as if each had come in a read of its own.
#[test]
fn commands_after_reset_are_parsed_for_the_new_session() {
    let mut input = cmd(&[b"AUTH", b"pw"]);
    input.extend(cmd(&[b"RESET"]));
    input.extend(cmd(&[b"CL.THROTTLE", b"k", b"1", b"1", b"3600"]));
    input.extend(cmd(&[b"ECHO", &[b'x'; 2000]]));
    let (out, closed) = talk(
        &mut conn(|a| a.requirepass = Some("pw".into())),
        &input,
        usize::MAX,
    );
    assert_eq!(
        text(&out),
        "+OK\r\n+RESET\r\n-NOAUTH Authentication required.\r\n-ERR Protocol error: unauthenticated bulk length\r\n"
    );
    assert!(closed);
}

/// The fuzz target's seed of a client reading a little at a time, run as a test.
#[test]
fn the_fuzz_seed_of_a_slow_reader_holds() {
    let seed =
        include_bytes!("../../../../fuzz/corpus/resp_connection/slow-reader-commands-parsed-ahead");
    crate::resp::fuzz_connection(seed);
}
