//! TLS interception of `CONNECT` tunnels whose origin may receive a masked
//! secret ([`crate::mask::Masking::intercepts`]). Each proxy (one per
//! process) has its own [`Authority`]: a CA generated in memory at start,
//! whose key never leaves the process memory, signing a leaf certificate per
//! host on first use. The child trusts it through the CA bundle the server
//! writes for it; nothing else does. Upstream TLS is verified against the
//! Mozilla roots (webpki-roots) plus [`crate::Launch::upstream_roots`].
//!
//! Inside the tunnel the proxy speaks HTTP/1.1 on both sides (ALPN
//! `http/1.1` only), one upstream connection per intercepted tunnel,
//! substituting secrets into each request's headers; responses pass through
//! unchanged.

use crate::mask::Scheme;
use crate::Shared;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use tokio::net::TcpStream;
use tokio::sync::Mutex as AsyncMutex;

/// Most leaf certificates kept per proxy; the cache is emptied when full.
const MAX_LEAVES: usize = 256;

/// Why interception could not be set up.
#[derive(Debug)]
pub enum MitmError {
    /// Generating or signing a certificate failed.
    Cert(rcgen::Error),
    /// rustls refused a configuration.
    Tls(rustls::Error),
}

impl std::fmt::Display for MitmError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MitmError::Cert(e) => write!(f, "certificate: {e}"),
            MitmError::Tls(e) => write!(f, "tls: {e}"),
        }
    }
}

impl std::error::Error for MitmError {}

impl From<rcgen::Error> for MitmError {
    fn from(e: rcgen::Error) -> Self {
        MitmError::Cert(e)
    }
}

impl From<rustls::Error> for MitmError {
    fn from(e: rustls::Error) -> Self {
        MitmError::Tls(e)
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// One proxy's interception CA and upstream TLS client.
pub struct Authority {
    ca: CertifiedIssuer<'static, KeyPair>,
    ca_pem: String,
    /// The CA certificate leaves are chained to: the one the child trusts
    /// (after an upgrade, the previous image's; the key is the same).
    ca_der: CertificateDer<'static>,
    /// The CA's private key (PKCS#8 PEM), for the next image of the server.
    key_pem: String,
    leaves: Mutex<HashMap<String, Arc<ServerConfig>>>,
    upstream: Arc<ClientConfig>,
}

/// A proxy's interception CA written down for the next image of the server
/// (an upgrade): its key, and the certificate the child trusts.
#[derive(Clone, serde::Serialize, serde::Deserialize)]
pub struct CaParts {
    key_pem: String,
    cert_pem: String,
    cert_der: Vec<u8>,
}

impl std::fmt::Debug for CaParts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CaParts").finish_non_exhaustive()
    }
}

impl Authority {
    /// A fresh CA; upstream servers are verified against the Mozilla roots
    /// and `extra_roots` (DER).
    pub fn new(extra_roots: &[CertificateDer<'static>]) -> Result<Authority, MitmError> {
        let ca = Self::issuer(KeyPair::generate()?)?;
        let (ca_pem, ca_der) = (ca.pem(), ca.der().clone());
        Self::build(ca, ca_pem, ca_der, extra_roots)
    }

    /// The CA a previous image of the server made ([`Authority::parts`]):
    /// its key signs new leaves, chained to the certificate the child
    /// already trusts.
    pub fn from_parts(
        parts: &CaParts,
        extra_roots: &[CertificateDer<'static>],
    ) -> Result<Authority, MitmError> {
        let ca = Self::issuer(KeyPair::from_pem(&parts.key_pem)?)?;
        let der = CertificateDer::from(parts.cert_der.clone());
        Self::build(ca, parts.cert_pem.clone(), der, extra_roots)
    }

    /// The CA written down for the next image of the server.
    pub fn parts(&self) -> CaParts {
        CaParts {
            key_pem: self.key_pem.clone(),
            cert_pem: self.ca_pem.clone(),
            cert_der: self.ca_der.to_vec(),
        }
    }

    fn issuer(key: KeyPair) -> Result<CertifiedIssuer<'static, KeyPair>, MitmError> {
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(
            DnType::CommonName,
            "exec-server credential masking CA (one process)",
        );
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        Ok(CertifiedIssuer::self_signed(params, key)?)
    }

    fn build(
        ca: CertifiedIssuer<'static, KeyPair>,
        ca_pem: String,
        ca_der: CertificateDer<'static>,
        extra_roots: &[CertificateDer<'static>],
    ) -> Result<Authority, MitmError> {
        let key_pem = ca.key().serialize_pem();
        let mut roots = RootCertStore::empty();
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        for r in extra_roots {
            // A bad extra root is skipped; the Mozilla roots still apply.
            let _ = roots.add(r.clone());
        }
        let mut client = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
        client.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Authority {
            ca,
            ca_pem,
            ca_der,
            key_pem,
            leaves: Mutex::new(HashMap::new()),
            upstream: Arc::new(client),
        })
    }

    /// The CA certificate (PEM) the child must trust.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The TLS server configuration presenting a leaf for `host`.
    fn leaf(&self, host: &str) -> Result<Arc<ServerConfig>, MitmError> {
        let mut cache = self.leaves.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = cache.get(host) {
            return Ok(c.clone());
        }
        let mut params = CertificateParams::new(vec![host.to_string()])?;
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, host);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.ca)?;
        let chain = vec![cert.der().clone(), self.ca_der.clone()];
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let mut cfg = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(chain, key)?;
        cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
        let cfg = Arc::new(cfg);
        if cache.len() >= MAX_LEAVES {
            cache.clear();
        }
        cache.insert(host.to_string(), cfg.clone());
        Ok(cfg)
    }
}

