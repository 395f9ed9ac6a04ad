//! The test harness's real Redis: a `redis-server` child process on a free loopback port
//! (`--save "" --appendonly no`), or a 3-master Redis Cluster; stopped when dropped.
#![allow(dead_code)]

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A free loopback port (bound, then released for the server to take).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind a loopback port")
        .port()
}

fn cli(port: u16, args: &[&str]) -> Option<String> {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .stderr(Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// One `redis-server`.
pub struct Server {
    pub port: u16,
    dir: PathBuf,
    child: Option<Child>,
    extra: Vec<String>,
}

impl Server {
    /// Starts a server on a free port.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts a server with extra arguments (e.g. `--cluster-enabled yes`).
    pub fn start_with(extra: &[&str]) -> Self {
        let port = free_port();
        let dir =
            std::env::temp_dir().join(format!("turnstile-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temporary directory");
        let mut s = Server {
            port,
            dir,
            child: None,
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        s.spawn();
        s
    }

    fn spawn(&mut self) {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            // The failure tests block the server with DEBUG SLEEP.
            .args(["--enable-debug-command", "yes"])
            .arg("--dir")
            .arg(&self.dir)
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server on PATH (apt-get install redis-server redis-tools)");
        self.child = Some(child);
        let t0 = Instant::now();
        while cli(self.port, &["ping"]).as_deref() != Some("PONG") {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "redis-server did not start on {}",
                self.port
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Runs a command with redis-cli, returning its output.
    pub fn cli(&self, args: &[&str]) -> String {
        cli(self.port, args).unwrap_or_default()
    }

    /// Kills the server (SIGKILL: no goodbye to its clients).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same port (empty: no persistence, no script cache).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A 3-master Redis Cluster.
pub struct Cluster {
    pub nodes: Vec<Server>,
}

impl Cluster {
    pub fn start() -> Self {
        let nodes: Vec<Server> = (0..3)
            .map(|_| {
                Server::start_with(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "2000",
                ])
            })
            .collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .arg("--cluster-yes")
            .output()
            .expect("redis-cli --cluster create");
        assert!(
            out.status.success(),
            "cluster create: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let t0 = Instant::now();
        while !nodes
            .iter()
            .all(|n| n.cli(&["cluster", "info"]).contains("cluster_state:ok"))
        {
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "cluster did not become ok"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Cluster { nodes }
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.url()).collect()
    }
}

/// A multi-threaded runtime for a test.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}
