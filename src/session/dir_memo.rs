//! The directory memo (issue 23): what the last scan found in each project directory — the
//! names of its session directories, under the directory's stamp (device, inode and ctime) — so
//! a scan of a directory whose stamp has not changed stats those sessions' logs without listing
//! the directory again (on ext4, listing a large directory hashes every name: about 1 µs each,
//! a third of a cold listing's stat pass). Adding, removing or renaming an entry in a directory
//! changes its ctime, and nothing sets a ctime back; a listing is memoized only when its stamp
//! was *settled* when the scan read it (`SETTLE` older than the clock just before), so a change
//! made after that read, however soon, gets a later ctime even on a file system whose times
//! are as coarse as a second or two. Every log a memoized name leads to is still statted: the
//! memo saves the listing of a directory, never the check of a log (seed 000's rule).
//!
//! Kept in memory by the runtime's query between its scans, and in a file beside the sessions
//! directory (`<sessions>.catalog-dirs.jsonl`) for the next start, written with the catalog
//! index. Derived state, never an authority: a file that is missing, unreadable, too large, of
//! another version, truncated, damaged (its digest) or holds a malformed entry is no memo at all,
//! and a directory whose stamp differs is listed; either way the scan lists what it would have
//! listed without one.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use foldhash::{HashMap, HashMapExt};
use serde::{Deserialize, Serialize};

use super::catalog_index;

/// What the memo file's name adds to the sessions directory's name (it sits beside it).
pub(crate) const MEMO_SUFFIX: &str = ".catalog-dirs.jsonl";
/// The format version on the first line; any other is ignored.
pub(super) const MEMO_VERSION: u64 = 1;
/// A memo file larger than this is not read (nor written).
const MEMO_LIMIT: u64 = 64 << 20;
/// How long before a scan's clock a directory's ctime must be for its listing to be memoized:
/// more than the coarsest timestamp granularity of the file systems kin runs on (ext4 with
/// small inodes and most network file systems count whole seconds; FAT two).
pub(crate) const SETTLE: Duration = Duration::from_secs(2);

/// A directory's identity and the time of its last change (any entry added, removed or renamed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct DirStamp {
    dev: u64,
    ino: u64,
    /// Seconds and nanoseconds of its ctime.
    ctime: (i64, i64),
}

impl DirStamp {
    /// The stamp of the open directory `dir` (one `fstat`).
    pub(crate) fn of(dir: &std::fs::File) -> std::io::Result<DirStamp> {
        use std::os::unix::fs::MetadataExt;
        let meta = dir.metadata()?;
        Ok(DirStamp { dev: meta.dev(), ino: meta.ino(), ctime: (meta.ctime(), meta.ctime_nsec()) })
    }

    /// Whether the directory last changed at least `settle` before `now` (a time taken before
    /// the stamp was read); a ctime before the epoch or after `now` is not settled.
    pub(crate) fn settled(&self, now: SystemTime, settle: Duration) -> bool {
        let (Ok(seconds), Ok(nanos)) = (u64::try_from(self.ctime.0), u32::try_from(self.ctime.1)) else {
            return false;
        };
        SystemTime::UNIX_EPOCH
            .checked_add(Duration::new(seconds, nanos))
            .and_then(|changed| changed.checked_add(settle))
            .is_some_and(|settled_at| settled_at <= now)
    }
}

/// One project directory's memoized listing: its session directories (every entry that is not a
/// file, as a scan lists them) in the order the directory gave them, under the stamp read before.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Listing {
    pub stamp: DirStamp,
    pub sessions: Names,
}

/// Where one name is in `Names`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Span {
    start: usize,
    end: usize,
}

/// Directory entry names joined by `/`, which no name holds: one allocation, and one string in
/// the file, for a directory of thousands (a memo is read at every start).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Names(Arc<[u8]>);

impl Names {
    pub(crate) fn of<'a>(names: impl IntoIterator<Item = &'a OsString>) -> Names {
        let mut joined = Vec::new();
        for name in names {
            if !joined.is_empty() {
                joined.push(b'/');
            }
            joined.extend_from_slice(name.as_bytes());
        }
        Names(joined.into())
    }

    /// The names, in order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &OsStr> {
        self.each_span().map(|span| self.at(span))
    }

    /// Where each name is in the joined bytes, in order (`at` gives the name back): a scan
    /// keeps these rather than a copy of each name.
    pub(crate) fn spans(&self) -> Vec<Span> {
        self.each_span().collect()
    }

    fn each_span(&self) -> impl Iterator<Item = Span> + '_ {
        let joined: &[u8] = &self.0;
        let mut start = 0;
        memchr::memchr_iter(b'/', joined).chain([joined.len()]).filter(|_| !joined.is_empty()).map(move |end| {
            let span = Span { start, end };
            start = end + 1;
            span
        })
    }

    /// The name at `span` (one of `spans`).
    pub(crate) fn at(&self, span: Span) -> &OsStr {
        OsStr::from_bytes(&self.0[span.start..span.end])
    }

    /// The names read from a memo file: `None` unless each is a name a directory can hold.
    fn read(joined: &str) -> Option<Names> {
        let names = Names(joined.as_bytes().into());
        let sound =
            names.iter().all(|name| !name.is_empty() && name != "." && name != ".." && !name.as_bytes().contains(&0));
        sound.then_some(names)
    }
}

