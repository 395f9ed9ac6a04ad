//! The server in process on loopback, spoken to over real sockets: raw RESP, and redis-cli
//! when it is installed (.ci/run installs it).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};
use turnstile::keyed::Store;
use turnstile::Limits;
use turnstile_server::throttle::{emission_ns, limit_of, reply};
use turnstile_server::{start, Running, RuntimeKind, ServeArgs};

fn server(f: impl FnOnce(&mut ServeArgs)) -> Running {
    let mut a = ServeArgs::new();
    a.resp = "127.0.0.1:0".parse().unwrap();
    a.http = "127.0.0.1:0".parse().unwrap();
    a.workers = Some(2);
    a.throttle_keys = 10_000;
    f(&mut a);
    start(a).expect("server starts")
}

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

/// Sends `req` and reads until the reply holds `want` bytes or the server closes.
fn roundtrip(s: &mut TcpStream, req: &[u8], want: usize) -> Vec<u8> {
    s.write_all(req).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while got.len() < want {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            // A server that closes with our request unread resets the connection.
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => panic!("read: {e}; got {:?}", String::from_utf8_lossy(&got)),
        }
    }
    got
}

/// HELLO 3, its whole reply (it ends with the empty module list).
fn hello3(s: &mut TcpStream) -> Vec<u8> {
    s.write_all(&cmd(&["HELLO", "3"])).unwrap();
    let mut got = Vec::new();
    let mut b = [0u8; 1];
    while !got.ends_with(b"modules\r\n*0\r\n") {
        assert_eq!(
            s.read(&mut b).unwrap(),
            1,
            "closed after {:?}",
            String::from_utf8_lossy(&got)
        );
        got.push(b[0]);
    }
    got
}

fn cmd(parts: &[&str]) -> Vec<u8> {
    let mut v = format!("*{}\r\n", parts.len()).into_bytes();
    for p in parts {
        v.extend_from_slice(format!("${}\r\n{p}\r\n", p.len()).as_bytes());
    }
    v
}

fn stop(r: Running) {
    r.stop();
    r.join().unwrap();
}

/// The default runtime is io_uring where it is available (the suite runs again with
/// `TURNSTILE_IO_URING=off`, on tokio).
#[test]
fn the_default_runtime_is_io_uring_where_available() {
    let r = server(|_| {});
    let want = match turnstile_server::io_uring_available() {
        Ok(()) => RuntimeKind::Uring,
        Err(_) => RuntimeKind::PerCore,
    };
    if std::env::var("TURNSTILE_IO_URING").is_ok_and(|v| v == "off") {
        assert_eq!(want, RuntimeKind::PerCore);
    }
    assert_eq!(r.runtime, want);
    let mut s = connect(r.resp);
    assert_eq!(roundtrip(&mut s, &cmd(&["PING"]), 7), b"+PONG\r\n");
    stop(r);
}

#[test]
fn pipelined_commands_and_errors() {
    let r = server(|_| {});
    let mut s = connect(r.resp);
    let mut req = Vec::new();
    req.extend(cmd(&["PING"]));
    req.extend(cmd(&["ECHO", "hi"]));
    req.extend(b"ping\r\n");
    req.extend(cmd(&["SELECT", "0"]));
    req.extend(cmd(&["SELECT", "1"]));
    req.extend(cmd(&["CL.THROTTLE", "k"]));
    req.extend(cmd(&["CL.THROTTLE", "k", "x", "1", "1"]));
    req.extend(cmd(&["NOPE", "a"]));
    let want = "+PONG\r\n$2\r\nhi\r\n+PONG\r\n+OK\r\n-ERR DB index is out of range\r\n-ERR wrong number of arguments for 'cl.throttle' command\r\n-ERR value is not an integer or out of range\r\n-ERR unknown command 'NOPE', with args beginning with: 'a' \r\n";
    let got = roundtrip(&mut s, &req, want.len());
    assert_eq!(String::from_utf8_lossy(&got), want);
    // RESP3 after HELLO 3: a map; a null is `_`.
    let got = hello3(&mut s);
    assert!(
        got.starts_with(b"%7\r\n$6\r\nserver\r\n$9\r\nturnstile\r\n"),
        "{:?}",
        String::from_utf8_lossy(&got)
    );
    let mut s2 = connect(r.resp);
    hello3(&mut s2);
    let got = roundtrip(&mut s2, &cmd(&["CLIENT", "GETNAME"]), 3);
    assert_eq!(got, b"_\r\n");
    // A protocol error is replied, then the connection closes.
    let mut s3 = connect(r.resp);
    let got = roundtrip(&mut s3, b"*1\r\n$-5\r\n", usize::MAX);
    assert_eq!(
        String::from_utf8_lossy(&got),
        "-ERR Protocol error: invalid bulk length\r\n"
    );
    let mut s4 = connect(r.resp);
    let got = roundtrip(&mut s4, format!("*{}\r\n", 1 << 20).as_bytes(), usize::MAX);
    assert_eq!(
        String::from_utf8_lossy(&got),
        "-ERR Protocol error: invalid multibulk length\r\n"
    );
    stop(r);
}

