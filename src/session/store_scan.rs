//! The stat pass of a session query's corpus scan: every session log under the sessions
//! directory, its length, mtime and ctime (`scan::LogStat`), from one `fstatat` per log relative to its
//! project directory (a short lookup instead of a walk of the whole path). The work is spread
//! over a few threads in two steps: each project directory is listed (a directory per task),
//! then the logs are statted in chunks that any thread takes next, so one large project (the
//! usual store: most sessions under one working directory) is shared instead of falling to one
//! thread. Scan order is kept: projects as the sessions directory lists them, logs as their
//! project directory does. A scan given the directory memo (`dir_memo`) lists only the project
//! directories whose stamp differs from their memoized listing's, and memoizes what it lists.

use std::ffi::{OsStr, OsString};
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use tokio_util::sync::CancellationToken;

use super::dir_memo::{DirStamp, Listing, Memo, Names, Span};
use super::layout::LOG_FILE;
use super::query::QueryError;
use super::scan::LogStat;

/// One project directory as a scan found it: its name and its session logs.
pub(super) struct ProjectScan {
    pub(super) name: OsString,
    /// The directory's session directory names (shared with its memoized listing, if any).
    names: Names,
    pub(super) logs: Vec<FoundLog>,
}

impl ProjectScan {
    /// The session directory name of `log`, one of this project's logs.
    pub(super) fn session(&self, log: &FoundLog) -> &OsStr {
        self.names.at(log.session)
    }
}

/// One session log a scan found: where its session directory's name is among its project's
/// (`ProjectScan::session`: no copy of the name per log), its stat, or why it could not be
/// statted as a regular file.
pub(super) struct FoundLog {
    session: Span,
    pub(super) found: Result<LogStat, String>,
}

/// At most this many threads scan the store (or build a listing's summaries).
pub(super) const SCAN_THREADS: usize = 4;

/// The logs a thread stats (or reads, in `each_in_parallel`) per task it takes.
const CHUNK: usize = 128;

/// How many threads to use for `tasks` tasks: at most `SCAN_THREADS` and the machine's cores.
pub(super) fn workers_for(tasks: usize) -> usize {
    // Read once: the standard library reads the process's cgroup files on every call, and a
    // listing asks several times.
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let cores = *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, usize::from));
    cores.min(SCAN_THREADS).min(tasks)
}

/// A thread of `in_parallel` panicked.
#[derive(Debug)]
pub(super) struct Panicked;

/// `task(0..tasks)` on up to `workers` threads (the caller's among them), each taking the next
/// task as it finishes one; the results in task order.
pub(super) fn in_parallel<T: Send>(
    workers: usize,
    tasks: usize,
    task: impl Fn(usize) -> T + Sync,
) -> Result<Vec<T>, Panicked> {
    if workers <= 1 || tasks <= 1 {
        return Ok((0..tasks).map(task).collect());
    }
    let next = AtomicUsize::new(0);
    let work = || {
        let mut done = Vec::new();
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            if i >= tasks {
                return done;
            }
            done.push((i, task(i)));
        }
    };
    let mut out: Vec<Option<T>> = std::iter::repeat_with(|| None).take(tasks).collect();
    std::thread::scope(|scope| {
        let helpers: Vec<_> = (1..workers).map(|_| scope.spawn(work)).collect();
        let mine = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work));
        let theirs = helpers.into_iter().map(|h| h.join().map_err(|_| Panicked)).collect::<Result<Vec<_>, _>>()?;
        for (i, result) in std::iter::once(mine.map_err(|_| Panicked)?).chain(theirs).flatten() {
            out[i] = Some(result);
        }
        Ok(())
    })?;
    // Every index below `tasks` was taken by exactly one thread, and none panicked.
    Ok(out.into_iter().flatten().collect())
}

/// `f` of each item, in order, on a few threads taking `CHUNK` items at a time (one thread
/// for a few items; this one alone if a thread panicked): `SessionStore::list`'s header reads
/// and a listing's titles.
pub(super) fn each_in_parallel<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let chunks: Vec<&[T]> = items.chunks(CHUNK).collect();
    match in_parallel(workers_for(chunks.len()), chunks.len(), |c| chunks[c].iter().map(&f).collect::<Vec<R>>()) {
        Ok(done) => done.into_iter().flatten().collect(),
        Err(_) => items.iter().map(f).collect(),
    }
}

/// One project directory, listed: the directory open for `fstatat`, its session directories
/// (their names and where each is among them), and their listing as memoized (when its stamp
/// was settled), and whether it was listed now.
struct Listed {
    name: OsString,
    dir: std::fs::File,
    names: Names,
    spans: Vec<Span>,
    memo: Option<Listing>,
    listed: bool,
}

