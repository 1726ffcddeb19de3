//! File-system safety (issue 19): every fs method acts on the path it was given
//! and nothing else. Each test builds a tree in a temp dir it owns, drives the
//! real binary, and checks the host afterwards.

use crate::common;
use common::*;
use nix::fcntl::{openat, OFlag};
use nix::sys::stat::{mkdirat, Mode};
use serde_json::{json, Value};
use std::os::fd::OwnedFd;
use std::path::Path;
use std::time::Duration;

/// A call that may take long on a loaded machine (deep trees): 120 s.
async fn slow_call(c: &mut Conn, method: &str, params: Value) -> Value {
    let id = c.send(method, params).await;
    c.expect(|m| m["id"] == json!(id), Duration::from_secs(120))
        .await
        .unwrap_or_else(|| panic!("{method}: no response within 120 s"))
}

async fn slow_ok(c: &mut Conn, method: &str, params: Value) -> Value {
    let r = slow_call(c, method, params).await;
    assert!(r.get("error").is_none(), "{method} failed: {r}");
    r["result"].clone()
}

fn code(r: &Value) -> i64 {
    r["error"]["code"]
        .as_i64()
        .unwrap_or_else(|| panic!("expected an error, got {r}"))
}

fn victim(dir: &Path) -> Vec<String> {
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    std::fs::write(dir.join("keep.txt"), b"precious").unwrap();
    std::fs::write(dir.join("sub/inner.bin"), [0u8, 1, 2, 255]).unwrap();
    snapshot(dir)
}

#[tokio::test]
async fn removing_a_symlink_with_a_trailing_slash_removes_only_the_link() {
    let s = Server::start(&[]);
    let d = tmpdir("rmslash");
    let before = victim(&d.join("victim"));
    std::fs::create_dir(d.join("work")).unwrap();
    let mut c = Conn::open(&s.url, None).await;
    for (i, extra) in [
        json!({}),
        json!({"recursive": true}),
        json!({"recursive": false}),
    ]
    .into_iter()
    .enumerate()
    {
        let link = d.join(format!("work/link{i}"));
        std::os::unix::fs::symlink(d.join("victim"), &link).unwrap();
        let mut params = json!({"path": format!("{}/", uri(&link))});
        params
            .as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        c.ok("fs/remove", params).await;
        assert!(
            std::fs::symlink_metadata(&link).is_err(),
            "the link is gone"
        );
        assert_eq!(snapshot(&d.join("victim")), before, "the target survives");
    }
    // `/` itself is refused, as the reference refuses it.
    let r = c
        .call("fs/remove", json!({"path": "file:///", "force": true}))
        .await;
    assert_eq!(code(&r), -32600);
    std::fs::remove_dir_all(&d).unwrap();
}

