//! The Redis the fleet runs on: one redis-server, or a Cluster of three masters, started on
//! free loopback ports for the run and stopped after it; and the CPU time they spent.

use super::super::drive::{self, Scratch, Server};
use std::process::Command;
use std::time::{Duration, Instant};

/// One server, or the masters of a cluster.
pub(crate) struct Redis {
    servers: Vec<Server>,
    pub(crate) ports: Vec<u16>,
    _dirs: Vec<Scratch>,
}

fn server(port: u16, dir: &Scratch, extra: &[String]) -> crate::Result<Server> {
    let mut c = Command::new("redis-server");
    c.args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .arg("--dir")
        .arg(dir.path(""))
        .args(extra);
    Server::start(c, port, "redis-server")
}

fn cli(port: u16, args: &[&str]) -> String {
    Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

impl Redis {
    /// One redis-server.
    pub(crate) fn single() -> crate::Result<Self> {
        drive::need("redis-server")?;
        let dir = Scratch::new("fleet")?;
        let port = drive::free_port()?;
        let s = server(port, &dir, &[])?;
        Ok(Self {
            servers: vec![s],
            ports: vec![port],
            _dirs: vec![dir],
        })
    }

    /// Three masters, each on a free port with a free bus port, made a cluster by
    /// `redis-cli --cluster create`; returns once every node says `cluster_state:ok`.
    pub(crate) fn cluster() -> crate::Result<Self> {
        drive::need("redis-server")?;
        drive::need("redis-cli")?;
        let mut servers = Vec::new();
        let mut ports = Vec::new();
        let dirs: Vec<Scratch> = (0..3)
            .map(|i| Scratch::new(&format!("fleet-node{i}")))
            .collect::<crate::Result<_>>()?;
        for d in &dirs {
            let [port, bus] = drive::free_ports()?;
            let extra = [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-port",
                &bus.to_string(),
            ]
            .map(str::to_string);
            servers.push(server(port, d, &extra)?);
            ports.push(port);
        }
        let addrs: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .arg("--cluster-yes")
            .output()
            .map_err(|e| format!("redis-cli --cluster create: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "redis-cli --cluster create failed: {}",
                String::from_utf8_lossy(&out.stdout)
            )
            .into());
        }
        let t0 = Instant::now();
        while !ports
            .iter()
            .all(|&p| cli(p, &["cluster", "info"]).contains("cluster_state:ok"))
        {
            if t0.elapsed() > Duration::from_secs(30) {
                return Err("the cluster did not reach cluster_state:ok within 30 s".into());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(Self {
            servers,
            ports,
            _dirs: dirs,
        })
    }

    /// CPU seconds the servers have used so far, together.
    pub(crate) fn cpu_secs(&self) -> crate::Result<f64> {
        self.servers.iter().map(|s| s.cpu_secs()).sum()
    }

    /// Their URLs.
    pub(crate) fn urls(&self) -> Vec<String> {
        self.ports
            .iter()
            .map(|p| format!("redis://127.0.0.1:{p}/"))
            .collect()
    }

    pub(crate) fn is_cluster(&self) -> bool {
        self.servers.len() > 1
    }
}
