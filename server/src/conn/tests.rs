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
         +OK\r\n-ERR unknown command 'NOPE', with args beginning with: \r\n+QUEUED\r\n+QUEUED\r\n-EXECABORT Transaction discarded because of previous errors.\r\n\
         +OK\r\n-ERR MULTI calls can not be nested\r\n+OK\r\n-ERR DISCARD without MULTI\r\n\
         -ERR WATCH is not supported: there are no keys to watch; each command is atomic on its own (docs/service.md)\r\n"
    );
}

/// What redis-server 7 answers to each (cli/tests/redis_parity.rs compares with it).
#[test]
fn transaction_errors_as_redis_answers_them() {
    let cases: &[(&[&[&[u8]]], &str)] = &[
        (
            &[&[b"MULTI"], &[b"ECHO", b"a"], &[b"EXEC", b"x"], &[b"EXEC"]],
            "+OK\r\n+QUEUED\r\n-EXECABORT Transaction discarded because of: wrong number of arguments for 'exec' command\r\n-ERR EXEC without MULTI\r\n",
        ),
        (
            &[&[b"MULTI"], &[b"PING", b"a", b"b"], &[b"EXEC"]],
            "+OK\r\n+QUEUED\r\n*1\r\n-ERR wrong number of arguments for 'ping' command\r\n",
        ),
        (
            &[&[b"MULTI"], &[b"DISCARD", b"x"], &[b"EXEC"]],
            "+OK\r\n-ERR wrong number of arguments for 'discard' command\r\n-EXECABORT Transaction discarded because of previous errors.\r\n",
        ),
        (
            &[&[b"MULTI"], &[b"CLIENT", b"FOO", b"a", b"b"], &[b"CLIENT", b"SETNAME"], &[b"EXEC"]],
            "+OK\r\n-ERR unknown subcommand 'FOO'. Try CLIENT HELP.\r\n-ERR wrong number of arguments for 'client|setname' command\r\n-EXECABORT Transaction discarded because of previous errors.\r\n",
        ),
        (
            &[&[b"MULTI"], &[b"WATCH", b"k"], &[b"CLIENT", b"SETNAME", b"a b"], &[b"EXEC"]],
            "+OK\r\n-ERR WATCH inside MULTI is not allowed\r\n+QUEUED\r\n*1\r\n-ERR Client names cannot contain spaces, newlines or special characters.\r\n",
        ),
        (
            &[&[b"EXEC", b"x"], &[b"CLIENT", b"MAINT_NOTIFICATIONS", b"on", b"moving-endpoint-type", b"internal-ip"]],
            "-EXECABORT Transaction discarded because of: wrong number of arguments for 'exec' command\r\n-ERR unknown subcommand 'MAINT_NOTIFICATIONS'. Try CLIENT HELP.\r\n",
        ),
        (
            &[&[b"CLIENT", b"SETINFO", b"LIB-NAME", b"a b"], &[b"CLIENT", b"SETINFO", b"lib-ver", b"1.0\n"], &[b"CLIENT", b"SETINFO", b"LIB-NAME", b"redis-py"]],
            "-ERR LIB-NAME cannot contain spaces, newlines or special characters.\r\n-ERR lib-ver cannot contain spaces, newlines or special characters.\r\n+OK\r\n",
        ),
    ];
    for (commands, want) in cases {
        let input: Vec<u8> = commands.iter().flat_map(|p| cmd(p)).collect();
        let (out, _) = talk(&mut conn(|_| {}), &input, 7);
        assert_eq!(text(&out), *want, "{commands:?}");
    }
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
        include_bytes!("../../../fuzz/corpus/resp_connection/slow-reader-commands-parsed-ahead");
    crate::conn::fuzz::fuzz_connection(seed);
}

/// The connection against itself: any pipeline of deterministic commands, fed by a client
/// whose reads, writes, `blocked()` calls and runs are drawn at random, is answered byte for
/// byte as a client that sends everything and reads everything at once is answered, and the
/// connection's bounds hold after every step. Commands parsed ahead point into the input
/// buffer and were parsed for the session as it was, the output pauses them mid-batch, a turn
/// ends after [`RUN_MAX`]: this is where a read that moves the input under waiting commands
/// shows (found by a soak), or a `RESET` that leaves them parsed for the session before it
/// (found by this test).
mod differential {
    use super::*;
    use proptest::collection::vec;
    use proptest::prelude::*;
    use proptest::sample::select;

