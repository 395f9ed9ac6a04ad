//! What the soak reads of the server and the machine: the server's resident memory from
//! `/proc/PID/status` and its descriptors from `/proc/PID/fd` (its process found from the port
//! it listens on), its flags from `/proc/PID/cmdline`, its `/metrics` over HTTP, the kernel's
//! TCP buffer memory from `/proc/net/sockstat`, and the load average.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A field of `/proc/PID/status` in bytes (`VmRSS`, `VmHWM`: the kernel writes kB).
pub fn status_bytes(pid: u32, field: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = s.lines().find(|l| l.starts_with(field))?;
    let kb: u64 = line[field.len()..]
        .trim_start_matches(':')
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kb * 1024)
}

/// The server's resident memory now.
pub fn rss(pid: u32) -> Option<u64> {
    status_bytes(pid, "VmRSS")
}

/// The process's open file descriptors (the entries of `/proc/PID/fd`).
pub fn fd_count(pid: u32) -> Option<u64> {
    Some(std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64)
}

/// Resets the process's peak resident memory (`VmHWM`) to its current resident memory, so that
/// the peak read after the attack is the attack's, even between two samples. False when the
/// kernel does not let this user do it (another user's process).
pub fn reset_peak(pid: u32) -> bool {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").is_ok()
}

/// The process's CPU time so far (user and system), in seconds.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    Some(stat_cpu_ticks(&s)? as f64 / clock_ticks())
}

/// utime + stime (fields 14 and 15) of a `/proc/PID/stat` line, in clock ticks. The command
/// name (field 2) is in parentheses and may hold spaces: fields are counted after its `)`.
pub(crate) fn stat_cpu_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut f = rest.split_whitespace().skip(11);
    let utime: u64 = f.next()?.parse().ok()?;
    let stime: u64 = f.next()?.parse().ok()?;
    Some(utime + stime)
}

/// Clock ticks per second (`sysconf(_SC_CLK_TCK)`, 100 on Linux).
pub(crate) fn clock_ticks() -> f64 {
    // SAFETY: sysconf reads a constant of the system; no memory is passed.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// Whether the process is still there (not exited, not a zombie).
pub fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            let state = s.rsplit_once(')')?.1.split_whitespace().next()?.to_string();
            Some(state != "Z" && state != "X")
        })
        .unwrap_or(false)
}

/// The process listening on `addr` (a loopback TCP port of this machine): the inode of the
/// listening socket from `/proc/net/tcp` or `tcp6`, then the process holding it among
/// `/proc/*/fd`. `None` when it cannot be seen (another user's process, no such listener).
pub fn find_pid(addr: SocketAddr) -> Option<u32> {
    let port = format!("{:04X}", addr.port());
    let mut inodes = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            // local_address is HEX_IP:HEX_PORT; state 0A is LISTEN; inode is field 9.
            if f.len() > 9 && f[3] == "0A" && f[1].rsplit(':').next() == Some(port.as_str()) {
                inodes.push(format!("socket:[{}]", f[9]));
            }
        }
    }
    if inodes.is_empty() {
        return None;
    }
    let me = std::process::id();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if let Ok(link) = std::fs::read_link(fd.path()) {
                if inodes.iter().any(|i| link.as_os_str() == i.as_str()) {
                    return Some(pid);
                }
            }
        }
    }
    None
}

/// The flags the server runs with, read back from its command line (`turnstile serve ...`),
/// so that the bound is computed from what it was given. `None` if the command line is not
/// a `serve` the flags parser accepts.
pub fn server_flags(pid: u32) -> Option<turnstile_server::ServeArgs> {
    use clap::{Args, FromArgMatches};
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let words: Vec<String> = raw
        .split(|b| *b == 0)
        .filter(|w| !w.is_empty())
        .map(|w| String::from_utf8_lossy(w).into_owned())
        .collect();
    let at = words.iter().position(|w| w == "serve")?;
    let cmd = turnstile_server::ServeArgs::augment_args(clap::Command::new("serve"));
    let m = cmd.try_get_matches_from(&words[at..]).ok()?;
    turnstile_server::ServeArgs::from_arg_matches(&m).ok()
}

/// Bytes of the kernel's TCP buffers, machine-wide (`/proc/net/sockstat`, pages of 4 KiB):
/// what sockets hold that no process's resident memory counts.
pub fn tcp_kernel_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/net/sockstat").ok()?;
    let line = s.lines().find(|l| l.starts_with("TCP:"))?;
    let mut it = line.split_whitespace();
    while let Some(w) = it.next() {
        if w == "mem" {
            return it.next()?.parse::<u64>().ok().map(|p| p * 4096);
        }
    }
    None
}

