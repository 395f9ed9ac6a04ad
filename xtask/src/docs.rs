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
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fence {
    /// The file, relative to the workspace root.
    pub file: String,
    /// 1-based line of the opening fence.
    pub line: usize,
    /// The info string (after the backticks).
    pub info: String,
    /// The lines inside.
    pub body: Vec<String>,
}

/// What to do with a fence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Run it, within this time.
    Run(Duration),
    /// Shown only, for this reason.
    NoRun(String),
    /// Not shell.
    Other,
}

impl Fence {
    /// The fence's kind from its info string; `Err` for a malformed one.
    pub fn kind(&self) -> Result<Kind, String> {
        let mut words = self.info.split_whitespace();
        if words.next() != Some("sh") {
            return Ok(Kind::Other);
        }
        let rest: Vec<&str> = words.collect();
        let rest = rest.join(" ");
        if let Some(reason) = rest.strip_prefix("no-run") {
            let reason = reason.trim_start_matches(':').trim();
            if reason.is_empty() {
                return Err(format!(
                    "{}:{}: a `sh no-run` fence needs a reason: ```sh no-run: why",
                    self.file, self.line
                ));
            }
            return Ok(Kind::NoRun(reason.to_string()));
        }
        let mut timeout = DEFAULT_TIMEOUT;
        for w in rest.split_whitespace() {
            match w.strip_prefix("timeout=").map(str::parse::<u64>) {
                Some(Ok(s)) => timeout = Duration::from_secs(s),
                _ => {
                    return Err(format!(
                    "{}:{}: unknown fence option `{w}`; expected no-run: REASON or timeout=SECONDS",
                    self.file, self.line
                ))
                }
            }
        }
        Ok(Kind::Run(timeout))
    }
}

/// The fenced blocks of a Markdown text, as CommonMark reads backtick fences: an opening line
/// of three or more backticks and an info string without backticks (a fence inside a list may
/// be indented), closed by a line of at least as many backticks and nothing else.
pub fn fences(file: &str, text: &str) -> Result<Vec<Fence>, String> {
    let ticks = |l: &str| l.len() - l.trim_start_matches('`').len();
    let mut out = Vec::new();
    // (opening line, info, indent, backticks, body)
    let mut open: Option<(usize, String, usize, usize, Vec<String>)> = None;
    for (i, raw) in text.lines().enumerate() {
        let indent = raw.len() - raw.trim_start().len();
        let line = raw.trim_start();
        match &mut open {
            None => {
                let n = ticks(line);
                let info = &line[n..];
                if n >= 3 && !info.contains('`') {
                    open = Some((i + 1, info.trim().to_string(), indent, n, Vec::new()));
                }
            }
            Some((start, info, ind, n, body)) => {
                let t = line.trim_end();
                if ticks(t) >= *n && ticks(t) == t.len() {
                    out.push(Fence {
                        file: file.to_string(),
                        line: *start,
                        info: std::mem::take(info),
                        body: std::mem::take(body),
                    });
                    open = None;
                } else {
                    let cut = (*ind).min(indent);
                    body.push(raw[cut..].to_string());
                }
            }
        }
    }
    if let Some((start, ..)) = open {
        return Err(format!("{file}:{start}: a fence that is never closed"));
    }
    Ok(out)
}

/// The commands of a shell fence: `\`-continued lines joined, blank and comment lines left
/// out.
pub fn commands(body: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for l in body {
        let t = l.trim_end();
        if cur.is_empty() && (t.trim().is_empty() || t.trim_start().starts_with('#')) {
            continue;
        }
        if let Some(head) = t.strip_suffix('\\') {
            cur.push_str(head);
            cur.push(' ');
            continue;
        }
        cur.push_str(t);
        out.push(std::mem::take(&mut cur));
    }
    if !cur.trim().is_empty() {
        out.push(cur);
    }
    out
}

/// A command as the harness runs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    /// The command as the docs show it.
    pub shown: String,
    /// What runs (a server: without `&` and `--daemonize yes`).
    pub run: String,
    /// A server: run in the background, waited for on these ports.
    pub server_ports: Option<Vec<u16>>,
}

/// The shell words of a command, roughly (quotes kept together, comment cut): enough to
/// find a server's program and flags.
fn words(cmd: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quote: Option<char> = None;
    for c in cmd.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => cur.push(c),
            (None, '\'' | '"') => quote = Some(c),
            (None, '#') if cur.is_empty() => break,
            (None, c) if c.is_whitespace() => {
                if !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                }
            }
            (None, c) => cur.push(c),
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// The port of `HOST:PORT` (or a bare port).
fn port_of(addr: &str) -> Option<u16> {
    addr.rsplit(':').next()?.parse().ok()
}

