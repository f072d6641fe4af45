//! The derived catalog index (issue 23): one file per sessions directory, beside it
//! (`<sessions>.catalog-index.jsonl`, so the directory itself stays dsh's layout and nothing
//! that walks it meets a file it does not know), holding what a listing needs of each log — its
//! stat (length, mtime, ctime), its header, once a listing has summarised the
//! log its event count, surface verdict, inbox counts and each `subagent/descriptor` line itself,
//! and once `session/list` has read it its title (with, for a long log, where that read stopped,
//! so a read after the log grew goes on from there) — so the first listing after a start reads no
//! child log instead of every child log whole, and the first `session/list` reads no log for its
//! titles (protocol/catalog.md, "The catalog index").
//! Each project's entries are written in the order the last scan found its logs, so the next
//! start's scan of an unchanged directory takes them in step (`Logs`) instead of looking each up
//! by name.
//!
//! Derived state, never an authority. An entry counts only for a log found at the entry's exact
//! stat (any write moves a log's ctime, which no one sets back); a descriptor only when its kept
//! line holds that event (else the log is read). A file that is missing, unreadable, too large,
//! of another version, garbage, truncated (its digest guards it against damage), or holds a
//! malformed or duplicated entry is no index at all: every log is read as without one, and the
//! index is written again. It is written whole: a temp file in the same directory, fsync,
//! rename over the old one, fsync of the directory.

use std::borrow::Cow;
use std::ffi::{OsStr, OsString};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use foldhash::{HashMap, HashMapExt};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use xxhash_rust::xxh3::{Xxh3, xxh3_128};

use super::canonical::{self, Cursor};
use super::event::Kind;
use super::inbox::InboxCounts;
use super::record::{Event, Record, SessionHeader};
use super::scan::{EventLine, LogStat, TitleMark, open_log};

/// What the index's file name adds to the sessions directory's name (it sits beside it).
pub(crate) const INDEX_SUFFIX: &str = ".catalog-index.jsonl";
/// The format version on the first line; any other is ignored.
/// Version 2: the digests are XXH3-128 (version 1's were SHA-256, a third of reading the index).
/// Version 3: an entry may hold the log's title.
/// Version 4: a title may hold where its read stopped (`mark`), and say the log grew since
/// (`grown`).
/// Version 5: an entry holds the log's ctime, and its summary each descriptor's line itself
/// (version 4's held where the line was, read back from the log at each start).
pub(crate) const INDEX_VERSION: u64 = 5;
/// A title read's mark is kept in the file only for a log at least this long: a shorter one is
/// read again from its start in about the time a mark's check takes.
pub(crate) const MARK_KEPT_FROM: u64 = 1 << 20;
/// An index larger than this is not read (nor written): listings fall back to reading logs.
const INDEX_LIMIT: u64 = 256 << 20;
/// No entry line is shorter than this (the names of the fields it must have take 85 bytes).
const SHORTEST_LINE: u64 = 100;
/// The index is read through a buffer of this size (grown only for a longer line).
const LINE_BUFFER: usize = 64 << 10;
/// A log with a descriptor line longer than this keeps no facts in the index (the next kin reads
/// it whole).
const LINE_LIMIT: usize = 64 << 10;

/// The entries of an index: per project directory name, that project's logs.
pub(crate) type Entries = HashMap<OsString, Logs>;

/// One project's entries, in the file's order: the order the scan before the write found the
/// logs in (`write`'s caller keeps it), which the next scan of an unchanged directory finds them
/// in again, so it takes each entry in step instead of looking it up by name.
#[derive(Debug, Default)]
pub(crate) struct Logs {
    /// Each entry's session directory name, and the entry until it is taken (`None` from the
    /// start for an entry that cannot be used).
    list: Vec<(OsString, Option<Entry>)>,
    /// Where `take` looks first: after the entry it took last.
    next: usize,
    /// How many entries are not taken.
    left: usize,
    /// Each entry's place by name, made the first time a scan is out of step with the file (a
    /// name the file repeats is found at its last entry; an entry never taken is dropped when
    /// the file is written again).
    places: Option<HashMap<OsString, usize>>,
}

impl Logs {
    /// These entries, their list's spare room handed back.
    fn fitted(mut self) -> Logs {
        self.list.shrink_to_fit();
        self
    }

    fn push(&mut self, session: OsString, entry: Option<Entry>) {
        self.left += usize::from(entry.is_some());
        self.list.push((session, entry));
    }

    /// The entry of `session`'s log, taken out (with its name, which the caller keeps).
    pub(crate) fn take(&mut self, session: &OsStr) -> Option<(OsString, Entry)> {
        let at = match self.list.get(self.next) {
            Some((name, _)) if name == session => self.next,
            _ => {
                let list = &self.list;
                let places = self
                    .places
                    .get_or_insert_with(|| list.iter().enumerate().map(|(at, (name, _))| (name.clone(), at)).collect());
                *places.get(session)?
            }
        };
        let entry = self.list[at].1.take()?;
        self.next = at + 1;
        self.left -= 1;
        Some((std::mem::take(&mut self.list[at].0), entry))
    }

    /// Whether every entry has been taken (or none could be used).
    pub(crate) fn is_empty(&self) -> bool {
        self.left == 0
    }

    /// The entries not taken, in the file's order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&OsString, &Entry)> {
        self.list.iter().filter_map(|(name, entry)| Some((name, entry.as_ref()?)))
    }
}

