//! `cargo xtask docs`: runs the shell commands of README.md and docs/*.md, so that every
//! command a user would paste works as written.
//!
//! # The fence convention
//!
//! * A fence whose info string starts with `sh` is run: ```` ```sh ````.
//! * ```` ```sh no-run: REASON ```` is shown but not run, and says why (a benchmark of
//!   minutes, a Redis Cluster of real hosts, a command CI runs as a step of its own). A
//!   `no-run` without a reason is an error. Commands with placeholders (`PORT`, `FILE`) go in
//!   ```` ```text ```` or a bare ```` ``` ```` fence, never ```` ```sh ````.
//! * ```` ```sh timeout=900 ```` raises the fence's time limit (default 600 s: a `cargo run`
//!   may build an example first).
//! * A fence runs as one `bash` script (`set -eo pipefail`) from the workspace root, with
//!   `target/release` first on `PATH` (so `turnstile` is the release binary, built first),
//!   in a process group of its own. It passes when every command exits 0 and no output line
//!   starts with `ERR ` or `(error)` (redis-cli exits 0 on an error reply).
//! * A server started in the foreground — `turnstile serve …`, `cargo run … -- serve …`,
//!   `redis-server …` — is started in the background instead (`--daemonize yes` is dropped so
//!   that the server stays in the group), and so is one the docs start with `&`; the next
//!   command waits until its ports answer (`--resp`, `--http`, `--grpc`, `--addr`, `--port`;
//!   `serve`'s defaults 6380 and 8080, redis-server's 6379). When the fence ends, everything
//!   it started is stopped (SIGTERM to the group, SIGKILL after 10 s), also on failure.
//! * Ports are the ones the docs name (loopback only): fences run one at a time, and a fence
//!   waits up to 30 s for its servers' ports to be free, then fails naming the port.
//! * Files a fence writes into the tree are removed afterwards (a user's copy of a command may
//!   well write `rules.toml`); a tracked file it changes is restored from git, or the fence
//!   fails if that file had uncommitted changes.

use std::collections::BTreeSet;
use std::io::Read as _;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Default time limit of a fence: room for a `cargo run` that builds an example first.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);
/// How long a fence waits for the ports its servers take to be free.
const PORT_FREE_WAIT: Duration = Duration::from_secs(30);
/// `turnstile serve`'s default RESP and HTTP ports (checked against `serve --help`).
const SERVE_DEFAULT_PORTS: [u16; 2] = [6380, 8080];
/// redis-server's default port.
const REDIS_DEFAULT_PORT: u16 = 6379;

/// A fenced block of a Markdown file.
mod fence;

pub use fence::*;

/// Whether a port on 127.0.0.1 is free (can be bound).
fn port_free(p: u16) -> bool {
    TcpListener::bind(("127.0.0.1", p)).is_ok()
}