/// The value of `--flag V` or `--flag=V`.
fn flag<'a>(w: &'a [String], name: &str) -> Option<&'a str> {
    let eq = format!("{name}=");
    w.iter().enumerate().find_map(|(i, x)| {
        if x == name {
            w.get(i + 1).map(String::as_str)
        } else {
            x.strip_prefix(&eq)
        }
    })
}

/// `cmd` without its trailing comment (a `#` that starts a word, outside quotes).
pub fn strip_comment(cmd: &str) -> &str {
    let mut quote: Option<char> = None;
    let mut prev_space = true;
    for (i, c) in cmd.char_indices() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '\'' | '"') => quote = Some(c),
            (None, '#') if prev_space => return cmd[..i].trim_end(),
            _ => {}
        }
        prev_space = c.is_whitespace();
    }
    cmd.trim_end()
}

/// Classifies one command: a server (which ports) or not.
pub fn step(cmd: &str) -> Step {
    let trimmed = strip_comment(cmd).trim();
    let no_amp = trimmed.strip_suffix('&').unwrap_or(trimmed).trim_end();
    let w = words(no_amp);
    let prog = w
        .iter()
        .find(|x| !x.contains('='))
        .map(String::as_str)
        .unwrap_or("");
    let prog = prog.rsplit('/').next().unwrap_or(prog);
    let serve = match prog {
        "turnstile" => w.iter().any(|x| x == "serve"),
        "cargo" => {
            w.iter().any(|x| x == "run")
                && w.iter().skip_while(|x| *x != "--").any(|x| x == "serve")
        }
        _ => false,
    };
    let is_example_server = prog == "cargo"
        && w.iter().any(|x| x == "run")
        && w.iter().any(|x| x == "--example")
        && trimmed.ends_with('&');
    let mut ports: Vec<u16> = Vec::new();
    let run;
    if serve {
        let resp = flag(&w, "--resp").and_then(port_of);
        let http = flag(&w, "--http").and_then(port_of);
        ports.push(resp.unwrap_or(SERVE_DEFAULT_PORTS[0]));
        ports.push(http.unwrap_or(SERVE_DEFAULT_PORTS[1]));
        if let Some(g) = flag(&w, "--grpc").and_then(port_of) {
            ports.push(g);
        }
        run = no_amp.to_string();
    } else if prog == "redis-server" {
        ports.push(
            flag(&w, "--port")
                .and_then(|p| p.parse().ok())
                .unwrap_or(REDIS_DEFAULT_PORT),
        );
        run = no_amp.replace("--daemonize yes", "").trim_end().to_string();
    } else if is_example_server || flag(&w, "--addr").is_some() {
        if let Some(p) = flag(&w, "--addr").and_then(port_of) {
            ports.push(p);
        }
        run = no_amp.to_string();
    } else {
        return Step {
            shown: cmd.to_string(),
            run: cmd.to_string(),
            server_ports: None,
        };
    }
    Step {
        shown: cmd.to_string(),
        run,
        server_ports: Some(ports),
    }
}

