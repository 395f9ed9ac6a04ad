//! What each listener needs to know, derived once from [`ServeArgs`] at start: the RESP
//! listener's bounds and credentials ([`RespConfig`]), the HTTP listeners' ([`HttpConfig`]),
//! and the credentials they share ([`Auth`]). The flags are checked here: a password file that
//! cannot be read, or an address other machines can reach with no password, refuses the start
//! with what to do instead.

use crate::args::ServeArgs;
use crate::listen::{Kind, Limits};
use crate::resp::Bounds;
use crate::ServeError;
use std::net::SocketAddr;
use std::time::Duration;
use subtle::ConstantTimeEq;

/// A password, compared in constant time.
#[derive(Clone)]
pub(crate) struct Secret(Box<[u8]>);

impl Secret {
    /// Whether `given` is this password (in time independent of where they differ).
    pub(crate) fn matches(&self, given: &[u8]) -> bool {
        // Lengths differ: not equal, and the length of a password is not the secret part.
        self.0.len() == given.len() && bool::from(self.0.ct_eq(given))
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// What a request or connection has shown.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Access {
    /// Nothing (a password is set and was not given).
    None,
    /// The client password, or none is needed.
    Client,
    /// May change the server (reload, limits).
    Admin,
}

impl Access {
    /// A grant's tag, as a connection remembers it (`listen::Conn::accept`): never 0.
    pub(crate) fn tag(self) -> u8 {
        self as u8 + 1
    }

    /// The grant of a tag from [`Access::tag`].
    pub(crate) fn of_tag(tag: u8) -> Option<Self> {
        [Access::None, Access::Client, Access::Admin]
            .into_iter()
            .find(|a| a.tag() == tag)
    }
}

/// The passwords, and what a listener grants without them.
#[derive(Clone, Debug, Default)]
pub(crate) struct Auth {
    /// `--requirepass`: every client must give it.
    pub(crate) client: Option<Secret>,
    /// `--admin-pass`: the operations that change the server.
    pub(crate) admin: Option<Secret>,
}

impl Auth {
    /// Whether a client must authenticate.
    pub(crate) fn required(&self) -> bool {
        self.client.is_some()
    }

    /// What a connection or request gets before showing anything, on a listener that
    /// grants admin without the admin password (`trusted`: a loopback listener with no
    /// --admin-pass, or --admin).
    pub(crate) fn initial(&self, trusted: bool) -> Access {
        match (&self.client, trusted) {
            (Some(_), _) => Access::None,
            (None, true) => Access::Admin,
            (None, false) => Access::Client,
        }
    }

