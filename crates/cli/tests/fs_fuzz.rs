//! Random `fs/*` sequences over a tree full of symlinks (to outside, to
//! itself, dangling), hard links, loops and a deep chain, against the real
//! binary. The invariant: a tree outside the arena, reachable only through
//! symlinks, never changes byte for byte, and the server keeps answering.
//!
//! Mutating calls use `followSymlinks: false` where the method has it; copy
//! destinations are checked on the host to have no symlink on the way (a
//! followed ancestor link is the named path, not an escape).
//! `FS_FUZZ_OPS` and `FS_FUZZ_SEED` change the run (the seed is printed).

use crate::common;
use common::*;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn flip(&mut self) -> bool {
        self.next() & 1 == 1
    }
}

fn build(d: &Path) -> (PathBuf, PathBuf) {
    let outside = d.join("outside");
    let arena = d.join("arena");
    std::fs::create_dir_all(outside.join("sub/deeper")).unwrap();
    std::fs::write(outside.join("secret.txt"), b"secret").unwrap();
    std::fs::write(outside.join("sub/deeper/key"), b"key").unwrap();
    std::fs::create_dir_all(arena.join("dir/inner")).unwrap();
    std::fs::write(arena.join("file"), b"file").unwrap();
    std::fs::write(arena.join("dir/inner/f"), b"f").unwrap();
    std::fs::hard_link(arena.join("file"), arena.join("dir/hard")).unwrap();
    let link = |target: &Path, name: &str| {
        std::os::unix::fs::symlink(target, arena.join(name)).unwrap();
    };
    link(&outside, "out_dir");
    link(&outside.join("secret.txt"), "out_file");
    link(&outside.join("missing"), "dangling");
    link(&arena, "loop");
    link(&arena.join("dir"), "dir/up");
    link(Path::new("../../outside/sub"), "dir/rel_out");
    // A chain 2000 levels deep.
    let mut chain = arena.join("chain");
    for _ in 0..40 {
        chain = chain.join("c/c/c/c/c/c/c/c/c/c/c/c/c/c/c/c/c/c/c/c/c/c/c/c/c/c/c/c/c/c/c/c/c/c/c/c/c/c/c/c/c/c/c/c/c/c/c/c/c/c");
    }
    std::fs::create_dir_all(&chain).unwrap();
    (outside, arena)
}

/// Names to build paths from: existing entries, link names, and new ones.
const NAMES: &[&str] = &[
    "dir",
    "inner",
    "f",
    "file",
    "hard",
    "out_dir",
    "out_file",
    "dangling",
    "loop",
    "up",
    "rel_out",
    "chain",
    "c",
    "new",
    "x",
    "secret.txt",
    "sub",
    "deeper",
    "key",
    ".",
];

fn random_path(rng: &mut Rng, arena: &Path) -> (PathBuf, String) {
    let mut p = arena.to_path_buf();
    for _ in 0..rng.below(5) {
        p.push(NAMES[rng.below(NAMES.len())]);
    }
    let mut text = uri(&p);
    if rng.below(4) == 0 {
        text.push('/');
    }
    (p, text)
}

/// True when no component of `p` below `arena` is a symlink (on the host).
fn link_free(p: &Path, arena: &Path) -> bool {
    let mut cur = arena.to_path_buf();
    let Ok(rest) = p.strip_prefix(arena) else {
        return false;
    };
    for c in rest.components() {
        cur.push(c);
        if std::fs::symlink_metadata(&cur).is_ok_and(|m| m.file_type().is_symlink()) {
            return false;
        }
    }
    true
}

fn request(rng: &mut Rng, arena: &Path) -> Option<(&'static str, Value)> {
    let (p, u) = random_path(rng, arena);
    let walk = json!({"maxDepth": 8, "maxDirectories": 100, "maxEntries": 500, "followDirectorySymlinks": rng.flip()});
    Some(match rng.below(11) {
        0 => (
            "fs/writeFile",
            json!({"path": u, "dataBase64": b64(b"fuzz"), "followSymlinks": false}),
        ),
        1 => (
            "fs/createDirectory",
            json!({"path": u, "recursive": rng.flip(), "followSymlinks": false}),
        ),
        2 => (
            "fs/remove",
            json!({"path": u, "recursive": rng.flip(), "force": rng.flip(), "followSymlinks": false}),
        ),
        3 | 4 => {
            let (dst, dst_uri) = random_path(rng, arena);
            if !link_free(&dst, arena) {
                return None;
            }
            (
                "fs/copy",
                json!({"sourcePath": u, "destinationPath": dst_uri, "recursive": rng.flip()}),
            )
        }
        5 => ("fs/readFile", json!({"path": u})),
        6 => (
            "fs/getMetadata",
            json!({"path": u, "followSymlinks": rng.flip()}),
        ),
        7 => ("fs/readDirectory", json!({"path": u})),
        8 => ("fs/walk", json!({"path": u, "options": walk})),
        9 => ("fs/canonicalize", json!({"path": u})),
        _ => {
            if !link_free(&p, arena) {
                return None;
            }
            (
                "fs/open",
                json!({"path": u, "handleId": format!("h{}", rng.next()), "mode": if rng.flip() { "read" } else { "replace" }}),
            )
        }
    })
}

#[tokio::test]
async fn random_fs_sequences_never_touch_anything_outside() {
    let ops: usize = std::env::var("FS_FUZZ_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(600);
    let seed: u64 = std::env::var("FS_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| 0x9E37_79B9_7F4A_7C15 ^ u64::from(std::process::id()));
    eprintln!("fs fuzz: {ops} operations, FS_FUZZ_SEED={seed}");
    let s = Server::start(&[]);
    let d = tmpdir("fsfuzz");
    let (outside, arena) = build(&d);
    let before = snapshot(&outside);
    let mut rng = Rng(seed | 1);
    let mut c = Conn::open(&s.url, None).await;
    let mut done = 0;
    let mut errors = 0;
    while done < ops {
        let Some((method, params)) = request(&mut rng, &arena) else {
            continue;
        };
        let r = c.call(method, params.clone()).await;
        assert!(
            r.get("result").is_some() || r.get("error").is_some(),
            "seed {seed}: {method} {params} → {r}"
        );
        if r.get("error").is_some() {
            errors += 1;
        }
        if method == "fs/open" && r.get("result").is_some() {
            c.ok("fs/close", json!({"handleId": params["handleId"]}))
                .await;
        }
        assert_eq!(
            snapshot(&outside),
            before,
            "seed {seed}: {method} {params} changed the outside tree"
        );
        done += 1;
        if !arena.exists() {
            std::fs::remove_dir_all(&outside).unwrap();
            let _ = std::fs::remove_dir_all(&arena);
            build(&d);
        }
    }
    eprintln!("fs fuzz: {done} operations, {errors} answered with an error");
    assert!(
        errors < done,
        "every call failed: the fuzzer is not exercising anything"
    );
    c.ok("environment/info", json!({})).await;
    std::fs::remove_dir_all(&d).unwrap();
}
