//! `turnstile serve --snapshot` against symbolic links planted beside the snapshot, as another
//! user of the directory would plant them: the built binary as a child process on free
//! loopback ports, raw RESP, stopped with SIGTERM; every wait bounded.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

mod common;
use common::free_port;

const BIN: &str = env!("CARGO_BIN_EXE_turnstile");

/// `turnstile serve` with `--snapshot snap` (written on shutdown only), listening: the
/// process and its RESP port.
fn start(snap: &Path) -> (common::Running, u16) {
    let (resp, http) = (free_port(), free_port());
    let mut cmd = Command::new(BIN);
    cmd.args(["serve", "--workers", "1", "--throttle-keys", "1000"])
        .args(["--resp", &format!("127.0.0.1:{resp}")])
        .args(["--http", &format!("127.0.0.1:{http}")])
        .arg("--snapshot")
        .arg(snap)
        .args(["--snapshot-every", "0"])
        .env("RUST_LOG", "warn");
    (common::spawn_listening(&mut cmd, &[resp, http]), resp)
}

/// SIGTERM, a clean exit within 30 s: what the server logged.
fn stop(mut s: common::Running) -> String {
    // SAFETY: kill(2) on our own child's pid; no memory is involved.
    assert_eq!(
        unsafe { libc::kill(s.id() as libc::pid_t, libc::SIGTERM) },
        0
    );
    let st = common::wait_bounded(&mut s, Duration::from_secs(30)).expect("exits after SIGTERM");
    let mut err = String::new();
    s.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert!(st.success(), "exit {st} after SIGTERM: {err}");
    err
}

/// `CL.THROTTLE key 0 1 3600` (one an hour): 0 admitted, 1 denied.
fn throttle(port: u16, key: &str) -> i64 {
    let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let parts = ["CL.THROTTLE", key, "0", "1", "3600"];
    let mut req = format!("*{}\r\n", parts.len());
    for p in parts {
        req.push_str(&format!("${}\r\n{p}\r\n", p.len()));
    }
    c.write_all(req.as_bytes()).unwrap();
    let mut lines = BufReader::new(c).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "*5");
    let first = lines.next().unwrap().unwrap();
    first[1..]
        .parse()
        .unwrap_or_else(|_| panic!("reply {first:?}"))
}

/// Links to a victim at the fixed name of the temporary file older builds used and at other
/// plausible ones, and a temporary file a crash left: the server starts, takes a request,
/// writes its snapshot on SIGTERM, and a restart on it still denies the key. The victim is
/// never touched, the links stay links, the crash's file is removed.
#[test]
fn serve_follows_no_link_planted_beside_its_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let victim = elsewhere.path().join("victim");
    std::fs::write(&victim, "precious\n").unwrap();
    let snap = dir.path().join("throttle.snap");
    let planted = [
        ".throttle.snap.tmp",
        "throttle.snap.tmp",
        ".throttle.snap.tmp-0000000000000000",
        "throttle.snap.new",
        "throttle.snap~",
    ];
    for name in planted {
        std::os::unix::fs::symlink(&victim, dir.path().join(name)).unwrap();
    }
    let crashed = dir.path().join(".throttle.snap.tmp-0123456789abcdef");
    std::fs::write(&crashed, "half a snapshot").unwrap();

    let (s, resp) = start(&snap);
    assert_eq!(throttle(resp, "user:1"), 0, "admitted");
    let log = stop(s);
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious\n", "victim");
    assert!(
        log.contains("removed the temporary file of an unfinished snapshot"),
        "{log}"
    );
    assert!(!crashed.exists(), "the crash's temporary file is removed");
    let (s, resp) = start(&snap);
    assert_eq!(
        throttle(resp, "user:1"),
        1,
        "still denied after the restart"
    );
    stop(s);

    assert_eq!(std::fs::read(&victim).unwrap(), b"precious\n", "victim");
    let meta = std::fs::symlink_metadata(&snap).unwrap();
    assert!(meta.file_type().is_file(), "{:?}", meta.file_type());
    for name in planted {
        let link = std::fs::read_link(dir.path().join(name)).unwrap();
        assert_eq!(link, victim, "{name}");
    }
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        planted.len() + 1,
        "no temporary file left behind"
    );
}
