//! What kin asks of the process allocator (glibc's malloc on Linux; elsewhere nothing).
//!
//! A long-running daemon sees rare large buffers (a message of a megabyte, the batches of a
//! fast stream) among many small ones, and glibc keeps freed heap memory in the process. Two
//! things hand it back:
//!
//! - One arena (`configure`, at start). glibc gives threads their own arenas, and
//!   `malloc_trim` never shrinks the top of a thread's arena: a stream handled on a runtime
//!   worker left megabytes of free memory there for the life of the process (a turn of one
//!   million one-character deltas kept 5-9 MB, of which 2 MB was live; `kin bench --only
//!   memory`). Threads share the main arena instead (each keeps its small per-thread cache), and
//!   a trim of it returns its top too. kin is an I/O daemon with two workers: the shared arena's
//!   lock is not where its time goes (the same bench's streamed turn took as long).
//! - After a turn that wrote a lot, free heap pages are handed back (`outflow` does it once the
//!   turn's updates are written to the client).
//!
//! A fixed mmap threshold (large buffers always mapped) kept a little less (2.8 MB against
//! 2.9 MB after a million one-character deltas, before the outflow cap went down to 4), but made
//! that turn 1.4 times slower, so glibc's adaptive threshold stays.

/// Sets the allocator up; call it first in `main`, before any thread starts.
pub fn configure() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `mallopt` only sets a malloc parameter; no other thread exists yet.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

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