/// What the index knows of one log at one stat (length, mtime, ctime).
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub stat: LogStat,
    pub header: Arc<SessionHeader>,
    pub facts: Option<Arc<Facts>>,
    /// The log's title at this length, once read.
    pub title: Option<Titled>,
    /// Where the last read of its title stopped (at this length, or before the log grew).
    pub title_mark: Option<Box<TitleMark>>,
}

/// A log's title as a read of its bytes up to the entry's length finds it: its last complete
/// `session/title` event's (`scan::read_title`), `Titled(None)` when it has none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Titled(pub Option<String>);

/// A listing's facts of one log, exactly what a full read of the same bytes gives.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Facts {
    pub event_count: u64,
    /// The surface fold's verdict (`Err` holds the violation).
    pub surface: Result<(), String>,
    pub inbox: InboxCounts,
    /// Each `subagent/descriptor` event's line, in seq order.
    pub descriptors: Vec<KeptLine>,
}

/// One descriptor event's seq and its line, as the log has it (without the newline).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(from = "DescriptorLine<Box<RawValue>>")]
pub(crate) struct KeptLine {
    pub seq: u64,
    pub line: Box<str>,
}

impl KeptLine {
    /// The line of one event, if the index keeps lines that long (`None`: the log's facts are
    /// not kept, and the next kin reads it whole).
    pub(crate) fn of(line: EventLine) -> Option<KeptLine> {
        if line.bytes.len() > LINE_LIMIT {
            return None;
        }
        let text = String::from_utf8(line.bytes).ok()?;
        Some(KeptLine { seq: line.seq, line: text.into_boxed_str() })
    }
}

impl Facts {
    /// The descriptor events of the lines these facts keep, or `None` when a line is not one
    /// (a log then read whole finds them).
    pub(crate) fn descriptor_events(&self) -> Option<Vec<Event>> {
        self.descriptors
            .iter()
            .map(|at| {
                let event = Record::parse(&at.line).ok()?.into_events().into_iter().find(|e| e.seq == at.seq)?;
                (event.kind == Kind::SubagentDescriptor).then_some(event)
            })
            .collect()
    }
}

/// The first line.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Head {
    kin_catalog_index: u64,
    entries: u64,
    /// The digest of every byte after the first line.
    digest: String,
}

/// One entry line (borrowing from the file's text where it can: thousands are read at a start).
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct EntryLine<'a> {
    #[serde(borrow)]
    project: Cow<'a, str>,
    #[serde(borrow)]
    session: Cow<'a, str>,
    len: u64,
    /// Seconds and nanoseconds since the Unix epoch.
    mtime: (u64, u32),
    /// The same, of the ctime.
    ctime: (u64, u32),
    /// The header, as compact JSON.
    #[serde(borrow)]
    header: &'a RawValue,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    title: Option<TitleLine>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    summary: Option<FactsLine<'a>>,
}

/// The last read of a log's title: `{"text":null}` when it found none (an entry without `title`
/// has not read it). `mark` is where it stopped, as `[line start, end, XXH3-64 of the line's first
/// 64 KiB]`; `grown` that the log has grown since, so `text` is the title up to the mark only.
#[derive(Serialize, Deserialize, Debug, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
struct TitleLine {
    text: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    mark: Option<(u64, u64, String)>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    grown: bool,
}

impl TitleLine {
    /// What an entry of a log `len` bytes long writes of its title.
    fn of(title: Option<&Titled>, mark: Option<&TitleMark>, len: u64) -> Option<TitleLine> {
        let kept = mark.filter(|m| m.end() >= MARK_KEPT_FROM && m.end() <= len);
        let line = |m: &TitleMark| {
            let (start, end, digest) = m.line();
            (start, end, format!("{digest:016x}"))
        };
        match (title, kept) {
            (Some(Titled(text)), kept) => {
                Some(TitleLine { text: text.clone(), mark: kept.filter(|m| m.title == *text).map(line), grown: false })
            }
            (None, Some(m)) => Some(TitleLine { text: m.title.clone(), mark: Some(line(m)), grown: true }),
            (None, None) => None,
        }
    }

    /// The title at the entry's length (none if the log grew since the read) and the mark.
    fn read(self, len: u64) -> Result<(Option<Titled>, Option<Box<TitleMark>>), String> {
        let mark = match self.mark {
            None => None,
            Some((line_start, end, digest)) => {
                let digest = is_lower_hex(&digest, 16)
                    .then(|| u64::from_str_radix(&digest, 16).ok())
                    .flatten()
                    .ok_or("a title mark's digest is not 16 lowercase hex digits")?;
                let mark = TitleMark::new(self.text.clone(), line_start, end, digest)
                    .filter(|mark| mark.end() <= len)
                    .ok_or("a title mark that is not a line of the log")?;
                Some(Box::new(mark))
            }
        };
        match (self.grown, mark) {
            (true, None) => Err("a grown title without a mark".into()),
            (true, mark) => Ok((None, mark)),
            (false, mark) => Ok((Some(Titled(self.text)), mark)),
        }
    }
}

#[derive(Serialize, Deserialize, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FactsLine<'a> {
    events: u64,
    /// The surface violation; `null` when the fold holds.
    surface: Option<String>,
    pending: usize,
    discarded: usize,
    /// Borrowed from the facts when written (the lines are not copied for it), owned when read.
    descriptors: Cow<'a, [KeptLine]>,
}

/// A descriptor in an entry: its seq and the log's line, verbatim (`line` is a `RawValue`).
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct DescriptorLine<L> {
    seq: u64,
    line: L,
}

impl From<DescriptorLine<Box<RawValue>>> for KeptLine {
    fn from(d: DescriptorLine<Box<RawValue>>) -> KeptLine {
        KeptLine { seq: d.seq, line: d.line.into() }
    }
}

