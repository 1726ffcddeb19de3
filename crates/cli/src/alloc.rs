//! Giving a serving process's free memory back to the kernel (its
//! allocator's settings: [`exec_server_sysio::malloc::tune`]).

/// How often a serving process gives its allocator's free memory back to
/// the kernel: every 30 s.
const TRIM_INTERVAL: std::time::Duration = std::time::Duration::from_secs(30);

/// Starts a thread that gives the allocator's free memory back to the
/// kernel every [`TRIM_INTERVAL`] (`malloc_trim(0)`), unless
/// `GLIBC_TUNABLES` already says how memory is managed.
///
/// Why: with [`exec_server_sysio::malloc::tune`]'s settings each of glibc's per-thread heaps keeps up to
/// 16 MiB free, and free pages below a heap's top are never returned at all.
/// After 1 200 short commands with 25 KB of output each a server held 94 MB
/// once every process was gone, 18 MB after one trim. A trim costs a walk
/// of the heaps every 30 s; a stream running meanwhile faults in again at
/// most what was trimmed.
pub fn spawn_trimmer() {
    if std::env::var_os("GLIBC_TUNABLES").is_some() {
        return;
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let trimmer = std::thread::Builder::new()
            .name("malloc-trim".into())
            .spawn(|| loop {
                std::thread::sleep(TRIM_INTERVAL);
                // SAFETY: malloc_trim only returns free memory to the kernel;
                // glibc serialises it with every allocation.
                unsafe { libc::malloc_trim(0) };
            });
        if let Err(e) = trimmer {
            tracing::warn!("free memory will not be returned to the kernel: {e}");
        }
    }
}
