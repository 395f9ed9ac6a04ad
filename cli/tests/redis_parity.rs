//! `turnstile serve` answering as redis-server answers: the same commands sent to the built
//! binary and to a real `redis-server` (both child processes on free loopback ports), each on
//! a new connection, their replies compared byte for byte.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;

// The harness's real redis-server, as turnstile-redis's own tests start it.
#[path = "../../redis/tests/common/mod.rs"]
mod redis_harness;

const BIN: &str = env!("CARGO_BIN_EXE_turnstile");

/// `turnstile serve` on free ports (RESP, HTTP), killed when dropped.
fn serve() -> (common::Running, u16) {
    let (resp, http) = (common::free_port(), common::free_port());
    let mut cmd = Command::new(BIN);
    cmd.args(["serve", "--workers", "1", "--throttle-keys", "1000"])
        .args(["--resp", &format!("127.0.0.1:{resp}")])
        .args(["--http", &format!("127.0.0.1:{http}")])
        .env("RUST_LOG", "warn");
    (common::spawn_listening(&mut cmd, &[resp, http]), resp)
}

fn frame(parts: &[&str]) -> Vec<u8> {
    let mut v = format!("*{}\r\n", parts.len()).into_bytes();
    for p in parts {
        v.extend_from_slice(format!("${}\r\n{p}\r\n", p.len()).as_bytes());
    }
    v
}

/// One whole RESP2 reply, as its bytes.
fn reply(r: &mut BufReader<TcpStream>, out: &mut Vec<u8>) {
    let mut line = String::new();
    assert!(r.read_line(&mut line).unwrap() > 0, "closed after {out:?}");
    out.extend_from_slice(line.as_bytes());
    let n: i64 = line[1..].trim_end().parse().unwrap_or(0);
    match line.as_bytes()[0] {
        b'$' if n >= 0 => {
            let mut b = vec![0; n as usize + 2];
            r.read_exact(&mut b).unwrap();
            out.extend_from_slice(&b);
        }
        b'*' => (0..n.max(0)).for_each(|_| reply(r, out)),
        _ => {}
    }
}

/// Sends `commands` on a new connection to `port`; every reply, as text.
fn talk(port: u16, commands: &[&[&str]]) -> String {
    let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut w = s;
    let mut out = Vec::new();
    for c in commands {
        w.write_all(&frame(c)).unwrap();
        reply(&mut r, &mut out);
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The client differences of transactions and `CLIENT`: each sequence answered as
/// redis-server answers it, byte for byte.
#[test]
fn transactions_and_client_errors_are_answered_as_redis_server_answers_them() {
    let redis = redis_harness::Server::start();
    let (_serve, port) = serve();
    let cases: &[&[&[&str]]] = &[
        // A refused EXEC discards the transaction: the next EXEC has no MULTI.
        &[&["MULTI"], &["ECHO", "a"], &["EXEC", "x"], &["EXEC"]],
        &[&["EXEC", "x"], &["PING"]],
        // Queued (PING's arity is "at least one"); its error comes from EXEC.
        &[&["MULTI"], &["PING", "a", "b"], &["EXEC"]],
        &[&["MULTI"], &["ECHO"], &["EXEC"]],
        &[&["MULTI"], &["NOPE", "x"], &["EXEC"]],
        &[&["MULTI"], &["DISCARD", "x"], &["EXEC"]],
        &[&["MULTI"], &["MULTI", "x"], &["EXEC"]],
        &[&["MULTI"], &["MULTI"], &["EXEC"]],
        &[&["MULTI"], &["WATCH", "k"], &["EXEC"]],
        &[&["MULTI"], &["CLIENT", "FOO", "a", "b"], &["EXEC"]],
        &[&["MULTI"], &["CLIENT", "SETNAME"], &["EXEC"]],
        &[&["MULTI"], &["CLIENT", "SETNAME", "a b"], &["EXEC"]],
        // go-redis's handshake: an unknown subcommand, whatever follows it.
        &[&[
            "CLIENT",
            "MAINT_NOTIFICATIONS",
            "on",
            "moving-endpoint-type",
            "internal-ip",
        ]],
        &[
            &["CLIENT", "FOO"],
            &["CLIENT", "FOO", "a"],
            &["client", "foo", "a", "b"],
        ],
        &[
            &["CLIENT", "SETNAME"],
            &["CLIENT", "SETNAME", "a", "b"],
            &["CLIENT", "ID", "x"],
        ],
        &[&["CLIENT", "GETNAME", "x"], &["CLIENT", "INFO", "x"]],
        &[
            &["CLIENT", "NO-EVICT", "x"],
            &["CLIENT", "NO-EVICT", "on", "x"],
        ],
        &[&["COMMAND", "FOO"], &["CONFIG", "FOO"], &["CONFIG", "GET"]],
        &[&["COMMAND", "COUNT", "x"]],
    ];
    for case in cases {
        assert_eq!(talk(port, case), talk(redis.port, case), "{case:?}");
    }
}

/// `CLIENT SETINFO` with a space (or any byte but printable ASCII) is refused as Redis 7.2
/// refuses it (redis-py's `client_info()` splits at spaces); Redis 7.0 has no `SETINFO`, so
/// its words are compared when the installed redis-server knows the subcommand.
#[test]
fn client_setinfo_refuses_what_redis_refuses() {
    let redis = redis_harness::Server::start();
    let (_serve, port) = serve();
    let case: &[&[&str]] = &[
        &["CLIENT", "SETINFO", "LIB-NAME", "a b"],
        &["CLIENT", "SETINFO", "lib-ver", "1.0\n"],
        &["CLIENT", "SETINFO", "LIB-NAME", "redis-py"],
        &["CLIENT", "SETINFO", "LIB-VER", "5.2.1"],
        &["CLIENT", "SETINFO", "nope", "x"],
    ];
    let want = "-ERR LIB-NAME cannot contain spaces, newlines or special characters.\r\n\
                -ERR lib-ver cannot contain spaces, newlines or special characters.\r\n\
                +OK\r\n+OK\r\n-ERR Unrecognized option 'nope'\r\n";
    let ours = talk(port, case);
    assert_eq!(ours, want);
    let theirs = talk(redis.port, case);
    if !theirs.contains("unknown subcommand") {
        assert_eq!(ours, theirs);
    }
    let info = talk(
        port,
        &[
            &["CLIENT", "SETINFO", "LIB-NAME", "redis-py"],
            &["CLIENT", "INFO"],
        ],
    );
    assert!(info.contains(" lib-name=redis-py "), "{info}");
}

/// The fields of an `INFO` section's text, in order.
fn fields(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.split_once(':').map(|(k, _)| k.to_string()))
        .collect()
}

/// `INFO section` through redis-cli.
fn info(port: u16, section: &str) -> String {
    let o = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "INFO", section])
        .output()
        .expect("redis-cli runs (cargo xtask test installs redis-tools)");
    assert!(o.status.success(), "{o:?}");
    String::from_utf8(o.stdout).unwrap()
}