impl Serialize for KeptLine {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let line: &RawValue = serde_json::from_str(&self.line).map_err(serde::ser::Error::custom)?;
        DescriptorLine { seq: self.seq, line }.serialize(serializer)
    }
}

/// The XXH3-128 of `bytes`: 32 lowercase hex digits. An integrity check against a torn or
/// damaged file, not a forger's (who could as well edit the logs it stands for).
pub(super) fn digest(bytes: &[u8]) -> String {
    format!("{:032x}", xxh3_128(bytes))
}

/// Whether `hex` is `digest(bytes)` (without making it).
pub(super) fn digest_is(bytes: &[u8], hex: &str) -> bool {
    digest_is_value(xxh3_128(bytes), hex)
}

/// Whether `hex` is the digest whose value is `value`: its 32 lowercase hex digits.
fn digest_is_value(value: u128, hex: &str) -> bool {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let hex = hex.as_bytes();
    hex.len() == 32 && hex.iter().enumerate().all(|(i, &digit)| digit == DIGITS[(value >> (124 - 4 * i)) as usize & 15])
}

/// Whether `hex` is `digits` lowercase hex digits (as kin writes its digests: one text each).
fn is_lower_hex(hex: &str, digits: usize) -> bool {
    hex.len() == digits && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The index file of a sessions directory, beside it; `None` for a directory without a parent
/// or a name (`/`), which has no index.
pub fn path(root: &Path) -> Option<PathBuf> {
    beside(root, INDEX_SUFFIX)
}

/// The file beside the sessions directory `root` named as it is with `suffix` added; `None` for
/// a directory without a parent or a name (`/`), which has no place beside it.
pub(super) fn beside(root: &Path, suffix: &str) -> Option<PathBuf> {
    let mut name = root.file_name()?.to_os_string();
    name.push(suffix);
    Some(root.parent()?.join(name))
}

/// `beside(root, suffix)`, or the error saying there is no such place for `what`.
pub(super) fn placed_beside(root: &Path, suffix: &str, what: &str) -> Result<PathBuf, String> {
    beside(root, suffix).ok_or_else(|| format!("{} has no place for {what} beside it", root.display()))
}

fn placed(root: &Path) -> Result<PathBuf, String> {
    placed_beside(root, INDEX_SUFFIX, "a catalog index")
}

/// The entries of the index of `root`, but for those whose session directory is not the one
/// their header's id names (unusable); `Err` says why there are none to use (the file is
/// missing, or anything about it is not exactly what `write` writes).
pub(crate) fn load(root: &Path) -> Result<Entries, String> {
    let path = placed(root)?;
    let file = open_log(&path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    let size = file.metadata().map_err(|e| e.to_string())?.len();
    if size > INDEX_LIMIT {
        return Err(format!("{} is larger than {INDEX_LIMIT} bytes", path.display()));
    }
    // Each line parsed, in order, on this thread (the index's own, beside the scan): parsing on
    // more threads made them contend for the process's one malloc arena (`heap::configure`) and
    // cost more CPU than it saved wall time, on cores the scan needs. The file is read through
    // one small buffer, not whole: a new process would fault in a page for every 4 KiB of it.
    // `write` groups a project's entries: each run of one project's lines goes to its list
    // without hashing the (long) project name per line, and a project met again later resumes
    // its list. Each entry is placed as it is read, while its line is in the cache; the digest
    // of the body is made as it goes, and nothing is used unless it holds at the end.
    let mut head: Option<Head> = None;
    let mut body = Xxh3::new();
    let (mut entries, mut count) = (Entries::new(), 0u64);
    let mut run: Option<(String, Logs)> = None;
    each_line(std::io::Read::take(file, INDEX_LIMIT), |line| {
        let Some(head) = head.as_ref() else {
            let first: Head = serde_json::from_slice(line).map_err(|e| format!("bad first line: {e}"))?;
            if first.kin_catalog_index != INDEX_VERSION {
                return Err(format!("version {} (this kin reads {INDEX_VERSION})", first.kin_catalog_index));
            }
            head = Some(first);
            return Ok(());
        };
        body.update(line);
        body.update(b"\n");
        count += 1;
        if count > head.entries {
            return Err(format!("more entries than the {} the first line says", head.entries));
        }
        let line = std::str::from_utf8(line).map_err(|e| format!("entry {count}: {e}"))?;
        let ((project, session), entry, named) = parse_entry(line).map_err(|e| format!("entry {count}: {e}"))?;
        if run.as_ref().is_none_or(|(name, _)| *name != project) {
            if let Some((name, logs)) = run.take() {
                entries.insert(OsString::from(name), logs.fitted());
            }
            let mut resumed = entries.remove(OsStr::new(project.as_ref())).unwrap_or_default();
            // Room for every entry left (as many as the first line says, and as the file's size
            // can hold), so the run's list is not copied as it grows; the memory not filled is
            // never touched, and is handed back when the run ends. Without that room (an
            // allocator that will not reserve it), the list grows as it is filled.
            let left = (head.entries - count + 1).min(size / SHORTEST_LINE);
            let _ = resumed.list.try_reserve(usize::try_from(left).unwrap_or(0));
            run = Some((project.into_owned(), resumed));
        }
        if let Some((_, logs)) = run.as_mut() {
            // An entry is taken only for the directory its header's id names (checked here,
            // where the line is in the cache, rather than by each scan that matches it).
            logs.push(OsString::from(session.as_ref()), named.then_some(entry));
        }
        Ok(())
    })
    .map_err(|e| format!("cannot read {}: {e}", path.display()))??;
    let head = head.ok_or("the index has no complete first line (truncated)")?;
    if !digest_is_value(body.digest128(), &head.digest) {
        return Err("the entries do not match the digest on the first line (truncated or changed)".into());
    }
    if let Some((name, logs)) = run {
        entries.insert(OsString::from(name), logs.fitted());
    }
    if count != head.entries {
        return Err(format!("{count} entries where the first line says {}", head.entries));
    }
    // Two entries for one log are not looked for (a tenth of the read, for a file kin never
    // writes so): a scan takes at most one entry per log it finds, checked as any entry is, and
    // the file is written again without the other.
    Ok(entries)
}

/// Calls `each` with every line `reader` gives (without its `\n`), read through one buffer that
/// grows only for a line longer than it; `each`'s first error ends the reading. Bytes after the
/// last `\n` are a line cut short: an error.
fn each_line(
    mut reader: impl std::io::Read,
    mut each: impl FnMut(&[u8]) -> Result<(), String>,
) -> std::io::Result<Result<(), String>> {
    let mut buffer = vec![0u8; LINE_BUFFER];
    // `buffer[..filled]` is read; `buffer[..done]` has been given to `each`.
    let (mut filled, mut done) = (0usize, 0usize);
    loop {
        if done > 0 {
            buffer.copy_within(done..filled, 0);
            (filled, done) = (filled - done, 0);
        }
        if filled == buffer.len() {
            buffer.resize(buffer.len() * 2, 0);
        }
        let read = match reader.read(&mut buffer[filled..]) {
            Ok(read) => read,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if read == 0 {
            return Ok(if filled == 0 { Ok(()) } else { Err("the index ends inside a line (truncated)".into()) });
        }
        let mut start = filled;
        filled += read;
        while let Some(end) = memchr::memchr(b'\n', &buffer[start..filled]).map(|at| start + at) {
            if let Err(e) = each(&buffer[done..end]) {
                return Ok(Err(e));
            }
            (done, start) = (end + 1, end + 1);
        }
    }
}

/// One entry line parsed: its (project, session) directory names (borrowed from the line
/// where they need no unescaping), the entry, and whether the session directory is the one its
/// header's id names.
type Parsed<'a> = ((Cow<'a, str>, Cow<'a, str>), Entry, bool);

fn parse_entry(line: &str) -> Result<Parsed<'_>, String> {
    let e = match canonical_entry(line) {
        Some(fast) => fast,
        None => {
            let e: EntryLine = serde_json::from_str(line).map_err(|e| e.to_string())?;
            Fields {
                project: e.project,
                session: e.session,
                len: e.len,
                mtime: e.mtime,
                ctime: e.ctime,
                header_text: e.header.get(),
                header: None,
                title: e.title,
                summary: e.summary,
            }
        }
    };
    let header = match e.header {
        Some(header) => header.validated()?,
        None => SessionHeader::parse(e.header_text)?,
    };
    // (Nanoseconds of a whole second or more are refused, not carried: a carry could overflow.)
    let time = |(seconds, nanos): (u64, u32), what: &str| {
        (nanos < 1_000_000_000)
            .then(|| SystemTime::UNIX_EPOCH.checked_add(Duration::new(seconds, nanos)))
            .flatten()
            .ok_or_else(|| format!("{what} out of range"))
    };
    let stat = LogStat { len: e.len, modified: time(e.mtime, "mtime")?, changed: time(e.ctime, "ctime")? };
    let facts = e.summary.map(|f| {
        Arc::new(Facts {
            event_count: f.events,
            surface: f.surface.map_or(Ok(()), Err),
            inbox: InboxCounts { pending: f.pending, discarded: f.discarded },
            descriptors: f.descriptors.into_owned(),
        })
    });
    let (title, title_mark) = e.title.map_or(Ok((None, None)), |t| t.read(e.len))?;
    let named = super::layout::is_segment_of(OsStr::new(e.session.as_ref()), &header.id);
    let key = (e.project, e.session);
    Ok((key, Entry { stat, header: Arc::new(header), facts, title, title_mark }, named))
}

/// An entry line's fields, as read by serde or by `canonical_entry`.
struct Fields<'a> {
    project: Cow<'a, str>,
    session: Cow<'a, str>,
    len: u64,
    mtime: (u64, u32),
    ctime: (u64, u32),
    /// The header's text.
    header_text: &'a str,
    /// The header, when `canonical_entry` read it (not validated yet).
    header: Option<SessionHeader>,
    title: Option<TitleLine>,
    summary: Option<FactsLine<'a>>,
}

/// An entry line exactly as `write` writes one (`session::canonical`), or `None` for serde to
/// read (or refuse) instead: a title or a surface violation with an escape is serde's.
fn canonical_entry(line: &str) -> Option<Fields<'_>> {
    let mut c = Cursor::new(line);
    let project = c.string_after("{\"project\":")?;
    let session = c.string_after(",\"session\":")?;
    let len = c.uint_after(",\"len\":")?;
    let seconds = c.uint_after(",\"mtime\":[")?;
    let nanos = u32::try_from(c.uint_after(",")?).ok()?;
    let ctime_seconds = c.uint_after("],\"ctime\":[")?;
    let ctime_nanos = u32::try_from(c.uint_after(",")?).ok()?;
    c.expect("],\"header\":")?;
    let start = c.at();
    let header = canonical::header(&mut c)?;
    let header_text = &line[start..c.at()];
    let title = if c.eat(",\"title\":{\"text\":") {
        let text = if c.eat("null") { None } else { Some(c.string()?.to_string()) };
        let mark = if c.eat(",\"mark\":[") {
            let line_start = c.uint()?;
            let end = c.uint_after(",")?;
            let digest = c.string_after(",")?.to_string();
            c.expect("]")?;
            Some((line_start, end, digest))
        } else {
            None
        };
        let grown = c.eat(",\"grown\":true");
        c.expect("}")?;
        Some(TitleLine { text, mark, grown })
    } else {
        None
    };
    let summary = if c.eat(",\"summary\":") { Some(canonical_facts(&mut c)?) } else { None };
    c.expect("}")?;
    if !c.is_done() {
        return None;
    }
    Some(Fields {
        project: project.into(),
        session: session.into(),
        len,
        mtime: (seconds, nanos),
        ctime: (ctime_seconds, ctime_nanos),
        header_text,
        header: Some(header),
        title,
        summary,
    })
}