#[test]
fn throttle_equals_the_in_process_store() {
    let r = server(|_| {});
    let mut s = connect(r.resp);
    // One per hour with a burst of 4: the elapsed milliseconds of the test change no second.
    let p = (4i64, 1i64, 3600i64);
    let store = Store::builder(Limits::new(vec![limit_of(p).unwrap()]).unwrap())
        .capacity(100)
        .build()
        .unwrap();
    let e = emission_ns(p.1, p.2).unwrap();
    for (i, q) in [1u64, 1, 2, 0, 7, 1, 1, 5, 0, 1].into_iter().enumerate() {
        let want = reply(&store.check("user:1", q), p.0, e).as_array();
        let mut w = b"*5\r\n".to_vec();
        for v in want {
            w.extend(format!(":{v}\r\n").as_bytes());
        }
        let got = roundtrip(
            &mut s,
            &cmd(&["CL.THROTTLE", "user:1", "4", "1", "3600", &q.to_string()]),
            w.len(),
        );
        assert_eq!(
            String::from_utf8_lossy(&got),
            String::from_utf8_lossy(&w),
            "step {i}, quantity {q}"
        );
    }
    stop(r);
}

fn redis_cli() -> bool {
    Command::new("redis-cli").arg("--version").output().is_ok()
}

#[test]
fn redis_cli_speaks_to_it() {
    if !redis_cli() {
        eprintln!("redis-cli not installed (apt-get install redis-tools): skipped");
        return;
    }
    let r = server(|a| a.requirepass = Some("s3cret".into()));
    let port = r.resp.port().to_string();
    let cli_all = |args: &[&str]| {
        let o = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &port, "--no-auth-warning"])
            .args(args)
            .output()
            .unwrap();
        (
            String::from_utf8_lossy(&o.stdout).trim().to_string(),
            String::from_utf8_lossy(&o.stderr).trim().to_string(),
        )
    };
    let cli = |args: &[&str]| cli_all(args).0;
    assert_eq!(cli(&["PING"]), "NOAUTH Authentication required.");
    let (out, err) = cli_all(&["-a", "wrong", "PING"]);
    assert!(
        err.contains("WRONGPASS invalid username-password pair"),
        "{err}"
    );
    assert_eq!(out, "NOAUTH Authentication required.");
    let a = ["-a", "s3cret"];
    assert_eq!(cli(&[&a[..], &["PING"]].concat()), "PONG");
    assert_eq!(
        cli(&[&a[..], &["CL.THROTTLE", "cli", "1", "1", "60"]].concat()),
        "0\n2\n1\n-1\n60"
    );
    assert_eq!(
        cli(&[&a[..], &["CL.THROTTLE", "cli", "1", "1", "60"]].concat()),
        "0\n2\n0\n-1\n120"
    );
    assert_eq!(
        cli(&[&a[..], &["CL.THROTTLE", "cli", "1", "1", "60"]].concat()),
        "1\n2\n0\n60\n120"
    );
    assert_eq!(
        cli(&[&a[..], &["-3", "CL.THROTTLE", "cli", "1", "1", "60", "0"]].concat()),
        "0\n2\n0\n-1\n120"
    );
    assert!(cli(&[&a[..], &["INFO"]].concat()).contains("redis_version"));
    stop(r);
}