/// The bash script of a fence: helpers, then each step behind a marker line.
pub fn script(steps: &[Step]) -> String {
    let mut s = String::from(
        r#"set -eo pipefail
__step() { printf '\n\036xtask-step %s\n' "$1"; }
__wait_ports() {
    local pid=$1; shift
    # As long as the server lives (a `cargo run` may build first): the fence's time limit
    # bounds the wait.
    for p in "$@"; do
        until (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; do
            if ! kill -0 "$pid" 2>/dev/null; then
                echo "xtask docs: the server exited before port $p answered" >&2; exit 1
            fi
            sleep 0.1
        done
    done
}
"#,
    );
    for (i, st) in steps.iter().enumerate() {
        s.push_str(&format!("__step {i}\n"));
        match &st.server_ports {
            Some(ports) => {
                let ports: Vec<String> = ports.iter().map(u16::to_string).collect();
                s.push_str(&format!(
                    "{} &\n__wait_ports $! {}\n",
                    st.run,
                    ports.join(" ")
                ));
            }
            None => {
                s.push_str(&st.run);
                s.push('\n');
            }
        }
    }
    s.push_str("__step done\n");
    s
}

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
    // The servers' ports must be free (another server of the docs, or someone else's).
    for p in steps
        .iter()
        .filter_map(|s| s.server_ports.as_ref())
        .flatten()
    {
        let until = Instant::now() + PORT_FREE_WAIT;
        while !port_free(*p) {
            if Instant::now() > until {
                return fail(
                    format!(
                        "port {p}, which the fence's servers take, is in use by another process"
                    ),
                    String::new(),
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
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
mod tests {
    use super::*;

    fn fence(info: &str) -> Fence {
        Fence {
            file: "f.md".into(),
            line: 3,
            info: info.into(),
            body: Vec::new(),
        }
    }

    #[test]
    fn fences_are_found_with_their_info_and_indented_ones_too() {
        let text =
            "# t\n\n```sh\na\nb \\\n  c\n```\n\n- item\n\n  ```text no\n  x\n  ```\n```\nopen";
        let e = fences("f.md", text).expect_err("the last fence is never closed");
        assert!(e.contains("f.md:14"), "{e}");
        let f = fences("f.md", &text[..text.len() - 9]).unwrap();
        assert_eq!(f.len(), 2);
        assert_eq!((f[0].line, f[0].info.as_str()), (3, "sh"));
        assert_eq!(commands(&f[0].body), ["a", "b    c"]);
        assert_eq!(
            (f[1].info.as_str(), f[1].body.as_slice()),
            ("text no", &["x".to_string()][..])
        );
    }

    #[test]
    fn issue_numbers_are_found_as_grep_finds_them() {
        // Written with `#` for the space, so that a grep of the sources finds none.
        let text = |s: &str| s.replace('#', " ");
        for yes in [
            "Targets of issue#5",
            "(issues#13 and 15: before)",
            "Issue#20, defect 3",
        ] {
            assert!(names_an_issue(&text(yes)), "{yes}");
        }
        for no in ["an issue of layout", "issues: none", "issue ##5"] {
            assert!(!names_an_issue(&text(no)), "{no}");
        }
    }

    #[test]
    fn inline_code_of_backticks_is_not_a_fence() {
        let text = "* ```` ```sh ```` is run\n  ```` ```sh ````.\n````md\n```sh\nx\n```\n````\n";
        let f = fences("f.md", text).unwrap();
        assert_eq!(f.len(), 1);
        assert_eq!((f[0].info.as_str(), f[0].body.len()), ("md", 3));
    }

    #[test]
    fn kinds_by_info_string() {
        assert_eq!(fence("sh").kind(), Ok(Kind::Run(DEFAULT_TIMEOUT)));
        assert_eq!(
            fence("sh timeout=600").kind(),
            Ok(Kind::Run(Duration::from_secs(600)))
        );
        assert_eq!(
            fence("sh no-run: a Cluster of real hosts").kind(),
            Ok(Kind::NoRun("a Cluster of real hosts".into()))
        );
        assert!(fence("sh no-run")
            .kind()
            .unwrap_err()
            .contains("needs a reason"));
        assert!(fence("sh fast")
            .kind()
            .unwrap_err()
            .contains("unknown fence option `fast`"));
        for other in ["", "text", "rust", "toml", "shell"] {
            assert_eq!(fence(other).kind(), Ok(Kind::Other), "{other}");
        }
    }

    #[test]
    fn comments_and_blank_lines_are_not_commands() {
        let body: Vec<String> = ["# a comment", "", "echo 1   # trailing", "  # indented"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(commands(&body), ["echo 1   # trailing"]);
    }

    #[test]
    fn comments_are_cut_outside_quotes_only() {
        assert_eq!(strip_comment("a b   # c"), "a b");
        assert_eq!(
            strip_comment(r##"curl -d '{"a":"#1"}' x # y"##),
            r##"curl -d '{"a":"#1"}' x"##
        );
        assert_eq!(strip_comment("echo a#b"), "echo a#b");
        assert_eq!(strip_comment("# all"), "");
    }

    #[test]
    fn servers_are_recognised_with_their_ports() {
        let s =
            step("cargo run --release -- serve --rules examples/rules.toml     # RESP on :6380");
        assert_eq!(s.server_ports, Some(vec![6380, 8080]));
        assert_eq!(
            s.run,
            "cargo run --release -- serve --rules examples/rules.toml"
        );
        let s =
            step("turnstile serve --rules r.toml --resp 127.0.0.1:6381 --http 127.0.0.1:8081 &");
        assert_eq!(s.server_ports, Some(vec![6381, 8081]));
        assert!(!s.run.ends_with('&'));
        let s = step("turnstile serve --grpc 127.0.0.1:8081 --envoy-config examples/envoy/");
        assert_eq!(s.server_ports, Some(vec![6380, 8080, 8081]));
        let s = step(
            "redis-server --port 6379 --bind 127.0.0.1 --save '' --appendonly no --daemonize yes",
        );
        assert_eq!(s.server_ports, Some(vec![6379]));
        assert!(!s.run.contains("daemonize"), "{}", s.run);
        let s = step(
            "cargo run --release -p turnstile-tower --example axum -- --addr 127.0.0.1:3000 &",
        );
        assert_eq!(s.server_ports, Some(vec![3000]));
        let s =
            step("cargo run --release -p turnstile-tower --example axum -- --addr 127.0.0.1:3000");
        assert_eq!(s.server_ports, Some(vec![3000]));
        assert!(s.run.ends_with("3000"), "{}", s.run);
        for not in [
            "redis-cli -p 6380 CL.THROTTLE user:1 15 30 60",
            "curl -s localhost:8080/metrics",
            "turnstile rules check examples/rules.toml",
            "cargo run --release -- bench",
            "echo serve",
        ] {
            assert_eq!(step(not).server_ports, None, "{not}");
        }
    }

    #[test]
    fn a_script_marks_each_step_and_waits_for_servers() {
        let steps = [step("turnstile serve"), step("redis-cli -p 6380 PING")];
        let s = script(&steps);
        assert!(
            s.contains("__step 0\nturnstile serve &\n__wait_ports $! 6380 8080\n"),
            "{s}"
        );
        assert!(
            s.contains("__step 1\nredis-cli -p 6380 PING\n__step done\n"),
            "{s}"
        );
    }

    #[test]
    fn judging_names_the_failing_command() {
        let steps = [step("echo a"), step("false"), step("redis-cli PING")];
        let t = Duration::from_secs(1);
        let log = "\n\u{1e}xtask-step 0\na\n\n\u{1e}xtask-step 1\n";
        assert_eq!(
            judge(&steps, log, Some(false), t),
            Some("`false` failed".into())
        );
        assert!(judge(&steps, log, None, t)
            .unwrap()
            .starts_with("timed out after 1 s in `false`"));
        let ok = "\n\u{1e}xtask-step 0\na\n\u{1e}xtask-step 2\nPONG\n\u{1e}xtask-step done\n";
        assert_eq!(judge(&steps, ok, Some(true), t), None);
        let err = ok.replace("PONG", "ERR unknown command 'PONG'");
        assert!(judge(&steps, &err, Some(true), t)
            .unwrap()
            .contains("`redis-cli PING` answered an error"));
        assert!(judge(&steps, "\n\u{1e}xtask-step 0\n", Some(true), t)
            .unwrap()
            .starts_with("stopped in"));
    }

    /// End to end on bash itself: a job the fence leaves in the background is stopped with
    /// its group, and a failing command is named.
    #[test]
    fn a_fence_runs_in_its_own_group_and_leaves_the_tree_clean() {
        let root = std::env::temp_dir().join(format!("xtask-fence-{}", std::process::id()));
        std::fs::create_dir_all(&root).unwrap();
        let f = Fence {
            file: "t.md".into(),
            line: 1,
            info: "sh".into(),
            body: vec!["sleep 600 &".into(), "echo $! > pid".into()],
        };
        let path = std::env::var("PATH").unwrap();
        let o = run_fence(&root, &f, Duration::from_secs(20), &path);
        assert_eq!(o.failure, None, "{}", o.log);
        let pid = std::fs::read_to_string(root.join("pid")).unwrap();
        // The background sleep was stopped with the group.
        let alive = Command::new("kill")
            .args(["-0", pid.trim()])
            .stderr(Stdio::null())
            .status()
            .unwrap()
            .success();
        assert!(!alive, "the fence's background job outlived it");
        let failing = Fence {
            body: vec!["true".into(), "exit 3".into(), "echo never".into()],
            ..f
        };
        let o = run_fence(&root, &failing, Duration::from_secs(20), &path);
        assert_eq!(o.failure.as_deref(), Some("`exit 3` failed"), "{}", o.log);
        std::fs::remove_dir_all(&root).unwrap();
    }
}
