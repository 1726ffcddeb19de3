//! Directories bound over themselves so that nothing the view masks or
//! makes read-only can be moved away by the command.
//!
//! Why: a mount point cannot be renamed (`EBUSY`), but an ordinary directory
//! above one can, and takes it along. With `deny ws/a/secret` under the
//! writable `ws`, a command ran `mv a b`; the next start of the same policy
//! found nothing at `ws/a/secret`, hid nothing, and `cat b/secret` printed
//! it. The same moved a `read` entry, a nested `.git` and the server's own
//! hidden directories out of their masks. So every directory between such a
//! path and the writable root above it, whose parent is writable, is made a
//! mount point too: a writable bind of itself (access unchanged), placed
//! before the first mount below it so that it covers none.

use crate::plan::Mount;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Most anchors added for nested protected names (best effort, like the
/// names themselves); those of policy entries and hidden paths are always
/// added: 512.
pub const MAX_NESTED_ANCHORS: usize = 512;

/// `mounts` (in order) with the anchors inserted.
pub fn anchored(mounts: Vec<Mount>) -> Vec<Mount> {
    let points: BTreeSet<&Path> = mounts.iter().filter_map(Mount::point).collect();
    let mut required = BTreeSet::new();
    let mut nested = BTreeSet::new();
    for m in &mounts {
        let (p, set) = match m {
            Mount::ReadOnly(p) | Mount::Protect(p) | Mount::DenyDir(p) | Mount::DenyFile(p) => {
                (p, &mut required)
            }
            Mount::ProtectNested(p) => (p, &mut nested),
            Mount::Writable(_) | Mount::Symlink(..) => continue,
        };
        for a in p.ancestors().skip(1) {
            let Some(parent) = a.parent() else {
                break;
            };
            if !points.contains(a) && writable(&mounts, parent) {
                set.insert(a.to_path_buf());
            }
        }
    }
    let extra: Vec<PathBuf> = nested
        .into_iter()
        .filter(|a| !required.contains(a))
        .take(MAX_NESTED_ANCHORS)
        .collect();
    let mut anchors: Vec<PathBuf> = required.into_iter().chain(extra).collect();
    anchors.sort_by_key(|a| a.components().count());
    let mut out = mounts;
    for a in anchors {
        let at = out
            .iter()
            .position(|m| m.point().is_some_and(|p| p != a && p.starts_with(&a)))
            .unwrap_or(out.len());
        out.insert(at, Mount::Writable(a));
    }
    out
}

/// Whether `dir` is writable in the view: the deepest mount holding it is
/// a writable bind.
fn writable(mounts: &[Mount], dir: &Path) -> bool {
    mounts
        .iter()
        .filter_map(|m| m.point().filter(|p| dir.starts_with(p)).map(|p| (p, m)))
        .max_by_key(|(p, _)| p.components().count())
        .is_some_and(|(_, m)| matches!(m, Mount::Writable(_)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_movable_directory_above_a_mask_is_anchored_before_it() {
        let ws = PathBuf::from("/w");
        let mounts = vec![
            Mount::Writable(ws.clone()),
            Mount::ReadOnly(ws.join("r")),
            Mount::ReadOnly(ws.join("r/x/y")),
            Mount::DenyFile(ws.join("a/b/secret")),
            Mount::Protect(ws.join(".git")),
        ];
        let out = anchored(mounts);
        assert_eq!(
            out,
            vec![
                Mount::Writable(ws.clone()),
                Mount::ReadOnly(ws.join("r")),
                // `r/x` lies in the read-only `r`: it cannot be moved.
                Mount::ReadOnly(ws.join("r/x/y")),
                Mount::Writable(ws.join("a")),
                Mount::Writable(ws.join("a/b")),
                Mount::DenyFile(ws.join("a/b/secret")),
                Mount::Protect(ws.join(".git")),
            ]
        );
        // Nothing above a writable root, nor in a read-only view.
        let ro = vec![Mount::ReadOnly(ws.clone()), Mount::DenyFile(ws.join("a/s"))];
        assert_eq!(anchored(ro.clone()), ro);
    }
}
