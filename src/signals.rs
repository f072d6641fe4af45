//! Process-wide signal dispositions and limits set first in `main`, and the death signal of the
//! children that speak to kin over pipes (`die_with_kin`).
//!
//! kin holds a descriptor per open session log and per connection, so it raises its soft limit
//! on open files to the hard one (`raise_open_files_limit`): the common soft limit of 1,024 ran
//! out at about a thousand sessions. The commands and servers it starts get the limit kin was
//! started with back (`restore_open_files_limit`, between their fork and `execve`), since a
//! program using `select` breaks on descriptors past 1,024.
//!
//! A file-size limit (`RLIMIT_FSIZE`, `ulimit -f`) must fail kin's write with `EFBIG`, as a full
//! disk fails it with `ENOSPC`, not kill kin: by default a write past the limit delivers
//! `SIGXFSZ`, whose default action ends the process (and every session in it). The signal is
//! caught by a handler that does nothing. It is not ignored: an ignored signal stays ignored in
//! the commands kin runs, while a caught one is reset to its default by `execve`.

/// Catches `SIGXFSZ` (see the module comment); call it first in `main`.
pub fn survive_file_size_limits() {
    extern "C" fn nothing(_signal: libc::c_int) {}
    // SAFETY: a handler that does nothing is async-signal-safe; `sigaction` only sets this
    // process's disposition of one signal.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = nothing as extern "C" fn(libc::c_int) as libc::sighandler_t;
        libc::sigemptyset(&mut action.sa_mask);
        action.sa_flags = libc::SA_RESTART;
        if libc::sigaction(libc::SIGXFSZ, &action, std::ptr::null_mut()) != 0 {
            eprintln!("kin: cannot catch SIGXFSZ: {}", std::io::Error::last_os_error());
        }
    }
}

/// The soft limit on open files kin was started with, when `raise_open_files_limit` raised it.
static STARTED_WITH_OPEN_FILES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(u64::MAX);

/// The most the soft limit is raised to (Linux's default `fs.nr_open`).
const MAX_OPEN_FILES: u64 = 1 << 20;

/// Raises the soft limit on open files to the hard one (at most `MAX_OPEN_FILES`); call it
/// first in `main`. A failure leaves the limit as it was.
pub fn raise_open_files_limit() {
    // SAFETY: getrlimit and setrlimit read and set this process's limit through a local struct.
    unsafe {
        let mut limit: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return;
        }
        let wanted = limit.rlim_max.min(MAX_OPEN_FILES);
        if limit.rlim_cur >= wanted {
            return;
        }
        let started = limit.rlim_cur;
        limit.rlim_cur = wanted;
        if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) == 0 {
            STARTED_WITH_OPEN_FILES.store(started, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

/// Gives this process (a child between its fork and `execve`) the soft limit on open files kin
/// was started with. Async-signal-safe: an atomic load and two system calls.
pub(crate) fn restore_open_files_limit() {
    let started = STARTED_WITH_OPEN_FILES.load(std::sync::atomic::Ordering::Relaxed);
    if started == u64::MAX {
        return;
    }
    // SAFETY: getrlimit and setrlimit on a local struct.
    unsafe {
        let mut limit: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 {
            limit.rlim_cur = started;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

/// Makes the child `command` starts get `SIGKILL` when kin dies, by `SIGKILL` too (Linux's
/// parent-death signal; elsewhere nothing): an external agent that ignores the end of its input
/// would outlive kin otherwise. The signal follows the thread that starts the child: kin starts
/// them from its runtime's threads (the main thread and the workers), which live as long as kin
/// does. The child also gets the open-files limit kin was started with.
pub(crate) fn die_with_kin(command: &mut tokio::process::Command) {
    #[cfg(target_os = "linux")]
    {
        let kin = libc::pid_t::try_from(std::process::id()).unwrap_or(0);
        // SAFETY: between fork and exec the closure makes only async-signal-safe system calls.
        unsafe {
            command.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                restore_open_files_limit();
                // kin died before the call above: the child is orphaned already.
                if libc::getppid() != kin {
                    libc::_exit(1);
                }
                Ok(())
            });
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = command;
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::ExitStatusExt;

    /// Caught here, the signal keeps its default in a command started after: a write past the
    /// limit kills it, as it would had kin not caught the signal.
    #[test]
    fn a_command_keeps_the_default_of_sigxfsz() {
        super::survive_file_size_limits();
        let dir = tempfile::tempdir().unwrap();
        let status = std::process::Command::new("sh")
            .args(["-c", "ulimit -f 1; head -c 4096 /dev/zero > big"])
            .current_dir(dir.path())
            .status()
            .unwrap();
        // The shell reports its child's signal as 128 + n, or dies of it itself.
        let by_signal = status.signal() == Some(libc::SIGXFSZ) || status.code() == Some(128 + libc::SIGXFSZ);
        assert!(by_signal, "{status:?}");
    }
}
