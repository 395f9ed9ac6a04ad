//! Extra listeners started beside RESP and HTTP: the place for the Envoy rate limit service
//! (gRPC, `--grpc`). Each listener binds before [`spawn`] returns (so that a bad address fails
//! the start), runs on its own thread(s), answers from the shared state (`Shared::engine`,
//! `Shared::metrics`), and stops accepting when `Shared::shutdown` turns `true`; [`start`]
//! joins the threads returned before it writes the final snapshot.
//!
//! [`start`]: crate::start

use crate::{ServeError, Shared};
use std::sync::Arc;
use std::thread::JoinHandle;

/// Starts the extra listeners the flags ask for. Called once by `start`, after the RESP and
/// HTTP listeners are bound.
pub(crate) fn spawn(shared: &Arc<Shared>) -> Result<Vec<JoinHandle<()>>, ServeError> {
    if let Some(addr) = shared.args.grpc {
        return Err(ServeError::Other(format!(
            "--grpc {addr}: the Envoy rate limit service is not built into this server yet"
        )));
    }
    Ok(Vec::new())
}
