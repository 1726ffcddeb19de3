//! `fs/walk`: breadth-first, names sorted, root not listed, bounded by WalkOptions.

use crate::error::{ExecError, ExecResult};
use exec_server_protocol::types::{WalkEntry, WalkEntryKind, WalkError, WalkOptions, WalkResponse};
use exec_server_protocol::PathUri;
use std::collections::{HashSet, VecDeque};
use std::path::{Path, PathBuf};

/// Largest `maxDepth` accepted: 64.
pub const MAX_WALK_DEPTH: u64 = 64;
/// Largest `maxDirectories` accepted: 10 000.
pub const MAX_WALK_DIRECTORIES: u64 = 10_000;
/// Largest `maxEntries` accepted: 50 000.
pub const MAX_WALK_ENTRIES: u64 = 50_000;

/// Walks `root`. Errors: `InvalidInput` for limits of zero or above the maximums;
/// `NotFound` or `Io` when the root itself cannot be read. Entries that cannot be read below
/// the root become `errors`.
pub fn walk(root: &Path, o: &WalkOptions) -> ExecResult<WalkResponse> {
    if o.max_depth == 0 || o.max_directories == 0 || o.max_entries == 0 {
        return Err(ExecError::invalid_input(
            "filesystem walk limits must be greater than zero",
        ));
    }
    if o.max_depth > MAX_WALK_DEPTH
        || o.max_directories > MAX_WALK_DIRECTORIES
        || o.max_entries > MAX_WALK_ENTRIES
    {
        return Err(ExecError::invalid_input(format!(
            "filesystem walk limits exceed maximums: depth={MAX_WALK_DEPTH}, directories={MAX_WALK_DIRECTORIES}, entries={MAX_WALK_ENTRIES}"
        )));
    }
    let meta = std::fs::metadata(root).map_err(ExecError::io)?;
    if !meta.is_dir() {
        // A file has nothing below it: an empty walk, as the reference answers.
        return Ok(WalkResponse {
            entries: Vec::new(),
            errors: Vec::new(),
            truncated: false,
        });
    }
    let mut out = WalkResponse {
        entries: Vec::new(),
        errors: Vec::new(),
        truncated: false,
    };
    let mut visited: HashSet<PathBuf> = HashSet::new();
    if let Ok(c) = std::fs::canonicalize(root) {
        visited.insert(c);
    }
    let mut queue: VecDeque<(PathBuf, u64)> = VecDeque::from([(root.to_path_buf(), 1)]);
    let mut dirs_read = 0u64;
    while let Some((dir, depth)) = queue.pop_front() {
        if dirs_read >= o.max_directories {
            out.truncated = true;
            break;
        }
        dirs_read += 1;
        let mut names: Vec<_> = match std::fs::read_dir(&dir) {
            Ok(rd) => rd.filter_map(|e| e.ok()).map(|e| e.file_name()).collect(),
            Err(e) => {
                if let Some(path) = PathUri::from_path(&dir) {
                    out.errors.push(WalkError {
                        path,
                        message: e.to_string(),
                    });
                }
                continue;
            }
        };
        names.sort();
        for name in names {
            let path = dir.join(&name);
            let Ok(lmeta) = std::fs::symlink_metadata(&path) else {
                continue;
            };
            let is_link = lmeta.file_type().is_symlink();
            let kind = if is_link {
                match std::fs::metadata(&path) {
                    Ok(m) if m.is_dir() && o.follow_directory_symlinks => WalkEntryKind::Directory,
                    _ => continue, // symlinks to files, dangling links: not listed
                }
            } else if lmeta.is_dir() {
                WalkEntryKind::Directory
            } else if lmeta.is_file() {
                WalkEntryKind::File
            } else {
                continue;
            };
            if out.entries.len() as u64 >= o.max_entries {
                out.truncated = true;
                return Ok(out);
            }
            let Some(uri) = PathUri::from_path(&path) else {
                continue;
            };
            out.entries.push(WalkEntry { path: uri, kind });
            if kind == WalkEntryKind::Directory && depth < o.max_depth {
                let canonical = std::fs::canonicalize(&path).unwrap_or_else(|_| path.clone());
                if visited.insert(canonical) {
                    queue.push_back((path, depth + 1));
                }
            } else if kind == WalkEntryKind::Directory && has_children(&path) {
                out.truncated = true;
            }
        }
    }
    if !queue.is_empty() {
        out.truncated = true;
    }
    Ok(out)
}

fn has_children(dir: &Path) -> bool {
    std::fs::read_dir(dir)
        .map(|mut r| r.next().is_some())
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(depth: u64, dirs: u64, entries: u64) -> WalkOptions {
        WalkOptions {
            max_depth: depth,
            max_directories: dirs,
            max_entries: entries,
            follow_directory_symlinks: false,
        }
    }

    #[test]
    fn breadth_first_sorted_and_bounded() {
        let tmp = std::env::temp_dir().join(format!("walk-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(tmp.join("b/deep")).unwrap();
        std::fs::write(tmp.join("a.txt"), "x").unwrap();
        std::fs::write(tmp.join("b/deep/f"), "x").unwrap();
        std::os::unix::fs::symlink(tmp.join("a.txt"), tmp.join("link")).unwrap();
        let r = walk(&tmp, &opts(5, 10, 10)).unwrap();
        let names: Vec<_> = r
            .entries
            .iter()
            .map(|e| e.path.as_str().rsplit('/').next().unwrap().to_string())
            .collect();
        assert_eq!(names, ["a.txt", "b", "deep", "f"]);
        assert!(!r.truncated);
        let r = walk(&tmp, &opts(5, 10, 1)).unwrap();
        assert_eq!(r.entries.len(), 1);
        assert!(r.truncated);
        let r = walk(&tmp, &opts(1, 10, 10)).unwrap();
        assert_eq!(r.entries.len(), 2);
        assert!(r.truncated, "depth cut the walk");
        use crate::error::ErrorKind;
        assert_eq!(
            walk(&tmp, &opts(0, 1, 1)).unwrap_err().kind(),
            ErrorKind::InvalidInput
        );
        assert_eq!(
            walk(&tmp, &opts(65, 1, 1)).unwrap_err().kind(),
            ErrorKind::InvalidInput
        );
        assert_eq!(
            walk(&tmp.join("missing"), &opts(1, 1, 1))
                .unwrap_err()
                .kind(),
            ErrorKind::NotFound
        );
        std::fs::remove_dir_all(&tmp).unwrap();
    }
}
