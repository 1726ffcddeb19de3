//! The server side of credential masking (`proxy.credentialMasking`,
//! `proxy.credentialProviders`; docs/credential-masking.md): the child's
//! environment is resolved here (so the secrets it would inherit are known
//! and replaced before it exists), and the interception CA of the process's
//! proxy is written, with the roots the child already trusted, to a bundle
//! only this server's user can read, named by the usual CA variables.

use exec_server_netproxy::mask::{AuthMethod, CustomProvider, Masking};
use exec_server_protocol::types::{CredentialAuthMethod, ExecParams, RemoteNetworkProxyConfig};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Variables pointed at the CA bundle (the reference's list: OpenSSL,
/// Python requests, curl, Node, git, pip, bundler, npm, and Codex's own).
pub const CA_ENV_KEYS: [&str; 10] = [
    "CODEX_CA_CERTIFICATE",
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
    "GIT_SSL_CAINFO",
    "PIP_CERT",
    "BUNDLE_SSL_CA_CERT",
    "npm_config_cafile",
    "NPM_CONFIG_CAFILE",
];

/// Where the host's roots are looked for when the child names none (Debian,
/// Fedora, Alpine/macOS layouts).
const SYSTEM_BUNDLES: [&str; 3] = [
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
];

/// Largest existing bundle copied into the child's: 4 MiB.
const MAX_BUNDLE_BYTES: u64 = 4 << 20;

fn custom_providers(p: &RemoteNetworkProxyConfig) -> Vec<CustomProvider> {
    p.credential_providers
        .iter()
        .flatten()
        .map(|(name, c)| CustomProvider {
            name: name.clone(),
            env: c.env.clone(),
            patterns: c.patterns.clone(),
            url_prefixes: c.url_prefixes.clone(),
            url_prefix_from_env: c.url_prefix_from_env.clone(),
            auth: c
                .auth
                .iter()
                .map(|a| match a {
                    CredentialAuthMethod::Bearer => AuthMethod::Bearer,
                    CredentialAuthMethod::Token => AuthMethod::Token,
                    CredentialAuthMethod::Basic => AuthMethod::Basic,
                    CredentialAuthMethod::Header => AuthMethod::Header,
                })
                .collect(),
            header: c.header.clone(),
            prefix: c.prefix.clone(),
        })
        .collect()
}

/// When the request `p` turns `credentialMasking` on: masks the child's
/// built environment `env` in place (inherited secrets included). Returns
/// the masking for the proxy; `None` (and `env` untouched) when masking is
/// off.
pub fn mask_env(p: &ExecParams, env: &mut BTreeMap<String, String>) -> Option<Arc<Masking>> {
    let cfg = &p.network_proxy.as_ref()?.proxy;
    if cfg.credential_masking != Some(true) {
        return None;
    }
    let customs = custom_providers(cfg);
    let (masking, skipped) = Masking::mask_env(&customs, env);
    for s in skipped {
        tracing::warn!(provider = %s.provider, "credential provider not used: {}", s.reason);
    }
    Some(Arc::new(masking))
}

/// After a shell snapshot merged its exports into the masked `env`
/// (`before`: the names present when it was masked): provider variables it
/// added are masked with a known placeholder or dropped (with a warning).
/// `p`: the request, whose proxy config names custom providers.
pub fn scrub_added(
    masking: &Masking,
    before: &std::collections::BTreeSet<String>,
    p: &ExecParams,
    env: &mut BTreeMap<String, String>,
) {
    let customs = p
        .network_proxy
        .as_ref()
        .map(|np| custom_providers(&np.proxy))
        .unwrap_or_default();
    for name in masking.scrub_added(before, &customs, env) {
        tracing::warn!(%name, "credential masking: dropped a secret the shell snapshot exported");
    }
}

/// The CA bundle of one process, `ca-bundle.pem` (0600) in a private (0700)
/// directory: the proxy's socket directory when the process is sandboxed
/// (bound into the sandbox, so the child sees it at
/// [`exec_server_sandbox::PROXY_DIR_INSIDE`]), else one of its own. Removed
/// when dropped.
pub struct CaBundle {
    file: PathBuf,
    child_path: PathBuf,
    own_dir: Option<PathBuf>,
}

/// The bundle's file name.
pub const CA_BUNDLE_FILE: &str = "ca-bundle.pem";

impl CaBundle {
    /// Writes `ca_pem` after the roots the child trusted so far (the file its
    /// `SSL_CERT_FILE` names when readable, else the host's bundle), into
    /// `socket_dir` (a sandboxed process's proxy directory) or a new private
    /// directory. Errors: the directory or file cannot be written.
    pub fn write(
        ca_pem: &str,
        env: &BTreeMap<String, String>,
        socket_dir: Option<&Path>,
    ) -> std::io::Result<CaBundle> {
        use std::io::Write;
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
        let bundle = match socket_dir {
            Some(d) => CaBundle {
                file: d.join(CA_BUNDLE_FILE),
                child_path: Path::new(exec_server_sandbox::PROXY_DIR_INSIDE).join(CA_BUNDLE_FILE),
                own_dir: None,
            },
            None => {
                let dir =
                    std::env::temp_dir().join(format!("exec-server-ca-{}", uuid::Uuid::new_v4()));
                std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
                CaBundle {
                    file: dir.join(CA_BUNDLE_FILE),
                    child_path: dir.join(CA_BUNDLE_FILE),
                    own_dir: Some(dir),
                }
            }
        };
        let mut text = existing_roots(env).unwrap_or_default();
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(ca_pem);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&bundle.file)?;
        f.write_all(text.as_bytes())?;
        Ok(bundle)
    }

    /// The bundle written down for an upgrade: its file, the path the child
    /// sees, and its own directory.
    pub fn parts(&self) -> (PathBuf, PathBuf, Option<PathBuf>) {
        (
            self.file.clone(),
            self.child_path.clone(),
            self.own_dir.clone(),
        )
    }

    /// The bundle a previous image of the server wrote ([`CaBundle::parts`]).
    pub fn adopt((file, child_path, own_dir): (PathBuf, PathBuf, Option<PathBuf>)) -> CaBundle {
        CaBundle {
            file,
            child_path,
            own_dir,
        }
    }

    /// The bundle's path as the child sees it.
    pub fn child_path(&self) -> &Path {
        &self.child_path
    }

    /// The variables naming the bundle.
    pub fn child_env(&self) -> Vec<(String, String)> {
        let p = self.child_path.to_string_lossy().into_owned();
        CA_ENV_KEYS
            .iter()
            .map(|k| (k.to_string(), p.clone()))
            .collect()
    }
}