/// Per project directory name, its memoized listing.
pub(crate) type Memo = HashMap<OsString, Listing>;

/// The first line.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Head {
    kin_catalog_dirs: u64,
    dirs: u64,
    /// The digest of every byte after the first line.
    digest: String,
}

/// One directory's line.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct DirLine<'a> {
    #[serde(borrow)]
    dir: std::borrow::Cow<'a, str>,
    stamp: DirStamp,
    /// The session directories' names, joined by `/` (`Names`).
    #[serde(borrow)]
    sessions: std::borrow::Cow<'a, str>,
}

/// The memo file of a sessions directory, beside it; `None` for a directory without a parent
/// or a name (`/`), which has none.
pub fn path(root: &Path) -> Option<PathBuf> {
    catalog_index::beside(root, MEMO_SUFFIX)
}

fn placed(root: &Path) -> Result<PathBuf, String> {
    catalog_index::placed_beside(root, MEMO_SUFFIX, "a directory memo")
}

/// The memo in the file beside `root`; `Err` says why there is none to use.
pub(crate) fn load(root: &Path) -> Result<Memo, String> {
    let path = placed(root)?;
    let file = super::scan::open_log(&path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    let size = file.metadata().map_err(|e| e.to_string())?.len();
    if size > MEMO_LIMIT {
        return Err(format!("{} is larger than {MEMO_LIMIT} bytes", path.display()));
    }
    let mut text = String::with_capacity(usize::try_from(size).unwrap_or(0));
    std::io::Read::read_to_string(&mut std::io::Read::take(file, MEMO_LIMIT), &mut text)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let (first, body) = text.split_once('\n').ok_or("the memo has no complete first line (truncated)")?;
    let head: Head = serde_json::from_str(first).map_err(|e| format!("bad first line: {e}"))?;
    if head.kin_catalog_dirs != MEMO_VERSION {
        return Err(format!("version {} (this kin reads {MEMO_VERSION})", head.kin_catalog_dirs));
    }
    if !catalog_index::digest_is(body.as_bytes(), &head.digest) {
        return Err("the directories do not match the digest on the first line (truncated or changed)".into());
    }
    let mut memo = Memo::new();
    for (n, line) in body.lines().enumerate() {
        let entry: DirLine = serde_json::from_str(line).map_err(|e| format!("directory {}: {e}", n + 1))?;
        let sessions =
            Names::read(&entry.sessions).ok_or_else(|| format!("directory {}: a name no directory holds", n + 1))?;
        let listing = Listing { stamp: entry.stamp, sessions };
        if memo.insert(OsString::from(entry.dir.as_ref()), listing).is_some() {
            return Err(format!("the directory {} has two entries", entry.dir));
        }
    }
    if memo.len() as u64 != head.dirs {
        return Err(format!("{} directories where the first line says {}", memo.len(), head.dirs));
    }
    Ok(memo)
}

/// Writes `memo` beside `root` whole (`catalog_index::write_whole`). Directories with a name
/// that is not UTF-8, or holding one, are left out (they are listed).
pub(crate) fn write(root: &Path, memo: &Memo) -> Result<(), String> {
    let mut names: Vec<(&OsStr, &Listing)> = memo.iter().map(|(name, listing)| (name.as_os_str(), listing)).collect();
    names.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    let mut body = String::new();
    let mut dirs = 0u64;
    for (name, listing) in names {
        let Some(dir) = name.to_str() else { continue };
        let Ok(sessions) = std::str::from_utf8(&listing.sessions.0) else { continue };
        let line = DirLine { dir: dir.into(), stamp: listing.stamp, sessions: sessions.into() };
        body.push_str(&serde_json::to_string(&line).map_err(|e| e.to_string())?);
        body.push('\n');
        dirs += 1;
    }
    let head = Head { kin_catalog_dirs: MEMO_VERSION, dirs, digest: catalog_index::digest(body.as_bytes()) };
    let mut text = serde_json::to_string(&head).map_err(|e| e.to_string())?;
    text.push('\n');
    text.push_str(&body);
    if text.len() as u64 > MEMO_LIMIT {
        return Err(format!("the directory memo would be larger than {MEMO_LIMIT} bytes; not written"));
    }
    catalog_index::write_whole(&placed(root)?, root, text.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether the memo file holding `text` is read as a memo.
    fn load_text(root: &Path, path: &Path, text: &str) -> bool {
        std::fs::write(path, text).unwrap();
        load(root).is_ok()
    }

    fn stamp(ctime: (i64, i64)) -> DirStamp {
        DirStamp { dev: 1, ino: 2, ctime }
    }

    /// Issue 23: a stamp is settled only once `SETTLE` has passed since its ctime, by a clock read
    /// before it; a ctime before the epoch or ahead of the clock never is.
    #[test]
    fn a_stamp_is_settled_only_well_after_its_ctime() {
        let now = SystemTime::UNIX_EPOCH + Duration::new(1_000, 500);
        assert!(stamp((998, 500)).settled(now, SETTLE));
        assert!(stamp((990, 0)).settled(now, SETTLE));
        assert!(!stamp((998, 501)).settled(now, SETTLE), "less than SETTLE before");
        assert!(!stamp((1_000, 500)).settled(now, SETTLE), "the clock's own second");
        assert!(!stamp((2_000, 0)).settled(now, SETTLE), "ahead of the clock (it went back)");
        assert!(!stamp((-1, 0)).settled(now, SETTLE));
        assert!(!stamp((5, -1)).settled(now, SETTLE));
        assert!(stamp((1_000, 500)).settled(now, Duration::ZERO));
    }

    /// Issue 23: the memo reads back as written (a name needing JSON escapes included), and any
    /// defect in the file means no memo.
    #[test]
    fn the_memo_reads_back_as_written_and_a_damaged_file_is_none() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("sessions");
        std::fs::create_dir(&root).unwrap();
        let listing = |names: &[&str], ctime| Listing {
            stamp: stamp(ctime),
            sessions: Names::of(&names.iter().map(OsString::from).collect::<Vec<_>>()),
        };
        let mut memo = Memo::new();
        memo.insert("--a--".into(), listing(&["s1", "s \"2\" \\ ü"], (10, 1)));
        memo.insert("--b--".into(), listing(&[], (11, 2)));
        memo.insert("--c--".into(), listing(&["one"], (12, 3)));
        let names = |p: &str| memo[OsStr::new(p)].sessions.iter().map(|n| n.to_str().unwrap()).collect::<Vec<_>>();
        assert_eq!((names("--a--"), names("--b--"), names("--c--")), (vec!["s1", "s \"2\" \\ ü"], vec![], vec!["one"]));
        write(&root, &memo).unwrap();
        assert_eq!(load(&root).unwrap(), memo);
        let path = path(&root).unwrap();
        let good = std::fs::read_to_string(&path).unwrap();
        let line = |sessions: &str| {
            format!(
                "{{\"dir\":\"--a--\",\"stamp\":{{\"dev\":1,\"ino\":2,\"ctime\":[3,4]}},\"sessions\":\"{sessions}\"}}"
            )
        };
        let consistent = |line: &str| {
            let body = format!("{line}\n");
            let digest = catalog_index::digest(body.as_bytes());
            format!("{{\"kinCatalogDirs\":1,\"dirs\":1,\"digest\":\"{digest}\"}}\n{body}")
        };
        assert!(load_text(&root, &path, &consistent(&line("a/b"))), "the consistent helper makes a sound memo");
        let cut = good.find('\n').unwrap() + 1;
        let damaged = [
            String::new(),
            good[..good.len() - 1].to_string(),
            good[..cut].to_string(),
            good.replacen("\"kinCatalogDirs\":1", "\"kinCatalogDirs\":2", 1),
            good.replacen("\"dirs\":3", "\"dirs\":4", 1),
            good.replacen("s1", "s9", 1),
            good.replacen("\"stamp\"", "\"stump\"", 1),
            "garbage\n".repeat(3),
            // A malformed line, and names no directory holds, under a digest that matches.
            consistent("{\"dir\":\"--a--\",\"stamp\":{\"dev\":1},\"sessions\":\"\"}"),
            consistent(&line("a//b")),
            consistent(&line("a/..")),
            consistent(&line("a/")),
            consistent(&line("a/b\\u0000")),
        ];
        for text in damaged {
            assert!(!load_text(&root, &path, &text), "{text:?} was read as a memo");
        }
        std::fs::remove_file(&path).unwrap();
        assert!(load(&root).is_err());
    }
}
