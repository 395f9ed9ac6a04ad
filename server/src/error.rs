//! [`ServeError`]: why the server could not start, or stopped with an error. Each says what
//! went wrong and what to do about it.

use std::net::SocketAddr;

use crate::SnapshotError;

/// Why the server could not start or stopped with an error.
#[derive(Debug)]
pub enum ServeError {
    /// The rules file was refused (`file:line:column: message`).
    Rules(turnstile::rules::RulesError),
    /// The address of a flag (`--resp`, `--http`, `--grpc`) could not be bound or a socket
    /// option set.
    Bind(&'static str, SocketAddr, std::io::Error),
    /// The snapshot could not be restored and `--snapshot-required` was given.
    Snapshot(SnapshotError),
    /// A runtime or thread could not be started.
    Runtime(std::io::Error),
    /// Something else, said in words.
    Other(String),
}

impl std::fmt::Display for ServeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ServeError::Rules(e) => write!(f, "{e}"),
            ServeError::Bind(flag, a, e) => {
                write!(f, "cannot listen on {a} ({flag}): {e}")?;
                match e.kind() {
                    std::io::ErrorKind::AddrInUse => write!(
                        f,
                        "; another process listens there: stop it or give another address with {flag}"
                    ),
                    std::io::ErrorKind::AddrNotAvailable => write!(
                        f,
                        "; no interface of this machine has that address: use 127.0.0.1, 0.0.0.0 or one of its own"
                    ),
                    std::io::ErrorKind::PermissionDenied => write!(
                        f,
                        "; ports under 1024 need privileges: use a higher port"
                    ),
                    _ => Ok(()),
                }
            }
            ServeError::Snapshot(e) => write!(
                f,
                "{e} (--snapshot-required: not starting; remove the flag to start empty)"
            ),
            ServeError::Runtime(e) => write!(f, "cannot start the runtime: {e}"),
            ServeError::Other(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for ServeError {}
