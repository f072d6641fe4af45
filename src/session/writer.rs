//! The append path of one log: events are serialized into a pending buffer (O(1) per event) and
//! written in batches; `flush` writes and `fsync`s. The first flush materializes the file through
//! a temporary file, `fsync`, a no-overwrite hard link and a directory `fsync`, so a log either
//! exists with its header or not at all. A failed write truncates the file back to its last
//! committed length, so a half line is never followed by another record. A failed `fsync` cuts
//! the file back to its last synced length and writes the bytes it covered again: Linux may drop
//! the pages whose writeback failed and report the error once, so a later `fsync` that succeeds
//! says nothing of them. A creation that fails (in `materialize`, or later through `discard`)
//! leaves neither the file nor its directory.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};

use super::record::{Event, SessionHeader};
use super::warn::{Fate, WriteWarnings};
use super::watch::LogWatch;

/// Pending bytes above which an append writes through (without `fsync`).
const WRITE_THROUGH_BYTES: usize = 1 << 20;

/// The batch buffer's capacity kept after a write.
const KEPT_BUFFER_BYTES: usize = 64 * 1024;

/// Written bytes not yet `fsync`ed are kept in memory (to be written again if the `fsync`
/// fails); when they reach this, a write-through `fsync`s them, so the copy stays bounded.
const UNSYNCED_KEPT_BYTES: usize = 4 << 20;

/// Appends events to one log file.
#[derive(Debug)]
pub struct LogWriter {
    path: PathBuf,
    file: Option<LockedFile>,
    /// Header line waiting for materialization (None once the file exists).
    header_line: Option<String>,
    committed: u64,
    pending: Vec<u8>,
    /// The bytes written since the last successful `fsync`: the file's last `unsynced.len()`
    /// bytes of its `committed`. A failed `fsync` cuts the file back to before them and puts them
    /// back in front of `pending`.
    unsynced: Vec<u8>,
    /// Test hook: how many of the next `fsync`s fail with EIO (a real one cannot be made to fail
    /// once on a test machine's disk).
    #[cfg(test)]
    failing_syncs: usize,
    /// A failed write's rollback failed too (this is why the write failed): bytes past
    /// `committed` (part of a line) may be in the file. They are cut before anything else is
    /// appended, or nothing is: appending after them would put a broken line inside the log.
    stray: Option<String>,
    /// This writer published the file (and, if it had to, its directory): `discard` removes them.
    created: Option<Created>,
    /// Failed writes are logged through this, rate-limited.
    warnings: WriteWarnings,
    /// Told when the header is published, after each `fsync` and when the writer closes.
    watch: Option<Arc<LogWatch>>,
}

/// What `materialize` created.
#[derive(Debug, Clone, Copy)]
struct Created {
    dir: bool,
}

impl LogWriter {
    /// A writer for a log that does not exist yet; nothing is written until the first flush.
    pub fn create(path: PathBuf, header: &SessionHeader) -> Result<Self> {
        if path.exists() {
            anyhow::bail!("session log already exists: {}", path.display());
        }
        let header_line = serde_json::to_string(header).context("serializing session header")?;
        Ok(LogWriter::at(path, None, Some(header_line), 0))
    }

