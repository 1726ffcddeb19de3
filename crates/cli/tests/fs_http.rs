//! File system, HTTP and discovery methods over WebSocket against the real binary.

use crate::common;
use common::loopback_http::http_server;
use common::*;
use serde_json::{json, Value};
use std::time::Duration;

async fn err_code(c: &mut Conn, method: &str, params: Value) -> i64 {
    let r = c.call(method, params).await;
    r["error"]["code"]
        .as_i64()
        .unwrap_or_else(|| panic!("{method} should fail: {r}"))
}

#[tokio::test]
async fn every_fs_method_and_error_path() {
    let s = Server::start(&[]);
    let d = tmpdir("fs");
    let mut c = Conn::open(&s.url, None).await;
    let u = |p: &str| uri(&d.join(p));
    // writeFile / readFile
    c.ok(
        "fs/writeFile",
        json!({"path": u("a.txt"), "dataBase64": b64(b"hello world")}),
    )
    .await;
    let r = c.ok("fs/readFile", json!({"path": u("a.txt")})).await;
    assert_eq!(unb64(&r["dataBase64"]), b"hello world");
    assert_eq!(
        err_code(&mut c, "fs/readFile", json!({"path": u("missing")})).await,
        -32004
    );
    assert_eq!(
        err_code(&mut c, "fs/readFile", json!({"path": uri(&d)})).await,
        -32600
    );
    assert_eq!(
        err_code(&mut c, "fs/readFile", json!({"path": "/bare/path"})).await,
        -32602
    );
    assert_eq!(
        err_code(
            &mut c,
            "fs/writeFile",
            json!({"path": u("no/parent/x"), "dataBase64": ""})
        )
        .await,
        -32004
    );
    // createDirectory
    c.ok("fs/createDirectory", json!({"path": u("d1/d2")}))
        .await;
    assert_eq!(
        err_code(
            &mut c,
            "fs/createDirectory",
            json!({"path": u("d1"), "recursive": false})
        )
        .await,
        -32603
    );
    // getMetadata (a symlink reports its target's type with isSymlink)
    std::os::unix::fs::symlink(d.join("a.txt"), d.join("link")).unwrap();
    let m = c.ok("fs/getMetadata", json!({"path": u("link")})).await;
    assert_eq!(
        (
            m["isFile"].clone(),
            m["isSymlink"].clone(),
            m["size"].clone()
        ),
        (json!(true), json!(true), json!(11))
    );
    assert_eq!(
        err_code(&mut c, "fs/getMetadata", json!({"path": u("missing")})).await,
        -32004
    );
    // canonicalize
    let r = c
        .ok("fs/canonicalize", json!({"path": u("d1/../link")}))
        .await;
    assert_eq!(
        r["path"],
        json!(uri(&std::fs::canonicalize(d.join("a.txt")).unwrap()))
    );
    // readDirectory
    let r = c.ok("fs/readDirectory", json!({"path": uri(&d)})).await;
    let mut names: Vec<String> = r["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["fileName"].as_str().unwrap().to_string())
        .collect();
    names.sort();
    assert_eq!(names, ["a.txt", "d1", "link"]);
    assert_eq!(
        err_code(&mut c, "fs/readDirectory", json!({"path": u("a.txt")})).await,
        -32603
    );
    // walk
    let r = c.ok("fs/walk", json!({"path": uri(&d), "options": {"maxDepth": 5, "maxDirectories": 10, "maxEntries": 2, "followDirectorySymlinks": false}})).await;
    assert_eq!(
        (
            r["entries"].as_array().unwrap().len(),
            r["truncated"].clone()
        ),
        (2, json!(true))
    );
    assert_eq!(
        err_code(
            &mut c,
            "fs/walk",
            json!({"path": uri(&d), "options": {"maxDepth": 5}})
        )
        .await,
        -32602
    );
    // copy: file, directory (recursive only), symlink as symlink
    c.ok(
        "fs/copy",
        json!({"sourcePath": u("a.txt"), "destinationPath": u("b.txt"), "recursive": false}),
    )
    .await;
    assert_eq!(std::fs::read(d.join("b.txt")).unwrap(), b"hello world");
    assert_eq!(
        err_code(
            &mut c,
            "fs/copy",
            json!({"sourcePath": u("d1"), "destinationPath": u("d3"), "recursive": false})
        )
        .await,
        -32600
    );
    std::os::unix::fs::symlink("a.txt", d.join("d1/rel")).unwrap();
    c.ok(
        "fs/copy",
        json!({"sourcePath": u("d1"), "destinationPath": u("d3"), "recursive": true}),
    )
    .await;
    assert!(d.join("d3/d2").is_dir());
    assert_eq!(
        std::fs::read_link(d.join("d3/rel")).unwrap(),
        std::path::Path::new("a.txt")
    );
    // remove
    assert_eq!(
        err_code(
            &mut c,
            "fs/remove",
            json!({"path": u("d3"), "recursive": false})
        )
        .await,
        -32603
    );
    c.ok("fs/remove", json!({"path": u("d3")})).await;
    assert!(!d.join("d3").exists());
    c.ok("fs/remove", json!({"path": u("gone")})).await;
    assert_eq!(
        err_code(
            &mut c,
            "fs/remove",
            json!({"path": u("gone"), "force": false})
        )
        .await,
        -32004
    );
    // open / readBlock / writeBlock / close
    c.ok(
        "fs/open",
        json!({"handleId": "w", "path": u("blocks"), "mode": "replace"}),
    )
    .await;
    c.ok(
        "fs/writeBlock",
        json!({"handleId": "w", "offset": 0, "chunk": b64(b"abc")}),
    )
    .await;
    c.ok(
        "fs/writeBlock",
        json!({"handleId": "w", "offset": 5, "chunk": b64(b"z")}),
    )
    .await;
    assert_eq!(
        err_code(
            &mut c,
            "fs/writeBlock",
            json!({"handleId": "w", "offset": 0, "chunk": ""})
        )
        .await,
        -32600
    );
    c.ok("fs/close", json!({"handleId": "w"})).await;
    assert_eq!(std::fs::read(d.join("blocks")).unwrap(), b"abc\0\0z");
    assert_eq!(
        err_code(
            &mut c,
            "fs/open",
            json!({"handleId": "r", "path": u("missing")})
        )
        .await,
        -32004
    );
    c.ok("fs/open", json!({"handleId": "r", "path": u("blocks")}))
        .await;
    assert_eq!(
        err_code(
            &mut c,
            "fs/open",
            json!({"handleId": "r", "path": u("blocks")})
        )
        .await,
        -32600
    );
    let r = c
        .ok(
            "fs/readBlock",
            json!({"handleId": "r", "offset": 3, "len": 100}),
        )
        .await;
    assert_eq!(
        (unb64(&r["chunk"]), r["eof"].clone()),
        (b"\0\0z".to_vec(), json!(true))
    );
    assert_eq!(
        err_code(
            &mut c,
            "fs/readBlock",
            json!({"handleId": "r", "offset": 0, "len": 1048577})
        )
        .await,
        -32600
    );
    assert_eq!(
        err_code(
            &mut c,
            "fs/readBlock",
            json!({"handleId": "nope", "offset": 0, "len": 1})
        )
        .await,
        -32004
    );
    c.ok("fs/close", json!({"handleId": "r"})).await;
    c.ok("fs/close", json!({"handleId": "r"})).await;
    // Handles are scoped to the session.
    c.ok("fs/open", json!({"handleId": "mine", "path": u("blocks")}))
        .await;
    let mut other = Conn::open(&s.url, None).await;
    assert_eq!(
        err_code(
            &mut other,
            "fs/readBlock",
            json!({"handleId": "mine", "offset": 0, "len": 1})
        )
        .await,
        -32004
    );
}

#[tokio::test]
async fn read_file_cap_names_fs_open_and_large_block_reads() {
    let s = Server::start(&[]);
    let d = tmpdir("big");
    let big = d.join("big");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(300 * 1024 * 1024)
        .unwrap();
    let mut c = Conn::open(&s.url, None).await;
    let r = c.call("fs/readFile", json!({"path": uri(&big)})).await;
    assert_eq!(r["error"]["code"], -32600);
    assert!(
        r["error"]["message"].as_str().unwrap().contains("fs/open"),
        "{r}"
    );
    c.ok("fs/open", json!({"handleId": "b", "path": uri(&big)}))
        .await;
    let mut n = 0;
    loop {
        let r = c
            .ok(
                "fs/readBlock",
                json!({"handleId": "b", "offset": n * 1048576, "len": 1048576}),
            )
            .await;
        n += 1;
        if r["eof"] == json!(true) {
            break;
        }
        assert!(n < 400);
    }
    assert_eq!(n, 300);
    c.ok("fs/close", json!({"handleId": "b"})).await;
}

/// A new temporary directory holding `f`: `size` bytes of a non-repeating
/// pattern. Returns the directory, the file and its bytes.
fn patterned_file(tag: &str, size: usize) -> (std::path::PathBuf, std::path::PathBuf, Vec<u8>) {
    let d = tmpdir(tag);
    let f = d.join("f");
    let data: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
    std::fs::write(&f, &data).unwrap();
    (d, f, data)
}

/// `fs/readFile` over a WebSocket is sent while the file is read: the server
/// never holds the file's base64 (4/3 of it; the whole reply peaked above the
/// file's size before), and the bytes arrive exact.
#[tokio::test]
async fn a_whole_file_read_is_streamed_not_held() {
    let s = Server::start(&[]);
    let (d, f, data) = patterned_file("streamed", 24 * 1024 * 1024);
    let mut c = Conn::open(&s.url, None).await;
    let r = c.ok("fs/readFile", json!({"path": uri(&f)})).await;
    let got = unb64(&r["dataBase64"]);
    assert!(got == data, "read {} bytes, not the file", got.len());
    let peak_kib = proc_status_kib(s.pid(), "VmHWM");
    assert!(
        peak_kib < 24 * 1024,
        "server peaked at {peak_kib} KiB reading a 24 MiB file (32 MiB of base64)"
    );
    // The connection goes on serving.
    c.ok("fs/getMetadata", json!({"path": uri(&f)})).await;
    // A file that opens but cannot be read (EIO at offset 0) is an error
    // response, not a closed connection.
    let r = c
        .call("fs/readFile", json!({"path": "file:///proc/self/mem"}))
        .await;
    assert!(r.get("error").is_some(), "{r}");
    c.ok("fs/getMetadata", json!({"path": uri(&f)})).await;
    let _ = std::fs::remove_dir_all(&d);
}

/// A large `fs/writeFile` is decoded while it arrives: the server never
/// holds its base64 whole (4/3 of the file), the file is exact, and invalid
/// base64 at the very end is refused as in a small request.
#[tokio::test]
async fn a_whole_file_write_is_decoded_as_it_arrives() {
    let s = Server::start(&[]);
    let d = tmpdir("lifted-write");
    let f = d.join("f");
    let size = 24 * 1024 * 1024;
    let data: Vec<u8> = (0..size).map(|i| (i * 7 % 253) as u8).collect();
    let mut c = Conn::open(&s.url, None).await;
    let before_kib = proc_status_kib(s.pid(), "VmRSS");
    c.ok(
        "fs/writeFile",
        json!({"path": uri(&f), "dataBase64": b64(&data)}),
    )
    .await;
    let grew_kib = proc_status_kib(s.pid(), "VmHWM").saturating_sub(before_kib);
    assert!(std::fs::read(&f).unwrap() == data, "the file differs");
    assert!(
        grew_kib < 28 * 1024,
        "writing a 24 MiB file (32 MiB of base64) took {grew_kib} KiB more"
    );
    let mut bad = b64(&data).into_bytes();
    let n = bad.len();
    bad[n - 2] = b'!';
    let g = d.join("g");
    let small = c
        .call(
            "fs/writeFile",
            json!({"path": uri(&g), "dataBase64": "QU!D"}),
        )
        .await;
    let large = c
        .call(
            "fs/writeFile",
            json!({"path": uri(&g), "dataBase64": String::from_utf8(bad).unwrap()}),
        )
        .await;
    // The reference's answer to base64 that does not decode.
    assert_eq!(large["error"]["code"], -32600, "{}", large["error"]);
    assert_eq!(large["error"]["code"], small["error"]["code"]);
    assert!(large["error"]["message"]
        .as_str()
        .is_some_and(|m| m.starts_with("fs/writeFile requires valid base64 dataBase64: ")));
    assert!(!g.exists(), "a refused write created the file");
    c.ok("fs/getMetadata", json!({"path": uri(&f)})).await;
    let _ = std::fs::remove_dir_all(&d);
}

/// A request behind a streamed `fs/readFile` on the same connection waits for
/// the reading to finish (arrival order), so a write that truncates the file
/// in place cannot cut the reply short.
#[tokio::test]
async fn a_write_behind_a_streamed_read_waits_for_it() {
    let s = Server::start(&[]);
    let (d, f, data) = patterned_file("streamed-order", 20 * 1024 * 1024);
    // A second link: the write then truncates and rewrites in place.
    std::fs::hard_link(&f, d.join("link")).unwrap();
    let mut c = Conn::open(&s.url, None).await;
    let read = c.send("fs/readFile", json!({"path": uri(&f)})).await;
    let write = c
        .send(
            "fs/writeFile",
            json!({"path": uri(&f), "dataBase64": b64(b"x")}),
        )
        .await;
    let r = c.response(read).await;
    let got = unb64(&r["result"]["dataBase64"]);
    assert!(
        got == data,
        "read {} bytes, not the file as it was",
        got.len()
    );
    assert!(c.response(write).await.get("error").is_none());
    assert_eq!(std::fs::read(&f).unwrap(), b"x");
    let _ = std::fs::remove_dir_all(&d);
}

#[tokio::test]
async fn discovery_methods() {
    let s = Server::start(&[]);
    let d = tmpdir("disc");
    std::fs::create_dir_all(d.join(".codex-plugin")).unwrap();
    std::fs::write(d.join(".codex-plugin/plugin.json"), r#"{"name":"p"}"#).unwrap();
    std::fs::write(d.join("SKILL.md"), "---\nname: s\n---\nbody").unwrap();
    let mut c = Conn::open(&s.url, None).await;
    let r = c
        .ok("capabilities/discoverV2", json!({"cwd": uri(&d)}))
        .await;
    assert_eq!(r, json!({"plugins": [], "skills": [], "warnings": []}));
    let r = c.ok("capabilityRoots/discoverV1", json!({"roots": [{"id": "x", "path": uri(&d)}, {"id": "y", "path": uri(&d.join("missing"))}]})).await;
    assert_eq!(r["roots"][0]["plugin"]["manifest"]["name"], "p");
    // As the reference: the client parses the front matter itself.
    assert_eq!(
        r["roots"][0]["skills"][0]["metadata"],
        serde_json::Value::Null
    );
    assert_eq!(
        r["roots"][0]["skills"][0]["instructions"]["contents"],
        "---\nname: s\n---\nbody"
    );
    assert!(r["roots"][1]["error"].is_string());
    let r = c
        .call(
            "environmentConfig/read",
            json!({"cwd": uri(&d), "configPaths": [], "requirementsPaths": []}),
        )
        .await;
    assert_eq!(r["error"]["code"], -32602);
    let r = c
        .ok(
            "environmentConfig/read",
            json!({"cwd": uri(&d), "configPaths": [["model"]], "requirementsPaths": []}),
        )
        .await;
    assert_eq!(r["config"]["cloudInsertionIndex"], 0);
    for m in [
        "fs/rename",
        "fs/symlink",
        "capabilityRoots/discoverV2",
        "network/policyRequest",
    ] {
        let r = c.call(m, json!({})).await;
        assert_eq!(r["error"]["code"], -32601, "{m}");
    }
}

#[tokio::test]
async fn http_request_paths() {
    let (base, server_task) = http_server().await;
    let mut child = crate::common::server_command(BIN)
        .args(["--listen", "ws://127.0.0.1:0"])
        .env("MY_HEADER_SECRET", "from-env")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let s = Server {
        child,
        url: line.trim().to_string(),
    };
    let mut c = Conn::open(&s.url, None).await;
    // Buffered, ordered repeated headers, env-var header, body.
    let r = c
        .ok(
            "http/request",
            json!({"method": "POST", "url": format!("{base}/echo"), "requestId": "r1",
                   "headers": [{"name": "X-A", "value": "1"}, {"name": "X-A", "value": "2"}, {"name": "X-Env", "valueEnvVar": "MY_HEADER_SECRET"}],
                   "bodyBase64": b64(b"payload")}),
        )
        .await;
    assert_eq!(r["status"], 200);
    let echo: Value = serde_json::from_slice(&unb64(&r["bodyBase64"])).unwrap();
    assert_eq!(echo["body"], "payload");
    let hdrs: Vec<String> = echo["headers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h.as_str().unwrap().to_ascii_lowercase())
        .collect();
    let xa: Vec<&String> = hdrs.iter().filter(|h| h.starts_with("x-a:")).collect();
    assert_eq!(xa, ["x-a: 1", "x-a: 2"]);
    assert!(hdrs.contains(&"x-env: from-env".to_string()));
    let multi: Vec<&Value> = r["headers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|h| h["name"] == "x-multi")
        .collect();
    assert_eq!(multi.len(), 2);
    // Non-2xx is a normal result; redirects followed or not.
    let r = c
        .ok(
            "http/request",
            json!({"method": "GET", "url": format!("{base}/gone"), "requestId": "r2"}),
        )
        .await;
    assert_eq!(r["status"], 410);
    let r = c
        .ok(
            "http/request",
            json!({"method": "GET", "url": format!("{base}/redirect"), "requestId": "r3"}),
        )
        .await;
    assert_eq!(r["status"], 200);
    let r = c.ok("http/request", json!({"method": "GET", "url": format!("{base}/redirect"), "requestId": "r4", "redirectPolicy": "stop"})).await;
    assert_eq!(r["status"], 302);
    // Streaming: result first with an empty body, then deltas from seq 1 and a final done.
    let id = c.send("http/request", json!({"method": "GET", "url": format!("{base}/stream"), "requestId": "s1", "streamResponse": true})).await;
    let r = c.response(id).await;
    assert_eq!(
        (
            r["result"]["status"].clone(),
            r["result"]["bodyBase64"].clone()
        ),
        (json!(200), json!(""))
    );
    let mut body = Vec::new();
    let mut seq = 0;
    loop {
        let d = c
            .expect(|m| m["method"] == "http/request/bodyDelta", WAIT)
            .await
            .expect("delta");
        seq += 1;
        assert_eq!(d["params"]["seq"], json!(seq));
        body.extend(unb64(&d["params"]["deltaBase64"]));
        if d["params"]["done"] == json!(true) {
            assert!(d["params"]["error"].is_null());
            break;
        }
    }
    assert_eq!(body, b"onetwothree");
    // Errors: bad method, scheme, URL, timeout, refused.
    for (p, code) in [
        (
            json!({"method": "BAD METHOD", "url": format!("{base}/echo"), "requestId": "e1"}),
            -32602,
        ),
        (
            json!({"method": "GET", "url": "ftp://127.0.0.1/x", "requestId": "e2"}),
            -32602,
        ),
        (
            json!({"method": "GET", "url": "not a url", "requestId": "e3"}),
            -32602,
        ),
        (
            json!({"method": "GET", "url": format!("{base}/slow"), "requestId": "e4", "timeoutMs": 100}),
            -32603,
        ),
        (
            json!({"method": "GET", "url": "http://127.0.0.1:1/", "requestId": "e5"}),
            -32603,
        ),
    ] {
        assert_eq!(
            err_code(&mut c, "http/request", p.clone()).await,
            code,
            "{p}"
        );
    }
    server_task.abort();
}

#[tokio::test]
async fn fs_watch_notifies_changes_until_unwatched() {
    let s = Server::start(&[]);
    let d = tmpdir("watch");
    let mut c = Conn::open(&s.url, None).await;
    c.ok(
        "fs/watch",
        json!({"watchId": "w1", "path": uri(&d), "recursive": true}),
    )
    .await;
    assert_eq!(
        err_code(
            &mut c,
            "fs/watch",
            json!({"watchId": "w1", "path": uri(&d)})
        )
        .await,
        -32600
    );
    assert_eq!(
        err_code(
            &mut c,
            "fs/watch",
            json!({"watchId": "w2", "path": uri(&d.join("missing"))})
        )
        .await,
        -32004
    );
    std::fs::write(d.join("new.txt"), "x").unwrap();
    let target = uri(&d.join("new.txt"));
    let n = expect_fs_changed(&mut c, &target)
        .await
        .expect("fs/changed for new.txt");
    assert_eq!(n["params"]["watchId"], "w1");
    c.ok("fs/unwatch", json!({"watchId": "w1"})).await;
    // Drain what the first write produced, then check silence after unwatch.
    while c
        .expect(|m| m["method"] == "fs/changed", Duration::from_millis(200))
        .await
        .is_some()
    {}
    std::fs::write(d.join("after.txt"), "y").unwrap();
    assert!(c
        .expect(|m| m["method"] == "fs/changed", Duration::from_millis(300))
        .await
        .is_none());
}

/// `fs/watchMissing`: one `fs/missingChanged` when a missing path (or a
/// missing ancestor) appears or `present` goes; nothing for unrelated changes,
/// nothing twice; `watching: false` in the reference's cases.
#[tokio::test]
async fn watch_missing_fires_once_and_only_for_its_paths() {
    let s = Server::start(&[]);
    let d = tmpdir("watch-missing");
    std::fs::write(d.join("present"), "x").unwrap();
    std::fs::write(d.join("file"), "x").unwrap();
    let mut c = Conn::open(&s.url, None).await;
    let arm = |id: u64, missing: Vec<String>, present: Option<String>| {
        let mut p = json!({"watchId": id, "missing": missing});
        if let Some(present) = present {
            p["present"] = json!(present);
        }
        p
    };
    let fired = |m: &serde_json::Value| m["method"] == "fs/missingChanged";
    let r = c
        .ok("fs/watchMissing", arm(1, vec![uri(&d.join("a/b/c"))], None))
        .await;
    assert_eq!(r, json!({"watching": true}));
    // An unrelated change, then a second watch's trigger: watch 2's
    // notification must be the first one to arrive.
    std::fs::write(d.join("unrelated"), "x").unwrap();
    let r = c
        .ok("fs/watchMissing", arm(2, vec![uri(&d.join("two"))], None))
        .await;
    assert_eq!(r["watching"], true);
    std::fs::create_dir(d.join("two")).unwrap();
    let n = c.expect(fired, WAIT).await.expect("watch 2 fired");
    assert_eq!(n["params"], json!({"watchId": 2}));
    // A missing ancestor appearing fires watch 1, once.
    std::fs::create_dir(d.join("a")).unwrap();
    std::fs::create_dir(d.join("a/b")).unwrap();
    let n = c.expect(fired, WAIT).await.expect("watch 1 fired");
    assert_eq!(n["params"], json!({"watchId": 1}));
    // `present` going away fires; watch 1 never fires again before it.
    let r = c
        .ok(
            "fs/watchMissing",
            arm(3, vec![uri(&d.join("zz"))], Some(uri(&d.join("present")))),
        )
        .await;
    assert_eq!(r["watching"], true);
    std::fs::create_dir(d.join("a/b/c")).unwrap();
    std::fs::remove_file(d.join("present")).unwrap();
    let n = c.expect(fired, WAIT).await.expect("watch 3 fired");
    assert_eq!(n["params"], json!({"watchId": 3}));
    // watching: false, as the reference.
    let many: Vec<String> = (0..65).map(|i| uri(&d.join(format!("m{i}")))).collect();
    for (why, params) in [
        ("id used before", arm(1, vec![uri(&d.join("new1"))], None)),
        ("path exists", arm(10, vec![uri(&d.join("file"))], None)),
        ("empty list", arm(11, vec![], None)),
        ("65 paths", arm(12, many.clone(), None)),
        (
            "present missing",
            arm(13, vec![uri(&d.join("new2"))], Some(uri(&d.join("gone")))),
        ),
        ("under a file", arm(14, vec![uri(&d.join("file/x"))], None)),
        (
            "in /proc",
            arm(15, vec!["file:///proc/self/nope".into()], None),
        ),
    ] {
        let r = c.ok("fs/watchMissing", params).await;
        assert_eq!(r, json!({"watching": false}), "{why}");
    }
    let r = c
        .ok("fs/watchMissing", arm(16, many[..64].to_vec(), None))
        .await;
    assert_eq!(r["watching"], true, "64 paths are fine");
    let e = c
        .call("fs/watchMissing", json!({"watchId": "w1", "missing": []}))
        .await;
    assert_eq!(e["error"]["code"], -32602);
    let info = c.ok("environment/info", json!({})).await;
    assert_eq!(info["capabilities"]["fsWatchMissing"], true);
}

/// `prependPathDirs`: the `--prepend-path` directories that exist, and a
/// command started with that directory in front of a bare PATH finds `rg`
/// there (what the Codex client does with it).
#[tokio::test]
async fn prepend_path_dirs_are_reported_and_hold_the_tools() {
    use std::os::unix::fs::PermissionsExt;
    let tools = tmpdir("tools");
    let rg = tools.join("rg");
    std::fs::write(&rg, "#!/bin/sh\necho 'ripgrep 14.1.0'\n").unwrap();
    std::fs::set_permissions(&rg, std::fs::Permissions::from_mode(0o755)).unwrap();
    let missing = tools.join("not-there");
    let s = Server::start(&[
        "--prepend-path",
        tools.to_str().unwrap(),
        "--prepend-path",
        missing.to_str().unwrap(),
    ]);
    let mut c = Conn::open(&s.url, None).await;
    let info = c.ok("environment/info", json!({})).await;
    assert_eq!(info["prependPathDirs"], json!([uri(&tools)]));
    let path = format!("{}:/usr/bin:/bin", tools.display());
    c.ok(
        "process/start",
        json!({"processId": "rg", "argv": ["sh", "-c", "rg --version"], "cwd": uri(&tools),
               "env": {"PATH": path}, "tty": false}),
    )
    .await;
    let out = c.collect("rg", WAIT).await;
    assert_eq!(out.exit, Some(0));
    assert_eq!(String::from_utf8_lossy(&out.bytes), "ripgrep 14.1.0\n");

    // A command whose environment is the server's (what Codex sends: an
    // `envPolicy`, no PATH) finds the tool directory first on its PATH.
    c.ok(
        "process/start",
        json!({"processId": "inherit", "argv": ["sh", "-c", "command -v rg"], "cwd": uri(&tools),
               "env": {}, "tty": false,
               "envPolicy": {"inherit": "all", "ignoreDefaultExcludes": true, "exclude": [],
                             "set": {}, "includeOnly": []}}),
    )
    .await;
    let out = c.collect("inherit", WAIT).await;
    assert_eq!(
        String::from_utf8_lossy(&out.bytes),
        format!("{}\n", rg.display())
    );
}
