//! What the running kernel offers the sandbox, probed once per process: the Landlock ABI (0: none),
//! seccomp filters, and a private mount namespace (to keep `.git` and kin's own directories
//! read-only inside a writable workspace). A debug build reads `KIN_SANDBOX_TEST_ABI` to pretend
//! the kernel has a lower Landlock ABI (0: none), so tests can see the fallback on this kernel.

use std::ffi::CString;
use std::io;
use std::sync::OnceLock;

/// The Landlock ABI kin's rules are written and tested for; newer kernels get this one.
pub(crate) const TESTED_ABI: i32 = 7;

/// The environment variable a debug build reads to lower the probed Landlock ABI.
pub(crate) const TEST_ABI_ENV: &str = "KIN_SANDBOX_TEST_ABI";

/// What the kernel enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Support {
    /// The Landlock ABI version, capped at [`TESTED_ABI`]; 0 when there is no Landlock.
    pub landlock_abi: i32,
    /// Seccomp filters can be installed.
    pub seccomp: bool,
    /// A private mount namespace with read-only bind mounts can be made (as root, or through an
    /// unprivileged user namespace).
    pub mount_ns: bool,
}

/// The running kernel's support (probed on first use).
pub(crate) fn support() -> Support {
    static SUPPORT: OnceLock<Support> = OnceLock::new();
    *SUPPORT.get_or_init(|| {
        let mut abi = landlock_abi();
        if cfg!(debug_assertions)
            && let Some(forced) = std::env::var(TEST_ABI_ENV).ok().and_then(|v| v.trim().parse::<i32>().ok())
        {
            tracing::warn!("{TEST_ABI_ENV}={forced}: pretending the kernel's Landlock ABI is {forced} (debug build)");
            abi = abi.min(forced.max(0));
        }
        let support = Support { landlock_abi: abi, seccomp: seccomp_filters(), mount_ns: mount_namespace() };
        tracing::debug!(?support, "sandbox support");
        support
    })
}

/// `landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION)`: the ABI, or 0.
fn landlock_abi() -> i32 {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_long = 1;
    // SAFETY: a null attribute pointer with size 0 and the VERSION flag only queries the ABI.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    i32::try_from(v).unwrap_or(0).clamp(0, TESTED_ABI)
}

/// Seccomp filter mode exists when installing a null filter fails with `EFAULT` (not `EINVAL`).
fn seccomp_filters() -> bool {
    // SAFETY: a null program pointer is rejected by the kernel before anything is installed.
    let rc = unsafe { libc::prctl(libc::PR_SET_SECCOMP, libc::SECCOMP_MODE_FILTER, 0usize, 0usize, 0usize) };
    rc == -1 && io::Error::last_os_error().raw_os_error() == Some(libc::EFAULT)
}

/// Forks a child that tries to enter a private mount namespace and reports whether it could.
fn mount_namespace() -> bool {
    let ids = Identity::current();
    // SAFETY: the child only makes system calls (async-signal-safe) and leaves with `_exit`.
    unsafe {
        let pid = libc::fork();
        if pid < 0 {
            return false;
        }
        if pid == 0 {
            let code = if ids.enter_mount_namespace().is_ok() { 0 } else { 1 };
            libc::_exit(code);
        }
        let mut status = 0;
        while libc::waitpid(pid, &mut status, 0) < 0 {
            if io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                return false;
            }
        }
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0
    }
}

/// Who kin runs as, prepared before a fork: root gets a plain mount namespace, anyone else an
/// unprivileged user namespace mapping only their own ids.
#[derive(Debug, Clone)]
pub(crate) struct Identity {
    root: bool,
    uid_map: CString,
    gid_map: CString,
}

impl Identity {
    pub(crate) fn current() -> Identity {
        // SAFETY: getters without failure modes.
        let (uid, gid, euid) = unsafe { (libc::getuid(), libc::getgid(), libc::geteuid()) };
        Identity {
            root: euid == 0,
            uid_map: CString::new(format!("{uid} {uid} 1\n")).unwrap_or_default(),
            gid_map: CString::new(format!("{gid} {gid} 1\n")).unwrap_or_default(),
        }
    }

    /// Moves the calling (single-threaded, forked) process into a private mount namespace whose
    /// mounts do not propagate back. Only system calls: safe between `fork` and `exec`.
    pub(crate) unsafe fn enter_mount_namespace(&self) -> io::Result<()> {
        // SAFETY: plain system calls on prepared, NUL-terminated data.
        unsafe {
            if self.root {
                check(libc::unshare(libc::CLONE_NEWNS))?;
            } else {
                check(libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS))?;
                write_file(c"/proc/self/setgroups", b"deny")?;
                write_file(c"/proc/self/uid_map", self.uid_map.as_bytes())?;
                write_file(c"/proc/self/gid_map", self.gid_map.as_bytes())?;
            }
            check(libc::mount(
                std::ptr::null(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_SLAVE,
                std::ptr::null(),
            ))
        }
    }
}

/// `-1` → the last OS error.
pub(crate) fn check(rc: libc::c_int) -> io::Result<()> {
    if rc == -1 { Err(io::Error::last_os_error()) } else { Ok(()) }
}

/// Writes `data` to an existing file with plain system calls.
unsafe fn write_file(path: &std::ffi::CStr, data: &[u8]) -> io::Result<()> {
    // SAFETY: `path` is NUL-terminated; `data` is a valid buffer.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let written = libc::write(fd, data.as_ptr().cast(), data.len());
        let result = if written == data.len() as isize { Ok(()) } else { Err(io::Error::last_os_error()) };
        libc::close(fd);
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernel_offers_landlock_seccomp_and_mount_namespaces() {
        if !crate::sandbox::landlock_for_tests() {
            return;
        }
        let support = support();
        assert!(support.landlock_abi >= 4, "the sandbox tests need Landlock ABI 4 or newer: {support:?}");
        assert!(support.seccomp, "{support:?}");
        assert!(support.mount_ns, "{support:?}");
    }
}