#[tokio::test]
async fn follow_symlinks_false_never_goes_through_a_link() {
    let s = Server::start(&[]);
    let d = tmpdir("nofollow");
    std::fs::create_dir_all(d.join("w")).unwrap();
    std::fs::write(d.join("w/secret.txt"), b"secret").unwrap();
    std::os::unix::fs::symlink("secret.txt", d.join("w/innocent.txt")).unwrap();
    let before_outside = victim(&d.join("outside"));
    std::os::unix::fs::symlink(d.join("outside"), d.join("w/dirlink")).unwrap();
    let mut c = Conn::open(&s.url, None).await;
    let u = |p: &str| uri(&d.join(p));

    let r = c
        .call(
            "fs/writeFile",
            json!({"path": u("w/innocent.txt"), "dataBase64": b64(b"x"), "followSymlinks": false}),
        )
        .await;
    assert_eq!(code(&r), -32603, "{r}");
    let r = c
        .call(
            "fs/readFile",
            json!({"path": u("w/innocent.txt"), "followSymlinks": false}),
        )
        .await;
    assert_eq!(code(&r), -32603, "{r}");
    for method_params in [
        (
            "fs/createDirectory",
            json!({"path": u("w/dirlink/made"), "followSymlinks": false}),
        ),
        (
            "fs/writeFile",
            json!({"path": u("w/dirlink/new"), "dataBase64": b64(b"x"), "followSymlinks": false}),
        ),
        (
            "fs/readFile",
            json!({"path": u("w/dirlink/keep.txt"), "followSymlinks": false}),
        ),
        (
            "fs/getMetadata",
            json!({"path": u("w/dirlink/keep.txt"), "followSymlinks": false}),
        ),
        (
            "fs/remove",
            json!({"path": u("w/dirlink/keep.txt"), "followSymlinks": false}),
        ),
        (
            "fs/createDirectory",
            json!({"path": u("w/dirlink"), "followSymlinks": false}),
        ),
    ] {
        let r = c.call(method_params.0, method_params.1.clone()).await;
        assert_eq!(code(&r), -32603, "{method_params:?} → {r}");
        assert_eq!(r["error"]["message"], "Not a directory (os error 20)");
    }
    assert_eq!(std::fs::read(d.join("w/secret.txt")).unwrap(), b"secret");
    assert_eq!(snapshot(&d.join("outside")), before_outside);
    // The defaults still follow, as before.
    let r = c
        .ok("fs/readFile", json!({"path": u("w/innocent.txt")}))
        .await;
    assert_eq!(unb64(&r["dataBase64"]), b"secret");
    std::fs::remove_dir_all(&d).unwrap();
}

#[tokio::test]
async fn copy_into_itself_is_refused_through_any_alias() {
    let s = Server::start(&[]);
    let d = tmpdir("copyself");
    let before = victim(&d.join("proj"));
    std::os::unix::fs::symlink(d.join("proj"), d.join("alias")).unwrap();
    std::os::unix::fs::symlink(d.join("proj/sub"), d.join("sublink")).unwrap();
    let mut c = Conn::open(&s.url, None).await;
    let u = |p: &str| uri(&d.join(p));
    for (src, dst) in [
        (u("proj"), u("alias/backup")),
        (u("proj"), u("sublink/backup")),
        (u("alias"), u("proj/sub/backup")),
        (u("proj"), u("proj")),
        (u("proj"), u("alias")),
    ] {
        let src = if src.ends_with("alias") {
            format!("{src}/")
        } else {
            src
        };
        let r = c
            .call(
                "fs/copy",
                json!({"sourcePath": src, "destinationPath": dst, "recursive": true}),
            )
            .await;
        // `alias/` is the link itself (as in the reference): it is copied as a
        // link, which is harmless; everything else is refused.
        if r.get("error").is_some() {
            assert_eq!(code(&r), -32600, "{src} → {dst}: {r}");
            assert_eq!(
                r["error"]["message"],
                "fs/copy cannot copy a directory to itself or one of its descendants"
            );
        } else {
            let copied = d.join("proj/sub/backup");
            assert!(std::fs::symlink_metadata(&copied)
                .unwrap()
                .file_type()
                .is_symlink());
            std::fs::remove_file(copied).unwrap();
        }
        assert_eq!(snapshot(&d.join("proj")), before, "{src} → {dst}");
    }
    // A real copy elsewhere still works and is exact.
    c.ok(
        "fs/copy",
        json!({"sourcePath": u("proj"), "destinationPath": u("copy"), "recursive": true}),
    )
    .await;
    assert_eq!(snapshot(&d.join("copy")), before);
    std::fs::remove_dir_all(&d).unwrap();
}

#[tokio::test]
async fn copy_onto_a_hard_link_of_its_source_keeps_the_bytes() {
    let s = Server::start(&[]);
    let d = tmpdir("hardlink");
    std::fs::write(d.join("h1"), b"hello hard link").unwrap();
    std::fs::hard_link(d.join("h1"), d.join("h2")).unwrap();
    let mut c = Conn::open(&s.url, None).await;
    for (a, b) in [("h1", "h2"), ("h1", "h1"), ("h2", "h1")] {
        let r = c
            .call(
                "fs/copy",
                json!({"sourcePath": uri(&d.join(a)), "destinationPath": uri(&d.join(b)), "recursive": false}),
            )
            .await;
        assert_eq!(code(&r), -32600, "{a} → {b}: {r}");
        assert_eq!(std::fs::read(d.join("h1")).unwrap(), b"hello hard link");
    }
    std::fs::remove_dir_all(&d).unwrap();
}

