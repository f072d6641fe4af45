//! One command's confinement, built in kin before the fork and entered by the child right before
//! `exec`: the Landlock ruleset (read everywhere, write the writable roots and a few device files,
//! no TCP for `network = false`, no signals to processes outside the sandbox), a seccomp filter
//! refusing every socket family but Unix for `network = false`, and read-only bind mounts (in a
//! private mount namespace) over the protected paths inside writable roots. Everything that
//! allocates happens in [`Confinement::build`]; [`Confinement::enter`] makes only system calls, so
//! it is safe between `fork` and `exec` of a multi-threaded process.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use landlock::{
    ABI, Access, AccessFs, AccessNet, CompatLevel, Compatible, PathBeneath, PathFd, Ruleset, RulesetAttr,
    RulesetCreatedAttr, Scope,
};
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule,
};

use super::kernel::{Identity, Support, check};
use super::policy::SandboxPolicy;

/// Device files every command may read and write.
const DEVICES: [&str; 5] = ["/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom"];

/// A path made read-only by a bind mount, and the flags its mount already has (which a remount in
/// a user namespace must keep).
#[derive(Debug)]
struct ReadOnlyMount {
    path: CString,
    flags: libc::c_ulong,
}

/// The mount namespace part.
#[derive(Debug)]
struct Mounts {
    identity: Identity,
    read_only: Vec<ReadOnlyMount>,
}

/// Everything one confined process applies to itself before `exec`.
#[derive(Debug)]
pub(crate) struct Confinement {
    ruleset: Option<OwnedFd>,
    seccomp: Option<BpfProgram>,
    mounts: Option<Mounts>,
}

/// The paths a confinement covers.
#[derive(Debug, Clone, Default)]
pub(crate) struct Layout {
    /// Directories the command may write (existing, real paths).
    pub writable: Vec<PathBuf>,
    /// Paths inside writable roots that stay read-only (existing, real paths).
    pub read_only: Vec<PathBuf>,
}

impl Confinement {
    /// Builds the confinement for `policy` (sandboxed) over `layout`, with what `support` says
    /// the kernel enforces (the ABI is negotiated best-effort; the caller decided that is enough).
    pub(crate) fn build(policy: SandboxPolicy, layout: &Layout, support: Support) -> Result<Confinement, String> {
        let ruleset = if support.landlock_abi > 0 { Some(landlock_rules(policy, layout, support)?) } else { None };
        let seccomp = if !policy.network() && support.seccomp { Some(socket_filter()?) } else { None };
        let mounts = if !layout.read_only.is_empty() && support.mount_ns {
            let read_only = layout.read_only.iter().map(|path| read_only_mount(path)).collect::<Result<Vec<_>, _>>()?;
            Some(Mounts { identity: Identity::current(), read_only })
        } else {
            None
        };
        Ok(Confinement { ruleset, seccomp, mounts })
    }

    /// Applies the confinement to the calling process: the mounts, `no_new_privs`, the seccomp
    /// filter, then the Landlock domain (after which mounts are refused). Only system calls.
    ///
    /// # Safety
    /// Meant for a freshly forked child before `exec`: it changes the calling process for good.
    pub(crate) unsafe fn enter(&self) -> io::Result<()> {
        // SAFETY: system calls on data prepared by `build`.
        unsafe {
            if let Some(mounts) = &self.mounts {
                mounts.identity.enter_mount_namespace()?;
                for mount in &mounts.read_only {
                    let path = mount.path.as_ptr();
                    let none = std::ptr::null();
                    check(libc::mount(path, path, none, libc::MS_BIND | libc::MS_REC, none.cast()))?;
                    let flags = libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY | mount.flags;
                    check(libc::mount(none, path, none, flags, none.cast()))?;
                }
            }
            check(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1usize, 0usize, 0usize, 0usize))?;
            if let Some(filter) = &self.seccomp {
                seccompiler::apply_filter(filter).map_err(|e| match e {
                    seccompiler::Error::Seccomp(e) | seccompiler::Error::Prctl(e) => e,
                    _ => io::Error::from_raw_os_error(libc::EINVAL),
                })?;
            }
            if let Some(fd) = &self.ruleset {
                let rc = libc::syscall(libc::SYS_landlock_restrict_self, fd.as_raw_fd(), 0u32);
                if rc != 0 {
                    return Err(io::Error::last_os_error());
                }
            }
        }
        Ok(())
    }

    /// The Landlock ruleset's descriptor (the child keeps it open until it applies it).
    pub(crate) fn ruleset_fd(&self) -> Option<i32> {
        self.ruleset.as_ref().map(AsRawFd::as_raw_fd)
    }
}

