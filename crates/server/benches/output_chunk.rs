//! The hot path of one output chunk: bytes read from a child's pipe → seq in the
//! output log → base64 → JSON notification → WebSocket frame bytes.
//!
//! `cargo bench -p exec-server --bench output_chunk`

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use exec_server::process::encode_output_notification;
use exec_server::process::output_log::OutputLog;
use exec_server_protocol::types::OutputStream;
use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};
use tokio_tungstenite::tungstenite::protocol::frame::Frame;

fn bench(c: &mut Criterion) {
    for size in [1024usize, 64 * 1024] {
        let data = vec![b'x'; size];
        let mut g = c.benchmark_group(format!("output_chunk_{}k", size / 1024));
        g.throughput(Throughput::Bytes(size as u64));
        let mut log = OutputLog::new(false, None);
        let mut out = Vec::with_capacity(size * 2);
        g.bench_function("log+encode+frame", |b| {
            b.iter(|| {
                let seq = log.push_output(OutputStream::Stdout, black_box(&data).to_vec());
                log.delivered_by_push(seq);
                let msg = encode_output_notification("proc-1", seq, OutputStream::Stdout, &data);
                let frame = Frame::message(msg.into_bytes(), OpCode::Data(Data::Text), true);
                out.clear();
                frame.format(&mut out).unwrap();
                black_box(out.len())
            })
        });
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