/// The tree's state: `git status --porcelain` lines (none if there is no git).
fn tree_state(root: &Path) -> BTreeSet<String> {
    Command::new("git")
        .args(["status", "--porcelain", "--untracked-files=all"])
        .current_dir(root)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// Undoes what a fence wrote into the tree; `Err` if it cannot.
fn restore_tree(root: &Path, before: &BTreeSet<String>) -> Result<Vec<String>, String> {
    let after = tree_state(root);
    let mut notes = Vec::new();
    for l in after.difference(before) {
        let (status, path) = l.split_at(3.min(l.len()));
        let path = path.trim();
        if status.starts_with("??") {
            let p = root.join(path);
            if p.is_file() {
                let _ = std::fs::remove_file(&p);
            }
            notes.push(format!("removed {path}, which the fence wrote"));
        } else {
            let before_has = before.iter().any(|b| b.len() > 3 && b[3..].trim() == path);
            if before_has {
                return Err(format!(
                    "the fence changed {path}, which had uncommitted changes: cannot restore it"
                ));
            }
            Command::new("git")
                .args(["checkout", "--", path])
                .current_dir(root)
                .status()
                .map_err(|e| format!("git checkout {path}: {e}"))?;
            notes.push(format!("restored {path}, which the fence changed"));
        }
    }
    Ok(notes)
}

/// Stops the process group `pgid`: SIGTERM, then SIGKILL after 10 s.
fn stop_group(pgid: u32) {
    let group = format!("-{pgid}");
    let signal = |sig: &str| {
        Command::new("kill")
            .args([sig, "--", &group])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if !signal("-TERM") {
        return;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if !signal("-0") {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    signal("-KILL");
}

/// How a fence ended.
pub struct Outcome {
    /// `None`: passed; else what failed.
    pub failure: Option<String>,
    /// The output.
    pub log: String,
    /// What was undone in the tree.
    pub notes: Vec<String>,
    /// How long it took.
    pub took: Duration,
}

/// Runs one fence.
pub fn run_fence(root: &Path, fence: &Fence, timeout: Duration, path: &str) -> Outcome {
    let t0 = Instant::now();
    let steps: Vec<Step> = commands(&fence.body).iter().map(|c| step(c)).collect();
    let fail = |msg: String, log: String| Outcome {
        failure: Some(msg),
        log,
        notes: Vec::new(),
        took: t0.elapsed(),
    };
    if let Err(e) = wait_for_ports(&steps) {
        return fail(e, String::new());
    }
    let before = tree_state(root);
    let dir = std::env::temp_dir().join(format!("xtask-docs-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let script_path = dir.join("fence.sh");
    let log_path = dir.join("fence.log");
    if let Err(e) = std::fs::write(&script_path, script(&steps)) {
        return fail(
            format!("cannot write {}: {e}", script_path.display()),
            String::new(),
        );
    }
    let log = match std::fs::File::create(&log_path) {
        Ok(f) => f,
        Err(e) => return fail(format!("cannot create the log: {e}"), String::new()),
    };
    let err = match log.try_clone() {
        Ok(f) => f,
        Err(e) => return fail(format!("cannot share the log: {e}"), String::new()),
    };
    use std::os::unix::process::CommandExt;
    let child = Command::new("bash")
        .arg(&script_path)
        .current_dir(root)
        .env("PATH", path)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(err)
        .process_group(0)
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => return fail(format!("cannot start bash: {e}"), String::new()),
    };
    let status = wait_then_stop(&mut child, timeout);
    let mut text = String::new();
    if let Ok(mut f) = std::fs::File::open(&log_path) {
        let _ = f.read_to_string(&mut text);
    }
    let _ = std::fs::remove_dir_all(&dir);
    let notes = match restore_tree(root, &before) {
        Ok(n) => n,
        Err(e) => return fail(e, text),
    };
    let failure = judge(&steps, &text, status.map(|s| s.success()), timeout);
    Outcome {
        failure,
        log: text,
        notes,
        took: t0.elapsed(),
    }
}

/// Waits up to [`PORT_FREE_WAIT`] for the ports the fence's servers take to be free (another
/// server of the docs, or someone else's).
fn wait_for_ports(steps: &[Step]) -> Result<(), String> {
    for p in steps
        .iter()
        .filter_map(|s| s.server_ports.as_ref())
        .flatten()
    {
        let until = Instant::now() + PORT_FREE_WAIT;
        while !port_free(*p) {
            if Instant::now() > until {
                return Err(format!(
                    "port {p}, which the fence's servers take, is in use by another process"
                ));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    Ok(())
}

/// Waits for the fence's script to exit, at most `timeout`, then stops everything it started
/// (its process group); its exit status if it exited in time.
fn wait_then_stop(
    child: &mut std::process::Child,
    timeout: Duration,
) -> Option<std::process::ExitStatus> {
    let pgid = child.id();
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Some(s),
            Ok(None) if Instant::now() > deadline => break None,
            Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            Err(_) => break None,
        }
    };
    stop_group(pgid);
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    status
}

/// Whether the fence passed, from its exit and its output: `None` if it did, else which
/// command failed and how.
pub fn judge(
    steps: &[Step],
    log: &str,
    success: Option<bool>,
    timeout: Duration,
) -> Option<String> {
    // The output of each step, by the markers.
    let mut current: Option<usize> = None;
    let mut reached_end = false;
    let mut bad_reply: Option<(usize, String)> = None;
    for l in log.lines() {
        if let Some(m) = l.strip_prefix("\u{1e}xtask-step ") {
            if m == "done" {
                reached_end = true;
            } else {
                current = m.parse().ok();
            }
            continue;
        }
        let t = l.trim_start();
        if bad_reply.is_none() && (t.starts_with("ERR ") || t.starts_with("(error)")) {
            if let Some(i) = current {
                bad_reply = Some((i, l.to_string()));
            }
        }
    }
    let name = |i: Option<usize>| {
        i.and_then(|i| steps.get(i)).map_or_else(
            || "(before the first command)".to_string(),
            |s| s.shown.clone(),
        )
    };
    match success {
        None => Some(format!(
            "timed out after {} s in `{}`",
            timeout.as_secs(),
            name(current)
        )),
        Some(false) => Some(format!("`{}` failed", name(current))),
        Some(true) if !reached_end => Some(format!("stopped in `{}`", name(current))),
        Some(true) => bad_reply.map(|(i, l)| format!("`{}` answered an error: {l}", name(Some(i)))),
    }
}

/// The Markdown files the docs test reads: README.md and docs/*.md, in name order.
pub fn doc_files(root: &Path) -> Result<Vec<PathBuf>, String> {
    let mut files = vec![root.join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .map_err(|e| format!("cannot read docs/: {e}"))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    Ok(files)
}

/// Whether `line` names an issue by number — the word "issue" or "issues", one space, a
/// digit, in any case — as `grep -iE 'issues? [0-9]+'` finds them.
pub fn names_an_issue(line: &str) -> bool {
    let l = line.to_ascii_lowercase();
    l.match_indices("issue").any(|(i, _)| {
        let rest = &l[i + 5..];
        let rest = rest.strip_prefix('s').unwrap_or(rest);
        rest.strip_prefix(' ')
            .is_some_and(|r| r.starts_with(|c: char| c.is_ascii_digit()))
    })
}

/// Lines of README.md and docs/*.md that name an issue by number (`FILE:LINE: text`).
pub fn issue_references(root: &Path) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for file in doc_files(root)? {
        let text = std::fs::read_to_string(&file)
            .map_err(|e| format!("cannot read {}: {e}", file.display()))?;
        let rel = file
            .strip_prefix(root)
            .unwrap_or(&file)
            .display()
            .to_string();
        for (i, l) in text.lines().enumerate() {
            if names_an_issue(l) {
                out.push(format!("{rel}:{}: {}", i + 1, l.trim()));
            }
        }
    }
    Ok(out)
}

/// Checks that `turnstile serve`'s defaults are still the ports this harness assumes.
pub fn check_serve_defaults(turnstile: &Path) -> Result<(), String> {
    let out = Command::new(turnstile)
        .args(["serve", "--help"])
        .output()
        .map_err(|e| format!("cannot run {} serve --help: {e}", turnstile.display()))?;
    let help = String::from_utf8_lossy(&out.stdout);
    for p in SERVE_DEFAULT_PORTS {
        if !help.contains(&format!("[default: 127.0.0.1:{p}]")) {
            return Err(format!(
                "turnstile serve's default ports are no longer {SERVE_DEFAULT_PORTS:?}: update SERVE_DEFAULT_PORTS in xtask/src/docs.rs"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
