//! The JSONL session store: creating, locating, listing, loading (repairing), inspecting
//! (read-only) and deleting logs under one root directory.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use super::layout::{LOG_FILE, encode_segment, log_path, validate_session_id};
use super::live::Session;
use super::record::SessionHeader;
use super::repair::closers;
use super::scan::{LogStat, ScanError, Scanned, read_filed_header, scan_file, scan_file_resident};
use super::store_scan::each_in_parallel;
use super::watch::LogWatch;
use super::writer::{LockedLog, LogWriter};

/// Why a session could not be opened.
#[derive(Debug)]
pub enum StoreError {
    InvalidId(String),
    NotFound(String),
    /// The operation is not allowed on this session; the message says why and what to do.
    Refused(String),
    Scan(ScanError),
    Io(anyhow::Error),
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreError::InvalidId(reason) => write!(f, "invalid session id: {reason}"),
            StoreError::NotFound(id) => write!(f, "unknown session: {id}"),
            StoreError::Refused(reason) => f.write_str(reason),
            StoreError::Scan(e) => e.fmt(f),
            StoreError::Io(e) => write!(f, "{e:#}"),
        }
    }
}

impl std::error::Error for StoreError {}

/// A session found on disk, read from its header line only.
#[derive(Debug, Clone)]
pub struct StoredSession {
    pub header: SessionHeader,
    pub path: PathBuf,
    /// The log's stat when its header was read (the key of its title).
    pub(crate) stat: LogStat,
}

impl StoredSession {
    /// When the log was last written.
    pub fn modified(&self) -> SystemTime {
        self.stat.modified
    }
}

/// All logs under one root.
#[derive(Debug, Clone)]
pub struct SessionStore {
    root: PathBuf,
    /// Told of every log this store's writers publish, flush or close, and of the logs it
    /// deletes (`watched`).
    watch: Option<Arc<LogWatch>>,
}