    /// What `password` (for `user`, RESP's `AUTH user pass`; `None` for HTTP's bearer token)
    /// grants on a listener that is `trusted` or not; `None` when it matches nothing.
    pub(crate) fn grant(
        &self,
        user: Option<&[u8]>,
        password: &[u8],
        trusted: bool,
    ) -> Option<Access> {
        let admin_user = user.is_none_or(|u| u.eq_ignore_ascii_case(b"admin"));
        let client_user = user.is_none_or(|u| u == b"default");
        if admin_user {
            if let Some(a) = &self.admin {
                if a.matches(password) {
                    return Some(Access::Admin);
                }
            }
        }
        if client_user {
            if let Some(c) = &self.client {
                if c.matches(password) {
                    return Some(if trusted {
                        Access::Admin
                    } else {
                        Access::Client
                    });
                }
            }
        }
        None
    }
}

/// The RESP listener's configuration.
#[derive(Clone, Debug)]
pub(crate) struct RespConfig {
    /// Frame bounds once authenticated.
    pub(crate) bounds: Bounds,
    /// Frame bounds before (Redis 7 allows unauthenticated clients 10 arguments).
    pub(crate) unauthenticated: Bounds,
    pub(crate) auth: Auth,
    /// Whether the listener grants admin without the admin password.
    pub(crate) trusted: bool,
    pub(crate) max_connections: usize,
    /// Zero: never.
    pub(crate) idle_timeout: Duration,
    pub(crate) output_limit: usize,
    /// `--coalesce` (io_uring runtime); zero: off.
    pub(crate) coalesce: Duration,
}

/// An HTTP listener's configuration.
#[derive(Clone, Debug)]
pub(crate) struct HttpConfig {
    pub(crate) auth: Auth,
    /// Whether the main HTTP listener grants admin without the admin password (loopback
    /// with no --admin-pass).
    pub(crate) trusted: bool,
    /// The same for --admin: it must be loopback without --admin-pass (refused at start
    /// otherwise); with one, it asks for it as every listener does.
    pub(crate) admin_trusted: bool,
    pub(crate) metrics_open: bool,
    pub(crate) max_body: usize,
    /// The rate-limit headers of `POST /v1/check`.
    pub(crate) ratelimit_headers: crate::RateLimitHeaders,
    pub(crate) max_header_bytes: usize,
    pub(crate) max_headers: usize,
}

/// Reads a password given inline or in a file.
fn secret(
    inline: &Option<String>,
    file: &Option<std::path::PathBuf>,
    flag: &str,
) -> Result<Option<Secret>, ServeError> {
    let raw = match (inline, file) {
        (Some(s), _) => s.clone().into_bytes(),
        (None, Some(p)) => {
            let mut b = std::fs::read(p).map_err(|e| {
                ServeError::Other(format!(
                    "{flag}-file {}: cannot read it ({e}): give a readable file holding the password",
                    p.display()
                ))
            })?;
            while b.last().is_some_and(|c| *c == b'\n' || *c == b'\r') {
                b.pop();
            }
            b
        }
        (None, None) => return Ok(None),
    };
    if raw.is_empty() {
        return Err(ServeError::Other(format!(
            "{flag}: the password is empty; give one, or leave the flag out"
        )));
    }
    Ok(Some(Secret(raw.into_boxed_slice())))
}

fn loopback(a: &SocketAddr) -> bool {
    a.ip().is_loopback()
}

/// Every listener's bounds ([`crate::listen`]) from the flags.
fn limits(a: &ServeArgs) -> Result<Limits, ServeError> {
    if a.tls_handshake_timeout.is_zero() {
        return Err(ServeError::Other(
            "--tls-handshake-timeout 0: a handshake needs a deadline; give one (10s is the default)".into(),
        ));
    }
    let mut max_connections = [0; 4];
    for (k, n) in [
        (Kind::Resp, a.max_connections),
        (Kind::Http, a.max_http_connections),
        (Kind::Admin, a.max_admin_connections),
        (Kind::Grpc, a.max_grpc_connections),
    ] {
        max_connections[k as usize] = n.max(1);
    }
    Ok(Limits {
        max_connections,
        handshake: a.tls_handshake_timeout,
        auth: a.auth_timeout,
        header: a.header_timeout,
        grpc_idle: a.grpc_idle_timeout,
        body: a.body_timeout,
        min_body_rate: a.min_body_rate as u64,
        max_body: a.max_body,
        max_streams: a.max_streams,
        body_memory: a.body_memory.max(a.max_body),
    })
}

/// The listeners' configurations from the flags, or why the flags are refused.
pub(crate) fn from_args(a: &ServeArgs) -> Result<(RespConfig, HttpConfig, Limits), ServeError> {
    let auth = Auth {
        client: secret(&a.requirepass, &a.requirepass_file, "--requirepass")?,
        admin: secret(&a.admin_pass, &a.admin_pass_file, "--admin-pass")?,
    };
    // Protected mode: reachable from other machines only with a password, or when told.
    if auth.client.is_none() && !a.unprotected {
        let mut open = vec![("--resp", a.resp), ("--http", a.http)];
        open.extend(a.grpc.map(|g| ("--grpc", g)));
        if let Some((flag, addr)) = open.into_iter().find(|(_, addr)| !loopback(addr)) {
            return Err(ServeError::Other(format!(
                "{flag} {addr} can be reached from other machines, and no password is set: set \
                 --requirepass-file FILE (clients then authenticate), bind a loopback address \
                 (127.0.0.1), or pass --unprotected to serve without credentials"
            )));
        }
    }
    if let Some(addr) = a.admin {
        if !loopback(&addr) && auth.admin.is_none() {
            return Err(ServeError::Other(format!(
                "--admin {addr}: the admin listener serves without the admin password, so it \
                 must be a loopback address (127.0.0.1 or ::1); or set --admin-pass-file FILE"
            )));
        }
    }
    let no_admin = auth.admin.is_none();
    let trusted = |addr: &SocketAddr| no_admin && loopback(addr);
    let resp = RespConfig {
        bounds: Bounds {
            max_args: a.max_args.max(1),
            max_bulk: a.max_bulk,
            max_inline: a.max_inline.max(16),
            unauthenticated: false,
        },
        unauthenticated: Bounds::UNAUTHENTICATED,
        auth: auth.clone(),
        trusted: trusted(&a.resp),
        max_connections: a.max_connections,
        idle_timeout: a.idle_timeout,
        output_limit: a.client_output_limit.max(4096),
        coalesce: a.coalesce,
    };
    let http = HttpConfig {
        auth,
        trusted: trusted(&a.http),
        admin_trusted: no_admin,
        metrics_open: a.metrics_open,
        max_body: a.max_body,
        ratelimit_headers: a.ratelimit_headers,
        max_header_bytes: a.max_header_bytes.max(1024),
        max_headers: a.max_headers.max(8),
    };
    Ok((resp, http, limits(a)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(p: &str) -> Option<Secret> {
        Some(Secret(p.as_bytes().into()))
    }

    #[test]
    fn grants() {
        let none = Auth::default();
        assert_eq!(none.initial(true), Access::Admin);
        assert_eq!(none.initial(false), Access::Client);
        let a = Auth {
            client: s("c"),
            admin: s("a"),
        };
        assert_eq!(a.initial(true), Access::None);
        assert_eq!(a.grant(None, b"c", false), Some(Access::Client));
        assert_eq!(a.grant(None, b"a", false), Some(Access::Admin));
        assert_eq!(a.grant(Some(b"admin"), b"a", false), Some(Access::Admin));
        assert_eq!(a.grant(Some(b"default"), b"a", false), None);
        assert_eq!(a.grant(Some(b"default"), b"c", false), Some(Access::Client));
        assert_eq!(a.grant(Some(b"admin"), b"c", false), None);
        assert_eq!(a.grant(None, b"", false), None);
        assert_eq!(a.grant(None, b"cc", false), None);
        // No admin password: the client password grants admin on a trusted listener.
        let c = Auth {
            client: s("c"),
            admin: None,
        };
        assert_eq!(c.grant(None, b"c", true), Some(Access::Admin));
        assert_eq!(c.grant(None, b"c", false), Some(Access::Client));
    }

    #[test]
    fn protected_mode() {
        let mut a = ServeArgs::new();
        a.resp = "0.0.0.0:6380".parse().unwrap();
        let e = from_args(&a).unwrap_err().to_string();
        assert!(
            e.contains("--resp 0.0.0.0:6380") && e.contains("--unprotected"),
            "{e}"
        );
        a.unprotected = true;
        assert!(from_args(&a).is_ok());
        a.unprotected = false;
        a.requirepass = Some("x".into());
        assert!(from_args(&a).is_ok());
        a.admin = Some("0.0.0.0:9000".parse().unwrap());
        let e = from_args(&a).unwrap_err().to_string();
        assert!(e.contains("--admin 0.0.0.0:9000"), "{e}");
        a.admin_pass = Some("y".into());
        assert!(from_args(&a).is_ok());
        a.requirepass = Some(String::new());
        assert!(from_args(&a).unwrap_err().to_string().contains("empty"));
    }
}