/// Bytes waiting in the kernel's queues of the server's own connections (those whose local
/// port is one of `ports`): (send, receive), from the `tx_queue:rx_queue` of `/proc/net/tcp`
/// and `tcp6`. The clients' ends are not counted.
pub fn server_queues(ports: &[u16]) -> Option<(u64, u64)> {
    let ports: Vec<String> = ports.iter().map(|p| format!("{p:04X}")).collect();
    let (mut tx, mut rx) = (0u64, 0u64);
    let mut any = false;
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        any = true;
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            // Listening sockets' rx_queue is their accept backlog: left out.
            if f.len() < 5 || f[3] == "0A" {
                continue;
            }
            let local = f[1].rsplit(':').next().unwrap_or("");
            if !ports.iter().any(|p| p == local) {
                continue;
            }
            if let Some((t, r)) = f[4].split_once(':') {
                tx += u64::from_str_radix(t, 16).unwrap_or(0);
                rx += u64::from_str_radix(r, 16).unwrap_or(0);
            }
        }
    }
    any.then_some((tx, rx))
}

/// The 1-minute load average.
pub fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// An HTTP/1.1 response as the attackers and the scraper read it.
#[derive(Debug)]
pub struct HttpResponse {
    pub status: u16,
    pub body: Vec<u8>,
}

/// What [`read_response`] says when the connection closed before a response.
pub const CLOSED: &str = "closed before a response";

/// Reads one response (head, then a `Content-Length` body) from `s`; `extra` holds what was
/// read past the previous response. Bounded: a head over 64 KiB or a body over 16 MiB is an
/// error.
pub async fn read_response(s: &mut TcpStream, extra: &mut Vec<u8>) -> Result<HttpResponse, String> {
    let mut buf = std::mem::take(extra);
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        if buf.len() > 64 << 10 {
            return Err("response head over 64 KiB".into());
        }
        let mut chunk = [0u8; 8192];
        let n = s.read(&mut chunk).await.map_err(|e| e.to_string())?;
        if n == 0 {
            return Err(CLOSED.into());
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("not an HTTP response: {:?}", &head[..head.len().min(80)]))?;
    let len = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse::<usize>().ok())
                .flatten()
        })
        .unwrap_or(0);
    if len > 16 << 20 {
        return Err(format!("a body of {len} bytes"));
    }
    let mut body = buf.split_off(head_end);
    while body.len() < len {
        let mut chunk = vec![0u8; (len - body.len()).min(64 << 10)];
        let n = s.read(&mut chunk).await.map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("closed inside a response body".into());
        }
        body.extend_from_slice(&chunk[..n]);
    }
    *extra = body.split_off(len);
    Ok(HttpResponse { status, body })
}

/// `/metrics` of the server, as `name{labels}` → value; `None` if it cannot be read (no
/// HTTP address, closed without the password, or an error).
pub async fn metrics(http: SocketAddr, password: Option<&[u8]>) -> Option<HashMap<String, f64>> {
    metrics_within(http, password, Duration::from_secs(5)).await
}

/// [`metrics`], given up after `wait`.
pub async fn metrics_within(
    http: SocketAddr,
    password: Option<&[u8]>,
    wait: Duration,
) -> Option<HashMap<String, f64>> {
    let fetch = async {
        let mut s = TcpStream::connect(http).await.ok()?;
        let mut req =
            format!("GET /metrics HTTP/1.1\r\nHost: {http}\r\nConnection: close\r\n").into_bytes();
        if let Some(p) = password {
            req.extend_from_slice(b"Authorization: Bearer ");
            req.extend_from_slice(p);
            req.extend_from_slice(b"\r\n");
        }
        req.extend_from_slice(b"\r\n");
        s.write_all(&req).await.ok()?;
        let r = read_response(&mut s, &mut Vec::new()).await.ok()?;
        (r.status == 200).then(|| parse_metrics(&String::from_utf8_lossy(&r.body)))
    };
    tokio::time::timeout(wait, fetch).await.ok().flatten()
}

/// Prometheus text → sample name (with its labels) → value.
pub fn parse_metrics(text: &str) -> HashMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process() {
        let me = std::process::id();
        assert!(rss(me).unwrap() > 0);
        assert!(fd_count(me).unwrap() >= 3);
        assert!(alive(me));
        assert!(cpu_seconds(me).is_some());
        assert_eq!(server_queues(&[1]), Some((0, 0)));
        assert!(load_average().is_some());
    }

    #[test]
    fn cpu_ticks_are_read_after_the_command_name() {
        let line = "4242 (tokio (rt) 1) S 1 4242 4242 0 -1 4194560 1234 0 0 0 250 37 0 0 20 0 9 0";
        assert_eq!(stat_cpu_ticks(line), Some(287));
        assert_eq!(stat_cpu_ticks("4242 (x) S 1"), None);
        assert_eq!(stat_cpu_ticks("garbage"), None);
    }

    #[test]
    fn finds_the_process_of_a_port() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        // This process is skipped (the soak never measures itself): nothing else listens.
        assert_eq!(find_pid(l.local_addr().unwrap()), None);
    }

    #[test]
    fn metrics_text() {
        let m = parse_metrics(
            "# HELP x y\n# TYPE x counter\nturnstile_throttle_total{result=\"allowed\"} 12\nturnstile_resp_buffer_bytes 4096\n",
        );
        assert_eq!(m["turnstile_throttle_total{result=\"allowed\"}"], 12.0);
        assert_eq!(m["turnstile_resp_buffer_bytes"], 4096.0);
    }
}