impl SessionStore {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        SessionStore { root: root.into(), watch: None }
    }

    /// This store, reporting the logs it writes and deletes to `watch` (the runtime's session
    /// query keeps its catalog index current through it; `session::watch`).
    pub fn watched(mut self, watch: Option<Arc<LogWatch>>) -> Self {
        self.watch = watch;
        self
    }

    /// Reports a removed log to the watch.
    fn removed(&self, path: &Path) {
        if let Some(watch) = &self.watch {
            watch.changed(path);
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// A new, not yet materialized session (the file appears at the first flush).
    pub fn create(&self, header: SessionHeader) -> Result<Session, StoreError> {
        self.create_seeded(header, Vec::new())
    }

    /// A new session whose log starts with `seed` (contiguous from seq 0, written verbatim),
    /// followed by `session/end-seed` when the seed is not empty.
    pub fn create_seeded(
        &self,
        header: SessionHeader,
        seed: Vec<crate::session::Event>,
    ) -> Result<Session, StoreError> {
        validate_session_id(&header.id).map_err(StoreError::InvalidId)?;
        if seed.iter().enumerate().any(|(i, e)| e.seq != i as u64) {
            return Err(StoreError::Io(anyhow::anyhow!("a session seed must be contiguous from seq 0")));
        }
        if self.locate(&header.id)?.is_some() {
            return Err(StoreError::Io(anyhow::anyhow!("session {} already exists", header.id)));
        }
        let path = log_path(&self.root, header.cwd.as_deref(), &header.id);
        let mut writer = LogWriter::create(path, &header).map_err(StoreError::Io)?.watched(self.watch.clone());
        for event in &seed {
            writer.append(event);
        }
        let seeded = !seed.is_empty();
        let mut session = Session::new(header, seed, writer);
        if seeded {
            session.push(super::event::EndSeed {});
        }
        Ok(session)
    }

    /// The log file of `id`, if any project directory holds it.
    pub fn locate(&self, id: &str) -> Result<Option<PathBuf>, StoreError> {
        validate_session_id(id).map_err(StoreError::InvalidId)?;
        let segment = encode_segment(id);
        let Ok(projects) = std::fs::read_dir(&self.root) else {
            return Ok(None);
        };
        for project in projects.flatten() {
            let candidate = project.path().join(&segment).join(LOG_FILE);
            if std::fs::symlink_metadata(&candidate).is_ok() {
                return Ok(Some(candidate));
            }
        }
        Ok(None)
    }

    /// The header of a stored session, read from its first line only (never blocking on a
    /// FIFO, never following a symlink): what authorization needs without loading anything.
    pub fn header(&self, id: &str) -> Result<SessionHeader, StoreError> {
        let path = self.locate(id)?.ok_or_else(|| StoreError::NotFound(id.to_string()))?;
        let stored = stored_at(&path).map_err(|e| StoreError::Io(anyhow::anyhow!("{}: {e}", path.display())))?;
        let header = stored.ok_or_else(|| StoreError::NotFound(id.to_string()))?.header;
        if header.id != id {
            return Err(StoreError::Scan(ScanError::Corrupt {
                path,
                line: 1,
                reason: format!("header names session {:?}, not {id:?}", header.id),
            }));
        }
        Ok(header)
    }

    /// Non-mutating read of the valid stored prefix: no truncation, no closers, no writes.
    pub fn inspect(&self, id: &str) -> Result<Scanned, StoreError> {
        self.scan(id, scan_file)
    }

    /// The scan of `id`'s log by `scan`, checked to be that session's.
    fn scan(&self, id: &str, scan: fn(&Path) -> Result<Scanned, ScanError>) -> Result<Scanned, StoreError> {
        let path = self.locate(id)?.ok_or_else(|| StoreError::NotFound(id.to_string()))?;
        Self::scan_at(id, path, scan)
    }

    /// `scan` of the log at `path`, whose header must name `id`.
    fn scan_at(id: &str, path: PathBuf, scan: fn(&Path) -> Result<Scanned, ScanError>) -> Result<Scanned, StoreError> {
        scan(&path).and_then(|scanned| named(id, scanned)).map_err(StoreError::Scan)
    }

    /// Whether a kin process (this one or another) has the log at `path` open for writing.
    pub(crate) fn is_open(path: &Path) -> bool {
        matches!(super::writer::try_lock(path), Ok(None))
    }

    /// Repairing load: truncates a torn tail, closes an interrupted turn (durably), and returns
    /// the session ready for appends.
    pub fn load(&self, id: &str) -> Result<Session, StoreError> {
        self.load_scanning(id, scan_file_resident)
    }

    /// `load`, the log read by `scan` once it is locked.
    fn load_scanning(&self, id: &str, scan: fn(&Path) -> Result<Scanned, ScanError>) -> Result<Session, StoreError> {
        let path = self.locate(id)?.ok_or_else(|| StoreError::NotFound(id.to_string()))?;
        let locked = LockedLog::open(path.clone()).map_err(StoreError::Io)?;
        // A call's later chunks stay on disk: the session holds what it needs (see `resident`).
        let scanned = Self::scan_at(id, path, scan)?;
        if let Some(torn) = &scanned.torn {
            tracing::warn!(path = %scanned.path.display(), line = torn.line, bytes = torn.bytes, reason = %torn.reason, "ignoring torn tail of session log");
        }
        let writer = locked.resume(scanned.committed_bytes).map_err(StoreError::Io)?.watched(self.watch.clone());
        let mut session = Session::restore(scanned.header, scanned.events, scanned.length, writer);
        let repairs = closers(session.events());
        if !repairs.is_empty() {
            tracing::warn!(session = %id, events = repairs.len(), "closing a turn interrupted by a crash");
            for closer in repairs {
                session.append_closer(closer);
            }
            session.flush().map_err(StoreError::Io)?;
        }
        Ok(session)
    }

    /// Every log under the root, read from header lines only (on a few threads, a chunk of logs
    /// each); unreadable logs are skipped with a warning. Unordered.
    pub fn list(&self) -> Vec<StoredSession> {
        let Ok(projects) = std::fs::read_dir(&self.root) else {
            return Vec::new();
        };
        let paths: Vec<PathBuf> = projects
            .flatten()
            .filter_map(|project| std::fs::read_dir(project.path()).ok())
            .flat_map(|sessions| sessions.flatten().map(|session| session.path().join(LOG_FILE)))
            .collect();
        let read = |path: &PathBuf| match stored_at(path) {
            Ok(stored) => stored,
            Err(e) => {
                tracing::warn!(path = %path.display(), "skipping unreadable session log: {e}");
                None
            }
        };
        each_in_parallel(&paths, read).into_iter().flatten().collect()
    }
}

impl SessionStore {
    /// Removes the log of a child that was never accepted (its creation was rolled back after the
    /// log was written), so it is neither listable nor resumable. Refused while a writer still
    /// holds the log; a log already gone is fine.
    pub fn discard_unaccepted(&self, id: &str) -> Result<(), StoreError> {
        let Some(path) = self.locate(id)? else { return Ok(()) };
        let Some(lock) = super::writer::try_lock(&path).map_err(StoreError::Io)? else {
            return Err(StoreError::Refused(format!("session {id} is still open; it cannot be discarded")));
        };
        remove_log(&path).map_err(StoreError::Io)?;
        drop(lock);
        self.removed(&path);
        Ok(())
    }

    /// Deletes a top-level session and every subagent session below it (children, their
    /// children, …; forks are sessions of their own and stay). A subagent child is refused (its
    /// top-level session is what gets deleted), and so is the whole request when any of those
    /// logs is open for writing in a kin process, this one or another (its writer holds the
    /// log's lock). Every log is locked first, then removed deepest first, each directory synced,
    /// so a crash midway leaves the session itself in place to delete again. Returns the ids
    /// removed, the session last.
    pub fn delete(&self, id: &str) -> Result<Vec<String>, StoreError> {
        let path = self.locate(id)?.ok_or_else(|| StoreError::NotFound(id.to_string()))?;
        let header = match stored_at(&path) {
            Ok(Some(stored)) => Some(stored.header),
            Ok(None) => return Err(StoreError::NotFound(id.to_string())),
            // A log whose header cannot be read (empty, damaged, not a file) is deleted as a
            // top-level session: nothing shows it is a subagent child, and nothing else in kin
            // can remove it.
            Err(reason) => {
                tracing::warn!(path = %path.display(), "deleting a session whose header cannot be read: {reason}");
                None
            }
        };
        if let Some(header) = &header
            && header.parent_session.is_some()
            && header.origin.as_deref() == Some("subagent")
        {
            return Err(StoreError::Refused(format!(
                "{id} is a subagent session; delete its top-level session, which removes it too"
            )));
        }
        // The tree, breadth first from the session: every stored subagent child of a member.
        let stored = self.list();
        let mut tree = vec![(id.to_string(), path)];
        let mut next = 0;
        while next < tree.len() {
            let parent = tree[next].0.clone();
            for s in &stored {
                let child = s.header.parent_session.as_deref() == Some(parent.as_str())
                    && s.header.origin.as_deref() == Some("subagent");
                if child && !tree.iter().any(|(t, _)| *t == s.header.id) {
                    tree.push((s.header.id.clone(), s.path.clone()));
                }
            }
            next += 1;
        }
        let mut locks = Vec::with_capacity(tree.len());
        for (sid, path) in &tree {
            match super::writer::try_lock(path) {
                Ok(Some(file)) => locks.push(file),
                // A symlink is not a log kin writes: there is no lock to take.
                Err(_) if std::fs::symlink_metadata(path).is_ok_and(|m| m.is_symlink()) => {}
                Ok(None) => {
                    let whose = if sid == id { String::new() } else { format!(" (its subagent session {sid} is)") };
                    return Err(StoreError::Refused(format!(
                        "session {id} is open in a kin process{whose}; close it (session/close) before deleting it"
                    )));
                }
                Err(e) => return Err(StoreError::Io(e)),
            }
        }
        for (_, path) in tree.iter().rev() {
            let removed = remove_log(path).map_err(StoreError::Io);
            self.removed(path);
            removed?;
        }
        drop(locks);
        Ok(tree.into_iter().rev().map(|(sid, _)| sid).collect())
    }
}

/// The top-level sessions of a listing (no `parentSession`: never subagent children or forks),
/// newest first by modification time, only those whose cwd is `cwd` if given.
pub(crate) fn top_level(listed: Vec<StoredSession>, cwd: Option<&Path>) -> Vec<StoredSession> {
    // One workspace however it is spelled (`layout::workspace`), in the filter and in headers
    // written before kin kept one spelling.
    let cwd = cwd.map(super::layout::workspace);
    let in_cwd = |s: &StoredSession| match (&cwd, &s.header.cwd) {
        (None, _) => true,
        // `Path`'s equality already ignores `.`, repeated and trailing separators: a header's
        // path is spelled out again (an allocation per stored session) only when it has a `..`.
        (Some(cwd), Some(theirs)) => {
            Path::new(theirs) == cwd || (theirs.contains("..") && super::layout::workspace(Path::new(theirs)) == *cwd)
        }
        (Some(_), None) => false,
    };
    let mut sessions: Vec<StoredSession> =
        listed.into_iter().filter(|s| s.header.parent_session.is_none()).filter(in_cwd).collect();
    sessions.sort_by_key(|s| std::cmp::Reverse((s.stat.modified, s.header.created_at)));
    sessions
}

/// Removes one log, then its session directory when nothing else is in it, syncing each
/// directory that changed.
fn remove_log(path: &Path) -> anyhow::Result<()> {
    use anyhow::Context;
    let sync = |dir: &Path| std::fs::File::open(dir).and_then(|d| d.sync_all());
    // A directory where the log should be is removed with what it holds (a symlink, not its target).
    let removed = if std::fs::symlink_metadata(path).is_ok_and(|m| m.is_dir()) {
        std::fs::remove_dir_all(path)
    } else {
        std::fs::remove_file(path)
    };
    removed.with_context(|| format!("removing {}", path.display()))?;
    let Some(dir) = path.parent() else { return Ok(()) };
    sync(dir).with_context(|| format!("syncing {}", dir.display()))?;
    match std::fs::remove_dir(dir) {
        Ok(()) => {
            if let Some(project) = dir.parent() {
                sync(project).with_context(|| format!("syncing {}", project.display()))?;
            }
        }
        Err(e) => tracing::debug!(dir = %dir.display(), "keeping a session directory that holds other files: {e}"),
    }
    Ok(())
}

/// `scanned` when its header names session `id` (the directory it is filed under), else the
/// corruption at line 1 every reader reports.
fn named(id: &str, scanned: Scanned) -> Result<Scanned, ScanError> {
    if scanned.header.id == id {
        return Ok(scanned);
    }
    let reason = format!("header names session {:?}, not {id:?}", scanned.header.id);
    Err(ScanError::Corrupt { path: scanned.path, line: 1, reason })
}

/// The stored session at `path`, from its header line; `Ok(None)` when there is no file.
fn stored_at(path: &Path) -> Result<Option<StoredSession>, String> {
    match read_filed_header(path) {
        Ok((header, stat)) => Ok(Some(StoredSession { header, path: path.to_path_buf(), stat })),
        Err(_) if std::fs::symlink_metadata(path).is_err() => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    /// Headers written before kin kept one spelling of a workspace are listed under it however
    /// they spell it.
    #[test]
    fn a_cwd_filter_matches_every_spelling_of_the_workspace() {
        let stored = |id: &str, cwd: &str| StoredSession {
            header: SessionHeader::new(id, 0, Some(cwd.to_string())),
            path: PathBuf::new(),
            stat: LogStat { len: 0, modified: SystemTime::UNIX_EPOCH, changed: SystemTime::UNIX_EPOCH },
        };
        let listed = vec![
            stored("a", "/w"),
            stored("b", "/w/"),
            stored("c", "//w/./"),
            stored("d", "/w/x/.."),
            stored("e", "/w/x"),
            stored("f", "/other/../w2"),
        ];
        for filter in ["/w", "/w/", "/w/x/.."] {
            let mut found: Vec<String> =
                top_level(listed.clone(), Some(Path::new(filter))).into_iter().map(|s| s.header.id).collect();
            found.sort();
            assert_eq!(found, ["a", "b", "c", "d"], "{filter}");
        }
        let found: Vec<String> = top_level(listed, Some(Path::new("/w2"))).into_iter().map(|s| s.header.id).collect();
        assert_eq!(found, ["f"]);
    }

    /// Set by `scan_while_another_writer_tries` when its writer was refused.
    static REFUSED: AtomicBool = AtomicBool::new(false);

    /// A scan during which another writer (as another kin closing the session would) tries to
    /// lock the log before appending to it.
    fn scan_while_another_writer_tries(path: &Path) -> Result<Scanned, ScanError> {
        let refused = LockedLog::open(path.to_path_buf()).is_err_and(|e| e.to_string().contains("another kin process"));
        REFUSED.store(refused, Ordering::SeqCst);
        scan_file_resident(path)
    }

    /// A log written as a file: its header line and `more` after it.
    fn write_log(root: &Path, cwd: &str, id: &str, more: &str) -> PathBuf {
        let path = log_path(root, Some(cwd), id);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let header = serde_json::to_string(&SessionHeader::new(id, 0, Some(cwd.to_string()))).unwrap();
        std::fs::write(&path, format!("{header}\n{more}")).unwrap();
        path
    }

    #[test]
    fn a_listing_reads_every_log_across_its_chunks_and_skips_the_broken_ones() {
        let dir = tempfile::tempdir().unwrap();
        let store = SessionStore::new(dir.path());
        let mut ids: Vec<String> = (0..300).map(|i| format!("s{i:03}")).collect();
        for (i, id) in ids.iter().enumerate() {
            write_log(dir.path(), if i % 3 == 0 { "/a" } else { "/b" }, id, "");
        }
        let broken = log_path(dir.path(), Some("/a"), "broken");
        std::fs::create_dir_all(broken.parent().unwrap()).unwrap();
        std::fs::write(&broken, "not a header\n").unwrap();
        std::fs::create_dir_all(log_path(dir.path(), Some("/a"), "empty").parent().unwrap()).unwrap();
        let mut listed: Vec<String> = store.list().into_iter().map(|s| s.header.id).collect();
        listed.sort();
        ids.sort();
        assert_eq!(listed, ids, "each log once; a broken header and a directory without a log are skipped");
    }

    #[test]
    fn a_load_refuses_a_fifo_or_a_symlink_at_the_log_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let real = write_log(dir.path(), "/a", "real", "");
        let fifo = log_path(dir.path(), Some("/a"), "fifo");
        std::fs::create_dir_all(fifo.parent().unwrap()).unwrap();
        let name = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0);
        let link = log_path(dir.path(), Some("/a"), "link");
        std::fs::create_dir_all(link.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let root = dir.path().to_path_buf();
        // On a thread: a load that blocks on the FIFO fails the test instead of hanging it.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let store = SessionStore::new(root);
            let error = |id: &str| store.load(id).err().map(|e| format!("{e:#}"));
            let _ = tx.send((error("fifo"), error("link")));
        });
        let (fifo, link) = rx.recv_timeout(std::time::Duration::from_secs(20)).expect("the load blocked");
        assert!(fifo.as_deref().is_some_and(|e| e.contains("not a regular file")), "{fifo:?}");
        assert!(link.as_deref().is_some_and(|e| e.contains("symlink")), "{link:?}");
    }

    #[test]
    fn a_session_whose_header_cannot_be_read_can_still_be_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let store = SessionStore::new(dir.path());
        let at = |id: &str| {
            let path = log_path(dir.path(), Some("/a"), id);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            path
        };
        std::fs::write(at("empty"), "").unwrap();
        std::fs::write(at("garbage"), "not a header\n").unwrap();
        std::fs::write(at("v1"), "{\"type\":\"session\",\"version\":1,\"id\":\"v1\",\"createdAt\":0}\n").unwrap();
        std::fs::create_dir(at("dir")).unwrap();
        std::fs::write(at("dir").join("inside"), "x").unwrap();
        std::os::unix::fs::symlink("/nonexistent/target", at("dangling")).unwrap();
        let outside = dir.path().join("outside.jsonl");
        std::fs::write(&outside, "kept").unwrap();
        std::os::unix::fs::symlink(&outside, at("link")).unwrap();
        let fifo = std::ffi::CString::new(at("fifo").as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        for id in ["empty", "garbage", "v1", "dir", "dangling", "link", "fifo"] {
            assert_eq!(store.delete(id).map_err(|e| e.to_string()), Ok(vec![id.to_string()]), "{id}");
            assert!(!log_path(dir.path(), Some("/a"), id).parent().unwrap().exists(), "{id}: its directory is gone");
        }
        assert_eq!(std::fs::read_to_string(&outside).unwrap(), "kept", "a link's target is not touched");
    }

    #[test]
    fn a_load_locks_the_log_before_it_scans_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = SessionStore::new(dir.path());
        let mut session = store.create(SessionHeader::new("s", 0, None)).unwrap();
        session.flush().unwrap();
        drop(session);
        let session = store.load_scanning("s", scan_while_another_writer_tries).unwrap();
        assert!(
            REFUSED.load(Ordering::SeqCst),
            "while the log was scanned no other writer could append what the truncation of a torn tail would cut off"
        );
        drop(session);
        LockedLog::open(store.locate("s").unwrap().unwrap()).expect("the lock goes with the session");
    }
}
