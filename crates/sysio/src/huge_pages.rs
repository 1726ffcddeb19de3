//! Transparent huge pages for large message buffers.
//!
//! A message of tens of MiB (a whole file as base64) is received into a
//! buffer of its own. Faulting that buffer in 4 KiB at a time cost more than
//! receiving its bytes: on a VM, each fault exits to the hypervisor's page
//! tables and charges the memory cgroup page by page. Asking for huge pages
//! (`MADV_HUGEPAGE`, honoured where THP is `madvise` or `always`) makes it one
//! fault per 2 MiB. Only the advice changes: the memory is the same, so
//! where THP is off this does nothing.

/// Buffers smaller than this are left alone (4 KiB pages serve them well,
/// and they are often reused by the allocator).
pub const HUGE_PAGE_MIN_BYTES: usize = 4 << 20;

const HUGE_PAGE_BYTES: usize = 2 << 20;

/// Advises the kernel to back the whole 2 MiB pages inside `vec`'s spare
/// and used capacity with huge pages, when its capacity is at least
/// [`HUGE_PAGE_MIN_BYTES`]. Best effort: errors are ignored (the advice is
/// an optimisation only).
pub fn advise_huge_pages(vec: &mut Vec<u8>) {
    #[cfg(target_os = "linux")]
    {
        let cap = vec.capacity();
        if cap < HUGE_PAGE_MIN_BYTES {
            return;
        }
        let start = vec.as_mut_ptr() as usize;
        let aligned = (start + HUGE_PAGE_BYTES - 1) & !(HUGE_PAGE_BYTES - 1);
        let end = (start + cap) & !(HUGE_PAGE_BYTES - 1);
        if end <= aligned {
            return;
        }
        // SAFETY: the range lies inside `vec`'s allocation; MADV_HUGEPAGE
        // changes how the pages are backed, never their contents.
        unsafe {
            libc::madvise(
                aligned as *mut libc::c_void,
                end - aligned,
                libc::MADV_HUGEPAGE,
            );
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = vec;
}