/// A summary exactly as `write` writes one (a surface violation with an escape is serde's).
fn canonical_facts(c: &mut Cursor<'_>) -> Option<FactsLine<'static>> {
    let events = c.uint_after("{\"events\":")?;
    c.expect(",\"surface\":")?;
    let surface = if c.eat("null") { None } else { Some(c.string()?.to_string()) };
    let pending = usize::try_from(c.uint_after(",\"pending\":")?).ok()?;
    let discarded = usize::try_from(c.uint_after(",\"discarded\":")?).ok()?;
    c.expect(",\"descriptors\":[")?;
    let mut descriptors = Vec::new();
    if !c.eat("]") {
        loop {
            let seq = c.uint_after("{\"seq\":")?;
            c.expect(",\"line\":")?;
            let line = c.raw_object()?;
            c.expect("}")?;
            descriptors.push(KeptLine { seq, line: line.into() });
            if c.eat("]") {
                break;
            }
            c.expect(",")?;
        }
    }
    c.expect("}")?;
    Some(FactsLine { events, surface, pending, discarded, descriptors: Cow::Owned(descriptors) })
}

/// Writes the index of `root` whole (`write_whole`: temp file beside it, fsync, rename,
/// directory fsync; nothing while `root` does not exist). Logs whose directory names are not
/// UTF-8 are left out (their listings read them).
pub(crate) fn write<'a>(
    root: &Path,
    entries: impl Iterator<Item = (&'a OsStr, &'a OsStr, Entry)>,
) -> Result<(), String> {
    let mut lines = Vec::new();
    for (project, session, entry) in entries {
        let (Some(project), Some(session)) = (project.to_str(), session.to_str()) else { continue };
        let header = serde_json::value::to_raw_value(&*entry.header).map_err(|e| e.to_string())?;
        let since = |time: SystemTime| {
            let since = time.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
            (since.as_secs(), since.subsec_nanos())
        };
        let summary = entry.facts.as_deref().map(|f| FactsLine {
            events: f.event_count,
            surface: f.surface.clone().err(),
            pending: f.inbox.pending,
            discarded: f.inbox.discarded,
            descriptors: Cow::Borrowed(&f.descriptors),
        });
        let line = EntryLine {
            project: project.into(),
            session: session.into(),
            len: entry.stat.len,
            mtime: since(entry.stat.modified),
            ctime: since(entry.stat.changed),
            header: &header,
            title: TitleLine::of(entry.title.as_ref(), entry.title_mark.as_deref(), entry.stat.len),
            summary,
        };
        lines.push(serde_json::to_string(&line).map_err(|e| e.to_string())?);
    }
    let mut body = String::with_capacity(lines.iter().map(|l| l.len() + 1).sum::<usize>());
    for line in &lines {
        body.push_str(line);
        body.push('\n');
    }
    let head = Head { kin_catalog_index: INDEX_VERSION, entries: lines.len() as u64, digest: digest(body.as_bytes()) };
    let mut text = serde_json::to_string(&head).map_err(|e| e.to_string())?;
    text.push('\n');
    text.push_str(&body);
    if text.len() as u64 > INDEX_LIMIT {
        return Err(format!("the index would be larger than {INDEX_LIMIT} bytes; not written"));
    }
    write_whole(&placed(root)?, root, text.as_bytes())
}