    /// `len` bytes from `seed`, every byte value among them (CR, LF, `$`, `*` included).
    fn bytes(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| seed.wrapping_add((i as u8).wrapping_mul(37)))
            .collect()
    }

    /// `len` letters from `seed`: an inline argument.
    fn letters(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| b'a' + seed.wrapping_add(i as u8) % 26)
            .collect()
    }

    fn frame(parts: &[Vec<u8>]) -> Vec<u8> {
        cmd(&parts.iter().map(Vec::as_slice).collect::<Vec<_>>())
    }

    /// `CL.THROTTLE` at one request per 15 minutes or more: its five integers are whole
    /// seconds that do not change within a test case (redis-cell's rounding keeps them while
    /// less than 999 ms pass between a key's first check and its last).
    fn throttle() -> impl Strategy<Value = Vec<u8>> {
        (
            0..4u8,
            0..6u8,
            select(vec![1u8, 2, 4]),
            select(vec![3600u32, 7200]),
            proptest::option::of(0..4u8),
        )
            .prop_map(|(k, burst, count, period, quantity)| {
                let mut p: Vec<Vec<u8>> = vec![
                    b"CL.THROTTLE".to_vec(),
                    format!("k{k}").into(),
                    burst.to_string().into(),
                    count.to_string().into(),
                    period.to_string().into(),
                ];
                p.extend(quantity.map(|q| q.to_string().into_bytes()));
                frame(&p)
            })
    }

    /// Short commands, which a `MULTI` may queue (each at most ~400 bytes, so that a queue
    /// never borrows from the deferred budget, which the output shares: a budget-dependent
    /// refusal would differ between the two clients).
    fn short() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            4 => Just(cmd(&[b"PING"])),
            2 => vec(any::<u8>(), 0..40).prop_map(|a| cmd(&[b"PING", &a])),
            4 => (0..300usize, any::<u8>()).prop_map(|(n, s)| cmd(&[b"ECHO", &bytes(n, s)])),
            1 => Just(cmd(&[b"COMMAND", b"COUNT"])),
            1 => Just(cmd(&[b"SELECT", b"0"])),
            1 => Just(cmd(&[b"CLIENT", b"GETNAME"])),
            4 => throttle(),
            2 => select(vec![
                cmd(&[b"NOPE", b"x"]),
                cmd(&[b"PING", b"a", b"b"]),
                cmd(&[b"ECHO"]),
                cmd(&[b"CL.THROTTLE", b"k0"]),
                cmd(&[b"CL.THROTTLE", b"k0", b"x", b"1", b"3600"]),
                cmd(&[b"CL.THROTTLE", b"k1", b"1", b"1", b"3600", b"-1"]),
                cmd(&[b"SELECT", b"1"]),
            ]),
        ]
    }

    /// `RESET`: back to the defaults (with a password, to unauthenticated: `NOAUTH`, the
    /// bounds before authentication), a few commands, then authenticated again.
    fn reset() -> impl Strategy<Value = Vec<u8>> {
        vec(short(), 0..3)
            .prop_map(|then| [cmd(&[b"RESET"]), then.concat(), cmd(&[b"AUTH", b"pw"])].concat())
    }

    /// One command of the pipeline, or a few that go together (a transaction).
    fn block() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            600 => short(),
            // Many small commands at once: a turn ends after RUN_MAX of them.
            40 => (short(), 20..120usize).prop_map(|(c, n)| c.repeat(n)),
            // Near the bulk bound (4 096 at the defaults).
            60 => (3900..=4096usize, any::<u8>()).prop_map(|(n, s)| cmd(&[b"ECHO", &bytes(n, s)])),
            // Short frames with long replies: the output pauses the connection mid-batch.
            80 => Just(cmd(&[b"COMMAND"])),
            // The longest frame (16 arguments of up to 4 KiB; a wrong arity): the input
            // buffer grows to it and shrinks back.
            20 => (1..=4096usize, any::<u8>()).prop_map(|(n, s)| {
                let a = bytes(n, s);
                let mut p: Vec<&[u8]> = vec![b"ECHO"];
                p.extend(std::iter::repeat_n(&a[..], 15));
                cmd(&p)
            }),
            60 => prop_oneof![
                Just(b"PING\r\n".to_vec()),
                Just(b"ping\n".to_vec()),
                Just(b"ECHO \"a b\" \r\n".to_vec()),
                Just(b"\r\n".to_vec()),
                Just(b"  \t \r\n".to_vec()),
                Just(b"*0\r\n".to_vec()),
                (0..=4096usize, any::<u8>()).prop_map(|(n, s)| {
                    let mut v = b"ECHO ".to_vec();
                    v.extend(letters(n, s));
                    v.extend(b"\r\n");
                    v
                }),
            ],
            60 => (
                vec(short(), 0..6),
                prop_oneof![Just(cmd(&[b"EXEC"])), Just(cmd(&[b"DISCARD"])), reset()]
            )
                .prop_map(|(queued, end)| [cmd(&[b"MULTI"]), queued.concat(), end].concat()),
            20 => reset(),
            20 => select(vec![
                cmd(&[b"EXEC"]),
                cmd(&[b"DISCARD"]),
                cmd(&[b"HELLO", b"3"]),
                cmd(&[b"HELLO", b"2"]),
                cmd(&[b"CLIENT", b"SETNAME", b"me"]),
            ]),
            // The end of the connection, at any point: QUIT, or a protocol error.
            1 => select(vec![
                cmd(&[b"QUIT"]),
                b"*17\r\n".to_vec(),
                b"*1\r\n+x\r\n".to_vec(),
                b"*1\r\n$1\r\nab\r\n".to_vec(),
                b"*2\r\n$4\r\nECHO\r\n$4097\r\n".to_vec(),
                b"PING \"a\r\n".to_vec(),
            ]),
        ]
    }

    /// What the adversarial client does in one round.
    #[derive(Clone, Debug)]
    struct Round {
        /// Bytes it sends if the connection reads (0: none this round).
        send: usize,
        /// Reads through [`Connection::io`] rather than [`Connection::read_buf`].
        io: bool,
        /// Tells the connection its writes would block.
        blocked: bool,
        /// Runs the connection (a driver may read and write without running between).
        run: bool,
        /// Bytes of the output it takes.
        take: usize,
    }

    fn size() -> impl Strategy<Value = usize> {
        prop_oneof![
            Just(0),
            Just(1),
            2..16usize,
            16..600usize,
            1000..9000usize,
            Just(usize::MAX),
        ]
    }

    fn round() -> impl Strategy<Value = Round> {
        (
            size(),
            any::<bool>(),
            prop::bool::weighted(0.3),
            prop::bool::weighted(0.8),
            size(),
        )
            .prop_map(|(send, io, blocked, run, take)| Round {
                send,
                io,
                blocked,
                run,
                take,
            })
    }

    /// The connection's bounds and the commands parsed ahead, which must point at what waits
    /// in the input buffer.
    fn holds(c: &Connection) {
        assert!(c.start <= c.filled && c.filled <= c.input.len());
        assert!(c.input.len() <= INPUT_BUSY.max(c.srv.resp.bounds.max_frame()));
        assert!(
            c.out.capacity() <= c.out_base() + c.out_reserved,
            "capacity {} borrowed {}",
            c.out.capacity(),
            c.out_reserved
        );
        let waiting = &c.ahead.items[c.ahead.next.min(c.ahead.items.len())..];
        if let Some(first) = waiting.first() {
            assert_eq!(
                first.start, c.start,
                "the next command starts where input waits"
            );
        }
        for w in waiting.windows(2) {
            assert_eq!(w[0].end, w[1].start);
        }
        assert!(waiting.iter().all(|i| i.start < i.end && i.end <= c.filled));
    }

    /// A client that sends all it can and reads everything, from `at` of `input` on; `out`
    /// is what it was answered so far.
    fn perfect(c: &mut Connection, input: &[u8], mut at: usize, mut out: Vec<u8>) -> Vec<u8> {
        for _ in 0..1_000_000 {
            let step = c.run();
            holds(c);
            out.extend_from_slice(c.output());
            let n = c.output().len();
            c.wrote(n);
            match step {
                Step::Close => return out,
                Step::Remote(_) => panic!("no Redis here"),
                Step::Yield => continue,
                Step::Wait if n > 0 => continue,
                Step::Wait if at == input.len() => return out,
                Step::Wait => {}
            }
            let buf = c.read_buf().expect("reads once its output is read");
            let n = buf.len().min(input.len() - at);
            buf[..n].copy_from_slice(&input[at..at + n]);
            c.read(n);
            at += n;
        }
        panic!("no end");
    }

    /// A client that does what `rounds` say, in turn, for a while, then finishes as the
    /// perfect one.
    fn adversary(c: &mut Connection, input: &[u8], rounds: &[Round]) -> Vec<u8> {
        let (mut at, mut out) = (0, Vec::new());
        for r in rounds.iter().cycle().take(4000) {
            if r.send > 0 && at < input.len() {
                let buf = if r.io { c.io().0 } else { c.read_buf() };
                if let Some(buf) = buf {
                    let n = buf.len().min(r.send).min(input.len() - at);
                    buf[..n].copy_from_slice(&input[at..at + n]);
                    c.read(n);
                    at += n;
                }
                holds(c);
            }
            if r.blocked {
                c.blocked();
            }
            let step = r.run.then(|| c.run());
            holds(c);
            let n = c.output().len().min(r.take);
            out.extend_from_slice(&c.output()[..n]);
            c.wrote(n);
            holds(c);
            match step {
                Some(Step::Close) => {
                    // The driver writes what is left, then closes.
                    out.extend_from_slice(c.output());
                    return out;
                }
                Some(Step::Remote(_)) => panic!("no Redis here"),
                Some(Step::Wait) if at == input.len() && c.output().is_empty() => break,
                _ => {}
            }
        }
        perfect(c, input, at, out)
    }

    fn server(password: bool) -> Arc<Server> {
        Server::detached(|a| {
            // Never closed for its output: a client that reads slowly only slows it.
            a.client_output_limit = 64 << 20;
            if password {
                a.requirepass = Some("pw".into());
            }
        })
    }

    /// Runs `input` on a fresh connection of a fresh server with `client`, and checks that
    /// everything the connection held is given back when it goes.
    fn answer(password: bool, client: impl FnOnce(&mut Connection) -> Vec<u8>) -> Vec<u8> {
        let srv = server(password);
        let mut c = Connection::new(srv.clone(), 1, None, None);
        let out = client(&mut c);
        drop(c);
        let relaxed = std::sync::atomic::Ordering::Relaxed;
        assert_eq!(
            srv.buffers.deferred.load(relaxed),
            0,
            "the budget is given back"
        );
        assert_eq!(srv.buffers.bytes.load(relaxed), 0, "the gauge is back to 0");
        out
    }

    proptest! {
        #[test]
        fn any_client_is_answered_as_a_perfect_one(
            blocks in vec(block(), 1..150),
            // With a password, `AUTH` comes after this many commands.
            auth in proptest::option::of(0..3usize),
            rounds in vec(round(), 1..40),
        ) {
            let mut blocks = blocks;
            if let Some(i) = auth {
                blocks.insert(i.min(blocks.len()), cmd(&[b"AUTH", b"pw"]));
            }
            let input = blocks.concat();
            let want = answer(auth.is_some(), |c| perfect(c, &input, 0, Vec::new()));
            let got = answer(auth.is_some(), |c| adversary(c, &input, &rounds));
            if got != want {
                let at = got.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(got.len().min(want.len()));
                let around = |v: &[u8]| text(&v[at.saturating_sub(80)..(at + 80).min(v.len())]);
                prop_assert!(false, "{} bytes answered, {} expected; first difference at {at}:\n got {:?}\nwant {:?}",
                    got.len(), want.len(), around(&got), around(&want));
            }
        }
    }
}
