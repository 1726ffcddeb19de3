//! Low-level helpers shared by the transports (`exec-server-rpc`), the server
//! and the client, where every byte of a transfer passes:
//!
//! - [`read_at`]: reads (positional from files, single from pipes) into a
//!   buffer's unused capacity (no zeroing before the read, no copy after it);
//! - [`huge_pages`]: transparent huge pages for large message buffers;
//! - [`fd_pass`]: file descriptors over Unix sockets (`SCM_RIGHTS`);
//! - [`procfs`]: a process's parent, group, session, CPU time and memory;
//! - [`launch`]: a program started inside its cgroup (`clone3`), as cheaply
//!   as `posix_spawn`;
//! - [`signals`]: the signal state and descriptors a started program gets;
//! - [`malloc`]: glibc's malloc set for bulk bytes (a program's `main`);
//! - [`shared_tcp`]: one TCP socket read, written and spliced by several
//!   users (a relay node).
//!
//! Linux only where it matters; elsewhere the advice is a no-op.

pub mod fd_pass;
pub mod huge_pages;
pub mod launch;
pub mod malloc;
pub mod procfs;
pub mod read_at;
#[cfg(feature = "shared-tcp")]
pub mod shared_tcp;
pub mod signals;
