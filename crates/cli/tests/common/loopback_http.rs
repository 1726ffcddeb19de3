//! A minimal HTTP/1.1 server on loopback for `http/request` tests. One request per
//! connection (every answer says `Connection: close`).
//!
//! Routes: `/echo` (request line, headers and body as JSON), `/gone` (410),
//! `/redirect` (302 to `/echo`), `/redirect-to/<location>` (302 to whatever
//! follows, e.g. `file:///etc/passwd`), `/stream` (three chunks, 50 ms apart),
//! `/slow` (headers after 3 s), `/stall-body` (headers and 10 of 100 bytes, then
//! 5 s of silence), `/length/N` (N bytes with a Content-Length), `/chunked/N` (N
//! bytes, chunked, no length), `/endless` (chunked, until the peer stops reading
//! or [`ENDLESS_BODY_LIMIT`] is sent); anything else 404.

use serde_json::json;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Bytes `/endless` sends at most, so a test that fails cannot run forever: 1 GiB.
pub const ENDLESS_BODY_LIMIT: usize = 1 << 30;

/// Starts the server; returns its base URL (`http://127.0.0.1:PORT`) and the
/// accept task (abort it to stop).
pub async fn http_server() -> (String, tokio::task::JoinHandle<()>) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let task = tokio::spawn(async move {
        loop {
            let Ok((sock, _)) = l.accept().await else {
                return;
            };
            tokio::spawn(serve_one(sock));
        }
    });
    (format!("http://{addr}"), task)
}

async fn serve_one(mut sock: TcpStream) {
    let mut buf = Vec::new();
    let mut tmp = [0u8; 4096];
    let head_end = loop {
        let n = sock.read(&mut tmp).await.unwrap_or(0);
        if n == 0 {
            return;
        }
        buf.extend_from_slice(&tmp[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let len: usize = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length:")
                .map(|v| v.trim().parse().unwrap_or(0))
        })
        .unwrap_or(0);
    while buf.len() < head_end + len {
        let n = sock.read(&mut tmp).await.unwrap_or(0);
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&tmp[..n]);
    }
    let body = buf[head_end..].to_vec();
    let mut lines = head.lines();
    let request_line = lines.next().unwrap_or("").to_string();
    let path = request_line.split(' ').nth(1).unwrap_or("/").to_string();
    let headers: Vec<String> = lines
        .filter(|l| !l.is_empty())
        .map(|l| l.to_string())
        .collect();
    const CLOSE: &str = "Connection: close\r\n";
    let number = |prefix: &str| {
        path.strip_prefix(prefix)
            .and_then(|n| n.parse::<usize>().ok())
    };
    let resp: Vec<u8> = if path == "/echo" {
        let j = json!({"request": request_line, "headers": headers, "body": String::from_utf8_lossy(&body)}).to_string();
        format!("HTTP/1.1 200 OK\r\n{CLOSE}Content-Type: application/json\r\nX-Multi: a\r\nX-Multi: b\r\nContent-Length: {}\r\n\r\n{j}", j.len()).into_bytes()
    } else if path == "/gone" {
        format!("HTTP/1.1 410 Gone\r\n{CLOSE}Content-Length: 4\r\n\r\ngone").into_bytes()
    } else if path == "/redirect" {
        format!("HTTP/1.1 302 Found\r\n{CLOSE}Location: /echo\r\nContent-Length: 0\r\n\r\n")
            .into_bytes()
    } else if let Some(to) = path.strip_prefix("/redirect-to/") {
        format!("HTTP/1.1 302 Found\r\n{CLOSE}Location: {to}\r\nContent-Length: 0\r\n\r\n")
            .into_bytes()
    } else if path == "/stream" {
        let _ = sock
            .write_all(
                format!("HTTP/1.1 200 OK\r\n{CLOSE}Transfer-Encoding: chunked\r\n\r\n").as_bytes(),
            )
            .await;
        for part in ["one", "two", "three"] {
            let _ = sock
                .write_all(format!("{:x}\r\n{part}\r\n", part.len()).as_bytes())
                .await;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        b"0\r\n\r\n".to_vec()
    } else if path == "/slow" {
        tokio::time::sleep(Duration::from_secs(3)).await;
        format!("HTTP/1.1 200 OK\r\n{CLOSE}Content-Length: 0\r\n\r\n").into_bytes()
    } else if path == "/stall-body" {
        let _ = sock
            .write_all(
                format!("HTTP/1.1 200 OK\r\n{CLOSE}Content-Length: 100\r\n\r\n0123456789")
                    .as_bytes(),
            )
            .await;
        tokio::time::sleep(Duration::from_secs(5)).await;
        return;
    } else if let Some(n) = number("/length/") {
        let mut r = format!("HTTP/1.1 200 OK\r\n{CLOSE}Content-Length: {n}\r\n\r\n").into_bytes();
        r.resize(r.len() + n, b'x');
        r
    } else if let Some(n) = number("/chunked/") {
        let mut r =
            format!("HTTP/1.1 200 OK\r\n{CLOSE}Transfer-Encoding: chunked\r\n\r\n").into_bytes();
        if n > 0 {
            r.extend(format!("{n:x}\r\n").as_bytes());
            r.resize(r.len() + n, b'x');
            r.extend(b"\r\n");
        }
        r.extend(b"0\r\n\r\n");
        r
    } else if path == "/endless" {
        let head = format!("HTTP/1.1 200 OK\r\n{CLOSE}Transfer-Encoding: chunked\r\n\r\n");
        if sock.write_all(head.as_bytes()).await.is_err() {
            return;
        }
        const PIECE: usize = 64 * 1024;
        let mut chunk = format!("{PIECE:x}\r\n").into_bytes();
        chunk.resize(chunk.len() + PIECE, b'x');
        chunk.extend(b"\r\n");
        let mut sent = 0;
        while sent < ENDLESS_BODY_LIMIT {
            if sock.write_all(&chunk).await.is_err() {
                return;
            }
            sent += PIECE;
        }
        b"0\r\n\r\n".to_vec()
    } else {
        format!("HTTP/1.1 404 Not Found\r\n{CLOSE}Content-Length: 0\r\n\r\n").into_bytes()
    };
    let _ = sock.write_all(&resp).await;
    let _ = sock.shutdown().await;
}
