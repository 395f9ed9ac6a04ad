//! The driver's buffers against the connection: input received in buffers of any size, by
//! one receive at a time or a multishot one, and stashed when the connection does not read,
//! and sends of a copy of the output that the kernel completes in part, later, while the
//! connection runs on — the copy must not move while a send of it is out, and the client must
//! get what a client that reads everything at once gets.

use super::*;
use crate::resp::parse::tests::cmd;
use proptest::collection::vec;
use proptest::prelude::*;

/// A pipeline of short commands with long replies and long commands: the output pauses the
/// connection and the input waits in the stash.
fn pipeline() -> impl Strategy<Value = Vec<u8>> {
    let one = prop_oneof![
        Just(cmd(&[b"PING"])),
        Just(cmd(&[b"COMMAND"])),
        (0..=4096usize).prop_map(|n| cmd(&[b"ECHO", &vec![b'e'; n]])),
        (20..100usize).prop_map(|n| cmd(&[b"PING"]).repeat(n)),
    ];
    vec(one, 1..60).prop_map(|v| v.concat())
}

/// What a client that sends and reads everything at once is answered.
fn at_once(input: &[u8]) -> Vec<u8> {
    let mut c = Connection::new(Server::detached(|_| {}), 1, None, None);
    let (mut at, mut out) = (0, Vec::new());
    loop {
        let step = c.run();
        out.extend_from_slice(c.output());
        let n = c.output().len();
        c.wrote(n);
        if matches!(step, Step::Yield) || n > 0 {
            continue;
        }
        if at == input.len() {
            return out;
        }
        let buf = c.read_buf().expect("reads once its output is read");
        let n = buf.len().min(input.len() - at);
        buf[..n].copy_from_slice(&input[at..at + n]);
        c.read(n);
        at += n;
    }
}

proptest! {
    #[test]
    fn partial_sends_and_stashed_input_answer_as_at_once(
        input in pipeline(),
        // Per round: bytes a receive completes with (0: none completes), the share of the
        // send out that completes (0: none), whether the connection runs.
        rounds in vec((0..=BUF_SIZE, 0..=4u8, any::<bool>()), 1..30),
        multishot in any::<bool>(),
    ) {
        let want = at_once(&input);
        let srv = Server::detached(|_| {});
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let sock = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let fd = types::Fd(sock.as_raw_fd());
        let mut c = Conn {
            conn: Connection::new(srv.clone(), 1, None, None),
            sock,
            gen: 1,
            _ticket: srv.guard.admit(crate::listen::Kind::Resp).unwrap(),
            started: Instant::now(),
            recv: false,
            send: None,
            send_round: 0,
            send_buf: Vec::new(),
            stash: Vec::new(),
            stash_at: 0,
            eof: false,
            parked: false,
            state: State::Open,
            progress: Instant::now(),
            drain: 0,
            dirty: false,
            more: false,
            accounted: 0,
        };
        let (mut at, mut got, mut copy) = (0, Vec::new(), Vec::new());
        // What the armed multishot receive may still deliver, and the stash it may leave.
        let mut budget = 0;
        let most = if multishot { MULTISHOT_LIMIT as usize + BUF_SIZE - 1 } else { BUF_SIZE };
        let now = Instant::now();
        for (i, &(recv, share, run)) in rounds.iter().cycle().take(20_000).enumerate() {
            // Past the drawn rounds, a client that keeps up.
            let (recv, share, run) = if i < 2000 { (recv, share, run) } else { (BUF_SIZE, 4, true) };
            if run || c.more {
                c.more = false;
                let _ = c.run(now);
            }
            // A receive completes (armed only with an empty stash while the connection reads,
            // as recv_entry arms it). A multishot one stays armed until it has delivered
            // MULTISHOT_LIMIT bytes (its last receive may go past by less than a buffer), and
            // may complete twice before the connection runs.
            for _ in 0..if multishot { 2 } else { 1 } {
                if c.recv && recv > 0 {
                    let n = recv.min(input.len() - at);
                    c.feed(&input[at..at + n]);
                    at += n;
                    budget -= n.min(budget);
                    c.recv = multishot && budget > 0 && at < input.len();
                    prop_assert!(c.stashed().len() <= most, "{} bytes stashed", c.stashed().len());
                }
            }
            if !c.recv && c.stashed().is_empty() && c.conn.wants_read() && at < input.len() {
                c.recv = true;
                budget = MULTISHOT_LIMIT as usize;
            }
            // The send out completes with part of its copy, which must not have moved.
            if let (Some(len), true) = (c.send, share > 0) {
                prop_assert_eq!(&c.send_buf[..len], &copy[..], "the copy changed while sent");
                let n = (len * usize::from(share)).div_ceil(4);
                got.extend_from_slice(&c.send_buf[..n]);
                c.send = None;
                c.conn.wrote(n);
                if n < len {
                    c.conn.blocked();
                }
            }
            let out = c.send.is_some();
            if c.send_entry(fd, 0, 0).is_some() {
                prop_assert!(!out, "a second send while one is out");
                copy = c.send_buf.clone();
            }
            if at == input.len() && c.send.is_none() && c.stashed().is_empty() && c.conn.output().is_empty() && !c.more {
                let _ = c.run(now);
                if c.conn.output().is_empty() && !c.more {
                    break;
                }
            }
        }
        prop_assert_eq!(at, input.len());
        prop_assert!(got == want, "{} bytes sent, {} answered at once", got.len(), want.len());
    }
}
