//! A command under a supervisor, so none of its processes outlives the call. kin forks a
//! supervisor (a child subreaper: every orphan below it, `setsid` or double-forked, is reparented
//! to it), which forks the command itself (`PR_SET_PDEATHSIG` on it, its own process group, the
//! sandbox entered before `execve`). The supervisor reports the command's exit on a status pipe
//! and holds the read end of a lifeline pipe whose write end only kin has: when kin closes it
//! (the call ended, timed out or was cancelled) or dies (its descriptors close even on
//! `SIGKILL`), the supervisor kills the command's group and then, level by level, every process
//! left below it, reaps them and exits. A `SIGTERM` sent to the supervisor is passed on to the
//! command's group (a server's grace before the kill). Between `fork` and `execve` only system
//! calls run.

use std::ffi::{CString, OsString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::process::{Child, ChildStderr, ChildStdin, ChildStdout, Command};

use super::confine::Confinement;

/// Status message kinds (one byte, then a native-endian `i32`).
const EXITED: u8 = 0;
const EXEC_FAILED: u8 = 1;
const CONFINE_FAILED: u8 = 2;

/// What the command is: a program (absolute path), its arguments (the first is its name) and
/// its whole environment.
pub(crate) struct Program {
    pub path: CString,
    pub argv: Vec<CString>,
    pub env: Vec<CString>,
}

impl Program {
    /// `path` with `args`, in this process's environment with `overrides` set.
    pub(crate) fn new(path: &Path, args: &[&str], overrides: &[(OsString, OsString)]) -> io::Result<Program> {
        let mut env: Vec<(OsString, OsString)> =
            std::env::vars_os().filter(|(k, _)| !overrides.iter().any(|(o, _)| o == k)).collect();
        env.extend(overrides.iter().cloned());
        Program::in_env(path, args, env)
    }

    /// `path` with `args`, in exactly the environment `env`.
    pub(crate) fn in_env(
        path: &Path,
        args: &[&str],
        env: impl IntoIterator<Item = (OsString, OsString)>,
    ) -> io::Result<Program> {
        let c = |bytes: &[u8]| CString::new(bytes).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL byte"));
        let mut argv = vec![c(path.file_name().map_or(path.as_os_str(), |n| n).as_bytes())?];
        for arg in args {
            argv.push(c(arg.as_bytes())?);
        }
        let env = env
            .into_iter()
            .filter_map(|(k, v)| {
                let mut entry = k.as_bytes().to_vec();
                entry.push(b'=');
                entry.extend_from_slice(v.as_bytes());
                CString::new(entry).ok()
            })
            .collect();
        Ok(Program { path: c(path.as_os_str().as_bytes())?, argv, env })
    }
}

/// A running supervised command.
pub(crate) struct Supervised {
    supervisor: Child,
    /// Piped only when `spawn` was asked to (`Input::Piped`).
    pub stdin: Option<ChildStdin>,
    pub stdout: Option<ChildStdout>,
    pub stderr: Option<ChildStderr>,
    status: Option<tokio::net::unix::pipe::Receiver>,
    /// The status message read so far (a read cancelled midway goes on from here).
    message: [u8; 5],
    got: usize,
    /// Closing it tells the supervisor to kill everything.
    lifeline: Option<OwnedFd>,
}

/// Two pipe ends, close-on-exec.
fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills two descriptors we then own.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both are fresh descriptors owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// The command's standard input.
#[derive(Clone, Copy)]
pub(crate) enum Input {
    /// `/dev/null`.
    Null,
    /// A pipe from kin (`Supervised::stdin`).
    Piped,
}

/// Starts `program` in `dir` (empty: this process's directory) under a supervisor, confined
/// when `confinement` is given; stdin as `input` says, stdout and stderr piped.
pub(crate) fn spawn(
    program: Program,
    dir: &Path,
    confinement: Option<Arc<Confinement>>,
    input: Input,
) -> io::Result<Supervised> {
    let (life_read, life_write) = pipe()?;
    let (status_read, status_write) = pipe()?;
    let mut argv: Vec<*const libc::c_char> = program.argv.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    let mut envp: Vec<*const libc::c_char> = program.env.iter().map(|e| e.as_ptr()).collect();
    envp.push(std::ptr::null());
    let child_side = ChildSide {
        program,
        argv: Pointers(argv),
        envp: Pointers(envp),
        lifeline: life_read.as_raw_fd(),
        status: status_write.as_raw_fd(),
        confinement,
    };
    // The program never runs through `Command`: the supervisor's pre-exec hook does not return.
    let mut command = Command::new(std::ffi::OsStr::from_bytes(child_side.program.path.as_bytes()));
    let stdin = match input {
        Input::Null => Stdio::null(),
        Input::Piped => Stdio::piped(),
    };
    command.stdin(stdin).stdout(Stdio::piped()).stderr(Stdio::piped()).process_group(0).kill_on_drop(false);
    if !dir.as_os_str().is_empty() {
        command.current_dir(dir);
    }
    // SAFETY: the closure never returns into the standard library: the supervisor and the
    // command each end in `_exit` or `execve`, making only system calls on prepared data.
    unsafe {
        command.pre_exec(move || child_side.supervise());
    }
    let mut supervisor = command.spawn()?;
    drop((life_read, status_write));
    let status = tokio::net::unix::pipe::Receiver::from_owned_fd(status_read)?;
    Ok(Supervised {
        stdin: supervisor.stdin.take(),
        stdout: supervisor.stdout.take(),
        stderr: supervisor.stderr.take(),
        supervisor,
        status: Some(status),
        message: [0; 5],
        got: 0,
        lifeline: Some(life_write),
    })
}

impl Supervised {
    /// Waits for the command (not its background processes) to exit. An error is a command that
    /// could not be started or confined. Cancel-safe: a wait dropped midway loses nothing.
    pub(crate) async fn exited(&mut self) -> io::Result<ExitStatus> {
        let mut read = Err(io::Error::from(io::ErrorKind::UnexpectedEof));
        while let Some(pipe) = self.status.as_mut() {
            match pipe.read(&mut self.message[self.got..]).await {
                Ok(0) | Err(_) => break,
                Ok(n) => self.got += n,
            }
            if self.got == self.message.len() {
                read = Ok(());
                break;
            }
        }
        self.status = None;
        if read.is_err() {
            // The supervisor died without a word: its own status stands for the command's.
            return self.supervisor.wait().await;
        }
        let message = self.message;
        let value = i32::from_ne_bytes([message[1], message[2], message[3], message[4]]);
        match message[0] {
            EXITED => Ok(ExitStatus::from_raw(value)),
            EXEC_FAILED => Err(io::Error::from_raw_os_error(value)),
            CONFINE_FAILED => {
                let cause = io::Error::from_raw_os_error(value);
                Err(io::Error::new(cause.kind(), format!("cannot enter the sandbox: {cause}")))
            }
            _ => Err(io::Error::other("the command's supervisor sent a bad status")),
        }
    }

    /// Tells the supervisor to kill every process of the command (at once; idempotent).
    pub(crate) fn kill(&mut self) {
        self.lifeline = None;
    }

    /// Has the supervisor send `SIGTERM` to the command's group (a grace before `kill`).
    pub(crate) fn terminate(&self) {
        if let Some(pid) = self.supervisor.id().and_then(|pid| libc::pid_t::try_from(pid).ok()) {
            // SAFETY: kill only sends a signal; the supervisor is our child, not yet reaped.
            unsafe {
                libc::kill(pid, libc::SIGTERM);
            }
        }
    }

    /// Kills everything and waits up to `limit` for the supervisor to have reaped it all.
    pub(crate) async fn finish(&mut self, limit: Duration) {
        self.kill();
        if tokio::time::timeout(limit, self.supervisor.wait()).await.is_err() {
            tracing::warn!("a command's supervisor did not finish within {limit:?}");
        }
    }
}

/// Raw pointers into the `CString`s of a [`Program`] (kept alive beside them).
struct Pointers(Vec<*const libc::c_char>);

// SAFETY: the pointers refer to the strings owned by the same `ChildSide`, which is only read.
unsafe impl Send for Pointers {}
unsafe impl Sync for Pointers {}

/// What the forked processes use.
struct ChildSide {
    program: Program,
    argv: Pointers,
    envp: Pointers,
    lifeline: RawFd,
    status: RawFd,
    confinement: Option<Arc<Confinement>>,
}

impl ChildSide {
    /// The supervisor: forks the command, then waits for it and for the lifeline; never returns.
    fn supervise(&self) -> io::Result<()> {
        // SAFETY: everything below is a system call on descriptors and memory prepared before the
        // fork (async-signal-safe), ending in `_exit`.
        unsafe {
            libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1usize, 0usize, 0usize, 0usize);
            let mut chld: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut chld);
            libc::sigaddset(&mut chld, libc::SIGCHLD);
            libc::sigaddset(&mut chld, libc::SIGTERM);
            libc::sigprocmask(libc::SIG_BLOCK, &chld, std::ptr::null_mut());
            let signals = libc::signalfd(-1, &chld, libc::SFD_CLOEXEC);
            let ruleset = self.confinement.as_ref().and_then(|c| c.ruleset_fd()).unwrap_or(-1);
            close_all_but(&[self.lifeline, self.status, signals, ruleset]);
            let me = libc::getpid();
            let command = libc::fork();
            if command < 0 {
                self.report(EXEC_FAILED, errno());
                libc::_exit(127);
            }
            if command == 0 {
                self.run_command(me);
            }
            if ruleset >= 0 {
                libc::close(ruleset);
            }
            libc::signal(libc::SIGPIPE, libc::SIG_IGN);
            let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
            if null >= 0 {
                libc::dup2(null, 0);
                libc::dup2(null, 1);
                libc::dup2(null, 2);
                libc::close(null);
            }
            let code = self.watch(command, signals);
            kill_tree(command);
            libc::_exit(code);
        }
    }

    /// The command: its own group, dies with the supervisor, confined, then `execve`.
    unsafe fn run_command(&self, supervisor: libc::pid_t) -> ! {
        // SAFETY: system calls on prepared data only; ends in `execve` or `_exit`.
        unsafe {
            let mut empty: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut empty);
            libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
            libc::close(self.lifeline);
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as usize, 0usize, 0usize, 0usize);
            if libc::getppid() != supervisor {
                libc::_exit(137);
            }
            libc::setpgid(0, 0);
            crate::signals::restore_open_files_limit();
            if let Some(confinement) = &self.confinement
                && let Err(e) = confinement.enter()
            {
                self.report(CONFINE_FAILED, e.raw_os_error().unwrap_or(libc::EPERM));
                libc::_exit(126);
            }
            libc::execve(self.program.path.as_ptr(), self.argv.0.as_ptr(), self.envp.0.as_ptr());
            self.report(EXEC_FAILED, errno());
            libc::_exit(127)
        }
    }

    /// Reaps children until the lifeline closes, reporting the command's exit once; returns the
    /// supervisor's exit code (the command's, as a shell would give it).
    unsafe fn watch(&self, command: libc::pid_t, signals: RawFd) -> i32 {
        let mut code = 0;
        let mut reported = false;
        // SAFETY: poll, read, waitpid and write on our own descriptors and stack buffers.
        unsafe {
            loop {
                let mut status = 0;
                loop {
                    let pid = libc::waitpid(-1, &mut status, libc::WNOHANG);
                    if pid <= 0 {
                        break;
                    }
                    if pid == command && !reported {
                        reported = true;
                        self.report(EXITED, status);
                        code = if libc::WIFEXITED(status) {
                            libc::WEXITSTATUS(status)
                        } else {
                            128 + libc::WTERMSIG(status)
                        };
                    }
                }
                let mut fds = [
                    libc::pollfd { fd: self.lifeline, events: libc::POLLIN, revents: 0 },
                    libc::pollfd { fd: signals, events: libc::POLLIN, revents: 0 },
                ];
                let n = if signals >= 0 { 2 } else { 1 };
                // Without a signalfd, fall back to polling for exits every 50 ms.
                let timeout = if signals >= 0 { -1 } else { 50 };
                if libc::poll(fds.as_mut_ptr(), n, timeout) < 0 && errno() != libc::EINTR {
                    return code;
                }
                if fds[0].revents != 0 {
                    return code;
                }
                if fds[1].revents != 0 {
                    let mut infos: [libc::signalfd_siginfo; 4] = std::mem::zeroed();
                    let len = libc::read(signals, infos.as_mut_ptr().cast(), std::mem::size_of_val(&infos));
                    let read = usize::try_from(len).unwrap_or(0) / std::mem::size_of::<libc::signalfd_siginfo>();
                    if infos[..read].iter().any(|info| info.ssi_signo == libc::SIGTERM as u32) {
                        libc::kill(-command, libc::SIGTERM);
                    }
                }
            }
        }
    }

    fn report(&self, kind: u8, value: i32) {
        let mut message = [kind, 0, 0, 0, 0];
        message[1..].copy_from_slice(&value.to_ne_bytes());
        // SAFETY: a write of a stack buffer to our own pipe.
        unsafe {
            libc::write(self.status, message.as_ptr().cast(), message.len());
        }
    }
}

