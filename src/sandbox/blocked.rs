//! Which refused writes in a confined command's stderr the sandbox caused. A line reporting
//! `Permission denied`, `Operation not permitted` or `Read-only file system` (EACCES, EPERM,
//! EROFS) names a path (quoted, or a `: `-separated field, as bash, coreutils and Python print
//! them); the path counts as blocked by the sandbox when it lies outside every writable root (or
//! under a read-only one) and kin itself, unconfined, could write it (or create it in its nearest
//! existing directory). Denials that name no path (a refused socket, say) are not detected.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::Layout;

const DENIALS: [&str; 3] = ["Permission denied", "Operation not permitted", "Read-only file system"];
/// At most this many paths are reported per command.
const MAX_REPORTED: usize = 8;

/// The paths in `stderr` the sandbox refused, in order of appearance, without repeats.
pub(crate) fn blocked_paths(stderr: &str, cwd: &Path, layout: &Layout) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = Vec::new();
    for line in stderr.lines().filter(|l| DENIALS.iter().any(|d| l.contains(d))) {
        for candidate in candidates(line) {
            let path = if Path::new(candidate).is_absolute() { PathBuf::from(candidate) } else { cwd.join(candidate) };
            let path = normalize(&path);
            if found.len() < MAX_REPORTED && !found.contains(&path) && refused_by_sandbox(&path, layout) {
                found.push(path);
            }
        }
    }
    found
}

/// Quoted strings in the line, then its `: `-separated fields that look like paths.
fn candidates(line: &str) -> Vec<&str> {
    let mut out = Vec::new();
    for (open, close) in [('\'', '\''), ('"', '"'), ('‘', '’'), ('`', '\'')] {
        let mut rest = line;
        while let Some(start) = rest.find(open) {
            let after = &rest[start + open.len_utf8()..];
            let Some(end) = after.find(close) else { break };
            let quoted = &after[..end];
            if looks_like_path(quoted) {
                out.push(quoted);
            }
            rest = &after[end + close.len_utf8()..];
        }
    }
    out.extend(line.split(": ").map(str::trim).filter(|f| looks_like_path(f) && !f.contains(' ')));
    out
}

fn looks_like_path(text: &str) -> bool {
    !text.is_empty() && text.len() < 4096 && (text.contains('/') || text.starts_with('.')) && !text.contains('\0')
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
        let found = blocked_paths(&stderr, &ws, &layout);
        let want: Vec<PathBuf> =
            ["a", "b", "c", "d", "e"].iter().map(|n| out.join(n)).chain([ws.join(".git/hooks/pre-commit")]).collect();
        assert_eq!(found, want);
    }
}
