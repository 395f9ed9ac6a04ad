//! The test harness's real Redis: a `redis-server` child process on a free loopback port
//! (`--save "" --appendonly no`), or a Redis Cluster (3 masters, optionally a replica each);
//! stopped when dropped.
#![allow(dead_code)]

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A free loopback port (bound, then released for the server to take).
pub fn free_port() -> u16 {
    free_ports(1)[0]
}

/// `n` distinct free loopback ports (all bound at once, then released).
pub fn free_ports(n: usize) -> Vec<u16> {
    let ls: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("bind a loopback port"))
        .collect();
    ls.iter()
        .map(|l| l.local_addr().expect("a bound port").port())
        .collect()
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
        Self::start_on_free_ports(0, |_| extra.iter().map(|s| s.to_string()).collect())
    }

    /// Starts a server on a free port with the arguments `extra(ports)` gives for `more` other
    /// free ports (e.g. a cluster bus port). Free ports are released before the server binds
    /// them, so another process may take one first: then the server exits (or another server
    /// answers on it) and it is started again on new ports, up to 5 times.
    pub fn start_on_free_ports(more: usize, extra: impl Fn(&[u16]) -> Vec<String>) -> Self {
        for _ in 0..5 {
            let ports = free_ports(1 + more);
            if let Some(s) = Self::try_start(ports[0], extra(&ports[1..])) {
                return s;
            }
        }
        panic!("redis-server did not start on 5 sets of free ports (see above)");
    }

    /// Starts a server on `port`; `None` if it exited (the port was taken).
    fn try_start(port: u16, extra: Vec<String>) -> Option<Self> {
        let dir =
            std::env::temp_dir().join(format!("turnstile-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temporary directory");
        let mut s = Server {
            port,
            dir,
            child: None,
            extra,
        };
        s.spawn().then_some(s)
    }

    /// Starts the server; false if it exited before answering (its port taken), or if the
    /// server answering on its port is another process's.
    fn spawn(&mut self) -> bool {
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
        let pid = format!("process_id:{}", child.id());
        self.child = Some(child);
        let t0 = Instant::now();
        while cli(self.port, &["ping"]).as_deref() != Some("PONG") {
            if let Some(c) = self.child.as_mut() {
                if c.try_wait().is_ok_and(|exited| exited.is_some()) {
                    self.child = None;
                    return false;
                }
            }
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "redis-server did not start on {}",
                self.port
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        if !self.cli(&["info", "server"]).contains(&pid) {
            self.kill();
            return false;
        }
        true
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

    /// Sends a signal to the server (`STOP`, `CONT`: `kill -SIG pid`). A stopped server is
    /// still killed by [`Server::kill`] and on drop.
    pub fn signal(&self, sig: &str) {
        let pid = self.child.as_ref().expect("a running server").id();
        let ok = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(pid.to_string())
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill -{sig} {pid} (redis-server on {})", self.port);
    }

    /// Starts it again on the same port (empty: no persistence, no script cache).
    pub fn restart(&mut self) {
        self.kill();
        assert!(
            self.spawn(),
            "redis-server did not start again on {}: its port was taken",
            self.port
        );
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A Redis Cluster of 3 masters, with or without a replica each. Every node has a free port
/// and a free cluster bus port of its own (`--cluster-port`: never the port + 10 000, which
/// may be taken or past 65 535).
pub struct Cluster {
    /// The masters first (`nodes[0..3]`), then the replicas as `redis-cli --cluster create`
    /// assigned them (see [`Cluster::topology`] for who replicates whom).
    pub nodes: Vec<Server>,
}

/// One line of `CLUSTER NODES`.
#[derive(Clone, Debug)]
pub struct NodeLine {
    pub id: String,
    pub port: u16,
    /// `master`, `slave`, `fail`, `fail?`, `myself`, ... (the flags column, split on `,`).
    pub flags: Vec<String>,
    /// The master's id for a replica.
    pub master: Option<String>,
    /// `connected` or `disconnected`.
    pub link: String,
    /// The slot ranges a master serves (`0-5460`, ...).
    pub slots: Vec<String>,
}

impl NodeLine {
    pub fn is_master(&self) -> bool {
        self.flags.iter().any(|f| f == "master")
    }
    pub fn failed(&self) -> bool {
        self.flags.iter().any(|f| f == "fail" || f == "fail?")
    }
    /// Whether this master serves `slot` (a range `a-b` or a single slot; migrating slots,
    /// `[...]`, are not counted).
    pub fn serves(&self, slot: u16) -> bool {
        self.slots.iter().any(|r| {
            let mut it = r.splitn(2, '-').map(|x| x.parse::<u16>());
            match (it.next(), it.next()) {
                (Some(Ok(a)), Some(Ok(b))) => (a..=b).contains(&slot),
                (Some(Ok(a)), None) => a == slot,
                _ => false,
            }
        })
    }
}

/// Parses `CLUSTER NODES`.
pub fn parse_nodes(text: &str) -> Vec<NodeLine> {
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() < 8 {
                return None;
            }
            let port = f[1].split('@').next()?.rsplit(':').next()?.parse().ok()?;
            Some(NodeLine {
                id: f[0].to_string(),
                port,
                flags: f[2].split(',').map(str::to_string).collect(),
                master: (f[3] != "-").then(|| f[3].to_string()),
                link: f[7].to_string(),
                slots: f[8..].iter().map(|s| s.to_string()).collect(),
            })
        })
        .collect()
}

/// Waits until `ok()` holds, polling every 50 ms, for at most `limit`; panics naming `what`
/// (and the last `state()`) past it. Returns the time it took.
pub fn wait_for(
    what: &str,
    limit: Duration,
    mut ok: impl FnMut() -> bool,
    state: impl Fn() -> String,
) -> Duration {
    let t0 = Instant::now();
    while !ok() {
        assert!(
            t0.elapsed() < limit,
            "{what}: not within {limit:?}; state:\n{}",
            state()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    t0.elapsed()
}

impl Cluster {
    /// 3 masters, no replicas, `cluster-node-timeout 2000`.
    pub fn start() -> Self {
        Self::start_with(0, 2000)
    }

    /// 3 masters with `replicas` replicas each and `cluster-node-timeout` of `node_timeout_ms`.
    /// Returns once every node says `cluster_state:ok`, every node knows every other one, and
    /// every replica's link to its master is up (its initial sync done).
    pub fn start_with(replicas: usize, node_timeout_ms: u64) -> Self {
        let n = 3 * (1 + replicas);
        let timeout = node_timeout_ms.to_string();
        let nodes: Vec<Server> = (0..n)
            .map(|_| {
                Server::start_on_free_ports(1, |bus| {
                    [
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        "nodes.conf",
                        "--cluster-node-timeout",
                        &timeout,
                        "--cluster-port",
                        &bus[0].to_string(),
                    ]
                    .map(str::to_string)
                    .to_vec()
                })
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
            .args(["--cluster-replicas", &replicas.to_string()])
            .arg("--cluster-yes")
            .output()
            .expect("redis-cli --cluster create");
        assert!(
            out.status.success(),
            "cluster create: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let cluster = Cluster { nodes };
        let ready = || {
            cluster.nodes.iter().all(|node| {
                let lines = parse_nodes(&node.cli(&["cluster", "nodes"]));
                node.cli(&["cluster", "info"]).contains("cluster_state:ok")
                    && lines.len() == n
                    && lines.iter().filter(|l| l.is_master()).count() == 3
                    && lines.iter().all(|l| {
                        l.link == "connected"
                            && !l
                                .flags
                                .iter()
                                .any(|f| f != "master" && f != "slave" && f != "myself")
                    })
            }) && cluster.nodes.iter().all(|node| {
                let info = node.cli(&["info", "replication"]);
                info.contains("role:master") || info.contains("master_link_status:up")
            })
        };
        wait_for("the cluster ready", Duration::from_secs(30), ready, || {
            cluster.nodes[0].cli(&["cluster", "nodes"])
        });
        cluster
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.url()).collect()
    }

    /// `CLUSTER NODES` as the node at `nodes[i]` sees it.
    pub fn topology(&self, i: usize) -> Vec<NodeLine> {
        parse_nodes(&self.nodes[i].cli(&["cluster", "nodes"]))
    }

    /// The index in `nodes` of the server on `port`.
    pub fn index_of(&self, port: u16) -> Option<usize> {
        self.nodes.iter().position(|n| n.port == port)
    }
}

/// Redis Cluster's key slot: CRC16 (XMODEM) of the hash tag, mod 16384.
pub fn slot(key: &str) -> u16 {
    let b = key.as_bytes();
    let tag = match b.iter().position(|&c| c == b'{') {
        Some(i) => match b[i + 1..].iter().position(|&c| c == b'}') {
            Some(j) if j > 0 => &b[i + 1..i + 1 + j],
            _ => b,
        },
        None => b,
    };
    let mut crc: u16 = 0;
    for &x in tag {
        crc ^= (x as u16) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

/// A multi-threaded runtime for a test.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}