    /// A writer of the log at `path` with nothing pending: `file` open on it (`None` until a new
    /// log's `header_line` is published), `committed` bytes of it written.
    fn at(path: PathBuf, file: Option<LockedFile>, header_line: Option<String>, committed: u64) -> LogWriter {
        LogWriter {
            path,
            file,
            header_line,
            committed,
            pending: Vec::new(),
            unsynced: Vec::new(),
            #[cfg(test)]
            failing_syncs: 0,
            stray: None,
            created: None,
            warnings: WriteWarnings::default(),
            watch: None,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// This writer, reporting its log to `watch` (see `session::watch`).
    pub(crate) fn watched(mut self, watch: Option<Arc<LogWatch>>) -> Self {
        self.watch = watch;
        self
    }

    /// Reports the log to the watch, if there is one and the file exists.
    fn report(&self) {
        if let Some(watch) = &self.watch
            && self.file.is_some()
        {
            watch.changed(&self.path);
        }
    }

    /// Queues one event. Writes through when the batch is large; never `fsync`s. A failed
    /// write-through keeps the batch (the file is rolled back) and surfaces at the next `flush`.
    pub fn append(&mut self, event: &Event) {
        event.write_line(&mut self.pending);
        if self.pending.len() >= WRITE_THROUGH_BYTES && self.write_logged().is_ok() {
            self.sync_when_kept_is_full();
        }
    }

    /// Writes everything pending and `fsync`s. On failure the file is back at its last committed
    /// length (its last synced one, when the `fsync` failed) and the events not yet durable are
    /// kept for the next attempt.
    pub fn flush(&mut self) -> Result<()> {
        self.write_logged()?;
        self.sync().inspect_err(|e| self.warnings.failed(&self.path, e, Fate::Kept))
    }

    /// `fsync`s what was written since the last `fsync`. When that fails, the bytes it covered
    /// cannot be trusted to reach the disk even if a later `fsync` succeeds, so the file is cut
    /// back to its last synced length and they go back in front of `pending`, to be written again.
    fn sync(&mut self) -> Result<()> {
        if self.unsynced.is_empty() {
            return Ok(());
        }
        if let Err(e) = self.sync_data() {
            let synced = self.synced();
            let mut e = anyhow::Error::new(e).context(format!("syncing {}", self.path.display()));
            if let Some(file) = &self.file
                && let Err(r) = file.set_len(synced)
            {
                // Whatever is past `synced` is cut before the next append, or nothing is appended.
                self.stray = Some(format!("{e:#}"));
                e = e.context(format!("(truncating it back failed too: {r})"));
            }
            self.committed = synced;
            let mut again = std::mem::take(&mut self.unsynced);
            again.append(&mut self.pending);
            self.pending = again;
            return Err(e);
        }
        self.unsynced.clear();
        self.unsynced.shrink_to(KEPT_BUFFER_BYTES);
        self.report();
        Ok(())
    }

    /// The file's length at its last successful `fsync`.
    fn synced(&self) -> u64 {
        self.committed - self.unsynced.len() as u64
    }

    /// `fsync` of the file's data (failing while the test hook says so).
    fn sync_data(&mut self) -> std::io::Result<()> {
        #[cfg(test)]
        if self.failing_syncs > 0 {
            self.failing_syncs -= 1;
            return Err(std::io::Error::from_raw_os_error(libc::EIO));
        }
        self.file.as_ref().map_or(Ok(()), |file| file.sync_data())
    }

    /// `sync`s when the copy of unsynced bytes has reached its bound (a failure is logged, and
    /// the bytes are written again at the next write).
    fn sync_when_kept_is_full(&mut self) {
        if self.unsynced.len() >= UNSYNCED_KEPT_BYTES
            && let Err(e) = self.sync()
        {
            self.warnings.failed(&self.path, &e, Fate::Kept);
        }
    }

    /// Writes `events` after everything pending and `fsync`s, all or nothing for `events`: when
    /// any step fails, the file ends where it did before them (earlier events stay written, or
    /// pending for the next attempt) and `events` are dropped. What a caller acknowledges as
    /// accepted goes through here.
    pub fn append_durably(&mut self, events: &[Event]) -> Result<()> {
        if let Err(e) = self.write_logged() {
            // The earlier events are kept (and warned of so); these are refused.
            self.warnings.failed(&self.path, &e, Fate::Refused);
            return Err(e);
        }
        // What was written before these events and not yet synced, kept if the sync fails.
        let earlier = self.unsynced.len();
        for event in events {
            event.write_line(&mut self.pending);
        }
        if let Err(e) = self.write_logged_as(Fate::Refused) {
            self.pending.clear();
            return Err(e);
        }
        if let Err(e) = self.sync() {
            // The file is back at its last synced length; the earlier bytes are pending again,
            // these events' are dropped.
            self.pending.truncate(earlier);
            self.warnings.failed(&self.path, &e, Fate::Refused);
            return Err(e);
        }
        Ok(())
    }

    /// Hands queued events to the OS without `fsync` (eager writes at await points: they survive
    /// a killed process, and `flush` later makes them durable). Failures are retried at `flush`.
    pub fn write_eager(&mut self) {
        if !self.pending.is_empty() && self.write_logged().is_ok() {
            self.sync_when_kept_is_full();
        }
    }

    /// The bytes of events appended so far: written or queued (the header not counted until
    /// the file exists).
    pub fn appended_bytes(&self) -> u64 {
        self.committed + self.pending.len() as u64
    }

    /// True when events are queued but not yet durable.
    pub fn is_dirty(&self) -> bool {
        !self.pending.is_empty() || !self.unsynced.is_empty() || self.header_line.is_some()
    }

    /// `write_pending`, logging a failure (rate-limited) and a recovery.
    fn write_logged(&mut self) -> Result<()> {
        self.write_logged_as(Fate::Kept)
    }

    /// `write_logged`, warning that what it was writing met `fate` if it fails.
    fn write_logged_as(&mut self, fate: Fate) -> Result<()> {
        let had_pending = !self.pending.is_empty();
        match self.write_pending() {
            Ok(()) => {
                if had_pending {
                    self.warnings.succeeded(&self.path);
                }
                Ok(())
            }
            Err(e) => {
                self.warnings.failed(&self.path, &e, fate);
                Err(e)
            }
        }
    }

    fn write_pending(&mut self) -> Result<()> {
        if self.header_line.is_some() {
            self.materialize()?;
        }
        if self.pending.is_empty() {
            return Ok(());
        }
        let Some(file) = self.file.as_mut() else {
            anyhow::bail!("session log {} is not open", self.path.display());
        };
        if let Some(cause) = &self.stray {
            file.set_len(self.committed).with_context(|| {
                format!(
                    "cutting {} back to its last whole event ({} bytes) before appending, after a failed write ({cause}) left part of a line",
                    self.path.display(),
                    self.committed
                )
            })?;
            self.stray = None;
        }
        if let Err(e) = file.write_all(&self.pending) {
            let rollback = file.set_len(self.committed);
            let context = format!("appending to {}", self.path.display());
            return match rollback {
                Ok(()) => Err(anyhow::Error::new(e).context(context)),
                Err(r) => {
                    self.stray = Some(e.to_string());
                    Err(anyhow::Error::new(e).context(format!("{context} (rollback failed too: {r})")))
                }
            };
        }
        self.committed += self.pending.len() as u64;
        if self.pending.len() > self.unsynced.len() {
            // The larger buffer takes the other's bytes: a huge line (a message built from a
            // million chunks lists their seqs: megabytes) is not held twice while it is copied.
            self.pending.splice(0..0, self.unsynced.drain(..));
            std::mem::swap(&mut self.unsynced, &mut self.pending);
        } else {
            self.unsynced.extend_from_slice(&self.pending);
        }
        self.pending.clear();
        // A huge line (a message built from a million chunks) or a full batch must not keep
        // its buffer for the life of the session.
        self.pending.shrink_to(KEPT_BUFFER_BYTES);
        Ok(())
    }

    /// Publishes the header. A failure at any step (out of file descriptors, a full disk)
    /// leaves nothing behind: the published link and a directory created for it are removed.
    fn materialize(&mut self) -> Result<()> {
        let Some(header_line) = self.header_line.clone() else {
            return Ok(());
        };
        let dir = self.path.parent().context("session log path has no parent directory")?.to_path_buf();
        let created = Created { dir: !dir.exists() };
        let mut linked = false;
        let mut publish = || -> Result<LockedFile> {
            create_dir_durably(&dir)?;
            let tmp = dir.join(format!(".session.jsonl.{}.tmp", uuid::Uuid::new_v4()));
            let written = (|| -> Result<()> {
                let mut f = File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
                f.write_all(header_line.as_bytes())?;
                f.write_all(b"\n")?;
                f.sync_all()?;
                std::fs::hard_link(&tmp, &self.path)
                    .with_context(|| format!("publishing {} (does it already exist?)", self.path.display()))?;
                linked = true;
                File::open(&dir).and_then(|d| d.sync_all()).with_context(|| format!("syncing {}", dir.display()))
            })();
            let _ = std::fs::remove_file(&tmp);
            written?;
            let file = OpenOptions::new()
                .append(true)
                .open(&self.path)
                .with_context(|| format!("opening {}", self.path.display()))?;
            lock_exclusive(file, &self.path)
        };
        match publish() {
            Ok(file) => {
                self.committed = header_line.len() as u64 + 1;
                self.file = Some(file);
                self.header_line = None;
                self.created = Some(created);
                self.report();
                Ok(())
            }
            Err(e) => {
                remove_published(&self.path, linked, created);
                Err(e)
            }
        }
    }

    /// Removes the log of a session that was never handed out (its creation failed after the
    /// file was published): the file, and its directory when this writer created it. A writer
    /// that did not publish its file (a reopened log) removes nothing.
    pub fn discard(mut self) {
        let Some(created) = self.created.take() else { return };
        self.file = None;
        remove_published(&self.path, true, created);
        if let Some(watch) = &self.watch {
            watch.changed(&self.path);
        }
    }
}

impl Drop for LogWriter {
    /// A closed log is reported (a discarded one was, when it was removed).
    fn drop(&mut self) {
        self.report();
    }
}

/// Undoes a publication: the log file (when `linked`) and the directory `materialize` created
/// for it (only if nothing else is in it).
fn remove_published(path: &Path, linked: bool, created: Created) {
    if linked && let Err(e) = std::fs::remove_file(path) {
        tracing::warn!(path = %path.display(), "cannot remove a session log whose creation failed: {e}");
    }
    if created.dir
        && let Some(dir) = path.parent()
    {
        let _ = std::fs::remove_dir(dir);
    }
}

/// A log file holding the writers' advisory exclusive lock (`flock`), which it releases
/// explicitly when dropped. Closing the file alone would not: the lock belongs to the open file
/// description, which a process this one forks while the file is open shares until it calls
/// `exec`, so a delete or a load right after a close, while kin spawns a tool or server process,
/// would be refused as if the session were still open.
#[derive(Debug)]
pub(crate) struct LockedFile(File);

impl LockedFile {
    /// `file` with the lock taken, or `None` when another open file holds it.
    fn take(file: File) -> std::io::Result<Option<LockedFile>> {
        Ok(flock(&file, libc::LOCK_EX | libc::LOCK_NB)?.then_some(LockedFile(file)))
    }
}

impl std::ops::Deref for LockedFile {
    type Target = File;
    fn deref(&self) -> &File {
        &self.0
    }
}

impl std::ops::DerefMut for LockedFile {
    fn deref_mut(&mut self) -> &mut File {
        &mut self.0
    }
}

impl Drop for LockedFile {
    fn drop(&mut self) {
        if let Err(e) = flock(&self.0, libc::LOCK_UN) {
            tracing::warn!("releasing a session log's lock: {e}; it is released when the file closes");
        }
    }
}

/// `flock(operation)`: true when done, false when `LOCK_NB` met a lock another open file holds.
fn flock(file: &File, operation: libc::c_int) -> std::io::Result<bool> {
    use std::os::fd::AsRawFd;
    // SAFETY: flock on a file descriptor this `File` owns for the duration of the call.
    let rc = unsafe { libc::flock(file.as_raw_fd(), operation) };
    if rc == 0 {
        return Ok(true);
    }
    let err = std::io::Error::last_os_error();
    match err.raw_os_error() {
        Some(libc::EWOULDBLOCK) => Ok(false),
        _ => Err(err),
    }
}

/// An existing log, open for appending and locked against every other kin process: taken
/// before the log is scanned, so that what the scan finds is still all of it when the writer
/// resumes (another kin closing the session between the two could otherwise have appended
/// events the torn-tail truncation would then cut off).
pub(crate) struct LockedLog {
    path: PathBuf,
    file: LockedFile,
}

impl LockedLog {
    /// Opens and locks `path`; refused while another kin process writes it.
    pub(crate) fn open(path: PathBuf) -> Result<LockedLog> {
        // Not a FIFO (the open would block the runtime's thread until a writer came), not a
        // symlink, not a directory: what a scan would refuse anyway, refused before the lock.
        let file = super::scan::open_log_as(&path, OpenOptions::new().append(true))
            .with_context(|| format!("opening session log {}", path.display()))?;
        let file = lock_exclusive(file, &path)?;
        Ok(LockedLog { path, file })
    }

    /// The writer continuing this log, whose valid prefix is `committed` bytes long: a torn tail
    /// beyond it is truncated now, before anything else is appended.
    pub(crate) fn resume(self, committed: u64) -> Result<LogWriter> {
        let LockedLog { path, file } = self;
        let len = file.metadata().map(|m| m.len()).unwrap_or(committed);
        if len != committed {
            file.set_len(committed).with_context(|| format!("truncating the torn tail of {}", path.display()))?;
            file.sync_all().with_context(|| format!("syncing {}", path.display()))?;
        }
        Ok(LogWriter::at(path, Some(file), None, committed))
    }
}

/// Takes the advisory exclusive lock (`flock`) that marks a log as written by this process; it is
/// released when the writer closes (`LockedFile`), or when the process dies. A log locked by
/// another open file is refused with an error that says so.
fn lock_exclusive(file: File, path: &Path) -> Result<LockedFile> {
    if let Some(locked) = LockedFile::take(file).with_context(|| format!("locking {}", path.display()))? {
        return Ok(locked);
    }
    anyhow::bail!(
        "session log {} is being written by another kin process; close the session there (or stop that kin) first",
        path.display()
    )
}

/// Creates `dir` and its missing parents, and syncs the parent of each directory it created, so
/// that a crash cannot lose a new session (or project) directory whose log was already published
/// and synced.
fn create_dir_durably(dir: &Path) -> Result<()> {
    create_dir_syncing(dir, |parent| File::open(parent).and_then(|p| p.sync_all()))
}

/// `create_dir_durably` with the sync of a directory given (`sync`), deepest first.
fn create_dir_syncing(dir: &Path, mut sync: impl FnMut(&Path) -> std::io::Result<()>) -> Result<()> {
    let missing: Vec<&Path> = dir.ancestors().take_while(|at| !at.exists()).collect();
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    for created in missing {
        if let Some(parent) = created.parent() {
            sync(parent).with_context(|| format!("syncing {}", parent.display()))?;
        }
    }
    Ok(())
}

/// Takes the writer's lock on an existing log without writing to it: `Some(file)` holds it (until
/// the file is dropped), `None` means a writer — a live session, in this process or another —
/// holds it.
pub(super) fn try_lock(path: &Path) -> Result<Option<LockedFile>> {
    // As a scan opens a log: a FIFO does not block the open, a symlink is not followed.
    let file = super::scan::open_log_unchecked(path).with_context(|| format!("opening {}", path.display()))?;
    LockedFile::take(file).with_context(|| format!("locking {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The writer continuing `path`, whose valid prefix is `committed` bytes long (as a load
    /// makes it, without the scan).
    fn reopen(path: PathBuf, committed: u64) -> Result<LogWriter> {
        LockedLog::open(path)?.resume(committed)
    }

    /// A writer on `/dev/full`, which fails every write with ENOSPC (opened directly: a load
    /// refuses anything but a regular file).
    fn full_device() -> LogWriter {
        let path = PathBuf::from("/dev/full");
        let file = OpenOptions::new().append(true).open(&path).unwrap();
        let file = lock_exclusive(file, &path).unwrap();
        LockedLog { path, file }.resume(0).unwrap()
    }
    use serde_json::json;

    fn event(seq: u64) -> Event {
        Event { kind: "x".into(), seq, time: 0, data: json!({}).into(), source_event_seqs: None, surface_op: None }
    }

    #[test]
    fn nothing_is_written_before_the_first_flush() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a/session.jsonl");
        let mut w = LogWriter::create(path.clone(), &SessionHeader::new("a", 0, None)).unwrap();
        w.append(&event(0));
        assert!(!path.exists());
        w.flush().unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 2);
        assert!(!w.is_dirty());
        let leftovers: Vec<_> = std::fs::read_dir(path.parent().unwrap()).unwrap().collect();
        assert_eq!(leftovers.len(), 1, "temporary file removed");
    }

    #[test]
    fn a_log_open_for_writing_cannot_be_opened_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a/session.jsonl");
        let mut first = LogWriter::create(path.clone(), &SessionHeader::new("a", 0, None)).unwrap();
        first.flush().unwrap();
        let committed = std::fs::metadata(&path).unwrap().len();
        let err = reopen(path.clone(), committed).unwrap_err().to_string();
        assert!(err.contains("being written by another kin process"), "{err}");
        drop(first);
        reopen(path, committed).expect("the lock is released with the writer");
    }

    #[test]
    fn a_discarded_log_leaves_neither_file_nor_directory() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("project/a/session.jsonl");
        let mut w = LogWriter::create(path.clone(), &SessionHeader::new("a", 0, None)).unwrap();
        w.flush().unwrap();
        assert!(path.exists());
        w.discard();
        assert!(!path.parent().unwrap().exists(), "the session directory is gone");
        assert!(dir.path().join("project").exists(), "the shared project directory stays");
        // A reopened log is never discarded.
        let mut w = LogWriter::create(path.clone(), &SessionHeader::new("a", 0, None)).unwrap();
        w.flush().unwrap();
        let committed = std::fs::metadata(&path).unwrap().len();
        drop(w);
        reopen(path.clone(), committed).unwrap().discard();
        assert!(path.exists());
    }