/// `ROLE` as redis-server answers it for a master without replicas, and the `INFO` sections
/// monitoring reads (`replication`, `cpu`, `clients`, `stats`): each field one redis-server
/// also writes, in its section, and the values a standalone master has.
#[test]
fn role_and_info_sections_are_worded_as_redis_words_them() {
    let redis = redis_harness::Server::start();
    let (_serve, port) = serve();
    let role: &[&[&str]] = &[&["ROLE"]];
    assert_eq!(talk(port, role), talk(redis.port, role));
    assert_eq!(talk(port, role), "*3\r\n$6\r\nmaster\r\n:0\r\n*0\r\n");
    for section in ["replication", "cpu", "clients", "stats", "cluster"] {
        let (ours, theirs) = (info(port, section), info(redis.port, section));
        assert_eq!(ours.lines().next(), theirs.lines().next(), "{section}");
        let known = fields(&theirs);
        let mine = fields(&ours);
        assert!(mine.len() >= 3 || section == "cluster", "{section}: {ours}");
        for f in &mine {
            assert!(
                known.contains(f),
                "{section}: redis-server has no {f}: {theirs}"
            );
        }
    }
    let replication = info(port, "replication");
    for line in ["role:master", "connected_slaves:0", "master_repl_offset:0"] {
        assert!(replication.lines().any(|l| l == line), "{replication}");
    }
    // Counted: this connection and the ones before it, and what they ran.
    let stats = info(port, "stats");
    let value = |t: &str, k: &str| -> f64 {
        t.lines()
            .find_map(|l| l.strip_prefix(k)?.strip_prefix(':')?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {k} in {t}"))
    };
    assert!(
        value(&stats, "total_connections_received") >= 6.0,
        "{stats}"
    );
    assert!(value(&stats, "total_commands_processed") >= 6.0, "{stats}");
    let clients = info(port, "clients");
    assert!(value(&clients, "connected_clients") >= 1.0, "{clients}");
    let cpu = info(port, "cpu");
    assert!(
        value(&cpu, "used_cpu_user") + value(&cpu, "used_cpu_sys") > 0.0,
        "{cpu}"
    );
    // The default sections hold them all, as Redis's do.
    let all = info(port, "default");
    for h in ["# Replication", "# CPU", "# Clients", "# Stats"] {
        assert!(all.contains(h), "{all}");
    }
}
