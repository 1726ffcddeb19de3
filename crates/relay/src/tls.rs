//! TLS for the registry and relay (rustls with `ring`): the server side from
//! PEM files (`--tls-cert`, `--tls-key`), and the client side that executors
//! and harnesses use for `https://` registries and `wss://` relay URLs.
//!
//! Clients trust the built-in web PKI roots (`webpki-roots`) plus every
//! certificate in the PEM file named by `SSL_CERT_FILE`, when that variable is
//! set. Unlike OpenSSL, the file is *added* to the built-in roots rather than
//! replacing them, so pointing it at a private CA never breaks public hosts.

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::path::Path;
use std::sync::{Arc, OnceLock};

/// The variable naming extra trusted roots (a PEM bundle).
pub const CA_FILE_ENV: &str = "SSL_CERT_FILE";

/// A TLS setup failure; the message names the file, never key material.
#[derive(Debug, Clone, thiserror::Error)]
#[error("tls: {0}")]
pub struct TlsError(pub String);

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs: Vec<_> = CertificateDer::pem_file_iter(path)
        .map_err(|e| TlsError(format!("cannot read {}: {e}", path.display())))?
        .collect::<Result<_, _>>()
        .map_err(|e| TlsError(format!("{}: invalid PEM: {e}", path.display())))?;
    if certs.is_empty() {
        return Err(TlsError(format!("{} holds no certificate", path.display())));
    }
    Ok(certs)
}

/// The server configuration from a PEM certificate chain and a PEM private key
/// (PKCS#8, PKCS#1 or SEC1). Errors: unreadable files, no certificate, no
/// key, or a key that does not match the certificate.
pub fn server_config(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let chain = certs(cert)?;
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| TlsError(format!("{}: no usable private key: {e}", key.display())))?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| TlsError(format!("certificate and key do not fit: {e}")))?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

/// Extra roots from [`CA_FILE_ENV`] (empty when unset).
pub fn extra_roots() -> Result<Vec<CertificateDer<'static>>, TlsError> {
    match std::env::var_os(CA_FILE_ENV) {
        Some(p) if !p.is_empty() => certs(Path::new(&p)),
        _ => Ok(Vec::new()),
    }
}

fn build_client_config() -> Result<Arc<rustls::ClientConfig>, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    for c in extra_roots()? {
        roots
            .add(c)
            .map_err(|e| TlsError(format!("{CA_FILE_ENV}: unusable certificate: {e}")))?;
    }
    let cfg = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(cfg))
}

/// The client configuration, built once per process.
pub fn client_config() -> Result<Arc<rustls::ClientConfig>, TlsError> {
    static CONFIG: OnceLock<Result<Arc<rustls::ClientConfig>, TlsError>> = OnceLock::new();
    CONFIG.get_or_init(build_client_config).clone()
}

/// Opens a WebSocket (`ws://` or `wss://`) with [`client_config`]'s roots.
pub async fn connect_websocket<R>(
    request: R,
    config: tokio_tungstenite::tungstenite::protocol::WebSocketConfig,
) -> Result<
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>,
    tokio_tungstenite::tungstenite::Error,
>
where
    R: tokio_tungstenite::tungstenite::client::IntoClientRequest + Unpin,
{
    let tls = client_config().map_err(|e| {
        tokio_tungstenite::tungstenite::Error::Io(std::io::Error::other(e.to_string()))
    })?;
    let (ws, _) = tokio_tungstenite::connect_async_tls_with_config(
        request,
        Some(config),
        true,
        Some(tokio_tungstenite::Connector::Rustls(tls)),
    )
    .await?;
    Ok(ws)
}
