//! A Markdown file's fences and the commands in them: what `cargo xtask docs` runs, and how
//! (servers started in the background, the ports they take).

use super::{DEFAULT_TIMEOUT, REDIS_DEFAULT_PORT, SERVE_DEFAULT_PORTS};
use std::time::Duration;

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
