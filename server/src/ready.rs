//! Readiness, apart from liveness: whether the server can answer as it is configured to. Ready
//! when the rules of `--rules` are loaded, every limits class in Redis has loaded (connected
//! once), and, when the rules keep their counts in Redis (`[backend] redis`), Redis answers a
//! `PING` within the backend's timeout (not ready while it has not been reached since the
//! start). `GET /readyz`
//! answers it (503 with the reason when not); the control thread asks every [`POLL`], and
//! each answer is kept for `/metrics` (`turnstile_ready`) and `INFO` (`turnstile_ready`), and
//! logged when it changes; the gRPC health service follows it (`NOT_SERVING` while not
//! ready). `/healthz` only says the process answers.

use crate::backend::Remote;
use crate::state::Server;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// How often the gRPC health service asks again.
pub(crate) const POLL: Duration = Duration::from_secs(1);

/// Ready, or why not (in words, for the probe's log); kept in the server's state, and
/// logged when it changed.
pub(crate) async fn check(s: &Server) -> Result<(), String> {
    let now = judge(s).await;
    // Relaxed: a flag for the metrics and the log; nothing else is published with it.
    if s.ready.swap(now.is_ok(), Ordering::Relaxed) != now.is_ok() {
        match &now {
            Ok(()) => tracing::info!("ready"),
            Err(why) => tracing::warn!(%why, "not ready"),
        }
    }
    now
}

/// Ready, or why not.
async fn judge(s: &Server) -> Result<(), String> {
    if s.files.rules.is_some() && s.checks.engine.is_none() {
        return Err("the rules of --rules are not loaded".into());
    }
    if let Some(why) = s.limits_loading.why() {
        return Err(why);
    }
    let redis = match s.checks.redis() {
        None => return Ok(()),
        Some(Remote::Connecting(c)) => return Err(c.reason()),
        Some(Remote::Connected(r)) => r,
    };
    redis.ping().await.map_err(|e| {
        let b = redis.backend();
        let at: Vec<String> = b
            .nodes
            .urls()
            .into_iter()
            .map(turnstile::rules::redact_url)
            .collect();
        format!(
            "the Redis of [backend] ({}) did not answer a PING within its timeout ({} ms): {e}",
            at.join(", "),
            b.timeout.as_millis()
        )
    })
}
