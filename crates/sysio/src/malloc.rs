//! glibc's malloc set for a program that moves bulk bytes.

/// Largest block served from the allocator's heaps rather than its own
/// mapping: 4 MiB (glibc starts at 128 KiB).
const MMAP_THRESHOLD_BYTES: i32 = 4 << 20;
/// Free memory a heap keeps at its top before giving it back: 16 MiB.
const TRIM_THRESHOLD_BYTES: i32 = 16 << 20;

/// Tunes glibc's malloc, unless `GLIBC_TUNABLES` already says how. Call it
/// first thing in `main`, before any thread starts.
///
/// Why: glibc maps each block above its threshold afresh and gives freed heap
/// memory back to the kernel once a little of it is free. A server that
/// allocates and frees a message of a few hundred KiB per output chunk (and a
/// client that receives them) then faults in and zeroes every page of every
/// message: about a tenth of a bulk stream's server time in a profile, and
/// 389 k page faults against 8.8 k for a client running `relay_bench`. With
/// these settings, the same memory is reused. Peak memory is unchanged;
/// memory after a peak is returned later (beyond 16 MiB free per heap).
pub fn tune() {
    if std::env::var_os("GLIBC_TUNABLES").is_some() {
        return;
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt changes allocator parameters only; the caller calls
    // it before the program starts any thread.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES);
        libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES);
    }
}