/// Sends `req` and checks the replies byte for byte against `want(reset)`, for some reset of an
/// hour less at most the time since `first`: the replies' resets are an hour after a check made
/// since then, and the round trips take milliseconds on a loaded machine.
fn assert_replies_with_reset(
    s: &mut TcpStream,
    req: &[u8],
    first: Instant,
    want: impl Fn(u64) -> String,
) {
    let got = roundtrip(s, req, want(3_600_000).len());
    let since = first.elapsed().as_millis() as u64 + 1;
    let got = String::from_utf8_lossy(&got).into_owned();
    assert!(
        (3_600_000 - since..=3_600_000).any(|reset| got == want(reset)),
        "{got:?}: want {:?} with a reset at most {since} ms below",
        want(3_600_000)
    );
}

#[test]
fn turnstile_check_over_rules() {
    let dir = std::env::temp_dir().join(format!("turnstile-resp-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let rules = dir.join("rules.toml");
    std::fs::write(
        &rules,
        "[[rule]]\nname = \"per-customer\"\nkey = \"customer\"\nlimits = [{ algorithm = \"token_bucket\", limit = 2, window = \"1h\" }]\n",
    )
    .unwrap();
    let r = server(|a| {
        a.rules = Some(rules.clone());
        a.runtime = turnstile_server::RuntimeKind::MultiThread;
    });
    let mut s = connect(r.resp);
    let first = Instant::now();
    let mut req = Vec::new();
    req.extend(cmd(&["TURNSTILE.PEEK", "customer", "5"]));
    req.extend(cmd(&["TURNSTILE.CHECK", "customer", "5"]));
    req.extend(cmd(&["TURNSTILE.CHECK", "customer", "5", "1", "get"]));
    // The second check's reset is an hour after the first check: an hour less the time
    // between the two (under a millisecond but on a loaded machine).
    let want = |reset: u64| {
        format!("*6\r\n:1\r\n:2\r\n:2\r\n:-1\r\n:0\r\n$-1\r\n*6\r\n:1\r\n:2\r\n:1\r\n:-1\r\n:1800000\r\n$-1\r\n*6\r\n:1\r\n:2\r\n:0\r\n:-1\r\n:{reset}\r\n$-1\r\n")
    };
    assert_replies_with_reset(&mut s, &req, first, want);
    // A tagged or zero-padded id is refused, never read as customer 5.
    for bad in ["user:5", "org:5", "05"] {
        let got = roundtrip(&mut s, &cmd(&["TURNSTILE.CHECK", "customer", bad]), 20);
        let text = String::from_utf8_lossy(&got);
        assert!(
            text.starts_with(&format!("-ERR `{bad}` is not a customer id")),
            "{text}"
        );
    }
    // Denied: the rule is named, retry in ms.
    let got = roundtrip(&mut s, &cmd(&["TURNSTILE.CHECK", "customer", "5"]), 55);
    let text = String::from_utf8_lossy(&got);
    assert!(
        text.starts_with("*6\r\n:0\r\n:2\r\n:0\r\n:1") && text.ends_with("$12\r\nper-customer\r\n"),
        "{text}"
    );
    // A refund gives the request back to the rule (the reply: rules refunded); the next
    // check is admitted again; a refund of 2 fills the bucket; no rule, nothing refunded.
    let mut req = Vec::new();
    req.extend(cmd(&["TURNSTILE.REFUND", "customer", "5"]));
    req.extend(cmd(&["TURNSTILE.CHECK", "customer", "5"]));
    req.extend(cmd(&["TURNSTILE.REFUND", "customer", "5", "2", "get"]));
    req.extend(cmd(&["TURNSTILE.PEEK", "customer", "5"]));
    req.extend(cmd(&["TURNSTILE.REFUND", "api_key", "k"]));
    // The check after the refund takes the refunded request back: the bucket is empty again
    // and full at the same instant as after the first two checks, an hour after them, so its
    // reset is an hour less the time since (a loaded machine takes milliseconds here).
    let want = |reset: u64| {
        format!(":1\r\n*6\r\n:1\r\n:2\r\n:0\r\n:-1\r\n:{reset}\r\n$-1\r\n:1\r\n*6\r\n:1\r\n:2\r\n:2\r\n:-1\r\n:0\r\n$-1\r\n:0\r\n")
    };
    assert_replies_with_reset(&mut s, &req, first, want);
    let bad = [
        (
            vec!["TURNSTILE.REFUND", "customer"],
            "-ERR wrong number of arguments for 'turnstile.refund' command",
        ),
        (
            vec!["TURNSTILE.REFUND", "customer", "5", "x"],
            "-ERR value is not an integer or out of range",
        ),
        (
            vec!["TURNSTILE.CHECK", "planet", "x"],
            "-ERR unknown key class `planet`",
        ),
        (
            vec!["TURNSTILE.CHECK", "customer", "bob"],
            "-ERR `bob` is not a customer id",
        ),
        (
            vec!["TURNSTILE.CHECK", "customer", "5", "-1"],
            "-ERR value is out of range, must be positive",
        ),
        (
            vec!["TURNSTILE.CHECK", "customer", "5", "1", "urgent"],
            "-ERR unknown priority",
        ),
        (
            vec!["TURNSTILE.CHECK", "customer"],
            "-ERR wrong number of arguments for 'turnstile.check' command",
        ),
    ];
    for (c, want) in bad {
        let got = roundtrip(&mut s, &cmd(&c), want.len());
        assert_eq!(String::from_utf8_lossy(&got[..want.len()]), want, "{c:?}");
        let mut rest = [0u8; 512];
        let mut got = got;
        while !got.ends_with(b"\r\n") {
            let n = s.read(&mut rest).unwrap();
            got.extend_from_slice(&rest[..n]);
        }
    }
    stop(r);
    // Without rules, TURNSTILE.CHECK says how to get them.
    let r = server(|_| {});
    let mut s = connect(r.resp);
    let want = "-ERR no rules loaded: start the server with --rules FILE\r\n";
    let got = roundtrip(
        &mut s,
        &cmd(&["TURNSTILE.CHECK", "customer", "1"]),
        want.len(),
    );
    assert_eq!(String::from_utf8_lossy(&got), want);
    stop(r);
}

#[test]
fn connection_limits() {
    let r = server(|a| {
        a.max_connections = 1;
        a.idle_timeout = Duration::from_millis(300);
    });
    let mut a = connect(r.resp);
    assert_eq!(roundtrip(&mut a, &cmd(&["PING"]), 7), b"+PONG\r\n");
    let mut b = connect(r.resp);
    let got = roundtrip(&mut b, &cmd(&["PING"]), usize::MAX);
    assert_eq!(
        String::from_utf8_lossy(&got),
        "-ERR max number of clients reached\r\n"
    );
    // Idle past the timeout: closed by the server.
    std::thread::sleep(Duration::from_millis(600));
    let mut buf = [0u8; 16];
    assert_eq!(a.read(&mut buf).unwrap(), 0, "an idle connection is closed");
    stop(r);
}

/// A client that sends a long pipeline (and half a command), then closes its side without
/// reading: every command it sent in full is answered (it may still read) and counted; the
/// half command is not. A client gone altogether gets nothing more run for it (no work is
/// done for a connection that has gone), and its connection is released.
#[test]
fn a_client_that_closes_its_side_gets_every_reply() {
    let r = server(|a| a.workers = Some(1));
    let one = cmd(&["CL.THROTTLE", "gone", "1999", "1", "86400"]);
    let mut s = connect(r.resp);
    let mut all = one.repeat(1000);
    all.extend_from_slice(&one[..20]);
    s.write_all(&all).unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut got = Vec::new();
    s.read_to_end(&mut got).unwrap();
    let replies = String::from_utf8_lossy(&got).matches("*5\r\n").count();
    assert_eq!(replies, 1000);
    // 1000 taken of 2000, one token per day: 1000 remain (seen with quantity 0).
    let peek = cmd(&["CL.THROTTLE", "gone", "1999", "1", "86400", "0"]);
    let got = roundtrip(&mut connect(r.resp), &peek, 30);
    let remaining: i64 = String::from_utf8_lossy(&got).split("\r\n").nth(3).unwrap()[1..]
        .parse()
        .unwrap();
    assert_eq!(remaining, 1000);
    // Gone without reading: at most what it sent is run, and the connection is let go.
    let mut s = connect(r.resp);
    s.write_all(&cmd(&["CL.THROTTLE", "gone2", "1999", "1", "86400"]).repeat(1000))
        .unwrap();
    drop(s);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let got = roundtrip(
            &mut connect(r.resp),
            &cmd(&["CL.THROTTLE", "gone2", "1999", "1", "86400", "0"]),
            30,
        );
        let remaining: i64 = String::from_utf8_lossy(&got).split("\r\n").nth(3).unwrap()[1..]
            .parse()
            .unwrap();
        assert!((1000..=2000).contains(&remaining), "{remaining}");
        let info = roundtrip(&mut connect(r.resp), &cmd(&["INFO", "clients"]), 45);
        if String::from_utf8_lossy(&info).contains("connected_clients:1\r\n") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the gone client's connection stays"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    stop(r);
}

/// A second server on ports another one listens on is refused (`SO_REUSEPORT` would have let
/// it join them, and each server see half of the connections and keep half of the counts).
#[test]
fn a_second_server_on_a_used_port_is_refused() {
    let r = server(|_| {});
    for used in ["--resp", "--http"] {
        let mut a = ServeArgs::new();
        a.resp = "127.0.0.1:0".parse().unwrap();
        a.http = "127.0.0.1:0".parse().unwrap();
        a.workers = Some(2);
        if used == "--resp" {
            a.resp = r.resp;
        } else {
            a.http = r.http;
        }
        match start(a) {
            Err(turnstile_server::ServeError::Bind(flag, _, e)) => {
                assert_eq!((flag, e.kind()), (used, std::io::ErrorKind::AddrInUse));
            }
            Err(e) => panic!("{used}: {e}"),
            Ok(_) => panic!("{used}: a second server started on a port in use"),
        }
    }
    stop(r);
}

/// A client that sends without ever reading its replies: once its output passes
/// --client-output-limit the connection is closed, and every other client is answered.
#[test]
fn a_client_that_never_reads_is_closed_past_its_output_limit() {
    let r = server(|a| {
        a.workers = Some(1);
        a.client_output_limit = 256 << 10;
    });
    let mut hog = connect(r.resp);
    hog.set_write_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    // COMMAND's reply is KiBs: 4 000 of them are far past the limit (and the socket buffers).
    let flood = cmd(&["COMMAND"]).repeat(4000);
    let writer = std::thread::spawn(move || {
        let _ = hog.write_all(&flood);
        hog
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut s = connect(r.resp);
        assert_eq!(roundtrip(&mut s, &cmd(&["PING"]), 7), b"+PONG\r\n");
        let info = roundtrip(&mut s, &cmd(&["INFO", "clients"]), 45);
        if String::from_utf8_lossy(&info).contains("connected_clients:1\r\n") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the client that never reads is still connected"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut hog = writer.join().unwrap();
    // What the server had sent before it closed is there to read, then the end.
    let mut got = Vec::new();
    let _ = hog.read_to_end(&mut got);
    assert!(got.len() < 8 << 20, "{} bytes", got.len());
    stop(r);
}

/// Shutdown with connections open and data in flight both ways: clients that read, one that
/// never reads, one halfway through a command, one idle. The server stops within its grace
/// period, and the clients that read got well-formed replies, in order, then the end.
#[test]
fn shutdown_with_connections_open_and_data_in_flight() {
    let r = server(|a| a.workers = Some(2));
    let one = cmd(&["CL.THROTTLE", "stop", "1000000", "1", "60"]);
    let mut readers = Vec::new();
    for _ in 0..8 {
        let mut s = connect(r.resp);
        let one = one.clone();
        readers.push(std::thread::spawn(move || {
            let mut w = s.try_clone().unwrap();
            let sender = std::thread::spawn(move || {
                for _ in 0..200 {
                    if w.write_all(&one.repeat(50)).is_err() {
                        return;
                    }
                }
            });
            let mut got = Vec::new();
            let _ = s.read_to_end(&mut got);
            let _ = sender.join();
            got
        }));
    }
    let mut silent = connect(r.resp);
    silent.write_all(&cmd(&["COMMAND"]).repeat(2000)).unwrap();
    let mut half = connect(r.resp);
    half.write_all(&one[..10]).unwrap();
    let _idle = connect(r.resp);
    std::thread::sleep(Duration::from_millis(200));
    let t0 = Instant::now();
    stop(r);
    assert!(t0.elapsed() < Duration::from_secs(12), "{:?}", t0.elapsed());
    for t in readers {
        let got = String::from_utf8(t.join().unwrap()).unwrap();
        let n = got.matches("*5\r\n").count();
        assert!(n > 0);
        // Whole replies only: each is 5 integers.
        assert_eq!(got.matches("\r\n").count(), 6 * n, "a reply cut short");
    }
    // The half command was never run; the connection was closed.
    let mut buf = [0u8; 64];
    assert!(matches!(half.read(&mut buf), Ok(0) | Err(_)));
}
