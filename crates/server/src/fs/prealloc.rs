//! Disk space reserved ahead of an upload into a replace's temporary file.
//!
//! On ext4 and XFS a buffered write into space not yet allocated reserves
//! and accounts each block as it is written (delayed allocation), a cost
//! the write pays again on top of filling fresh page cache; space allocated
//! first, as unwritten extents, by `fallocate(2)`, avoids it (figures:
//! BENCHMARKS.md, "Figures behind design choices"). The temporary file is invisible
//! until committed, so its size may run ahead of the data; at commit it is
//! cut back to the end of what was written, which is what the file would
//! have been without the reservation.
//!
//! Best effort throughout: a file system that cannot (or a disk too full to)
//! reserve just writes as before, and the write itself reports a real lack
//! of space.

use std::fs::File;
use std::sync::Mutex;

/// The first reservation ahead of the writes: 1 MiB; each next one doubles
/// what is reserved, up to [`MAX_STEP_BYTES`] at a time.
const MIN_STEP_BYTES: u64 = 1 << 20;
/// Most reserved at once ahead of the writes: 64 MiB.
const MAX_STEP_BYTES: u64 = 64 << 20;

/// What a replace handle has reserved and written.
#[derive(Debug)]
pub struct Preallocation {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Bytes from offset 0 allocated (the file's size follows it).
    reserved: u64,
    /// End of the furthest write.
    written: u64,
    /// A reservation failed: none is tried again.
    off: bool,
}

impl Preallocation {
    /// A reservation for `file` where its file system gains from one
    /// (ext4, XFS); `None` elsewhere.
    pub fn for_file(file: &File) -> Option<Preallocation> {
        gains(file).then(|| Preallocation {
            state: Mutex::new(State::default()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Called before writing `len` bytes at `offset`: reserves ahead when
    /// the write starts within what is reserved (or right after it) and
    /// reaches past it.
    pub fn before_write(&self, file: &File, offset: u64, len: u64) {
        let mut st = self.lock();
        let end = offset.saturating_add(len);
        st.written = st.written.max(end);
        // A write past a gap leaves the gap a hole, as it would be without
        // a reservation: only a write that continues what is reserved
        // reserves more.
        if st.off || end <= st.reserved || offset > st.reserved {
            return;
        }
        let step = st.reserved.clamp(MIN_STEP_BYTES, MAX_STEP_BYTES);
        let target = end.saturating_add(step);
        if reserve(file, st.reserved, target).is_ok() {
            st.reserved = target;
        } else {
            st.off = true;
        }
    }

    /// Cuts the file back to the end of what was written (before the
    /// commit); a no-op when nothing was reserved past it.
    ///
    /// # Errors
    /// The truncation's error: committing a file longer than its data
    /// would be wrong, so the commit must not go ahead.
    pub fn finish(&self, file: &File) -> std::io::Result<()> {
        let st = self.lock();
        if st.reserved > st.written {
            file.set_len(st.written)?;
        }
        Ok(())
    }
}

/// Whether `file`'s file system allocates per block as it is written
/// (ext4, XFS), so that reserving first saves work.
fn gains(file: &File) -> bool {
    use nix::sys::statfs::{fstatfs, EXT4_SUPER_MAGIC, XFS_SUPER_MAGIC};
    fstatfs(file)
        .map(|s| s.filesystem_type())
        .is_ok_and(|fs| fs == EXT4_SUPER_MAGIC || fs == XFS_SUPER_MAGIC)
}

/// Allocates `[from, to)` of `file` (extending its size to `to`).
fn reserve(file: &File, from: u64, to: u64) -> nix::Result<()> {
    let (Ok(at), Ok(len)) = (
        libc::off_t::try_from(from),
        libc::off_t::try_from(to.saturating_sub(from)),
    ) else {
        return Err(nix::errno::Errno::EFBIG);
    };
    nix::fcntl::fallocate(file, nix::fcntl::FallocateFlags::empty(), at, len)
}

/// Allocates the whole of a file about to receive `len` bytes, where its
/// file system gains from it (see the module documentation); best effort.
pub fn reserve_whole(file: &File, len: u64) {
    if len >= MIN_STEP_BYTES && gains(file) {
        let _ = reserve(file, 0, len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    fn scratch_file(tag: &str) -> (std::path::PathBuf, File) {
        let dir = std::env::temp_dir().join(format!("prealloc-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("f");
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .unwrap();
        (dir, f)
    }

    #[test]
    fn the_file_ends_where_the_writes_end_whatever_was_reserved() {
        let (dir, f) = scratch_file("ends");
        let Some(p) = Preallocation::for_file(&f) else {
            // Not ext4 or XFS here: nothing is reserved, nothing to check.
            let _ = std::fs::remove_dir_all(&dir);
            return;
        };
        // Out of order and with a gap, as blocks in flight may land.
        let block = vec![7u8; 300_000];
        for offset in [0u64, 900_000, 300_000, 1_200_000, 2_500_000] {
            p.before_write(&f, offset, block.len() as u64);
            f.write_all_at(&block, offset).unwrap();
        }
        let reserved = p.lock().reserved;
        assert!(
            reserved > 2_800_000,
            "reserved {reserved} bytes, not ahead of the writes"
        );
        assert_eq!(f.metadata().unwrap().len(), reserved);
        // A write far past the end stays sparse: nothing reserved up to it.
        p.before_write(&f, 1 << 30, 1);
        f.write_all_at(b"z", 1 << 30).unwrap();
        assert_eq!(p.lock().reserved, reserved);
        use std::os::unix::fs::MetadataExt;
        let allocated = f.metadata().unwrap().blocks() * 512;
        assert!(
            allocated < 64 << 20,
            "{allocated} bytes allocated for a sparse write"
        );
        p.finish(&f).unwrap();
        assert_eq!(f.metadata().unwrap().len(), (1 << 30) + 1);
        f.set_len(2_800_000).unwrap();
        let mut content = Vec::new();
        use std::io::Read;
        (&f).read_to_end(&mut content).unwrap();
        assert_eq!(content.len(), 2_800_000);
        assert!(content[..600_000].iter().all(|b| *b == 7));
        assert!(content[600_000..900_000].iter().all(|b| *b == 0));
        assert!(content[900_000..1_500_000].iter().all(|b| *b == 7));
        assert!(content[1_500_000..2_500_000].iter().all(|b| *b == 0));
        assert!(content[2_500_000..].iter().all(|b| *b == 7));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
