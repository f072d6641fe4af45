//! Which refused writes in a confined command's stderr the sandbox caused. A line reporting
//! `Permission denied`, `Operation not permitted` or `Read-only file system` (EACCES, EPERM,
//! EROFS) names a path (quoted, or a `: `-separated field, as bash, coreutils and Python print
//! them); the path counts as blocked by the sandbox when it lies outside every writable root (or
//! under a read-only one) and kin itself, unconfined, could write it (or create it in its nearest
//! existing directory). A quoted bare name (`touch: cannot touch 'x'`) and the name a shell's
//! own redirection error gives (`bash: line 1: x: Permission denied`) are taken relative to the
//! command's directory. bash's network pseudo-files (`/dev/tcp/HOST/PORT`, `/dev/udp/…`) are not
//! paths: a denial naming one, in a sandbox without the network, is the network refused. Other
//! denials that name no path (a refused socket, say) are not detected.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::Layout;

const DENIALS: [&str; 3] = ["Permission denied", "Operation not permitted", "Read-only file system"];
/// At most this many paths are reported per command.
const MAX_REPORTED: usize = 8;

/// What the sandbox refused, as a command's stderr shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Blocked {
    /// A write to this path (or the creation of it).
    Write(PathBuf),
    /// A connection through bash's `/dev/tcp/HOST/PORT` (or `/dev/udp/…`), named so.
    Network(String),
}

impl std::fmt::Display for Blocked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Blocked::Write(path) => write!(f, "{}", path.display()),
            Blocked::Network(target) => write!(f, "a network connection ({target}): this sandbox has no network"),
        }
    }
}

/// What in `stderr` the sandbox refused, in order of appearance, without repeats: writes outside
/// the writable roots, and (when `network` is off) bash's connections.
pub(crate) fn blocked(stderr: &str, cwd: &Path, layout: &Layout, network: bool) -> Vec<Blocked> {
    let mut found: Vec<Blocked> = Vec::new();
    for line in stderr.lines().filter(|l| DENIALS.iter().any(|d| l.contains(d))) {
        for candidate in candidates(line) {
            let seen = if let Some(target) = network_target(candidate) {
                if network {
                    continue;
                }
                Blocked::Network(target)
            } else {
                let path =
                    if Path::new(candidate).is_absolute() { PathBuf::from(candidate) } else { cwd.join(candidate) };
                let path = normalize(&path);
                if !refused_by_sandbox(&path, layout) {
                    continue;
                }
                Blocked::Write(path)
            };
            if found.len() < MAX_REPORTED && !found.contains(&seen) {
                found.push(seen);
            }
        }
    }
    found
}

/// `/dev/tcp/HOST/PORT` (or `/dev/udp/…`) as `tcp HOST port PORT`: a bash pseudo-file, not a path.
fn network_target(candidate: &str) -> Option<String> {
    let (protocol, rest) = candidate.strip_prefix("/dev/")?.split_once('/')?;
    if !matches!(protocol, "tcp" | "udp") {
        return None;
    }
    let (host, port) = rest.split_once('/')?;
    Some(format!("{protocol} {host} port {port}"))
}

/// Quoted strings in the line (a bare name too: quoting makes it one), then its `: `-separated
/// fields that look like paths, and, in a shell's own error (`bash: …`), the field before the
/// denial: the file its redirection could not open.
fn candidates(line: &str) -> Vec<&str> {
    let mut out = Vec::new();
    for (open, close) in [('\'', '\''), ('"', '"'), ('‘', '’'), ('`', '\'')] {
        let mut rest = line;
        while let Some(start) = rest.find(open) {
            let after = &rest[start + open.len_utf8()..];
            let Some(end) = after.find(close) else { break };
            let quoted = &after[..end];
            // A bare name has no spaces: an apostrophe ("can't open 'x'") pairs with a quote.
            if looks_like_path(quoted) || (is_name(quoted) && !quoted.contains(char::is_whitespace)) {
                out.push(quoted);
            }
            rest = &after[end + close.len_utf8()..];
        }
    }
    let fields: Vec<&str> = line.split(": ").map(str::trim).collect();
    out.extend(fields.iter().copied().filter(|f| looks_like_path(f) && !f.contains(' ')));
    if SHELLS.contains(&fields[0])
        && let Some(denied) = fields.iter().position(|f| DENIALS.contains(f))
        && denied >= 2
    {
        // dash: `sh: 1: cannot create out.txt: Permission denied`.
        let field = fields[denied - 1];
        let name = field.strip_prefix("cannot create ").unwrap_or(field);
        if is_name(name) && !name.contains(' ') && !SHELL_CALLS.contains(&name) && !out.contains(&name) {
            out.push(name);
        }
    }
    out
}

/// The shells whose own errors name the file first (`bash: line 1: out.txt: Permission denied`).
const SHELLS: [&str; 4] = ["bash", "sh", "dash", "zsh"];
/// What a shell's error names in that place when it is not a file: the call that failed.
const SHELL_CALLS: [&str; 2] = ["socket", "connect"];

/// A file name (any, a bare one too), not a sentence.
fn is_name(text: &str) -> bool {
    !text.is_empty() && text.len() < 4096 && !text.contains('\0') && text != "." && text != ".."
}

