//! `exec-server forward --connect ws://… --remote URL --environment-id ID`:
//! registers like an executor, but bridges every relay stream to its own
//! WebSocket connection to an exec-server that already listens (ours or the
//! reference), message for message.

use crate::executor::RemoteArgs;
use clap::Args;
use exec_server_relay::executor::{self, Config, StreamHandler};
use exec_server_relay::registry_client::RegistryClient;
use exec_server_relay::stream::Channel;
use futures_util::{SinkExt, StreamExt};
use std::sync::Arc;
use tokio_tungstenite::tungstenite::Message;

/// `forward` flags.
#[derive(Args, Debug)]
pub struct ForwardArgs {
    /// The exec-server to bridge to (ws://HOST:PORT).
    #[arg(long, value_name = "URL")]
    pub connect: String,
    #[command(flatten)]
    pub remote: RemoteArgs,
}

/// Bridges one relay stream to one WebSocket connection until either ends.
async fn bridge(mut ch: Channel, url: String) {
    let mut cfg = tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default();
    cfg.max_message_size = Some(exec_server::MAX_MESSAGE_BYTES);
    cfg.max_frame_size = Some(exec_server::MAX_MESSAGE_BYTES);
    let ws = match tokio_tungstenite::connect_async_with_config(url.as_str(), Some(cfg), true).await
    {
        Ok((ws, _)) => ws,
        Err(e) => {
            tracing::warn!("forward: cannot connect to {url}: {e}");
            return; // dropping the channel resets the stream
        }
    };
    let (mut sink, mut source) = ws.split();
    loop {
        tokio::select! {
            m = ch.inbound.recv() => {
                let Some(m) = m else { break };
                let Ok(text) = tokio_tungstenite::tungstenite::Utf8Bytes::try_from(m) else { break };
                if sink.send(Message::Text(text)).await.is_err() {
                    break;
                }
            }
            m = source.next() => {
                let bytes = match m {
                    Some(Ok(Message::Text(t))) => t.into(),
                    Some(Ok(Message::Binary(b))) => b,
                    Some(Ok(Message::Close(_))) | Some(Err(_)) | None => break,
                    Some(Ok(_)) => continue,
                };
                if ch.outbound.send(bytes.into()).await.is_err() {
                    break;
                }
            }
        }
    }
    let _ = sink.close().await;
}

/// Runs the forwarder until SIGTERM/SIGINT or a fatal registration error.
pub async fn run(args: ForwardArgs) -> i32 {
    if !(args.connect.starts_with("ws://") || args.connect.starts_with("wss://")) {
        eprintln!("exec-server forward: --connect needs a ws:// or wss:// URL");
        return 2;
    }
    let (Some(url), Some(env)) = (&args.remote.remote, &args.remote.environment_id) else {
        eprintln!("exec-server forward: needs --remote URL and --environment-id ID");
        return 2;
    };
    let (token, show_bodies) = match crate::executor::bearer(&args.remote, url) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("exec-server forward: {e}");
            return 2;
        }
    };
    let registry = match RegistryClient::new(url, &token, None, show_bodies) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("exec-server forward: {e}");
            return 2;
        }
    };
    let target = args.connect.clone();
    let handler: StreamHandler = Arc::new(move |ch| {
        tracing::debug!(peer = %ch.peer, cipher = ?ch.transport_cipher, "relay stream opened");
        tokio::spawn(bridge(ch, target.clone()));
    });
    let config = Config {
        registry,
        environment_id: env.trim().to_string(),
        keepalive: executor::KEEPALIVE,
        pong_timeout: executor::PONG_TIMEOUT,
        observer: std::sync::Arc::new(executor::NoObserver),
        transport_cipher: exec_server_relay::TransportCipher::preferred(),
    };
    tokio::select! {
        r = executor::run(config, handler) => match r {
            Ok(()) => 0,
            Err(e) => { eprintln!("exec-server forward: {e}"); 1 }
        },
        _ = tokio::signal::ctrl_c() => 0,
    }
}