/// The Landlock ruleset: reads everywhere, everything under the writable roots, the device files;
/// no TCP bind or connect without the network (ABI 4); no signals or abstract Unix sockets out of
/// the sandbox (ABI 6).
fn landlock_rules(policy: SandboxPolicy, layout: &Layout, support: Support) -> Result<OwnedFd, String> {
    let abi = ABI::from(support.landlock_abi);
    let failed = |e: &dyn std::fmt::Display| format!("cannot build the Landlock rules: {e}");
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(AccessFs::from_all(abi))
        .map_err(|e| failed(&e))?;
    if !policy.network() && abi >= ABI::V4 {
        ruleset = ruleset.handle_access(AccessNet::from_all(abi)).map_err(|e| failed(&e))?;
    }
    if abi >= ABI::V6 {
        let scopes = if policy.network() { Scope::Signal.into() } else { Scope::Signal | Scope::AbstractUnixSocket };
        ruleset = ruleset.scope(scopes).map_err(|e| failed(&e))?;
    }
    let mut created = ruleset.create().map_err(|e| failed(&e))?;
    let rule = |path: &Path, access| -> Result<PathBeneath<PathFd>, String> {
        let fd = PathFd::new(path).map_err(|e| format!("cannot open {} for the sandbox: {e}", path.display()))?;
        Ok(PathBeneath::new(fd, access))
    };
    created = created.add_rule(rule(Path::new("/"), AccessFs::from_read(abi))?).map_err(|e| failed(&e))?;
    for root in &layout.writable {
        created = created.add_rule(rule(root, AccessFs::from_all(abi))?).map_err(|e| failed(&e))?;
    }
    for device in DEVICES.map(Path::new).into_iter().filter(|d| d.exists()) {
        let access = AccessFs::from_file(abi) & !AccessFs::Execute;
        created = created.add_rule(rule(device, access)?).map_err(|e| failed(&e))?;
    }
    let fd: Option<OwnedFd> = created.into();
    fd.ok_or_else(|| "the kernel refused to create a Landlock ruleset".to_string())
}

/// The x32 ABI's system calls are x86-64's numbers with this bit set, under the same audit
/// architecture: a kernel built with x32 takes `socket` by that number too.
const X32_SYSCALL_BIT: i64 = 0x4000_0000;

/// A seccomp filter: `socket(2)` of any family but `AF_UNIX`, and `io_uring_setup(2)` (whose
/// socket operations would bypass the filter), fail with `EACCES`, by their x32 numbers too on
/// x86-64.
fn socket_filter() -> Result<BpfProgram, String> {
    let failed = |e: &dyn std::fmt::Display| format!("cannot build the network filter: {e}");
    let arch = std::env::consts::ARCH.try_into().map_err(|e| failed(&e))?;
    let not_unix = SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Ne, libc::AF_UNIX as u64)
        .map_err(|e| failed(&e))?;
    let numbers = |call: i64| {
        let x32 = cfg!(target_arch = "x86_64").then_some(call | X32_SYSCALL_BIT);
        std::iter::once(call).chain(x32)
    };
    let mut rules = BTreeMap::new();
    for socket in numbers(libc::SYS_socket) {
        rules.insert(socket, vec![SeccompRule::new(vec![not_unix.clone()]).map_err(|e| failed(&e))?]);
    }
    for setup in numbers(libc::SYS_io_uring_setup) {
        rules.insert(setup, vec![]);
    }
    let filter = SeccompFilter::new(rules, SeccompAction::Allow, SeccompAction::Errno(libc::EACCES as u32), arch)
        .map_err(|e| failed(&e))?;
    filter.try_into().map_err(|e: seccompiler::BackendError| failed(&e))
}

/// The bind mount making `path` read-only, keeping the flags a user namespace may not drop.
fn read_only_mount(path: &Path) -> Result<ReadOnlyMount, String> {
    let c_path = CString::new(path.as_os_str().as_bytes()).map_err(|_| format!("{} has a NUL byte", path.display()))?;
    // SAFETY: statvfs fills the struct for a NUL-terminated path.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c_path.as_ptr(), &mut stat) } != 0 {
        return Err(format!("cannot inspect {} for the sandbox: {}", path.display(), io::Error::last_os_error()));
    }
    let kept = [
        (libc::ST_NOSUID, libc::MS_NOSUID),
        (libc::ST_NODEV, libc::MS_NODEV),
        (libc::ST_NOEXEC, libc::MS_NOEXEC),
        (libc::ST_NOATIME, libc::MS_NOATIME),
        (libc::ST_NODIRATIME, libc::MS_NODIRATIME),
        (libc::ST_RELATIME, libc::MS_RELATIME),
    ];
    let flags = kept.iter().filter(|(st, _)| stat.f_flag & st != 0).fold(0, |acc, (_, ms)| acc | ms);
    Ok(ReadOnlyMount { path: c_path, flags })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The filter compares the system call number with `socket`'s, and on x86-64 with its x32
    /// number as well.
    #[test]
    fn the_network_filter_names_the_x32_socket_call_too() {
        let program = socket_filter().unwrap();
        let compares = |number: i64| program.iter().any(|op| i64::from(op.k) == number);
        assert!(compares(libc::SYS_socket));
        if cfg!(target_arch = "x86_64") {
            assert!(compares(libc::SYS_socket | X32_SYSCALL_BIT));
            assert!(compares(libc::SYS_io_uring_setup | X32_SYSCALL_BIT));
        }
    }
}
