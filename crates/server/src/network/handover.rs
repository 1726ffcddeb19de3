//! A process's managed proxy across an upgrade: the next image serves the
//! same child on the same listening sockets (its proxy variables and its
//! sandbox's sockets stay right), with the same interception CA key (the
//! certificate the child trusts stays valid), the same credential masking
//! and the same rules. Connections open at the upgrade end with the old
//! image; decisions the client made are asked again.

use super::{decider_for, launch_for, masking::CaBundle, RunningProxy, SocketDir};
use crate::link::Link;
use crate::process::handover::{Sink, Source};
use exec_server_netproxy::handover::{Inherited, ListenerFds};
use exec_server_netproxy::{CaParts, Proxy};
use exec_server_protocol::types::RemoteNetworkProxyLaunchConfig;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::sync::Arc;

/// A running proxy written down for the next image.
#[derive(Debug, Serialize, Deserialize)]
pub struct ProxyDoc {
    cfg: RemoteNetworkProxyLaunchConfig,
    process_id: String,
    /// Its listeners, by descriptor number in the document.
    fds: ListenerFds,
    ca: Option<CaParts>,
    /// The credential masking (secrets included: the document is a memfd
    /// of this process, never a file).
    masking: Option<serde_json::Value>,
    /// The socket directory of a routed sandbox.
    dir: Option<PathBuf>,
    /// The CA bundle's file, the path the child sees, and its own directory.
    ca_bundle: Option<(PathBuf, PathBuf, Option<PathBuf>)>,
}

impl ProxyDoc {
    /// Every descriptor it names.
    pub fn fds(&self) -> Vec<i32> {
        let f = &self.fds;
        [f.http, f.socks, f.unix_http, f.unix_socks, f.unix_tcp]
            .into_iter()
            .flatten()
            .collect()
    }
}

impl RunningProxy {
    /// Writes the proxy down; its listeners' descriptors go to `sink`.
    pub fn write(&self, sink: &mut dyn Sink) -> ProxyDoc {
        let (fds, ca) = self.proxy.handover();
        let mut keep = |fd: Option<i32>| fd.map(|fd| sink.fd(fd));
        ProxyDoc {
            cfg: self.cfg.clone(),
            process_id: self.process_id.clone(),
            fds: ListenerFds {
                http: keep(fds.http),
                socks: keep(fds.socks),
                unix_http: keep(fds.unix_http),
                unix_socks: keep(fds.unix_socks),
                unix_tcp: keep(fds.unix_tcp),
            },
            ca,
            masking: self
                .masking
                .as_deref()
                .and_then(|m| serde_json::to_value(m).ok()),
            dir: self._dir.as_ref().map(|d| d.0.clone()),
            ca_bundle: self.ca.as_ref().map(CaBundle::parts),
        }
    }
}

/// Serves again, in this image, the proxy `doc` wrote down (its decider
/// asks the client of `link`). Errors: a descriptor it names is missing, or
/// the proxy cannot serve on it.
pub async fn adopt(
    doc: ProxyDoc,
    source: &mut dyn Source,
    link: Arc<Link>,
    server: &crate::ServerConfig,
) -> std::io::Result<RunningProxy> {
    let mut take = |n: Option<i32>| n.map(|n| source.fd(n)).transpose();
    let inherited = Inherited {
        http: take(doc.fds.http)?,
        socks: take(doc.fds.socks)?,
        unix_http: take(doc.fds.unix_http)?,
        unix_socks: take(doc.fds.unix_socks)?,
        unix_tcp: take(doc.fds.unix_tcp)?,
        ca: doc.ca,
    };
    let masking = match doc.masking {
        Some(v) => Some(Arc::new(
            serde_json::from_value(v).map_err(std::io::Error::other)?,
        )),
        None => None,
    };
    let decider = decider_for(&doc.cfg, &doc.process_id, link);
    let l = launch_for(&doc.cfg, doc.dir.clone(), server, masking.clone());
    let proxy = Proxy::take_over(l, decider, inherited).await?;
    Ok(RunningProxy {
        proxy,
        // The sandbox was routed at its start; nothing reads it again.
        route: None,
        ca: doc.ca_bundle.map(CaBundle::adopt),
        _dir: doc.dir.map(SocketDir),
        cfg: doc.cfg,
        process_id: doc.process_id,
        masking,
    })
}
