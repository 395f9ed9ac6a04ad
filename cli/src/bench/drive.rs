//! Driving programs that are not ours for the service and layer benchmarks: servers started
//! pinned to one core (`taskset`) and stopped when dropped, load generators run pinned to
//! another, free loopback ports, and the CPU time a process spent (`/proc/PID/stat`) or the
//! children we waited for spent (`getrusage`).

use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::soak::probe::{clock_ticks, stat_cpu_ticks};

/// How to install what the benchmarks drive, for the error that says it is missing.
const INSTALL: &str = "apt-get install -y redis-server redis-tools wrk valgrind util-linux";

/// Checks that `program` can be run (it is on `PATH`, or a path that exists).
pub(crate) fn need(program: &str) -> crate::Result<()> {
    let found = if program.contains('/') {
        Path::new(program).is_file()
    } else {
        std::env::var_os("PATH")
            .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(program).is_file()))
    };
    if found {
        Ok(())
    } else {
        Err(format!("`{program}` is not installed or not on PATH (Debian: {INSTALL})").into())
    }
}

/// A free loopback port: bound to port 0, read back, released. Another process could take it
/// before the server binds it; the server then fails to start and says so.
pub(crate) fn free_port() -> crate::Result<u16> {
    Ok(free_ports::<1>()?[0])
}

/// `N` distinct free loopback ports, all held until every one is picked (two calls of
/// [`free_port`] may return the same port: the first is released before the second bind).
pub(crate) fn free_ports<const N: usize>() -> crate::Result<[u16; N]> {
    let mut held = Vec::with_capacity(N);
    let mut ports = [0; N];
    for p in &mut ports {
        let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .map_err(|e| format!("no free loopback port: {e}"))?;
        *p = l.local_addr()?.port();
        held.push(l);
    }
    Ok(ports)
}

/// `program args...` pinned to `core` (`taskset -c CORE`).
pub(crate) fn pinned(core: usize, program: &str) -> Command {
    let mut c = Command::new("taskset");
    c.arg("-c").arg(core.to_string()).arg(program);
    c
}

/// A server we started: killed and reaped when dropped, also when the benchmark fails.
pub(crate) struct Server {
    child: Child,
    name: String,
    /// Its standard error, a file of its own (removed on drop): what an early exit said.
    log: std::path::PathBuf,
}

impl Server {
    /// Starts `cmd` (stdout discarded, stderr to a temporary file) and waits, at most 60 s,
    /// until it accepts connections on `port`; `name` names it in errors, with the end of what
    /// it wrote if it exited first.
    pub(crate) fn start(mut cmd: Command, port: u16, name: &str) -> crate::Result<Self> {
        let log =
            std::env::temp_dir().join(format!("turnstile-bench-{}-{port}.log", std::process::id()));
        let err = std::fs::File::create(&log)
            .map_err(|e| format!("cannot create {}: {e}", log.display()))?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .map_err(|e| format!("cannot start {name}: {e}"))?;
        let mut s = Server {
            child,
            name: name.to_string(),
            log,
        };
        s.wait_port(port, Duration::from_secs(60))?;
        Ok(s)
    }

    fn wait_port(&mut self, port: u16, within: Duration) -> crate::Result<()> {
        let deadline = Instant::now() + within;
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            if let Some(status) = self.child.try_wait()? {
                let said = std::fs::read_to_string(&self.log).unwrap_or_default();
                let lines: Vec<&str> = said.lines().collect();
                let tail = lines[lines.len().saturating_sub(5)..].join(" | ");
                return Err(format!(
                    "{} exited ({status}) before listening on {port}: {tail}",
                    self.name
                )
                .into());
            }
            if Instant::now() > deadline {
                return Err(
                    format!("{} did not listen on {port} within {within:?}", self.name).into(),
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// The process id (of `taskset`, which execs the server: the same process).
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// CPU time the server has used so far, in seconds: the sum over its threads of
    /// `/proc/PID/task/TID/schedstat`'s time on a CPU (nanoseconds), or where the kernel keeps
    /// no such statistics, user + system time of `/proc/PID/stat` (in ticks of 10 ms).
    pub(crate) fn cpu_secs(&self) -> crate::Result<f64> {
        if let Some(ns) = schedstat_ns(self.pid()) {
            return Ok(ns as f64 / 1e9);
        }
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).map_err(|e| {
            format!(
                "cannot read the CPU time of {}: {e} (Linux only)",
                self.name
            )
        })?;
        let ticks = stat_cpu_ticks(&stat)
            .ok_or_else(|| format!("unexpected /proc/{}/stat: {stat}", self.pid()))?;
        Ok(ticks as f64 / clock_ticks())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

/// Nanoseconds on a CPU of every thread of `pid` (the first field of each thread's
/// schedstat); `None` if the kernel gives none.
fn schedstat_ns(pid: u32) -> Option<u64> {
    let mut total = 0;
    for t in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
        let s = std::fs::read_to_string(t.ok()?.path().join("schedstat")).ok()?;
        total += s.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(total)
}

/// User + system CPU seconds of the children this process has waited for.
fn children_cpu_secs() -> f64 {
    // SAFETY: `getrusage` writes one `rusage`, which `u` is; all-zero is a valid rusage.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to a rusage owned by this frame.
    if unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut u) } != 0 {
        return f64::NAN;
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(u.ru_utime) + secs(u.ru_stime)
}

/// A load generator's run: what it printed, how long it took and the CPU it used.
pub(crate) struct Run {
    pub stdout: String,
    pub wall_secs: f64,
    pub cpu_secs: f64,
}

/// Runs `cmd` to its end (its stdout captured, stderr shown on failure), bounded by the
/// program's own request count or duration.
pub(crate) fn run(mut cmd: Command, what: &str) -> crate::Result<Run> {
    let cpu0 = children_cpu_secs();
    let t0 = Instant::now();
    let out: Output = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {what}: {e}"))?;
    let wall_secs = t0.elapsed().as_secs_f64();
    let cpu_secs = children_cpu_secs() - cpu0;
    if !out.status.success() {
        return Err(format!(
            "{what} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )
        .into());
    }
    Ok(Run {
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        wall_secs,
        cpu_secs,
    })
}

/// A directory of scratch files (load scripts, callgrind output), removed when dropped.
pub(crate) struct Scratch(PathBuf);

impl Scratch {
    pub(crate) fn new(what: &str) -> crate::Result<Self> {
        let d = std::env::temp_dir().join(format!("turnstile-bench-{what}-{}", std::process::id()));
        std::fs::create_dir_all(&d).map_err(|e| format!("cannot create {}: {e}", d.display()))?;
        Ok(Scratch(d))
    }

    pub(crate) fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_program_is_named_with_how_to_install_it() {
        let e = need("surely-not-a-program-here").unwrap_err().to_string();
        assert!(
            e.contains("surely-not-a-program-here") && e.contains("apt-get"),
            "{e}"
        );
        assert!(need("sh").is_ok());
    }
}