    #[test]
    fn a_durable_append_that_cannot_be_written_leaves_nothing_of_itself() {
        // /dev/full fails every write with ENOSPC.
        let mut w = full_device();
        w.append(&event(0));
        let before = w.pending.clone();
        let err = w.append_durably(&[event(1), event(2)]).unwrap_err();
        assert!(format!("{err:#}").contains("No space left on device"), "{err:#}");
        assert_eq!(w.pending, before, "the earlier event stays pending, the durable ones are gone");
        assert_eq!(w.committed, 0);
        assert!(w.flush().is_err());
    }

    #[test]
    fn a_durable_append_writes_what_was_pending_first_and_syncs() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a/session.jsonl");
        let mut w = LogWriter::create(path.clone(), &SessionHeader::new("a", 0, None)).unwrap();
        w.append(&event(0));
        w.append_durably(&[event(1)]).unwrap();
        assert!(!w.is_dirty());
        let text = std::fs::read_to_string(&path).unwrap();
        let seqs: Vec<&str> = text.lines().skip(1).map(|l| &l[l.find("\"seq\":").unwrap() + 6..][..1]).collect();
        assert_eq!(seqs, ["0", "1"]);
    }

    /// A new log at `dir/a/session.jsonl` with event 0 synced, and the file's length then.
    fn synced_log(dir: &tempfile::TempDir) -> (PathBuf, LogWriter, u64) {
        let path = dir.path().join("a/session.jsonl");
        let mut w = LogWriter::create(path.clone(), &SessionHeader::new("a", 0, None)).unwrap();
        w.append(&event(0));
        w.flush().unwrap();
        let synced = std::fs::metadata(&path).unwrap().len();
        (path, w, synced)
    }

    /// The seqs of the events in the log at `path`, in file order.
    fn seqs_in(path: &Path) -> Vec<u64> {
        let text = std::fs::read_to_string(path).unwrap();
        text.lines()
            .skip(1)
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["seq"].as_u64().unwrap())
            .collect()
    }

    #[test]
    fn a_failed_sync_cuts_the_log_back_and_writes_its_bytes_again_before_trusting_a_later_sync() {
        let dir = tempfile::tempdir().unwrap();
        let (path, mut w, synced) = synced_log(&dir);
        w.append(&event(1));
        w.append(&event(2));
        w.write_eager();
        assert!(std::fs::metadata(&path).unwrap().len() > synced, "handed to the OS, not synced");
        w.failing_syncs = 1;
        let err = format!("{:#}", w.flush().unwrap_err());
        assert!(err.contains("syncing") && err.contains("Input/output error"), "{err}");
        // The pages of events 1 and 2 may never reach the disk, whatever the next fsync says:
        // they are cut from the file and pending again.
        assert_eq!(std::fs::metadata(&path).unwrap().len(), synced, "cut back to the last synced length");
        assert_eq!(seqs_in(&path), [0]);
        assert!(w.is_dirty());
        w.flush().unwrap();
        assert_eq!(seqs_in(&path), [0, 1, 2], "written again, once each, and synced");
        assert!(!w.is_dirty());
    }

    #[test]
    fn a_durable_append_whose_sync_fails_keeps_the_earlier_events_and_refuses_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let (path, mut w, synced) = synced_log(&dir);
        w.append(&event(1));
        w.failing_syncs = 1;
        assert!(w.append_durably(&[event(2), event(3)]).is_err());
        assert_eq!(std::fs::metadata(&path).unwrap().len(), synced);
        w.append(&event(4));
        w.flush().unwrap();
        assert_eq!(seqs_in(&path), [0, 1, 4], "event 1 kept and written again, the refused ones gone");
    }

    /// The bytes written since the last `fsync` are kept once: the larger of the batch just
    /// written and the earlier unsynced bytes takes the other's (a message listing a million
    /// chunk seqs is megabytes, and was held twice while it was copied), and a failed `fsync`
    /// still writes them all again in order, whichever buffer took them.
    #[test]
    fn a_large_batch_becomes_the_unsynced_copy_instead_of_being_copied_into_it() {
        let dir = tempfile::tempdir().unwrap();
        let (path, mut w, synced) = synced_log(&dir);
        let big = |seq| Event { data: json!({"text": "x".repeat(200_000)}).into(), ..event(seq) };
        // Nothing unsynced: the written buffer itself is kept.
        w.append(&big(1));
        let written = w.pending.as_ptr();
        w.write_eager();
        assert_eq!(w.unsynced.as_ptr(), written, "the batch's own buffer, not a copy of it");
        assert!(w.pending.capacity() <= KEPT_BUFFER_BYTES);
        // A small batch joins the unsynced bytes; a larger one takes them in front of its own.
        w.append(&event(2));
        w.write_eager();
        w.append(&big(3));
        w.append(&big(4));
        w.write_eager();
        w.append(&event(5));
        w.write_eager();
        assert_eq!(w.synced(), synced, "nothing synced since event 0");
        assert_eq!(std::fs::metadata(&path).unwrap().len() - synced, w.unsynced.len() as u64);
        w.failing_syncs = 1;
        assert!(w.flush().is_err());
        assert_eq!(seqs_in(&path), [0]);
        w.flush().unwrap();
        assert_eq!(seqs_in(&path), [0, 1, 2, 3, 4, 5], "written again in order, once each");
    }

    #[test]
    fn unsynced_bytes_kept_for_a_rewrite_stay_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let (path, mut w, _) = synced_log(&dir);
        let big = |seq| Event { data: json!({"text": "x".repeat(100_000)}).into(), ..event(seq) };
        for seq in 1..=100 {
            w.append(&big(seq));
            assert!(w.unsynced.len() < UNSYNCED_KEPT_BYTES + WRITE_THROUGH_BYTES + 200_000, "at event {seq}");
        }
        assert!(std::fs::metadata(&path).unwrap().len() > 9_000_000, "written through");
        assert!(w.unsynced.len() < UNSYNCED_KEPT_BYTES, "synced when the copy was full");
        w.flush().unwrap();
        assert_eq!(seqs_in(&path), (0..=100).collect::<Vec<_>>());
    }

    #[test]
    fn a_created_directory_is_made_durable_in_its_parent_up_to_the_first_that_existed() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("project/session");
        let mut synced = Vec::new();
        create_dir_syncing(&dir, |p| {
            synced.push(p.to_path_buf());
            Ok(())
        })
        .unwrap();
        assert!(dir.is_dir());
        assert_eq!(
            synced,
            [root.path().join("project"), root.path().to_path_buf()],
            "the session's, then the project's entry"
        );
        let other = root.path().join("project/another");
        synced.clear();
        create_dir_syncing(&other, |p| {
            synced.push(p.to_path_buf());
            Ok(())
        })
        .unwrap();
        assert_eq!(synced, [root.path().join("project")], "only what was created");
        let failed = create_dir_syncing(&root.path().join("third/x"), |_| Err(std::io::ErrorKind::Other.into()));
        assert!(failed.unwrap_err().to_string().contains("syncing"), "a failed sync fails the creation");
    }

    #[test]
    fn a_failed_rollback_is_remembered_and_the_stray_bytes_cut_before_the_next_append() {
        // /dev/full fails every write, and a device cannot be truncated: the rollback fails.
        let mut w = full_device();
        w.append(&event(0));
        let err = format!("{:#}", w.flush().unwrap_err());
        assert!(err.contains("rollback failed too"), "{err}");
        assert!(w.stray.as_deref().is_some_and(|cause| cause.contains("No space left")), "{:?}", w.stray);
        let err = format!("{:#}", w.flush().unwrap_err());
        assert!(err.contains("before appending"), "nothing is appended after the stray bytes: {err}");
        assert!(err.contains("No space left on device"), "the first failure is named: {err}");

        // A real log holding part of a line past its last whole event, as a failed rollback
        // leaves it: the next append cuts it first.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("session.jsonl");
        std::fs::write(
            &path, "header
",
        )
        .unwrap();
        let mut w = reopen(path.clone(), 7).unwrap();
        std::fs::OpenOptions::new().append(true).open(&path).unwrap().write_all(b"{\"type\":\"x\",\"se").unwrap();
        w.stray = Some("No space left on device".into());
        w.append(&event(1));
        w.flush().unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(lines[1].starts_with("{\"type\":\"x\",\"seq\":1"), "{text}");
        assert!(w.stray.is_none());
    }

    #[test]
    fn a_closed_log_s_lock_is_released_while_a_process_forked_with_it_open_has_not_exec_d() {
        use std::io::{Read, Write};
        use std::os::fd::AsRawFd;
        use std::os::unix::process::CommandExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a/session.jsonl");
        let mut w = LogWriter::create(path.clone(), &SessionHeader::new("a", 0, None)).unwrap();
        w.flush().unwrap();
        // A process forked while the log is open and held between its fork and its `exec`, as a
        // tool or server process kin spawns is for a moment: it shares the log's open file.
        let (mut forked, forked_says) = std::io::pipe().unwrap();
        let (release_waits, mut release) = std::io::pipe().unwrap();
        let (says, waits) = (forked_says.as_raw_fd(), release_waits.as_raw_fd());
        let mut command = std::process::Command::new("true");
        // SAFETY: the hook only calls `write` and `read`, both async-signal-safe.
        unsafe {
            command.pre_exec(move || {
                let mut byte = 0u8;
                libc::write(says, (&raw const byte).cast(), 1);
                libc::read(waits, (&raw mut byte).cast(), 1);
                Ok(())
            });
        }
        let child = std::thread::spawn(move || command.spawn().and_then(|mut child| child.wait()));
        forked.read_exact(&mut [0u8]).unwrap();
        drop(w);
        // What a delete (`try_lock`) and a load (`LockedLog::open`) of the closed log find.
        let deletable = try_lock(&path).unwrap().is_some();
        let loadable = LockedLog::open(path.clone()).map(drop);
        release.write_all(b"x").unwrap();
        assert!(child.join().unwrap().unwrap().success());
        assert!(deletable, "the closed log is still locked while the forked process has not exec'd");
        loadable.expect("a closed log opens for writing again");
    }

    #[test]
    fn reopen_truncates_the_torn_tail() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("session.jsonl");
        std::fs::write(&path, "header\n{\"torn").unwrap();
        let mut w = reopen(path.clone(), 7).unwrap();
        w.append(&event(0));
        w.flush().unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with("header\n{\"type\":\"x\""), "{text}");
    }
}
