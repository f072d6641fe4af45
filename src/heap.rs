//! What kin asks of the process allocator (glibc's malloc on Linux; elsewhere nothing).
//!
//! A long-running daemon sees rare large buffers (a message of a megabyte, the batches of a
//! fast stream) among many small ones, and glibc keeps freed heap memory in the process: a turn
//! that streamed one megabyte kept about 8 MB of RSS after it ended, of which 2 MB was the
//! message itself (`kin bench --only memory`). After a turn that wrote a lot, free heap pages
//! are handed back (`outflow` does it once the turn's updates are written). A fixed mmap
//! threshold (large buffers always mapped) kept less still, but made a finely streamed turn
//! three times slower, so glibc's adaptive threshold stays.

/// A turn that appended more than this to its log freed enough to be worth handing back.
pub(crate) const RELEASE_AFTER_BYTES: u64 = 512 * 1024;

/// Hands free heap pages back to the OS (all arenas).
pub(crate) fn release_freed() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `malloc_trim` only returns free heap pages; it takes no pointers.
    unsafe {
        libc::malloc_trim(0);
    }
}
