//! Gives the crate an id of its sources (`EXEC_SERVER_SANDBOX_SOURCE_ID`),
//! so that a server uses a separate inner-stage program only when it was
//! built from the same sandbox code as itself (see `src/inner_program.rs`).

use std::path::Path;

/// FNV-1a, 64 bits: no dependency, and collisions between two builds of
/// one crate are not a concern.
fn fnv(hash: &mut u64, bytes: &[u8]) {
    for b in bytes {
        *hash ^= u64::from(*b);
        *hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
}

fn visit(dir: &Path, hash: &mut u64) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut paths: Vec<_> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    paths.sort();
    for p in paths {
        if p.is_dir() {
            visit(&p, hash);
        } else if let Ok(bytes) = std::fs::read(&p) {
            fnv(
                hash,
                p.to_string_lossy()
                    .rsplit("src")
                    .next()
                    .unwrap_or("")
                    .as_bytes(),
            );
            fnv(hash, &bytes);
        }
    }
}

fn main() {
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-changed=Cargo.toml");
    let mut hash = 0xcbf2_9ce4_8422_2325u64;
    fnv(&mut hash, env!("CARGO_PKG_VERSION").as_bytes());
    visit(Path::new("src"), &mut hash);
    println!("cargo:rustc-env=EXEC_SERVER_SANDBOX_SOURCE_ID={hash:016x}");
}
