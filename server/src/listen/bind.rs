//! The listening sockets: every listener's the same way (`SO_REUSEADDR`, `SO_REUSEPORT` where
//! several workers share a port, non-blocking, a backlog of 1 024).

use crate::ServeError;
use socket2::{Domain, Protocol, Socket, Type};
use std::net::SocketAddr;

/// A listening socket on `addr`, with `SO_REUSEPORT` if `reuse_port`.
pub(crate) fn listener(
    flag: &'static str,
    addr: SocketAddr,
    reuse_port: bool,
) -> Result<std::net::TcpListener, ServeError> {
    let bind = |addr| -> std::io::Result<std::net::TcpListener> {
        let s = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
        s.set_reuse_address(true)?;
        #[cfg(unix)]
        if reuse_port {
            s.set_reuse_port(true)?;
        }
        s.set_nonblocking(true)?;
        s.bind(&addr.into())?;
        s.listen(1024)?;
        Ok(s.into())
    };
    bind(addr).map_err(|e| ServeError::Bind(flag, addr, e))
}