fn looks_like_path(text: &str) -> bool {
    is_name(text) && (text.contains('/') || text.starts_with('.'))
}

/// `.` and `..` resolved lexically.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

fn refused_by_sandbox(path: &Path, layout: &Layout) -> bool {
    // The real location of the path (or of its nearest existing ancestor, for a new file).
    let mut existing = path.to_path_buf();
    while !existing.exists() {
        if !existing.pop() {
            return false;
        }
    }
    let real = std::fs::canonicalize(&existing).unwrap_or(existing.clone());
    let writable = layout.writable.iter().any(|root| real.starts_with(root));
    let read_only = layout.read_only.iter().any(|p| real.starts_with(p));
    (!writable || read_only) && writable_by_kin(&existing)
}

/// Whether kin (unconfined) may write `path`.
fn writable_by_kin(path: &Path) -> bool {
    let Ok(c_path) = CString::new(path.as_os_str().as_bytes()) else { return false };
    // SAFETY: access(2) on a NUL-terminated path.
    unsafe { libc::access(c_path.as_ptr(), libc::W_OK) == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn denials_of_paths_outside_the_writable_roots_are_found() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        let ws = root.join("ws");
        let out = root.join("out");
        std::fs::create_dir_all(ws.join(".git/hooks")).unwrap();
        std::fs::create_dir_all(&out).unwrap();
        let layout = Layout { writable: vec![ws.clone()], read_only: vec![ws.join(".git/hooks")] };
        let o = out.display();
        let w = ws.display();
        let stderr = format!(
            "bash: line 1: {o}/a: Permission denied\n\
             touch: cannot touch '{o}/b': Permission denied\n\
             mkdir: cannot create directory ‘{o}/c’: Permission denied\n\
             PermissionError: [Errno 13] Permission denied: '{o}/d'\n\
             bash: ../out/e: Permission denied\n\
             bash: {w}/.git/hooks/pre-commit: Read-only file system\n\
             bash: {w}/own: Permission denied\n\
             bash: {o}/a: Permission denied\n\
             curl: (7) Failed to connect: Permission denied\n\
             some other line mentioning {o}/f\n"
        );
        let found = blocked(&stderr, &ws, &layout, false);
        let want: Vec<Blocked> = ["a", "b", "c", "d", "e"]
            .iter()
            .map(|n| out.join(n))
            .chain([ws.join(".git/hooks/pre-commit")])
            .map(Blocked::Write)
            .collect();
        assert_eq!(found, want);
    }

    #[test]
    fn bare_names_count_where_the_command_ran_and_shell_calls_do_not() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        let ws = root.join("ws");
        std::fs::create_dir_all(&ws).unwrap();
        // A read-only sandbox: nothing in the workspace is writable.
        let layout = Layout { writable: vec![], read_only: vec![] };
        let stderr = "touch: cannot touch 'made': Permission denied\n\
                      bash: line 1: out.txt: Permission denied\n\
                      bash: kept.log: Read-only file system\n\
                      sh: 1: cannot create dash.txt: Permission denied\n\
                      PermissionError: [Errno 13] Permission denied: 'py.txt'\n\
                      bash: socket: Permission denied\n\
                      bash: connect: Permission denied\n\
                      cat: can't open 'x' for you: Permission denied\n\
                      ping: socket: Operation not permitted\n";
        let found = blocked(stderr, &ws, &layout, true);
        let want: Vec<Blocked> =
            ["made", "out.txt", "kept.log", "dash.txt", "py.txt"].iter().map(|n| Blocked::Write(ws.join(n))).collect();
        // (The apostrophe hides `x`: better missed than a file named `t open `.)
        assert_eq!(found, want, "no `socket`, `connect` or `t open ` file");
        // Where the workspace is writable, the same names are not the sandbox's doing.
        let writable = Layout { writable: vec![ws.clone()], read_only: vec![] };
        assert_eq!(blocked(stderr, &ws, &writable, true), vec![]);
    }

    #[test]
    fn bash_network_files_are_the_network_refused_not_writes() {
        let dir = tempfile::tempdir().unwrap();
        let ws = std::fs::canonicalize(dir.path()).unwrap();
        let layout = Layout { writable: vec![ws.clone()], read_only: vec![] };
        let stderr = "bash: socket: Permission denied\n\
                      bash: line 1: /dev/tcp/127.0.0.1/8080: Permission denied\n\
                      bash: /dev/udp/10.0.0.1/53: Permission denied\n\
                      bash: /dev/tcp/127.0.0.1/8080: Permission denied\n";
        assert_eq!(
            blocked(stderr, &ws, &layout, false),
            vec![Blocked::Network("tcp 127.0.0.1 port 8080".into()), Blocked::Network("udp 10.0.0.1 port 53".into())]
        );
        assert_eq!(
            Blocked::Network("tcp 127.0.0.1 port 8080".into()).to_string(),
            "a network connection (tcp 127.0.0.1 port 8080): this sandbox has no network"
        );
        // With the network on, a denial there is not the sandbox's (nor a write under /dev).
        assert_eq!(blocked(stderr, &ws, &layout, true), vec![]);
    }
}
