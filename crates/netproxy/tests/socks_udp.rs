//! SOCKS5 `UDP ASSOCIATE` end to end on loopback: a datagram to an allowed
//! destination is relayed and its answer comes back wrapped; a denied
//! destination's datagram is dropped; without `enableSocks5Udp` the command is
//! refused (reply 7).

use exec_server_netproxy::{
    Answer, AskFailure, BoxFuture, Decider, Decision, Destination, Launch, Pattern, Proxy, Rules,
};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};

#[derive(Default)]
struct Audit(Mutex<Vec<(String, String)>>);

impl Decider for Audit {
    fn ask(&self, _: &Destination) -> BoxFuture<Result<Answer, AskFailure>> {
        Box::pin(async { Err(AskFailure::Unavailable) })
    }
    fn audit(&self, d: &Destination, x: &Decision) {
        self.0
            .lock()
            .unwrap()
            .push((d.protocol.as_str().into(), x.verdict.as_str().into()));
    }
}

async fn associate(socks: SocketAddr) -> (TcpStream, Option<SocketAddr>, u8) {
    let mut c = TcpStream::connect(socks).await.unwrap();
    c.write_all(&[5, 1, 0]).await.unwrap();
    let mut m = [0u8; 2];
    c.read_exact(&mut m).await.unwrap();
    assert_eq!(m, [5, 0]);
    c.write_all(&[5, 3, 0, 1, 0, 0, 0, 0, 0, 0]).await.unwrap();
    let mut r = [0u8; 10];
    c.read_exact(&mut r).await.unwrap();
    let relay = (r[1] == 0)
        .then(|| SocketAddr::from(([r[4], r[5], r[6], r[7]], u16::from_be_bytes([r[8], r[9]]))));
    (c, relay, r[1])
}

fn wrap(to: SocketAddr, data: &[u8]) -> Vec<u8> {
    let SocketAddr::V4(v4) = to else { panic!("v4") };
    let mut d = vec![0, 0, 0, 1];
    d.extend_from_slice(&v4.ip().octets());
    d.extend_from_slice(&v4.port().to_be_bytes());
    d.extend_from_slice(data);
    d
}

#[tokio::test]
async fn udp_associate_relays_only_allowed_destinations() {
    let echo = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let echo_addr = echo.local_addr().unwrap();
    tokio::spawn(async move {
        let mut b = [0u8; 1500];
        while let Ok((n, from)) = echo.recv_from(&mut b).await {
            let _ = echo.send_to(&b[..n], from).await;
        }
    });
    let audit = Arc::new(Audit::default());
    let launch = |udp| Launch {
        rules: Rules {
            allow_local_binding: true,
            deny: vec![Pattern::new("127.0.0.2")],
            ..Rules::default()
        },
        socks5: true,
        socks5_udp: udp,
        unix_dir: None,
        ..Launch::default()
    };
    let proxy = Proxy::start(launch(true), audit.clone()).await.unwrap();
    let (_ctl, relay, code) = associate(proxy.socks_addr().unwrap()).await;
    assert_eq!(code, 0);
    let me = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    me.send_to(&wrap(echo_addr, b"ping"), relay.unwrap())
        .await
        .unwrap();
    let mut b = [0u8; 1500];
    let (n, _) = tokio::time::timeout(Duration::from_secs(5), me.recv_from(&mut b))
        .await
        .expect("answer relayed")
        .unwrap();
    assert_eq!(&b[..n], wrap(echo_addr, b"ping").as_slice());
    // A denied destination: nothing comes back, and the denial is audited.
    let denied: SocketAddr = format!("127.0.0.2:{}", echo_addr.port()).parse().unwrap();
    me.send_to(&wrap(denied, b"x"), relay.unwrap())
        .await
        .unwrap();
    assert!(
        tokio::time::timeout(Duration::from_millis(500), me.recv_from(&mut b))
            .await
            .is_err()
    );
    assert!(audit
        .0
        .lock()
        .unwrap()
        .contains(&("socks5_udp".into(), "deny".into())));
    let off = Proxy::start(launch(false), audit).await.unwrap();
    let (_c, relay, code) = associate(off.socks_addr().unwrap()).await;
    assert_eq!(
        (relay, code),
        (None, 7),
        "UDP ASSOCIATE refused when not enabled"
    );
}
