//! An attacker's connection: raw bytes out, RESP replies read back, every wait bounded, and
//! counted open (per kind and per listener) while it lives.

use super::stats::{Gauge, KindStats};
use super::{source, Kind, Outcome};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{timeout, timeout_at, Instant};

/// A connection counted open while it lives.
pub(super) struct Conn<'a> {
    pub(super) s: TcpStream,
    pub(super) buf: Vec<u8>,
    pub(super) st: &'a KindStats,
    gauge: &'a Gauge,
    opened: Instant,
}

/// How reading ended.
pub(super) enum End {
    Closed,
    Error(String),
    Quiet,
}

impl<'a> Conn<'a> {
    /// A connection to `addr` from the address of `kind`'s attackers ([`source::of`]).
    pub(super) async fn open(
        addr: SocketAddr,
        kind: Kind,
        st: &'a KindStats,
        gauge: &'a Gauge,
    ) -> Result<Conn<'a>, Outcome> {
        let from = source::of(kind, addr);
        let s = timeout(Duration::from_secs(5), source::connect(addr, from))
            .await
            .map_err(|_| Outcome::Connect("no connection within 5 s".into()))?
            .map_err(|e| Outcome::Connect(e.to_string()))?;
        let _ = s.set_nodelay(true);
        st.connections.fetch_add(1, Ordering::Relaxed);
        st.open.fetch_add(1, Ordering::Relaxed);
        gauge.up();
        Ok(Conn {
            s,
            buf: Vec::new(),
            st,
            gauge,
            opened: Instant::now(),
        })
    }

    /// Whether the server has closed the connection (or it failed), without waiting: what it
    /// sent meanwhile is read and dropped.
    pub(super) fn closed(&mut self) -> bool {
        let mut chunk = [0u8; 4096];
        loop {
            match self.s.try_read(&mut chunk) {
                Ok(0) => return true,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return false,
                Err(_) => return true,
            }
        }
    }

    pub(super) async fn send(&mut self, b: &[u8]) -> std::io::Result<()> {
        self.s.write_all(b).await?;
        self.st.sent(b.len());
        Ok(())
    }

    /// Writes what it can of `b` within `wait`: the bytes written (0 when the socket stays
    /// full that long).
    pub(super) async fn push(&mut self, b: &[u8], wait: Duration) -> std::io::Result<usize> {
        match timeout(wait, self.s.write(b)).await {
            Err(_) => Ok(0),
            Ok(Ok(0)) => Err(std::io::ErrorKind::WriteZero.into()),
            Ok(Ok(n)) => {
                self.st.sent(n);
                Ok(n)
            }
            Ok(Err(e)) => Err(e),
        }
    }

    /// Sends `b` as far as the server takes it within `wait` per write, ignoring errors (a
    /// server that refused the frame closes the connection under it).
    pub(super) async fn spray(&mut self, b: &[u8], wait: Duration) {
        let mut at = 0;
        while at < b.len() {
            match self.push(&b[at..], wait).await {
                Ok(0) | Err(_) => return,
                Ok(n) => at += n,
            }
        }
    }

    /// One line of the reply (CRLF removed), within `wait`; at most 1 MiB.
    pub(super) async fn line(&mut self, wait: Duration) -> Result<String, End> {
        let deadline = Instant::now() + wait;
        loop {
            if let Some(i) = self.buf.windows(2).position(|w| w == b"\r\n") {
                let l = String::from_utf8_lossy(&self.buf[..i]).into_owned();
                self.buf.drain(..i + 2);
                return Ok(l);
            }
            if self.buf.len() > 1 << 20 {
                return Err(End::Error("a reply line over 1 MiB".into()));
            }
            let mut chunk = [0u8; 16384];
            match timeout_at(deadline, self.s.read(&mut chunk)).await {
                Err(_) => return Err(End::Quiet),
                Ok(Ok(0)) => return Err(End::Closed),
                Ok(Ok(n)) => self.buf.extend_from_slice(&chunk[..n]),
                Ok(Err(e)) => return Err(End::Error(e.to_string())),
            }
        }
    }

    /// One whole reply (arrays and bulk strings included): its first line, or how reading
    /// ended.
    pub(super) async fn reply(&mut self, wait: Duration) -> Result<String, End> {
        let first = self.line(wait).await?;
        let mut todo = 0i64;
        match first.as_bytes().first() {
            Some(b'*') => todo = first[1..].parse::<i64>().unwrap_or(0),
            Some(b'$') if first[1..].parse::<i64>().unwrap_or(-1) >= 0 => todo = 1,
            _ => {}
        }
        while todo > 0 {
            let l = self.line(wait).await?;
            todo -= 1;
            match l.as_bytes().first() {
                Some(b'*') => todo += l[1..].parse::<i64>().unwrap_or(0),
                Some(b'$') if l[1..].parse::<i64>().unwrap_or(-1) >= 0 => todo += 1,
                _ => {}
            }
        }
        Ok(first)
    }

    /// Reads (discarding) until the server closes, an error, or `quiet` without data.
    pub(super) async fn drain(&mut self, quiet: Duration) -> End {
        self.buf.clear();
        let mut chunk = [0u8; 16384];
        loop {
            match timeout(quiet, self.s.read(&mut chunk)).await {
                Err(_) => return End::Quiet,
                Ok(Ok(0)) => return End::Closed,
                Ok(Ok(n)) => {
                    if self.buf.len() < 4096 {
                        self.buf.extend_from_slice(&chunk[..n.min(4096)]);
                    }
                }
                Ok(Err(e)) => return End::Error(e.to_string()),
            }
        }
    }

    /// Waits, reading nothing it needs, until the server closes the connection (`true`) or
    /// `until`.
    pub(super) async fn hold(&mut self, until: Instant) -> bool {
        let mut chunk = [0u8; 4096];
        loop {
            match timeout_at(until, self.s.read(&mut chunk)).await {
                Err(_) => return false,
                Ok(Ok(0)) | Ok(Err(_)) => return true,
                Ok(Ok(_)) => {}
            }
        }
    }

    /// Holds the connection until `until`: `closed` if the server closed it first, else
    /// `held`.
    pub(super) async fn held(
        &mut self,
        until: Instant,
        closed: &'static str,
        held: &'static str,
    ) -> Outcome {
        Outcome::Expected(if self.hold(until).await { closed } else { held })
    }

    /// AUTH with the password, if there is one.
    pub(super) async fn auth(&mut self, password: Option<&[u8]>) -> Result<(), Outcome> {
        let Some(p) = password else { return Ok(()) };
        let mut parts: Vec<&[u8]> = vec![b"AUTH"];
        parts.push(p);
        self.send(&frame(&parts))
            .await
            .map_err(|e| Outcome::Unexpected(format!("AUTH not sent: {e}")))?;
        match self.line(Duration::from_secs(5)).await {
            Ok(l) if l == "+OK" => Ok(()),
            Ok(l) => Err(Outcome::Unexpected(format!("AUTH answered {l}"))),
            Err(e) => Err(Outcome::Unexpected(format!("AUTH: {}", ended(&e)))),
        }
    }
}

impl Drop for Conn<'_> {
    fn drop(&mut self) {
        self.st.open.fetch_sub(1, Ordering::Relaxed);
        self.gauge.down();
        let ms = self.opened.elapsed().as_millis() as u64;
        self.st.longest_ms.fetch_max(ms, Ordering::Relaxed);
    }
}

pub(super) fn ended(e: &End) -> String {
    match e {
        End::Closed => "closed".into(),
        End::Error(e) => e.clone(),
        End::Quiet => "no reply within the wait".into(),
    }
}

/// A RESP array of bulk strings.
pub(super) fn frame(parts: &[&[u8]]) -> Vec<u8> {
    let mut v = format!("*{}\r\n", parts.len()).into_bytes();
    for p in parts {
        v.extend_from_slice(format!("${}\r\n", p.len()).as_bytes());
        v.extend_from_slice(p);
        v.extend_from_slice(b"\r\n");
    }
    v
}
