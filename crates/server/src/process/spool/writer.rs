//! The spool's writer thread. Spooling is a write nobody waits for, into
//! fresh page cache, whose first touch is its costliest part (BENCHMARKS.md,
//! "Figures behind design choices"); done inline it ran under the process's
//! lock, on the path that reads the child's output or marks it delivered.
//! Here it runs on one thread per server, beside them.
//!
//! Queued bytes are [`Bytes`] shared with the output log (no copy); the queue
//! is bounded server-wide by [`MAX_QUEUED_BYTES`], past which a write is done
//! inline again, so memory stays bounded when the disk is the slower side.
//! (`O_DIRECT` was tried and dropped: BENCHMARKS.md says why.)

use bytes::Bytes;
use std::fs::File;
use std::io::{self, IoSlice};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, PoisonError};

/// Most bytes waiting for the writer thread across the server: 8 MiB.
pub const MAX_QUEUED_BYTES: usize = 8 * 1024 * 1024;

/// One positional write: `parts` back to back from offset `at` of `file`.
struct Job {
    file: Arc<File>,
    at: u64,
    parts: Vec<Bytes>,
    owner: Arc<Outstanding>,
}

impl Job {
    fn len(&self) -> usize {
        self.parts.iter().map(Bytes::len).sum()
    }

    /// One vectored write (more only if the kernel takes less).
    fn write(&self) -> io::Result<()> {
        let mut slices: Vec<IoSlice<'_>> = self.parts.iter().map(|p| IoSlice::new(p)).collect();
        let mut rest = &mut slices[..];
        let mut at = self.at;
        while !rest.is_empty() {
            let offset =
                i64::try_from(at).map_err(|_| io::Error::other("spool offset overflow"))?;
            let n = match nix::sys::uio::pwritev(&*self.file, rest, offset) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => n,
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(e.into()),
            };
            at += n as u64;
            IoSlice::advance_slices(&mut rest, n);
        }
        Ok(())
    }
}

/// The writes of one spool not yet done, and whether any failed.
#[derive(Debug, Default)]
pub struct Outstanding {
    jobs: Mutex<usize>,
    idle: Condvar,
    failed: AtomicBool,
}

impl Outstanding {
    /// True once a write of this spool failed (its records are then not all
    /// on disk).
    pub fn failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }

    /// Records a failure found outside the writer (the spool stops).
    pub fn mark_failed(&self) {
        self.failed.store(true, Ordering::Release);
    }

    /// Blocks until every queued write of this spool is done. Bounded: the
    /// queue holds at most [`MAX_QUEUED_BYTES`] across the server.
    pub fn wait_idle(&self) {
        let mut jobs = self.jobs.lock().unwrap_or_else(PoisonError::into_inner);
        while *jobs > 0 {
            jobs = self.idle.wait(jobs).unwrap_or_else(PoisonError::into_inner);
        }
    }

    fn finish(&self, result: io::Result<()>) {
        if let Err(e) = result {
            if !self.failed.swap(true, Ordering::AcqRel) {
                tracing::warn!("output spool write failed, spooling stops for this process: {e}");
            }
        }
        let mut jobs = self.jobs.lock().unwrap_or_else(PoisonError::into_inner);
        *jobs -= 1;
        if *jobs == 0 {
            self.idle.notify_all();
        }
    }
}

/// The server's spool writer: a thread and its queue.
#[derive(Debug)]
pub struct Writer {
    /// `None` when the thread could not be started: every write is inline.
    queue: Option<mpsc::Sender<Job>>,
    queued_bytes: Arc<AtomicUsize>,
}

impl Writer {
    /// Starts the thread; it ends when the writer is dropped and its queue is
    /// drained.
    pub fn start() -> Writer {
        let queued_bytes = Arc::new(AtomicUsize::new(0));
        let (tx, rx) = mpsc::channel::<Job>();
        let counter = queued_bytes.clone();
        let started = std::thread::Builder::new()
            .name("output-spool".into())
            .spawn(move || {
                for job in rx {
                    let n = job.len();
                    let result = job.write();
                    counter.fetch_sub(n, Ordering::AcqRel);
                    job.owner.finish(result);
                }
            });
        let queue = match started {
            Ok(_) => Some(tx),
            Err(e) => {
                tracing::warn!("output spool writes stay inline: no writer thread: {e}");
                None
            }
        };
        Writer {
            queue,
            queued_bytes,
        }
    }

    /// Writes `parts` at `at` in `file`: queued when there is room, else
    /// inline. A failure shows in `owner.failed()` (at once when inline).
    pub fn write(&self, owner: &Arc<Outstanding>, file: &Arc<File>, at: u64, parts: Vec<Bytes>) {
        let job = Job {
            file: file.clone(),
            at,
            parts,
            owner: owner.clone(),
        };
        *owner.jobs.lock().unwrap_or_else(PoisonError::into_inner) += 1;
        let n = job.len();
        let room = self
            .queued_bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |q| {
                (q + n <= MAX_QUEUED_BYTES).then_some(q + n)
            })
            .is_ok();
        let job = match (&self.queue, room) {
            (Some(queue), true) => match queue.send(job) {
                Ok(()) => return,
                Err(mpsc::SendError(job)) => {
                    self.queued_bytes.fetch_sub(n, Ordering::AcqRel);
                    job
                }
            },
            _ => job,
        };
        let result = job.write();
        job.owner.finish(result);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{FileExt, OpenOptionsExt};

    fn scratch() -> Arc<File> {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_TMPFILE)
            .open(std::env::temp_dir())
            .unwrap();
        Arc::new(f)
    }

    /// Queued writes and inline ones (the queue bound passed) all land, at their offsets, once
    /// `wait_idle` returns.
    #[test]
    fn every_write_lands_by_wait_idle() {
        let w = Writer::start();
        let owner = Arc::new(Outstanding::default());
        let file = scratch();
        let piece = 1024 * 1024;
        let pieces = 3 * MAX_QUEUED_BYTES / piece;
        for i in 0..pieces {
            let head = Bytes::from(vec![i as u8; 5]);
            let body = Bytes::from(vec![!(i as u8); piece - 5]);
            w.write(&owner, &file, (i * piece) as u64, vec![head, body]);
        }
        owner.wait_idle();
        assert!(!owner.failed());
        let mut got = vec![0u8; pieces * piece];
        file.read_exact_at(&mut got, 0).unwrap();
        for (i, p) in got.chunks(piece).enumerate() {
            assert_eq!(&p[..5], &[i as u8; 5]);
            assert!(p[5..].iter().all(|&b| b == !(i as u8)), "piece {i}");
        }
        assert_eq!(w.queued_bytes.load(Ordering::Acquire), 0);
    }

    /// A write that fails (past the largest offset a file may have) is
    /// reported to its spool, not lost, and no other spool sees it.
    #[test]
    fn a_failed_write_marks_its_owner() {
        let w = Writer::start();
        let owner = Arc::new(Outstanding::default());
        let ok = Arc::new(Outstanding::default());
        let file = scratch();
        w.write(
            &owner,
            &file,
            i64::MAX as u64 - 1,
            vec![Bytes::from_static(b"xyz")],
        );
        w.write(&ok, &file, 0, vec![Bytes::from_static(b"y")]);
        owner.wait_idle();
        ok.wait_idle();
        assert!(owner.failed());
        assert!(!ok.failed(), "another spool is not affected");
    }
}