fn errno() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
}

/// Closes every descriptor from 3 up except `keep` (negative entries are ignored).
unsafe fn close_all_but(keep: &[RawFd]) {
    let mut kept: [RawFd; 8] = [-1; 8];
    let mut n = 0;
    for &fd in keep.iter().filter(|fd| **fd >= 3) {
        if n < kept.len() {
            kept[n] = fd;
            n += 1;
        }
    }
    kept[..n].sort_unstable();
    let mut low: u32 = 3;
    // SAFETY: closing descriptors of this (forked) process.
    unsafe {
        for &fd in &kept[..n] {
            let fd = fd as u32;
            if fd > low {
                close_range(low, fd - 1);
            }
            low = fd + 1;
        }
        close_range(low, u32::MAX);
    }
}

unsafe fn close_range(low: u32, high: u32) {
    // SAFETY: close_range(2), or close(2) one by one where it is missing.
    unsafe {
        if libc::syscall(libc::SYS_close_range, low, high, 0u32) == 0 {
            return;
        }
        for fd in low..=high.min(65_535) {
            libc::close(fd as RawFd);
        }
    }
}

/// Kills the command's group, then every child of this process (orphans come here: it is a
/// subreaper) until none is left, reaping them.
unsafe fn kill_tree(command: libc::pid_t) {
    // SAFETY: kill, waitpid and reads of /proc into stack buffers.
    unsafe {
        libc::kill(-command, libc::SIGKILL);
        loop {
            let mut pids = [0 as libc::pid_t; 256];
            let n = children(&mut pids);
            let mut killed = 0;
            for pid in &mut pids[..n] {
                // A zombie takes the signal too; a process we may not signal is left alone.
                if libc::kill(*pid, libc::SIGKILL) == 0 {
                    killed += 1;
                } else {
                    *pid = 0;
                }
            }
            for &pid in pids[..n].iter().filter(|pid| **pid > 0) {
                let mut status = 0;
                libc::waitpid(pid, &mut status, 0);
            }
            if n > 0 && killed == 0 {
                return;
            }
            let mut status = 0;
            let reaped = libc::waitpid(-1, &mut status, libc::WNOHANG);
            if n == 0 && reaped < 0 {
                // ECHILD: nothing is left below.
                return;
            }
            if n == 0 && reaped == 0 {
                // Children exist that /proc did not list (no CONFIG_PROC_CHILDREN): wait for one.
                libc::waitpid(-1, &mut status, 0);
            }
        }
    }
}

