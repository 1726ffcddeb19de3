//! Expanding a glob entry into the paths it names now.
//!
//! The `glob` crate was not reachable from this build environment, so this is a
//! deliberately small matcher: `*` and `?` within one component, `**` as any
//! number of components, no character classes (a `[` is literal). Expansion is
//! bounded by [`MAX_GLOB_MATCHES`] matches and [`MAX_GLOB_VISITS`] visited
//! entries; symlinked directories are not descended.

use crate::MAX_GLOB_MATCHES;
use std::path::{Path, PathBuf};

/// Most directory entries one expansion visits: 50 000.
pub const MAX_GLOB_VISITS: usize = 50_000;

/// True if `name` matches `pattern` (`*` any run, `?` one character).
pub fn matches(pattern: &str, name: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let n: Vec<char> = name.chars().collect();
    let (mut pi, mut ni, mut star, mut mark) = (0, 0, None, 0);
    while ni < n.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == n[ni]) {
            pi += 1;
            ni += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ni;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ni = mark;
        } else {
            return false;
        }
    }
    while pi < p.len() && p[pi] == '*' {
        pi += 1;
    }
    pi == p.len()
}

/// The existing paths matching the absolute `pattern`.
pub fn expand(pattern: &str) -> Vec<PathBuf> {
    let parts: Vec<&str> = pattern.split('/').filter(|s| !s.is_empty()).collect();
    let mut out = Vec::new();
    let mut budget = MAX_GLOB_VISITS;
    walk(Path::new("/"), &parts, &mut out, &mut budget);
    out
}

fn is_literal(s: &str) -> bool {
    !s.contains(['*', '?'])
}

fn walk(base: &Path, parts: &[&str], out: &mut Vec<PathBuf>, budget: &mut usize) {
    if out.len() >= MAX_GLOB_MATCHES || *budget == 0 {
        return;
    }
    let Some((first, rest)) = parts.split_first() else {
        if base.symlink_metadata().is_ok() {
            out.push(base.to_path_buf());
        }
        return;
    };
    if *first == "**" {
        // Zero components, then one more level with `**` still pending.
        walk(base, rest, out, budget);
        for child in children(base, budget) {
            if child.symlink_metadata().is_ok_and(|m| m.is_dir()) {
                walk(&child, parts, out, budget);
            }
        }
        return;
    }
    if is_literal(first) {
        walk(&base.join(first), rest, out, budget);
        return;
    }
    for child in children(base, budget) {
        let name = child.file_name().map(|n| n.to_string_lossy().into_owned());
        if name.is_some_and(|n| matches(first, &n)) {
            walk(&child, rest, out, budget);
        }
    }
}

fn children(dir: &Path, budget: &mut usize) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut v = Vec::new();
    for e in rd.flatten() {
        if *budget == 0 {
            break;
        }
        *budget -= 1;
        v.push(e.path());
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expands_stars_and_double_stars() {
        let d = std::env::temp_dir().join(format!("sbx-glob-{}", std::process::id()));
        std::fs::create_dir_all(d.join("a/b")).unwrap();
        std::fs::write(d.join("x.env"), "").unwrap();
        std::fs::write(d.join("a/b/y.env"), "").unwrap();
        std::fs::write(d.join("a/z.txt"), "").unwrap();
        let mut got = expand(&format!("{}/**/*.env", d.display()));
        got.sort();
        assert_eq!(got, vec![d.join("a/b/y.env"), d.join("x.env")]);
        assert_eq!(
            expand(&format!("{}/a/?.txt", d.display())),
            vec![d.join("a/z.txt")]
        );
        std::fs::remove_dir_all(&d).unwrap();
    }
}
