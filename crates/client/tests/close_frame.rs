//! `close()` says goodbye: a program that closes its client and exits at
//! once (as `exec-server run` does) still sends the WebSocket close frame,
//! so the server sees a normal closure (1000), not an abnormal one (1006).

use exec_server_client::{ClientOptions, ExecServerClient, Source};
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use std::time::Duration;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::Message;

/// What the server saw end the connection.
#[derive(Debug, PartialEq)]
enum Ending {
    CloseFrame(CloseCode),
    /// The socket ended (or failed) with no close frame.
    NoCloseFrame,
}

/// Serves one WebSocket connection: answers `initialize`, then reads until
/// the connection ends.
async fn serve(listener: tokio::net::TcpListener) -> Ending {
    let (tcp, _) = listener.accept().await.unwrap();
    let mut ws = tokio_tungstenite::accept_async(tcp).await.unwrap();
    while let Some(msg) = ws.next().await {
        match msg {
            Ok(Message::Text(t)) => {
                let msg: Value = serde_json::from_str(t.as_str()).unwrap();
                if msg["method"] == "initialize" {
                    let answer = json!({"id": msg["id"], "result": {"sessionId": "s1"}});
                    ws.send(Message::text(answer.to_string())).await.unwrap();
                }
            }
            Ok(Message::Close(frame)) => {
                return Ending::CloseFrame(frame.map_or(CloseCode::Status, |f| f.code))
            }
            Ok(_) => {}
            Err(_) => return Ending::NoCloseFrame,
        }
    }
    Ending::NoCloseFrame
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_closed_just_before_its_program_exits_sends_a_close_frame() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(serve(listener));
    // The "program": a runtime of its own on a thread of its own, dropped
    // (its tasks with it) as soon as `close()` returns.
    let program = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let client =
                ExecServerClient::new(ClientOptions::new(Source::from_url(&url, None).unwrap()));
            client.connect().await.expect("connected");
            client.close().await;
        });
    });
    tokio::task::spawn_blocking(move || program.join())
        .await
        .unwrap()
        .unwrap();
    let ending = tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .expect("the connection ended")
        .unwrap();
    assert_eq!(ending, Ending::CloseFrame(CloseCode::Normal));
}