/// Writes `bytes` to `path` (a file beside the sessions directory `root`) whole: a temp file in
/// the same directory, fsync, rename over the old one, fsync of the directory.
/// Nothing while `root` does not exist (a first `kin sessions list`: nothing to keep, and no
/// directory beside which to put it).
pub(super) fn write_whole(path: &Path, root: &Path, bytes: &[u8]) -> Result<(), String> {
    if std::fs::symlink_metadata(root).is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound) {
        return Ok(());
    }
    let dir = path.parent().unwrap_or(root);
    let failed = |e: std::io::Error| format!("cannot write {}: {e}", path.display());
    let mut temp = tempfile::Builder::new().prefix(".catalog-index.").tempfile_in(dir).map_err(failed)?;
    temp.write_all(bytes).map_err(failed)?;
    temp.as_file().sync_all().map_err(failed)?;
    temp.persist(path).map_err(|e| failed(e.error))?;
    std::fs::File::open(dir).and_then(|dir| dir.sync_all()).map_err(failed)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A descriptor event's line at `seq`, with `fields` in its data.
    fn descriptor(seq: u64, fields: &str) -> KeptLine {
        let line = format!(
            r#"{{"type":"subagent/descriptor","seq":{seq},"time":0,"data":{{"version":2,"mode":"continuable","provider":"spawn",{fields}}}}}"#
        );
        KeptLine { seq, line: line.into() }
    }

    /// Issue 23: the descriptor lines an entry keeps give their events, exactly as the log's
    /// read gives them; a line that is not the named descriptor event gives none (the log is then
    /// read whole).
    #[test]
    fn kept_descriptor_lines_give_their_events_or_none() {
        let facts = |descriptors: Vec<KeptLine>| Facts {
            event_count: 3,
            surface: Ok(()),
            inbox: InboxCounts::default(),
            descriptors,
        };
        let kept = descriptor(4, r#""label":"worker""#);
        let events = facts(vec![kept.clone(), descriptor(7, r#""label":"again""#)]).descriptor_events().unwrap();
        assert_eq!(events.iter().map(|e| e.seq).collect::<Vec<_>>(), [4, 7]);
        assert_eq!(events[0], Record::parse(&kept.line).unwrap().into_events().remove(0));
        assert_eq!(facts(Vec::new()).descriptor_events(), Some(Vec::new()));
        let other_kind = KeptLine { seq: 4, line: kept.line.replace("subagent/descriptor", "session/end-seed").into() };
        for bad in [
            KeptLine { seq: 5, ..kept.clone() },
            other_kind,
            KeptLine { seq: 4, line: "not json".into() },
            KeptLine { seq: 4, line: "{}".into() },
        ] {
            assert_eq!(facts(vec![kept.clone(), bad.clone()]).descriptor_events(), None, "{bad:?}");
        }
    }

    /// A descriptor line too long for the index keeps no facts.
    #[test]
    fn a_descriptor_line_too_long_is_not_kept() {
        let at = |len: usize| EventLine { seq: 0, bytes: vec![b'x'; len] };
        assert!(KeptLine::of(at(LINE_LIMIT)).is_some());
        assert!(KeptLine::of(at(LINE_LIMIT + 1)).is_none());
        assert!(KeptLine::of(EventLine { seq: 0, bytes: vec![0xff] }).is_none(), "not UTF-8");
    }

    /// A sessions directory in `dir`, made (an index is written only beside one that exists).
    fn sessions_in(dir: &tempfile::TempDir) -> PathBuf {
        let root = dir.path().join("sessions");
        std::fs::create_dir(&root).unwrap();
        root
    }

    /// Issue 23: every line `write` writes is read by `canonical_entry` (serde only parses what
    /// kin did not write), as serde reads it.
    #[test]
    fn the_lines_kin_writes_are_read_without_serde_as_serde_reads_them() {
        let dir = tempfile::tempdir().unwrap();
        let root = sessions_in(&dir);
        let mut child = SessionHeader::new("child", 3, Some("/w/{odd} c,wd}".into()));
        child.parent_session = Some("parent".into());
        child.origin = Some("subagent".into());
        child.delegation_depth = 1;
        let facts = Facts {
            event_count: 9,
            surface: Err("a violation".into()),
            inbox: InboxCounts { pending: 1, discarded: 2 },
            descriptors: vec![descriptor(0, r#""label":"a {\"braced}\" label","x":[{"y":"]}"}]"#)],
        };
        let summary = |surface, n: u64| Facts {
            event_count: 40 + n,
            surface,
            inbox: InboxCounts::default(),
            descriptors: (0..n).map(|i| descriptor(i, r#""label":"plain""#)).collect(),
        };
        let at = SystemTime::UNIX_EPOCH + Duration::new(1_700_000_000, 123_456_789);
        let changed = at + Duration::new(5, 1);
        const LEN: u64 = 4 << 20;
        let stat = LogStat { len: LEN, modified: at, changed };
        let entry = |header: SessionHeader, facts: Option<Facts>, title: Option<Titled>| Entry {
            stat,
            header: Arc::new(header),
            facts: facts.map(Arc::new),
            title,
            title_mark: None,
        };
        let titled = |text: &str| Some(Titled(Some(text.into())));
        let top = |id: &str| SessionHeader::new(id, 1, Some("/w".into()));
        let marked = |mut entry: Entry, title: Option<&str>, end: u64| {
            entry.title_mark = TitleMark::new(title.map(str::to_string), end - 300, end, u64::MAX - end).map(Box::new);
            entry
        };
        let entries = [
            ("--p--", "parent", entry(top("parent"), None, titled("Fix the parser"))),
            ("--p--", "child", entry(child, Some(facts), None)),
            ("--p--", "untitled", entry(top("untitled"), None, Some(Titled(None)))),
            ("--p--", "quoted", entry(top("quoted"), None, titled("The \"odd\" one \\ ünïcode"))),
            // A long log's title with the mark of its read; one that grew since (its mark alone);
            // one untitled up to its mark; a short log's mark, which is not kept.
            ("--p--", "long", marked(entry(top("long"), None, titled("Long")), Some("Long"), 2 << 20)),
            ("--p--", "grown", marked(entry(top("grown"), None, None), Some("Before"), LEN)),
            ("--p--", "blank", marked(entry(top("blank"), None, Some(Titled(None))), None, MARK_KEPT_FROM)),
            ("--p--", "short", marked(entry(top("short"), None, titled("Short")), Some("Short"), 4000)),
            // Summaries of two descriptors, of none, and with a violation that has an escape.
            ("--p--", "twice", entry(top("twice"), Some(summary(Ok(()), 2)), None)),
            ("--p--", "none", entry(top("none"), Some(summary(Ok(()), 0)), None)),
            ("--p--", "odd", entry(top("odd"), Some(summary(Err("a \"quoted\" one".into()), 1)), None)),
        ];
        write(&root, entries.iter().map(|(p, s, e)| (OsStr::new(p), OsStr::new(s), e.clone()))).unwrap();
        let text = std::fs::read_to_string(path(&root).unwrap()).unwrap();
        let lines: Vec<&str> = text.lines().skip(1).collect();
        assert_eq!(lines.len(), entries.len());
        for (line, (project, session, written)) in lines.iter().zip(&entries) {
            let ((p, s), read, named) = parse_entry(line).unwrap();
            assert!(named);
            assert_eq!((p.as_ref(), s.as_ref()), (*project, *session));
            let kept_mark = written.title_mark.clone().filter(|m| m.end() >= MARK_KEPT_FROM);
            assert_eq!(
                (read.stat, &read.header, &read.facts, &read.title, &read.title_mark),
                (stat, &written.header, &written.facts, &written.title, &kept_mark),
                "{line}"
            );
            if *session == "quoted" || *session == "odd" {
                assert!(canonical_entry(line).is_none(), "a text with escapes is serde's to read: {line}");
                continue;
            }
            let fast = canonical_entry(line).unwrap_or_else(|| panic!("not read fast: {line}"));
            let serde: EntryLine = serde_json::from_str(line).unwrap();
            assert_eq!((fast.project.as_ref(), fast.session.as_ref()), (&*serde.project, &*serde.session));
            assert_eq!(
                (fast.len, fast.mtime, fast.ctime, fast.header_text),
                (serde.len, serde.mtime, serde.ctime, serde.header.get())
            );
            assert_eq!(fast.header.as_ref(), Some(&SessionHeader::parse(serde.header.get()).unwrap()));
            assert_eq!(fast.summary, serde.summary);
            assert_eq!(fast.title, serde.title);
        }
        assert_eq!(load(&root).unwrap().len(), 1, "one project");
        // A line with an escape (outside the header) is serde's to
        // read, and reads the same.
        let escaped = lines[0].replacen("\"project\":\"--p--\"", "\"project\":\"--\\u0070--\"", 1);
        assert!(escaped != lines[0] && canonical_entry(&escaped).is_none());
        let ((project, _), read, _) = parse_entry(&escaped).unwrap();
        assert_eq!((project.as_ref(), &read.header), ("--p--", &entries[0].2.header));
        // So is a summary in another shape than kin's (a space; fields in another order), and
        // one serde refuses is refused (a field it does not know).
        let child = lines[1];
        let spaced = child.replacen("{\"events\":", "{\"events\": ", 1);
        let reordered = child.replacen("\"pending\":1,\"discarded\":2", "\"discarded\":2,\"pending\":1", 1);
        for other in [spaced, reordered] {
            assert!(other != child && canonical_entry(&other).is_none(), "{other}");
            assert_eq!(parse_entry(&other).unwrap().1.facts, entries[1].2.facts, "{other}");
        }
        let unknown = child.replacen("\"pending\":1", "\"pending\":1,\"more\":0", 1);
        assert!(unknown != child && parse_entry(&unknown).is_err(), "{unknown}");
    }

    /// A title mark that is not exactly what `write` writes makes its entry malformed (and so
    /// the file no index): a digest that is not 16 lowercase hex digits, a line that ends where
    /// or before it starts or past the log's length, a mark that is not a triple, `grown`
    /// without a mark, or a field it does not know.
    #[test]
    fn a_title_mark_is_read_exactly_or_not_at_all() {
        let dir = tempfile::tempdir().unwrap();
        let root = sessions_in(&dir);
        let entry = Entry {
            stat: LogStat { len: 3 << 20, modified: SystemTime::UNIX_EPOCH, changed: SystemTime::UNIX_EPOCH },
            header: Arc::new(SessionHeader::new("s", 1, Some("/w".into()))),
            facts: None,
            title: Some(Titled(Some("T".into()))),
            title_mark: TitleMark::new(Some("T".into()), 2 << 20, (2 << 20) + 99, 0xabc).map(Box::new),
        };
        write(&root, std::iter::once((OsStr::new("--w--"), OsStr::new("s"), entry.clone()))).unwrap();
        let text = std::fs::read_to_string(path(&root).unwrap()).unwrap();
        let line = text.lines().nth(1).unwrap();
        let mark = r#""mark":[2097152,2097251,"0000000000000abc"]"#;
        assert!(line.contains(&format!(r#""title":{{"text":"T",{mark}}}"#)), "{line}");
        let (_, read, _) = parse_entry(line).unwrap();
        assert_eq!((read.title, read.title_mark), (entry.title, entry.title_mark));
        for bad in [
            r#""mark":[2097152,2097251,"0000000000000ABC"]"#,
            r#""mark":[2097152,2097251,"000000000000abc"]"#,
            r#""mark":[2097152,2097251,"00000000000000abc"]"#,
            r#""mark":[2097152,2097152,"0000000000000abc"]"#,
            r#""mark":[2097152,2097100,"0000000000000abc"]"#,
            r#""mark":[2097152,4194304,"0000000000000abc"]"#,
            r#""mark":[2097152,"0000000000000abc"]"#,
            r#""mark":null,"grown":true"#,
            r#""grown":true"#,
            r#""mark":[2097152,2097251,"0000000000000abc"],"grown":false,"odd":1"#,
        ] {
            let edited = line.replacen(mark, bad, 1);
            assert!(parse_entry(&edited).is_err(), "read: {edited}");
        }
        let grown = line.replacen(mark, &format!(r#"{mark},"grown":true"#), 1);
        let (_, read, _) = parse_entry(&grown).unwrap();
        assert_eq!((read.title, read.title_mark.map(|m| m.title)), (None, Some(Some("T".into()))));
        // The same file as version 4 (no ctimes, descriptors read back) or 6 is not read.
        let head = text.lines().next().unwrap();
        for (version, read) in [(INDEX_VERSION, true), (4, false), (6, false)] {
            let other = head.replacen(&format!(":{INDEX_VERSION},"), &format!(":{version},"), 1);
            std::fs::write(path(&root).unwrap(), text.replacen(head, &other, 1)).unwrap();
            assert_eq!(load(&root).is_ok(), read, "version {version}");
        }
    }

    /// Issue 23: a scan in the file's order takes each entry in step; one out of step finds it
    /// by name; an entry is taken once, an unusable one never, and what is left is listed in the
    /// file's order.
    #[test]
    fn logs_are_taken_in_step_or_by_name_once_each() {
        let entry = |id: &str| Entry {
            stat: LogStat { len: 1, modified: SystemTime::UNIX_EPOCH, changed: SystemTime::UNIX_EPOCH },
            header: Arc::new(SessionHeader::new(id, 1, None)),
            facts: None,
            title: None,
            title_mark: None,
        };
        let mut logs = Logs::default();
        for name in ["a", "b", "c", "d", "e"] {
            logs.push(name.into(), (name != "d").then(|| entry(name)));
        }
        let took = |logs: &mut Logs, name: &str| logs.take(OsStr::new(name)).map(|(key, e)| (key, e.header.id.clone()));
        assert_eq!(took(&mut logs, "a"), Some(("a".into(), "a".into())));
        assert_eq!(took(&mut logs, "b"), Some(("b".into(), "b".into())));
        assert!(logs.places.is_none(), "in step: no name is looked up");
        assert_eq!(took(&mut logs, "e"), Some(("e".into(), "e".into())), "out of step: found by name");
        assert!(logs.places.is_some());
        assert_eq!(took(&mut logs, "e"), None, "taken once");
        assert_eq!(took(&mut logs, "a"), None, "taken once, in step before");
        assert_eq!(took(&mut logs, "d"), None, "an unusable entry is never taken");
        assert_eq!(took(&mut logs, "zz"), None, "no such entry");
        let left: Vec<_> = logs.iter().map(|(name, _)| name.clone()).collect();
        assert_eq!(left, ["c"]);
        assert!(!logs.is_empty());
        assert_eq!(took(&mut logs, "c"), Some(("c".into(), "c".into())));
        assert!(logs.is_empty() && logs.iter().next().is_none());
    }

    /// Lines are given whole whatever the reads cut them into, one longer than the buffer too;
    /// bytes after the last newline are a line cut short.
    #[test]
    fn each_line_gives_whole_lines_across_reads_and_refuses_a_cut_one() {
        /// Gives at most `step` bytes a read.
        struct Trickle<'a>(&'a [u8], usize);
        impl std::io::Read for Trickle<'_> {
            fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
                let n = self.0.len().min(self.1).min(out.len());
                out[..n].copy_from_slice(&self.0[..n]);
                self.0 = &self.0[n..];
                Ok(n)
            }
        }
        let long = "x".repeat(LINE_BUFFER * 2 + 7);
        let text = format!("a\n\nbc\n{long}\nlast\n");
        for step in [1, 3, 4096, LINE_BUFFER, usize::MAX] {
            let mut lines = Vec::new();
            let read = each_line(Trickle(text.as_bytes(), step), |line| {
                lines.push(String::from_utf8(line.to_vec()).unwrap());
                Ok(())
            });
            assert_eq!(read.unwrap(), Ok(()), "step {step}");
            assert_eq!(lines, ["a", "", "bc", long.as_str(), "last"], "step {step}");
            let cut = each_line(Trickle(&text.as_bytes()[..text.len() - 1], step), |_| Ok(()));
            assert_eq!(cut.unwrap(), Err("the index ends inside a line (truncated)".to_string()), "step {step}");
        }
        let mut seen = 0;
        let stopped = each_line(Trickle(text.as_bytes(), 5), |_| {
            seen += 1;
            if seen == 2 { Err("stop".into()) } else { Ok(()) }
        });
        assert_eq!((stopped.unwrap(), seen), (Err("stop".to_string()), 2));
    }

    /// A project whose lines are not all in one run (what `write` writes is grouped, a hand-made
    /// index need not be) is read whole.
    #[test]
    fn a_project_met_again_later_in_the_file_keeps_its_earlier_entries() {
        let dir = tempfile::tempdir().unwrap();
        let root = sessions_in(&dir);
        let entry = |id: &str| Entry {
            stat: LogStat {
                len: 10,
                modified: SystemTime::UNIX_EPOCH + Duration::from_secs(5),
                changed: SystemTime::UNIX_EPOCH + Duration::from_secs(6),
            },
            header: Arc::new(SessionHeader::new(id, 1, None)),
            facts: None,
            title: None,
            title_mark: None,
        };
        let interleaved = [("--a--", "a1"), ("--b--", "b1"), ("--a--", "a2"), ("--b--", "b2"), ("--a--", "a3")];
        let written = |logs: &[(&'static str, &'static str)]| {
            write(&root, logs.iter().map(|(p, s)| (OsStr::new(*p), OsStr::new(*s), entry(s)))).unwrap();
            load(&root)
        };
        let loaded = written(&interleaved).unwrap();
        let names = |project: &str| {
            let mut names: Vec<_> = loaded[OsStr::new(project)].iter().map(|(name, _)| name.clone()).collect();
            names.sort();
            names
        };
        assert_eq!(names("--a--"), ["a1", "a2", "a3"]);
        assert_eq!(names("--b--"), ["b1", "b2"]);
        let a2 = loaded[OsStr::new("--a--")].iter().find(|(name, _)| *name == "a2").map(|(_, entry)| entry);
        assert_eq!(a2.map(|entry| entry.header.id.as_str()), Some("a2"));
    }
}
