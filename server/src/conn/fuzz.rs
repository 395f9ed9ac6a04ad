//! The connection fuzz target's body: one connection driven with arbitrary bytes, its bounds
//! checked after every step. Not an API.

use super::{Connection, Step};

/// The body of the connection fuzz target (`fuzz/fuzz_targets/resp_connection.rs`): one
/// connection of a server without listeners is fed `data` (its first byte picks a password or
/// none, the read size, and a client that reads everything, a little at a time — so that
/// commands parsed ahead wait while the input moves — or nothing), and its bounds are checked after
/// every step: the input buffer within the largest frame, the waiting output within the output
/// limit and one reply, nothing run once it closed. A client that reads its replies must be
/// answered byte for byte as one that sends everything and reads everything at once, when
/// no answer depends on the time or the connection's state (no `CL.THROTTLE`, `TURNSTILE.*`,
/// `CLIENT` or `INFO` anywhere in `data`). Not an API.
#[doc(hidden)]
pub fn fuzz_connection(data: &[u8]) {
    let Some((&mode, data)) = data.split_first() else {
        return;
    };
    let chunk = 1 + usize::from(mode >> 3) * 73;
    let reads = mode & 6 != 2;
    // How much of its output the client reads at a time.
    let take = if mode & 4 == 4 { 1000 } else { usize::MAX };
    let got = fuzz_client(mode, data, chunk, reads, take);
    let timeless = ["THROTTLE", "TURNSTILE", "CLIENT", "INFO"].iter().all(|w| {
        !data
            .windows(w.len())
            .any(|d| d.eq_ignore_ascii_case(w.as_bytes()))
    });
    if let (Some(got), true) = (got, timeless) {
        let want = fuzz_client(mode, data, usize::MAX, true, usize::MAX);
        assert!(
            Some(&got) == want.as_ref(),
            "answered otherwise than at once"
        );
    }
}

/// [`fuzz_connection`]'s client: sends `data` in reads of `chunk` bytes and, if it `reads`,
/// takes `take` bytes of output at a time; its replies, if it reads them all.
fn fuzz_client(mode: u8, data: &[u8], chunk: usize, reads: bool, take: usize) -> Option<Vec<u8>> {
    let srv = crate::state::Server::detached(|a| {
        a.client_output_limit = 64 << 10;
        if mode & 1 == 1 {
            a.requirepass = Some("pw".into());
        }
    });
    let mut c = Connection::new(srv.clone(), 1, None, None);
    let (mut at, mut out) = (0, Vec::new());
    let limit = srv.resp.output_limit + 16 * 1024;
    for _ in 0..100_000 {
        if !reads {
            c.blocked();
        }
        let yielded = match c.run() {
            Step::Close => {
                assert!(c.output().len() <= limit);
                out.extend_from_slice(c.output());
                return reads.then_some(out);
            }
            Step::Remote(_) => unreachable!("no Redis backend"),
            Step::Wait => false,
            Step::Yield => true,
        };
        assert!(c.output().len() <= limit, "{} waiting", c.output().len());
        let n = if reads { c.output().len().min(take) } else { 0 };
        out.extend_from_slice(&c.output()[..n]);
        c.wrote(n);
        if yielded || (at >= data.len() && reads && (n > 0 || !c.output().is_empty())) {
            // Runs on, or takes the rest of its replies.
            continue;
        }
        if at >= data.len() {
            return reads.then_some(out);
        }
        let Some(buf) = c.read_buf() else {
            // Paused: a client that does not read makes no more progress; one that reads
            // a little at a time reads on.
            if reads && !c.output().is_empty() {
                continue;
            }
            assert!(!reads || c.output().is_empty());
            return None;
        };
        assert!(buf.len() <= 80 * 1024);
        let n = buf.len().min(chunk).min(data.len() - at);
        buf[..n].copy_from_slice(&data[at..at + n]);
        c.read(n);
        at += n;
    }
    None
}