/// Creates `levels` nested directories `a/a/…` under `root` with descriptors
/// (the path is far beyond PATH_MAX), returning the deepest one.
fn deep_chain(root: &Path, levels: usize) -> OwnedFd {
    let mut dir =
        nix::fcntl::open(root, OFlag::O_RDONLY | OFlag::O_DIRECTORY, Mode::empty()).unwrap();
    for _ in 0..levels {
        mkdirat(&dir, "a", Mode::from_bits_truncate(0o755)).unwrap();
        dir = openat(
            &dir,
            "a",
            OFlag::O_RDONLY | OFlag::O_DIRECTORY,
            Mode::empty(),
        )
        .unwrap();
    }
    dir
}

#[tokio::test]
async fn a_hundred_thousand_levels_deep_tree_in_every_fs_method() {
    const LEVELS: usize = 100_000;
    let s = Server::start(&[]);
    // On tmpfs where there is one: deleting 100 000 directories on this
    // machine's ext4 (mounted with `discard`) takes minutes of I/O, on tmpfs
    // about a second; the server's code path is the same.
    let shm = Path::new("/dev/shm");
    let d = if shm.is_dir() {
        let d = shm.join(format!("es-test-deep-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    } else {
        tmpdir("deep")
    };
    std::fs::create_dir(d.join("t")).unwrap();
    let deepest = deep_chain(&d.join("t"), LEVELS);
    nix::unistd::write(
        openat(
            &deepest,
            "f",
            OFlag::O_WRONLY | OFlag::O_CREAT,
            Mode::from_bits_truncate(0o644),
        )
        .unwrap(),
        b"bottom",
    )
    .unwrap();
    drop(deepest);
    let deep_path = format!("{}{}", uri(&d.join("t")), "/a".repeat(LEVELS));
    let mut c = Conn::open(&s.url, None).await;
    let top = uri(&d.join("t"));
    let walk_opts = json!({"maxDepth": 64, "maxDirectories": 10000, "maxEntries": 50000, "followDirectorySymlinks": false});
    let calls = [
        ("fs/readFile", json!({"path": format!("{deep_path}/f")})),
        (
            "fs/writeFile",
            json!({"path": format!("{deep_path}/g"), "dataBase64": b64(b"x")}),
        ),
        (
            "fs/createDirectory",
            json!({"path": format!("{deep_path}/new/er")}),
        ),
        ("fs/getMetadata", json!({"path": format!("{deep_path}/f")})),
        ("fs/canonicalize", json!({"path": deep_path.clone()})),
        ("fs/readDirectory", json!({"path": deep_path.clone()})),
        (
            "fs/walk",
            json!({"path": top.clone(), "options": walk_opts}),
        ),
        (
            "fs/open",
            json!({"path": format!("{deep_path}/f"), "handleId": "deep"}),
        ),
        (
            "fs/copy",
            json!({"sourcePath": top.clone(), "destinationPath": uri(&d.join("copy")), "recursive": true}),
        ),
    ];
    for (method, params) in calls {
        let r = slow_call(&mut c, method, params).await;
        assert!(
            r.get("result").is_some() || r.get("error").is_some(),
            "{method}: {r}"
        );
    }
    // The deep file was read through the long path, and the copy is complete.
    let r = slow_ok(
        &mut c,
        "fs/readFile",
        json!({"path": format!("{deep_path}/f")}),
    )
    .await;
    assert_eq!(unb64(&r["dataBase64"]), b"bottom");
    let copied = format!("{}{}/f", uri(&d.join("copy")), "/a".repeat(LEVELS));
    let r = slow_ok(&mut c, "fs/readFile", json!({"path": copied})).await;
    assert_eq!(unb64(&r["dataBase64"]), b"bottom");
    // An open handle pins the dentries above its file: removing the tree while
    // it is open is quadratic in the kernel (for `rm -rf` too), so close it.
    c.ok("fs/close", json!({"handleId": "deep"})).await;
    for tree in ["t", "copy"] {
        slow_ok(&mut c, "fs/remove", json!({"path": uri(&d.join(tree))})).await;
        assert!(!d.join(tree).exists(), "{tree} removed");
    }
    // Still serving, still the same process.
    c.ok("environment/info", json!({})).await;
    assert!(std::fs::read_dir(format!("/proc/{}", s.pid())).is_ok());
    std::fs::remove_dir_all(&d).unwrap();
}

#[tokio::test]
async fn write_file_is_atomic_and_keeps_permissions() {
    use std::os::unix::fs::PermissionsExt;
    let s = Server::start(&[]);
    let d = tmpdir("atomic");
    let f = d.join("data");
    let a = vec![b'a'; 1 << 20];
    let b = vec![b'b'; 1 << 20];
    std::fs::write(&f, &a).unwrap();
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o640)).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (f, stop) = (f.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut torn = 0;
            let mut reads = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && reads < 1_000_000 {
                let data = std::fs::read(&f).unwrap();
                reads += 1;
                let whole = data.len() == 1 << 20
                    && (data.iter().all(|&x| x == b'a') || data.iter().all(|&x| x == b'b'));
                if !whole {
                    torn += 1;
                }
            }
            (reads, torn)
        })
    };
    let mut c = Conn::open(&s.url, None).await;
    for i in 0..40 {
        let data = if i % 2 == 0 { &b } else { &a };
        c.ok(
            "fs/writeFile",
            json!({"path": uri(&f), "dataBase64": b64(data)}),
        )
        .await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (reads, torn) = reader.join().unwrap();
    assert!(reads > 0);
    assert_eq!(torn, 0, "{torn} of {reads} reads saw a partial file");
    assert_eq!(
        std::fs::metadata(&f).unwrap().permissions().mode() & 0o777,
        0o640
    );
    let names: Vec<_> = std::fs::read_dir(&d)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        names,
        vec![std::ffi::OsString::from("data")],
        "no temporary file left"
    );
    std::fs::remove_dir_all(&d).unwrap();
}

