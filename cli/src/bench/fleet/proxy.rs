//! A TCP proxy that delays what it forwards: `--rtt` puts one between the nodes and Redis
//! (this kernel has no netem). Each direction holds every chunk it reads for half the round
//! trip, then writes it, in order: a request and its reply each wait rtt / 2.
//!
//! Bounded: at most `QUEUE` chunks of at most `CHUNK` bytes wait in each direction of each
//! connection (a reader that runs ahead waits for the writer), and the proxy lives as long as
//! the benchmark row that started it (its task is aborted when dropped).

use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// Chunks waiting per direction of a connection.
const QUEUE: usize = 1024;
/// Bytes read at once.
const CHUNK: usize = 16 * 1024;

/// A running proxy: its address; stopped when dropped.
pub(crate) struct Proxy {
    pub(crate) addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Proxy {
    /// Listens on a free loopback port and forwards every connection to `upstream`, each
    /// direction delayed by `rtt / 2`.
    pub(crate) async fn start(upstream: SocketAddr, rtt: Duration) -> crate::Result<Self> {
        let l = TcpListener::bind(("127.0.0.1", 0))
            .await
            .map_err(|e| format!("the --rtt proxy cannot listen on loopback: {e}"))?;
        let addr = l.local_addr()?;
        let half = rtt / 2;
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = l.accept().await {
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(upstream).await {
                        let _ = client.set_nodelay(true);
                        let _ = server.set_nodelay(true);
                        let (cr, cw) = client.into_split();
                        let (sr, sw) = server.into_split();
                        tokio::spawn(pipe(cr, sw, half));
                        tokio::spawn(pipe(sr, cw, half));
                    }
                });
            }
        });
        Ok(Self { addr, task })
    }
}

/// Copies `from` to `to`, each chunk written `delay` after it was read.
async fn pipe<R, W>(mut from: R, mut to: W, delay: Duration)
where
    R: AsyncReadExt + Unpin + Send + 'static,
    W: AsyncWriteExt + Unpin + Send + 'static,
{
    let (tx, mut rx) = mpsc::channel::<(Instant, Vec<u8>)>(QUEUE);
    let writer = tokio::spawn(async move {
        while let Some((at, buf)) = rx.recv().await {
            tokio::time::sleep_until(at).await;
            if to.write_all(&buf).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    });
    let mut buf = vec![0u8; CHUNK];
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let due = Instant::now() + delay;
                if tx.send((due, buf[..n].to_vec())).await.is_err() {
                    break;
                }
            }
        }
    }
    drop(tx);
    let _ = writer.await;
}
