//! Path handling for the file tools: resolving a model-supplied path against the session
//! directory (lexically, so `..` is settled before anything touches the disk), and deciding
//! whether a path lies inside the workspace after following every symlink that exists, so a link
//! inside the workspace cannot lead outside it.

use std::ffi::OsStr;
use std::path::{Component, Path, PathBuf};

/// Symlink hops followed before a path counts as unresolvable (the Linux limit).
const MAX_SYMLINK_HOPS: usize = 40;

/// `raw` resolved against `cwd` (unless absolute), with `.` and `..` removed lexically. An empty
/// result (empty `cwd` and `raw`) becomes `.`.
pub(crate) fn resolve(cwd: &Path, raw: &str) -> PathBuf {
    let raw = Path::new(raw);
    let joined = if raw.is_absolute() { raw.to_path_buf() } else { cwd.join(raw) };
    let normalized = normalize(&joined);
    if normalized.as_os_str().is_empty() { PathBuf::from(".") } else { normalized }
}

/// Lexical normalization: drops `.`, lets `..` remove the previous name (never climbing above
/// the root of an absolute path), and keeps leading `..` of a relative path.
pub(crate) fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => pop_parent(&mut out),
            other => out.push(other.as_os_str()),
        }
    }
    out
}

fn pop_parent(out: &mut PathBuf) {
    let last_is_name = matches!(out.components().next_back(), Some(Component::Normal(_)));
    if last_is_name {
        out.pop();
    } else if !out.has_root() {
        out.push("..");
    }
}

/// True when `path`, with every existing symlink on it followed, lies inside one of `roots`
/// (themselves resolved the same way). Parts of `path` that do not exist yet are taken
/// lexically, so a file about to be created inside the workspace is inside.
pub(crate) fn inside_workspace(roots: &[PathBuf], path: &Path) -> bool {
    let Some(real) = real_path(path) else {
        return false;
    };
    roots.iter().filter_map(|root| real_path(root.as_path())).any(|root| real.starts_with(root))
}

/// `path` made absolute with every existing symlink followed (including a dangling link, through
/// its target) and the missing tail re-attached. `None` when a symlink chain is too long or the
/// process directory is needed but unknown.
pub(crate) fn real_path(path: &Path) -> Option<PathBuf> {
    let mut current = absolute(path)?;
    for _ in 0..MAX_SYMLINK_HOPS {
        match resolve_existing(&current) {
            Resolved::Done(real) => return Some(real),
            Resolved::Relink(next) => current = next,
        }
    }
    None
}

/// `path` normalized and, when relative, joined to the process directory.
fn absolute(path: &Path) -> Option<PathBuf> {
    if path.is_absolute() {
        return Some(normalize(path));
    }
    let cwd = std::env::current_dir().ok()?;
    Some(normalize(&cwd.join(path)))
}

enum Resolved {
    /// The real path.
    Done(PathBuf),
    /// The path through a dangling symlink's target, to be resolved again.
    Relink(PathBuf),
}

/// Canonicalizes the longest existing ancestor of `path` (absolute and normalized) and
/// re-attaches the missing components.
fn resolve_existing(path: &Path) -> Resolved {
    let mut base = path;
    let mut missing: Vec<&OsStr> = Vec::new();
    loop {
        if let Ok(real) = base.canonicalize() {
            missing.reverse();
            return reattach(real, &missing);
        }
        let (Some(parent), Some(name)) = (base.parent(), base.file_name()) else {
            return Resolved::Done(path.to_path_buf());
        };
        missing.push(name);
        base = parent;
    }
}

/// `real` joined with `missing`; if the first missing component is a dangling symlink (it exists
/// but its target does not), the path continues through the link's target instead.
fn reattach(real: PathBuf, missing: &[&OsStr]) -> Resolved {
    let Some((first, rest)) = missing.split_first() else {
        return Resolved::Done(real);
    };
    let candidate = real.join(first);
    match link_target(&candidate) {
        Some(target) => Resolved::Relink(join_all(normalize(&real.join(target)), rest)),
        None => Resolved::Done(join_all(candidate, rest)),
    }
}