/// Opens `f` for a replace upload (handle `u`) and writes `data` at offset 0.
async fn start_upload(c: &mut Conn, f: &Path, data: &[u8]) {
    c.ok(
        "fs/open",
        json!({"handleId": "u", "path": uri(f), "mode": "replace"}),
    )
    .await;
    c.ok(
        "fs/writeBlock",
        json!({"handleId": "u", "offset": 0, "chunk": b64(data)}),
    )
    .await;
}

#[tokio::test]
async fn an_interrupted_replace_upload_leaves_the_old_file() {
    let s = Server::start(&[]);
    let d = tmpdir("upload");
    let f = d.join("target.bin");
    std::fs::write(&f, b"old content").unwrap();
    let mut c = Conn::open(&s.url, None).await;
    start_upload(&mut c, &f, b"new par").await;
    assert_eq!(
        std::fs::read(&f).unwrap(),
        b"old content",
        "untouched until close"
    );
    c.close().await;
    // The server drops the handle when it sees the disconnect: no temp file stays.
    let only_target = || std::fs::read_dir(&d).unwrap().count() == 1;
    assert!(eventually(Duration::from_secs(10), only_target).await);
    assert_eq!(std::fs::read(&f).unwrap(), b"old content");
    // A completed upload replaces it on fs/close.
    let mut c = Conn::open(&s.url, None).await;
    start_upload(&mut c, &f, b"new content").await;
    c.ok("fs/close", json!({"handleId": "u"})).await;
    assert_eq!(std::fs::read(&f).unwrap(), b"new content");
    assert!(only_target());
    std::fs::remove_dir_all(&d).unwrap();
}
