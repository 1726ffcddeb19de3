//! Why a child could not start, told apart for the client: a missing working
//! directory, a missing program, a program that cannot be executed. The OS
//! error travels inside a [`std::io::Error`] (what [`super::spawn::start`]
//! returns) and becomes an [`ExecError`] of the matching kind, its message
//! still the OS text the reference sends.

use crate::error::{ErrorKind, ExecError};
use std::path::{Path, PathBuf};

/// Which step of starting a child failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Checking the working directory.
    Cwd,
    /// Finding or executing the program.
    Program,
}

/// An OS error at a [`Stage`], about `path`.
#[derive(Debug)]
struct Tagged {
    stage: Stage,
    path: PathBuf,
    source: std::io::Error,
}

impl std::fmt::Display for Tagged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The reference's text: the OS error alone.
        self.source.fmt(f)
    }
}

impl std::error::Error for Tagged {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// `err` marked as failing at `stage` about `path` (same kind and text).
pub fn tag(stage: Stage, path: &Path, err: std::io::Error) -> std::io::Error {
    std::io::Error::new(
        err.kind(),
        Tagged {
            stage,
            path: path.to_path_buf(),
            source: err,
        },
    )
}

/// The domain error for a failed start: [`ErrorKind::CwdNotFound`],
/// [`ErrorKind::ProgramNotFound`], [`ErrorKind::NotExecutable`],
/// [`ErrorKind::PermissionDenied`] (a cwd that cannot be entered) for tagged
/// OS errors, else [`ErrorKind::SpawnFailed`]. The message is the OS text.
pub fn classify(err: std::io::Error) -> ExecError {
    let message = err.to_string();
    if !err.get_ref().is_some_and(|e| e.is::<Tagged>()) {
        return ExecError::new(ErrorKind::SpawnFailed, message).with_source(err);
    }
    let Some(Ok(t)) = err.into_inner().map(|e| e.downcast::<Tagged>()) else {
        return ExecError::new(ErrorKind::SpawnFailed, message);
    };
    let errno = t.source.raw_os_error();
    let kind = match (t.stage, errno) {
        (Stage::Cwd, Some(libc::ENOENT | libc::ENOTDIR)) => ErrorKind::CwdNotFound,
        (Stage::Cwd, Some(libc::EACCES | libc::EPERM)) => ErrorKind::PermissionDenied,
        (Stage::Program, Some(libc::ENOENT | libc::ENOTDIR)) => ErrorKind::ProgramNotFound,
        (Stage::Program, Some(libc::EACCES | libc::ENOEXEC | libc::EISDIR)) => {
            ErrorKind::NotExecutable
        }
        _ => ErrorKind::SpawnFailed,
    };
    ExecError::new(kind, message)
        .with_path(t.path)
        .with_source(t.source)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_survive_the_io_error_and_keep_the_text() {
        let e = tag(
            Stage::Cwd,
            Path::new("/nope"),
            std::io::Error::from_raw_os_error(libc::ENOENT),
        );
        assert_eq!(e.to_string(), "No such file or directory (os error 2)");
        let d = classify(e);
        assert_eq!(d.kind(), ErrorKind::CwdNotFound);
        assert_eq!(d.message(), "No such file or directory (os error 2)");
        assert_eq!(d.path(), Some(Path::new("/nope")));
        assert_eq!(d.io_error().and_then(|e| e.raw_os_error()), Some(2));
        let p = classify(tag(
            Stage::Program,
            Path::new("/x"),
            std::io::Error::from_raw_os_error(libc::EACCES),
        ));
        assert_eq!(p.kind(), ErrorKind::NotExecutable);
        let plain = classify(std::io::Error::from_raw_os_error(libc::ENOENT));
        assert_eq!(plain.kind(), ErrorKind::SpawnFailed);
    }
}
