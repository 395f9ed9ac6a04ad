//! TLS on every listener (`--tls-cert`, `--tls-key`): rustls (ring), one server
//! configuration per protocol, differing only in what ALPN offers (RESP: nothing, as Redis;
//! HTTP: `h2` and `http/1.1`; gRPC: `h2`). A handshake must finish within `--tls-handshake-timeout` (the guard's, crate::listen); until
//! it has, a connection holds rustls's buffers and nothing else.

use crate::ServeError;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::path::Path;
use std::sync::Arc;
use tokio_rustls::TlsAcceptor;

/// The acceptors of each protocol.
#[derive(Clone)]
pub(crate) struct Tls {
    pub(crate) resp: TlsAcceptor,
    pub(crate) http: TlsAcceptor,
    pub(crate) grpc: TlsAcceptor,
}

fn refuse(flag: &str, path: &Path, what: impl std::fmt::Display) -> ServeError {
    ServeError::Other(format!("{flag} {}: {what}", path.display()))
}

impl Tls {
    /// The acceptors for the certificate chain and key in these PEM files, or why they are
    /// refused (which file, and what it should hold).
    pub(crate) fn load(cert: &Path, key: &Path) -> Result<Tls, ServeError> {
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
            .map_err(|e| refuse("--tls-cert", cert, format!("cannot read it ({e})")))?
            .collect::<Result<_, _>>()
            .map_err(|e| refuse("--tls-cert", cert, format!("not PEM certificates ({e})")))?;
        if certs.is_empty() {
            return Err(refuse(
                "--tls-cert",
                cert,
                "no certificate in it: give the PEM chain (-----BEGIN CERTIFICATE-----), the server's first",
            ));
        }
        let key = PrivateKeyDer::from_pem_file(key).map_err(|e| {
            refuse(
                "--tls-key",
                key,
                format!(
                    "no private key read from it ({e}): give a PEM key (PKCS#8, PKCS#1 or SEC1)"
                ),
            )
        })?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = |alpn: &[&[u8]]| -> Result<TlsAcceptor, ServeError> {
            let mut c = rustls::ServerConfig::builder_with_provider(provider.clone())
                .with_safe_default_protocol_versions()
                .map_err(|e| ServeError::Other(format!("TLS: {e}")))?
                .with_no_client_auth()
                .with_single_cert(certs.clone(), key.clone_key())
                .map_err(|e| {
                    ServeError::Other(format!(
                        "--tls-cert and --tls-key do not make a usable pair: {e}"
                    ))
                })?;
            c.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
            Ok(TlsAcceptor::from(Arc::new(c)))
        };
        Ok(Tls {
            resp: config(&[])?,
            http: config(&[b"h2", b"http/1.1"])?,
            grpc: config(&[b"h2"])?,
        })
    }
}