/// This process's children from `/proc/self/task/<pid>/children` (up to `out.len()`).
unsafe fn children(out: &mut [libc::pid_t]) -> usize {
    let mut path = [0u8; 64];
    let prefix = b"/proc/self/task/";
    path[..prefix.len()].copy_from_slice(prefix);
    let mut at = prefix.len();
    // SAFETY: getpid, open, read and close with stack buffers.
    unsafe {
        at += write_decimal(&mut path[at..], libc::getpid());
        let suffix = b"/children\0";
        path[at..at + suffix.len()].copy_from_slice(suffix);
        let fd = libc::open(path.as_ptr().cast(), libc::O_RDONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return 0;
        }
        let mut buf = [0u8; 4096];
        let len = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
        libc::close(fd);
        let mut n = 0;
        let mut value: libc::pid_t = 0;
        let mut digits = false;
        for &byte in &buf[..usize::try_from(len).unwrap_or(0)] {
            if byte.is_ascii_digit() {
                value = value * 10 + libc::pid_t::from(byte - b'0');
                digits = true;
            } else if digits {
                if n < out.len() {
                    out[n] = value;
                    n += 1;
                }
                value = 0;
                digits = false;
            }
        }
        if digits && n < out.len() {
            out[n] = value;
            n += 1;
        }
        n
    }
}

/// Writes `value` in decimal at the start of `out`; returns the length.
fn write_decimal(out: &mut [u8], value: libc::pid_t) -> usize {
    let mut digits = [0u8; 12];
    let mut len = 0;
    let mut v = value.max(0);
    loop {
        digits[len] = b'0' + (v % 10) as u8;
        len += 1;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    for i in 0..len {
        out[i] = digits[len - 1 - i];
    }
    len
}