/// A scan's use of the directory memo: the listings it may reuse while their stamps hold, and
/// how long before the scan's clock a directory must have last changed for its listing to be
/// memoized (`dir_memo::SETTLE`).
pub(super) struct Memoizing<'m> {
    pub(super) known: &'m Memo,
    pub(super) settle: Duration,
}

/// What a scan found: the projects, the memo of the directories as this scan saw them (those it
/// reused and those it listed with a settled stamp), and how many directories it listed.
pub(super) struct Scanned {
    pub(super) projects: Vec<ProjectScan>,
    pub(super) memo: Memo,
    pub(super) listed: usize,
}

/// Every session log under `root` (see the module comment); `stats` counts the `fstatat`s.
pub(super) fn scan_store(
    root: &Path,
    stats: &AtomicU64,
    memoizing: Option<Memoizing<'_>>,
    cancel: &CancellationToken,
) -> Result<Scanned, QueryError> {
    // Read before any directory's stamp: a lower bound on the time each was read at.
    let now = SystemTime::now();
    let mut dirs = Vec::new();
    match std::fs::read_dir(root) {
        Ok(entries) => {
            for entry in entries {
                let entry = entry.map_err(|e| read_failed(root, e))?;
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    dirs.push(entry.file_name());
                }
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(read_failed(root, e)),
    }
    let panicked = |_| QueryError::PersistenceFailed("a session scan thread panicked".into());
    let listed = in_parallel(workers_for(dirs.len()), dirs.len(), |i| {
        list_project(root, &dirs[i], memoizing.as_ref().map(|m| (m, now)), cancel)
    })
    .map_err(panicked)?
    .into_iter()
    .collect::<Result<Vec<Listed>, QueryError>>()?;
    let chunks: Vec<(usize, usize)> = listed
        .iter()
        .enumerate()
        .flat_map(|(p, project)| (0..project.spans.len()).step_by(CHUNK).map(move |start| (p, start)))
        .collect();
    let chunk = |&(p, start): &(usize, usize)| {
        let project: &Listed = &listed[p];
        &project.spans[start..(start + CHUNK).min(project.spans.len())]
    };
    let statted = in_parallel(workers_for(chunks.len()), chunks.len(), |c| {
        let project = &listed[chunks[c].0];
        let spans = chunk(&chunks[c]);
        if cancel.is_cancelled() {
            return Err(QueryError::Aborted);
        }
        stats.fetch_add(spans.len() as u64, Ordering::Relaxed);
        Ok(spans.iter().map(|&span| stat_log(&project.dir, project.names.at(span))).collect::<Vec<_>>())
    })
    .map_err(panicked)?;
    let mut projects: Vec<ProjectScan> = listed
        .iter()
        .map(|p| ProjectScan { name: p.name.clone(), names: p.names.clone(), logs: Vec::with_capacity(p.spans.len()) })
        .collect();
    for (place, found) in chunks.iter().zip(statted) {
        for (found, &session) in found?.into_iter().zip(chunk(place)) {
            if let Some(found) = found {
                projects[place.0].logs.push(FoundLog { session, found });
            }
        }
    }
    let dirs_listed = listed.iter().filter(|p| p.listed).count();
    let memo = listed.into_iter().filter_map(|project| Some((project.name, project.memo?))).collect();
    Ok(Scanned { projects, memo, listed: dirs_listed })
}

/// How many session logs `scan_store` finds under `root`: the stat pass alone, which every
/// listing makes before it reads an index or a log (`kin bench`'s floor of a cold listing).
pub(crate) fn stat_pass(root: &Path) -> Result<usize, QueryError> {
    let scanned = scan_store(root, &AtomicU64::new(0), None, &CancellationToken::new())?;
    Ok(scanned.projects.iter().map(|p| p.logs.len()).sum())
}

/// The session directories of one project directory (entries that are not files): its
/// memoized listing while the directory's stamp is the one memoized, else a listing made now,
/// memoized if its stamp (read before it) was settled at `now`.
fn list_project(
    root: &Path,
    name: &OsStr,
    memoizing: Option<(&Memoizing<'_>, SystemTime)>,
    cancel: &CancellationToken,
) -> Result<Listed, QueryError> {
    if cancel.is_cancelled() {
        return Err(QueryError::Aborted);
    }
    let path = root.join(name);
    let dir = std::fs::File::open(&path).map_err(|e| read_failed(&path, e))?;
    // No stamp (its `fstat` failed, or no memo is kept): listed, and not memoized.
    let stamp = memoizing.and_then(|_| DirStamp::of(&dir).ok());
    let known = memoizing.and_then(|(m, _)| m.known.get(name)).filter(|known| stamp == Some(known.stamp));
    if let Some(known) = known {
        let (names, spans) = (known.sessions.clone(), known.sessions.spans());
        return Ok(Listed { name: name.to_owned(), dir, names, spans, memo: Some(known.clone()), listed: false });
    }
    let mut sessions = Vec::new();
    for session in std::fs::read_dir(&path).map_err(|e| read_failed(&path, e))? {
        let session = session.map_err(|e| read_failed(&path, e))?;
        if !session.file_type().is_ok_and(|t| t.is_file()) {
            sessions.push(session.file_name());
        }
    }
    let names = Names::of(&sessions);
    let memo = stamp
        .zip(memoizing)
        .filter(|(stamp, (m, now))| stamp.settled(*now, m.settle))
        .map(|(stamp, _)| Listing { stamp, sessions: names.clone() });
    Ok(Listed { name: name.to_owned(), dir, spans: names.spans(), names, memo, listed: true })
}

/// A session directory's log: `None` when there is none.
fn stat_log(dir: &std::fs::File, session: &OsStr) -> Option<Result<LogStat, String>> {
    match stat_at(dir, session, LOG_FILE) {
        Ok(Some(found)) => Some(Ok(found)),
        Ok(None) => Some(Err("not a regular file".into())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => Some(Err(e.to_string())),
    }
}

pub(super) fn read_failed(at: &Path, e: std::io::Error) -> QueryError {
    QueryError::PersistenceFailed(format!("cannot read {}: {e}", at.display()))
}

/// `fstatat(dir, "<session>/<file>", AT_SYMLINK_NOFOLLOW)`: the stat of a regular file, `None`
/// for anything else (a symlink, a directory, a FIFO).
fn stat_at(dir: &std::fs::File, session: &OsStr, file: &str) -> std::io::Result<Option<LogStat>> {
    use std::os::fd::AsRawFd;
    use std::os::unix::ffi::OsStrExt;
    // `<session>/<file>\0`, on the stack when it fits (it is made once per log per scan).
    let (session, file) = (session.as_bytes(), file.as_bytes());
    let len = session.len() + 1 + file.len() + 1;
    let mut stack = [0u8; 256];
    let mut heap = Vec::new();
    let buf = if len <= stack.len() {
        &mut stack[..len]
    } else {
        heap.resize(len, 0);
        &mut heap[..]
    };
    buf[..session.len()].copy_from_slice(session);
    buf[session.len()] = b'/';
    buf[session.len() + 1..len - 1].copy_from_slice(file);
    let rel =
        std::ffi::CStr::from_bytes_with_nul(buf).map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    // SAFETY: an all-zero `stat` is a valid value for fstatat to fill.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a valid directory fd, a NUL-terminated relative path and a writable stat buffer.
    let rc = unsafe { libc::fstatat(dir.as_raw_fd(), rel.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Ok(None);
    }
    Ok(Some(LogStat::of_raw(&st)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_parallel_gives_every_result_in_task_order() {
        for workers in [1, 2, 4] {
            let out = in_parallel(workers, 1000, |i| i * 2).unwrap();
            assert_eq!(out, (0..1000).map(|i| i * 2).collect::<Vec<_>>(), "{workers} workers");
        }
        assert!(in_parallel(2, 0, |i| i).unwrap().is_empty());
    }

    #[test]
    fn a_panicking_task_is_reported() {
        let out = in_parallel(2, 10, |i| {
            if i == 7 {
                panic!("task 7");
            }
            i
        });
        // Whichever thread took task 7, the caller's or a helper.
        assert!(out.is_err());
    }

    #[test]
    fn a_large_project_is_statted_in_chunks_and_kept_in_order() {
        let root = tempfile::tempdir().unwrap();
        let big = root.path().join("big");
        let mut expected = Vec::new();
        for i in 0..(3 * CHUNK + 5) {
            let session = big.join(format!("s{i:04}"));
            std::fs::create_dir_all(&session).unwrap();
            if i % 50 != 3 {
                std::fs::write(session.join(LOG_FILE), "x".repeat(i)).unwrap();
                expected.push((format!("s{i:04}"), i as u64));
            }
        }
        std::fs::write(big.join("stray-file"), "").unwrap();
        std::fs::create_dir_all(root.path().join("small/one")).unwrap();
        std::fs::create_dir(root.path().join("small/one").join(LOG_FILE)).unwrap();
        let stats = AtomicU64::new(0);
        let projects = scan_store(root.path(), &stats, None, &CancellationToken::new()).unwrap().projects;
        assert_eq!(stats.load(Ordering::Relaxed), 3 * CHUNK as u64 + 5 + 1, "one stat per session directory");
        let big = projects.iter().find(|p| p.name == "big").unwrap();
        let mut found: Vec<(String, u64)> = big
            .logs
            .iter()
            .map(|log| (big.session(log).to_string_lossy().into_owned(), log.found.as_ref().unwrap().len))
            .collect();
        let listed_order: Vec<OsString> = std::fs::read_dir(root.path().join("big"))
            .unwrap()
            .map(|e| e.unwrap())
            .filter(|e| e.file_type().unwrap().is_dir())
            .map(|e| e.file_name())
            .filter(|name| root.path().join("big").join(name).join(LOG_FILE).exists())
            .collect();
        assert_eq!(
            big.logs.iter().map(|l| big.session(l).to_owned()).collect::<Vec<_>>(),
            listed_order,
            "directory order"
        );
        found.sort();
        assert_eq!(found, expected, "every log with its length; session directories without one are left out");
        let small = projects.iter().find(|p| p.name == "small").unwrap();
        assert_eq!(small.logs.len(), 1);
        assert_eq!(
            stat_pass(root.path()).unwrap(),
            expected.len() + 1,
            "the bench's stat pass counts what the scan found"
        );
        assert_eq!(small.logs[0].found, Err("not a regular file".to_string()));
        let cancelled = CancellationToken::new();
        cancelled.cancel();
        assert!(matches!(scan_store(root.path(), &stats, None, &cancelled), Err(QueryError::Aborted)));
    }

    /// The sessions a scan found in project `p`, sorted.
    fn sessions_in(scanned: &Scanned, p: &str) -> Vec<String> {
        let project = scanned.projects.iter().find(|project| project.name == p).unwrap();
        let mut names: Vec<String> =
            project.logs.iter().map(|log| project.session(log).to_string_lossy().into_owned()).collect();
        names.sort();
        names
    }

    /// Issue 23: a scan lists a project directory only while the memo has no listing under its
    /// current stamp; it memoizes only listings whose stamp was settled; a memoized session
    /// directory without a log is still looked in, so a log made in it later is found.
    #[test]
    fn a_settled_directory_is_listed_once_while_its_stamp_holds() {
        let root = tempfile::tempdir().unwrap();
        for (project, session, log) in [("p", "s1", true), ("p", "s2", true), ("p", "s3", false), ("q", "t1", true)] {
            let dir = root.path().join(project).join(session);
            std::fs::create_dir_all(&dir).unwrap();
            if log {
                std::fs::write(dir.join(LOG_FILE), "x").unwrap();
            }
        }
        let stats = AtomicU64::new(0);
        let cancel = CancellationToken::new();
        let scan = |known: &Memo, settle: Duration| {
            scan_store(root.path(), &stats, Some(Memoizing { known, settle }), &cancel).unwrap()
        };
        // Just made: not settled, so listed and not memoized.
        let fresh = scan(&Memo::default(), super::super::dir_memo::SETTLE);
        assert_eq!((fresh.listed, fresh.memo.len()), (2, 0));
        // Settled (a zero margin): memoized, then not listed again.
        let first = scan(&Memo::default(), Duration::ZERO);
        assert_eq!(first.listed, 2);
        let mut p_names: Vec<String> =
            first.memo[OsStr::new("p")].sessions.iter().map(|s| s.to_string_lossy().into()).collect();
        p_names.sort();
        assert_eq!(p_names, ["s1", "s2", "s3"], "every session directory, with a log or not");
        let again = scan(&first.memo, Duration::ZERO);
        assert_eq!(again.listed, 0);
        assert_eq!(again.memo, first.memo);
        assert_eq!(sessions_in(&again, "p"), ["s1", "s2"]);
        // The names come from the memo while the stamp holds...
        let mut partial = first.memo.clone();
        let p = partial.get_mut(OsStr::new("p")).unwrap();
        let kept: Vec<OsString> = p.sessions.iter().filter(|s| *s != "s2").map(OsStr::to_owned).collect();
        p.sessions = Names::of(&kept);
        let trusted = scan(&partial, Duration::ZERO);
        assert_eq!((trusted.listed, sessions_in(&trusted, "p")), (0, vec!["s1".to_string()]));
        // ...and from the directory once it differs (here another directory's stamp).
        partial.get_mut(OsStr::new("p")).unwrap().stamp = first.memo[OsStr::new("q")].stamp;
        let relisted = scan(&partial, Duration::ZERO);
        assert_eq!((relisted.listed, sessions_in(&relisted, "p")), (1, vec!["s1".to_string(), "s2".to_string()]));
        assert_eq!(relisted.memo, first.memo, "the listing made now is memoized again");
        // A log made in a memoized session directory (its project directory unchanged).
        std::fs::write(root.path().join("p/s3").join(LOG_FILE), "y").unwrap();
        let later = scan(&first.memo, Duration::ZERO);
        assert_eq!((later.listed, sessions_in(&later, "p")), (0, vec!["s1".into(), "s2".into(), "s3".into()]));
    }
}