impl Drop for CaBundle {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.file);
        if let Some(d) = &self.own_dir {
            let _ = std::fs::remove_dir(d);
        }
    }
}

fn read_small(p: &Path) -> Option<String> {
    let meta = std::fs::metadata(p).ok()?;
    if !meta.is_file() || meta.len() > MAX_BUNDLE_BYTES {
        return None;
    }
    std::fs::read_to_string(p).ok()
}

fn existing_roots(env: &BTreeMap<String, String>) -> Option<String> {
    if let Some(own) = env
        .get("SSL_CERT_FILE")
        .map(Path::new)
        .filter(|p| p.is_absolute())
        .and_then(read_small)
    {
        return Some(own);
    }
    SYSTEM_BUNDLES.iter().find_map(|p| read_small(Path::new(p)))
}

/// The certificates (DER) of the `CERTIFICATE` blocks of a PEM text; other
/// blocks and undecodable ones are skipped.
pub fn pem_certificates(text: &str) -> Vec<Vec<u8>> {
    use base64::Engine as _;
    const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
    const END: &str = "-----END CERTIFICATE-----";
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find(BEGIN) {
        let after = &rest[i + BEGIN.len()..];
        let Some(j) = after.find(END) else { break };
        let b64: String = after[..j].chars().filter(|c| !c.is_whitespace()).collect();
        if let Ok(der) = base64::engine::general_purpose::STANDARD.decode(b64) {
            out.push(der);
        }
        rest = &after[j + END.len()..];
    }
    out
}