type Sender = hyper::client::conn::http1::SendRequest<Incoming>;

/// The upstream side of one intercepted tunnel: where it goes, and the
/// current HTTP/1.1 connection (or why there is none).
struct Upstream {
    host: String,
    addrs: Vec<SocketAddr>,
    sender: Result<Sender, String>,
}

impl Upstream {
    /// The connection for the next request: the current one while it is
    /// open, else a new one to the same addresses (the server closed the
    /// previous one, e.g. `Connection: close`, while the child keeps its
    /// tunnel alive since that header is hop-by-hop).
    async fn ready(&mut self, auth: &Authority) -> Result<&mut Sender, String> {
        let usable = match &mut self.sender {
            Ok(s) => s.ready().await.is_ok(),
            Err(_) => false,
        };
        if !usable {
            self.sender = match crate::upstream::connect(&self.addrs).await {
                Ok(up) => upstream(auth, up, &self.host).await,
                Err(e) => Err(e.to_string()),
            };
        }
        self.sender.as_mut().map_err(|e| e.clone())
    }
}

/// Serves one intercepted tunnel: `down` is the child's side (after the
/// `200` to its `CONNECT`), `up` the TCP connection to `host:port` (one of
/// `addrs`, the addresses the policy checked).
pub(crate) async fn serve<S>(
    down: S,
    up: TcpStream,
    host: String,
    port: u16,
    addrs: Vec<SocketAddr>,
    shared: Arc<Shared>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let Some(auth) = shared.mitm.clone() else {
        return;
    };
    let cfg = match auth.leaf(&host) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(%host, "network proxy: no leaf certificate: {e}");
            return;
        }
    };
    let down = match tokio_rustls::TlsAcceptor::from(cfg).accept(down).await {
        Ok(s) => s,
        Err(e) => {
            tracing::debug!(%host, "network proxy: child TLS handshake failed: {e}");
            return;
        }
    };
    // The upstream handshake comes after the child's, so a failure can be
    // told to the child as a 502 rather than a broken TLS connection.
    let sender = upstream(&auth, up, &host).await;
    let up = Arc::new(AsyncMutex::new(Upstream {
        host: host.clone(),
        addrs,
        sender,
    }));
    let svc = hyper::service::service_fn(move |req| {
        let (up, shared, host, auth) = (up.clone(), shared.clone(), host.clone(), auth.clone());
        async move { Ok::<_, Infallible>(forward(req, &up, &auth, &shared, &host, port).await) }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(crate::responses::HEADER_READ_TIMEOUT)
        .serve_connection(TokioIo::new(down), svc)
        .await;
}

/// TLS to the real server (verified) and an HTTP/1.1 client on it; `Err`
/// holds the reason for the 502s.
async fn upstream(auth: &Authority, up: TcpStream, host: &str) -> Result<Sender, String> {
    let name = ServerName::try_from(host.to_string()).map_err(|e| e.to_string())?;
    let tls = tokio_rustls::TlsConnector::from(auth.upstream.clone())
        .connect(name, up)
        .await
        .map_err(|e| format!("TLS to {host}: {e}"))?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    Ok(sender)
}

async fn forward(
    req: Request<Incoming>,
    up: &AsyncMutex<Upstream>,
    auth: &Authority,
    shared: &Shared,
    host: &str,
    port: u16,
) -> Response<crate::responses::Body> {
    let mut up = up.lock().await;
    let s = match up.ready(auth).await {
        Ok(s) => s,
        Err(e) => return crate::responses::bad_gateway_text(host, port, &e),
    };
    let (mut parts, body) = req.into_parts();
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    if let Some(m) = &shared.masking {
        let n = m.substitute(Scheme::Https, host, port, &path, &mut parts.headers);
        tracing::debug!(%host, port, substituted = n, "network proxy: intercepted request");
    }
    crate::responses::strip_hop_headers(&mut parts.headers);
    // Requests inside a tunnel are origin-form already; keep it so.
    if parts.uri.scheme().is_some() {
        parts.uri = path
            .parse()
            .unwrap_or_else(|_| hyper::Uri::from_static("/"));
    }
    match s.send_request(Request::from_parts(parts, body)).await {
        Ok(resp) => {
            let (mut parts, body) = resp.into_parts();
            crate::responses::strip_hop_headers(&mut parts.headers);
            Response::from_parts(parts, body.boxed())
        }
        Err(e) => crate::responses::bad_gateway_text(host, port, &e.to_string()),
    }
}