/// The target of `path` when it is a symlink.
fn link_target(path: &Path) -> Option<PathBuf> {
    let meta = std::fs::symlink_metadata(path).ok()?;
    if meta.file_type().is_symlink() { std::fs::read_link(path).ok() } else { None }
}

fn join_all(mut path: PathBuf, names: &[&OsStr]) -> PathBuf {
    for name in names {
        path.push(name);
    }
    path
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// A temp dir holding `ws/` (the workspace) and `outside/`.
    fn layout() -> (tempfile::TempDir, PathBuf, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        let outside = dir.path().join("outside");
        std::fs::create_dir(&ws).unwrap();
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("secret.txt"), "secret").unwrap();
        (dir, ws, outside)
    }

    #[test]
    fn resolve_joins_relative_paths_and_settles_dots() {
        let cwd = Path::new("/work/ws");
        assert_eq!(resolve(cwd, "a.txt"), PathBuf::from("/work/ws/a.txt"));
        assert_eq!(resolve(cwd, "./src/../b.txt"), PathBuf::from("/work/ws/b.txt"));
        assert_eq!(resolve(cwd, "../../../etc"), PathBuf::from("/etc"));
        assert_eq!(resolve(cwd, "/tmp/x/./y/.."), PathBuf::from("/tmp/x"));
        assert_eq!(resolve(cwd, "."), PathBuf::from("/work/ws"));
        assert_eq!(resolve(Path::new(""), ""), PathBuf::from("."));
        assert_eq!(resolve(Path::new(""), "../a"), PathBuf::from("../a"));
    }

    #[test]
    fn dot_dot_escape_is_outside() {
        let (_dir, ws, _outside) = layout();
        let roots = [ws.clone()];
        let escaped = resolve(&ws, "../outside/secret.txt");
        assert!(!inside_workspace(&roots, &escaped));
        assert!(!inside_workspace(&roots, &resolve(&ws, "sub/../../outside")));
    }

    #[test]
    fn absolute_path_elsewhere_is_outside() {
        let (_dir, ws, outside) = layout();
        let roots = [ws.clone()];
        assert!(!inside_workspace(&roots, &outside.join("secret.txt")));
        assert!(!inside_workspace(&roots, Path::new("/etc/passwd")));
        assert!(inside_workspace(&roots, &ws));
    }

    #[test]
    fn symlink_to_outside_is_outside() {
        let (_dir, ws, outside) = layout();
        let roots = [ws.clone()];
        symlink(&outside, ws.join("link")).unwrap();
        assert!(!inside_workspace(&roots, &ws.join("link/secret.txt")));
        assert!(!inside_workspace(&roots, &ws.join("link/new-file.txt")));
        symlink(outside.join("not-yet.txt"), ws.join("dangling")).unwrap();
        assert!(!inside_workspace(&roots, &ws.join("dangling")));
        std::fs::write(ws.join("real.txt"), "x").unwrap();
        symlink(ws.join("real.txt"), ws.join("inner-link")).unwrap();
        assert!(inside_workspace(&roots, &ws.join("inner-link")));
    }

    #[test]
    fn symlink_loop_is_not_inside() {
        let (_dir, ws, _outside) = layout();
        symlink(ws.join("loop"), ws.join("loop")).unwrap();
        assert!(!inside_workspace(std::slice::from_ref(&ws), &ws.join("loop/file")));
    }

    #[test]
    fn missing_file_inside_is_inside() {
        let (_dir, ws, _outside) = layout();
        let roots = [ws.clone()];
        assert!(inside_workspace(&roots, &ws.join("new/dir/file.txt")));
        assert!(inside_workspace(&roots, &resolve(&ws, "a/../b.txt")));
    }

    #[test]
    fn workspace_reached_through_a_symlink_still_counts() {
        let (dir, ws, _outside) = layout();
        let alias = dir.path().join("alias");
        symlink(&ws, &alias).unwrap();
        assert!(inside_workspace(std::slice::from_ref(&alias), &ws.join("file.txt")));
        assert!(inside_workspace(std::slice::from_ref(&ws), &alias.join("file.txt")));
    }
}
