//! Bounded decoder vs plain `serde_json::from_slice::<Value>`.
use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use exec_server_protocol::{from_slice_bounded, ByteChunk, MAX_JSONRPC_VALUE_NODES};

fn output_notification() -> Vec<u8> {
    let data = vec![b'x'; 64 * 1024];
    format!(
        r#"{{"method":"process/output","params":{{"processId":"p1","seq":42,"stream":"stdout","chunk":"{}"}}}}"#,
        ByteChunk::encode(&data)
    )
    .into_bytes()
}

fn start_request() -> Vec<u8> {
    br#"{"id":17,"method":"process/start","params":{"processId":"proc-17","argv":["bash","-lc","cargo test --workspace"],"cwd":"file:///home/user/project","env":{"PATH":"/usr/local/bin:/usr/bin:/bin","HOME":"/home/user","LANG":"C.UTF-8","TERM":"xterm-256color"},"tty":false,"pipeStdin":true,"arg0":null}}"#.to_vec()
}

fn bench(c: &mut Criterion) {
    for (name, msg) in [
        ("output_64k", output_notification()),
        ("start", start_request()),
    ] {
        let mut g = c.benchmark_group(name);
        g.throughput(Throughput::Bytes(msg.len() as u64));
        g.bench_function("bounded", |b| {
            b.iter(|| from_slice_bounded(black_box(&msg), MAX_JSONRPC_VALUE_NODES).unwrap())
        });
        g.bench_function("serde_json_value", |b| {
            b.iter(|| serde_json::from_slice::<serde_json::Value>(black_box(&msg)).unwrap())
        });
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
