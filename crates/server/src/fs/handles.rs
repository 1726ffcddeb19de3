//! Open file handles of a session (`fs/open`), by client-chosen id.

use super::prealloc::Preallocation;
use super::write::{PendingReplace, Writer};
use crate::error::{ExecError, ExecResult};
use std::collections::HashMap;
use std::fs::File;
use std::sync::{Arc, Mutex, MutexGuard};

/// One open handle: the file, and for a replace the rename still to do and
/// the space reserved ahead of its writes.
pub struct Handle {
    file: Arc<File>,
    replace: Option<PendingReplace>,
    prealloc: Option<Arc<Preallocation>>,
}

impl Handle {
    /// A handle reading `file`.
    pub fn read(file: File) -> Handle {
        Handle {
            file: Arc::new(file),
            replace: None,
            prealloc: None,
        }
    }

    /// A handle writing through `writer`; closing it commits the write.
    pub fn write(writer: Writer) -> Handle {
        match writer {
            Writer::Replace(file, pending) => Handle::from_parts(file, Some(pending)),
            Writer::InPlace(file) => Handle::read(file),
        }
    }
}

impl Handle {
    /// The open file and, for a replace, the rename still to do.
    pub fn into_parts(self) -> (Arc<File>, Option<PendingReplace>) {
        (self.file, self.replace)
    }

    /// A handle from [`Handle::into_parts`]. A replace's temporary file,
    /// which nobody sees before the commit, gets space reserved ahead of
    /// its writes ([`Preallocation`]); a file written in place never does
    /// (its size is visible).
    pub fn from_parts(file: File, replace: Option<PendingReplace>) -> Handle {
        let prealloc = replace
            .as_ref()
            .and_then(|_| Preallocation::for_file(&file))
            .map(Arc::new);
        Handle {
            file: Arc::new(file),
            replace,
            prealloc,
        }
    }
}

/// Most handles one session may hold open: 256.
pub const MAX_OPEN_FILES_PER_SESSION: usize = 256;

/// The table. Handles close when removed, or when the session ends; a replace
/// that was never closed (`fs/close`) is discarded and leaves the target as it
/// was.
#[derive(Default)]
pub struct HandleTable {
    files: Mutex<HashMap<String, Handle>>,
}

impl HandleTable {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Handle>> {
        self.files.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Fails if `id` is taken ([`AlreadyExists`](crate::error::ErrorKind::AlreadyExists))
    /// or the table is full ([`LimitReached`](crate::error::ErrorKind::LimitReached)).
    pub fn check_free(&self, id: &str) -> ExecResult<()> {
        let files = self.lock();
        if files.contains_key(id) {
            return Err(ExecError::already_exists(format!(
                "file handle `{id}` already exists"
            )));
        }
        if files.len() >= MAX_OPEN_FILES_PER_SESSION {
            return Err(ExecError::limit_reached(format!(
                "too many open file handles (limit {MAX_OPEN_FILES_PER_SESSION}); close some with fs/close"
            )));
        }
        Ok(())
    }

    /// Adds `file` under `id` (rechecked, so two racing opens cannot share an id).
    pub fn insert(&self, id: &str, handle: Handle) -> ExecResult<()> {
        self.check_free(id)?;
        self.lock().insert(id.to_string(), handle);
        Ok(())
    }

    /// The file under `id`, or `NotFound` ``unknown file handle `id` ``.
    pub fn get(&self, id: &str) -> ExecResult<Arc<File>> {
        self.get_for_write(id).map(|(file, _)| file)
    }

    /// The file under `id` for a write, with the space reservation to
    /// consult first (replace handles on ext4 and XFS); `NotFound` as [`Self::get`].
    pub fn get_for_write(&self, id: &str) -> ExecResult<(Arc<File>, Option<Arc<Preallocation>>)> {
        self.lock()
            .get(id)
            .map(|h| (h.file.clone(), h.prealloc.clone()))
            .ok_or_else(|| ExecError::not_found(format!("unknown file handle `{id}`")))
    }

    /// Closes `id` (unknown ids are fine); a replace is cut to the end of
    /// its writes and renamed over its target now, and a failure of either
    /// is returned (the target is then left as it was).
    pub fn remove(&self, id: &str) -> std::io::Result<()> {
        let Some(handle) = self.lock().remove(id) else {
            return Ok(());
        };
        let Some(pending) = handle.replace else {
            return Ok(());
        };
        if let Some(p) = &handle.prealloc {
            p.finish(&handle.file)?;
        }
        pending.commit()
    }

    /// Takes the handle under `id` out of the table, open (the sandboxed
    /// file-system helper hands its parts to the server).
    pub fn take(&self, id: &str) -> Option<Handle> {
        self.lock().remove(id)
    }

    /// Closes every handle.
    pub fn clear(&self) {
        self.lock().clear();
    }

    /// Number of open handles.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// True when none is open.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    fn null() -> Handle {
        Handle::read(File::open("/dev/null").unwrap())
    }

    #[test]
    fn handle_limit_and_duplicates() {
        let t = HandleTable::default();
        for i in 0..MAX_OPEN_FILES_PER_SESSION {
            t.insert(&format!("h{i}"), null()).unwrap();
        }
        let e = t.insert("one-more", null()).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::LimitReached);
        assert_eq!(
            t.insert("h0", null()).unwrap_err().kind(),
            ErrorKind::AlreadyExists
        );
        t.remove("h0").unwrap();
        assert!(t.insert("again", null()).is_ok());
        t.clear();
        assert!(t.is_empty());
        assert_eq!(t.get("again").unwrap_err().kind(), ErrorKind::NotFound);
    }
}
