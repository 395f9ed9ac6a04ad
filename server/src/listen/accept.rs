//! The tokio accept loop every tokio listener runs (RESP on tokio, HTTP, admin, gRPC):
//! accept, back off on failure ([`Backoff`]), admit ([`Guard::admit`]) before anything is
//! read, and hand the socket and its [`Ticket`] on — or the refusal, to close at once.

use super::{Backoff, Guard, Kind, Refusal, Ticket};
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::{TcpListener, TcpStream};

/// What a listener does with what it accepts.
pub(crate) trait Accepted {
    /// An admitted connection from `peer`.
    fn admitted(&mut self, sock: TcpStream, peer: SocketAddr, ticket: Ticket);
    /// A refused one (dropped after this: closed).
    fn refused(&mut self, sock: TcpStream, why: Refusal) {
        let _ = (sock, why);
    }
}

/// Accepts on `l` until `stop` reads `true`.
pub(crate) async fn accept_loop(
    l: &TcpListener,
    kind: Kind,
    guard: &Arc<Guard>,
    stop: &mut tokio::sync::watch::Receiver<bool>,
    on: &mut impl Accepted,
) {
    let mut backoff = Backoff::new(kind);
    loop {
        tokio::select! {
            r = l.accept() => match r {
                Ok((sock, peer)) => {
                    backoff.ok();
                    match guard.admit(kind) {
                        Ok(t) => on.admitted(sock, peer, t),
                        Err(why) => on.refused(sock, why),
                    }
                }
                Err(e) => {
                    let wait = backoff.failed(&e, std::time::Instant::now(), guard);
                    tokio::time::sleep(wait).await;
                }
            },
            () = super::stopped(stop) => return,
        }
    }
}
