//! Reading a log: the torn-tail scan shared by the repairing `load` and the read-only `inspect`
//! (dsh `scanLog`). O(n) in the file size; nothing here writes.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use super::event::Kind;
use super::record::{Event, Record, SessionHeader};
use super::resident::{ChunkOf, Resident};

/// A log read up to its last valid line.
#[derive(Debug, Clone)]
pub struct Scanned {
    pub path: PathBuf,
    pub header: SessionHeader,
    /// The events read (all of them, or the resident ones of `scan_file_resident`), in seq order.
    pub events: Vec<Event>,
    /// The number of events in the valid prefix (the seq the next one gets).
    pub length: u64,
    /// Byte length of the valid prefix (end of the last preserved line).
    pub committed_bytes: u64,
    /// What was cut off the end, if anything.
    pub torn: Option<TornTail>,
}

/// The ignored end of a log: a line without its newline, or an unreadable line after the last
/// complete turn.
#[derive(Debug, Clone, PartialEq)]
pub struct TornTail {
    /// 1-based line number of the first ignored line.
    pub line: usize,
    pub bytes: u64,
    pub reason: String,
}

/// Why a log could not be read.
#[derive(Debug, Clone, PartialEq)]
pub enum ScanError {
    /// The file is missing or unreadable.
    Io { path: PathBuf, message: String },
    /// Damage a reader must not paper over: a bad header, or a bad line before the last `turn/end`.
    Corrupt { path: PathBuf, line: usize, reason: String },
}

impl std::fmt::Display for ScanError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ScanError::Io { path, message } => write!(f, "{}: {message}", path.display()),
            ScanError::Corrupt { path, line, reason } => {
                write!(f, "{}:{line}: corrupt session log: {reason}", path.display())
            }
        }
    }
}

impl std::error::Error for ScanError {}

/// A header line longer than this is not a header.
const HEADER_LIMIT: u64 = 1 << 20;

/// A line longer than this is not an event kin reads (it is damage: a torn tail, or corruption
/// before a later `turn/end`). Far above what kin writes: a prompt is at most one frame
/// (`max_frame_bytes`, at most 128 MiB), a model's answer at most 64 MiB of stream.
const MAX_LINE_BYTES: u64 = 512 << 20;
/// A line is held while it is at most this long; a longer one is first read past, to its
/// newline, and read again only when it has one and is at most `MAX_LINE_BYTES` long: a torn
/// tail of any size (the last line, without its newline) is never held.
const HELD_WHILE_READING: usize = 1 << 20;

/// `read_header` of a log in the store (`<session dir>/session.jsonl`), refusing a header whose
/// id is not the one its session directory names: every reader finds a session by that
/// directory, so such a log would be listed under an id nothing could open.
pub(crate) fn read_filed_header(path: &Path) -> Result<(SessionHeader, LogStat), String> {
    let (header, stat) = read_header(path)?;
    filed(path, &header.id)?;
    Ok((header, stat))
}

/// Whether the log at `path` is filed under the session directory of `id` (else why not).
pub(crate) fn filed(path: &Path, id: &str) -> Result<(), String> {
    match path.parent().and_then(Path::file_name) {
        Some(dir) if !super::layout::is_segment_of(dir, id) => {
            Err(format!("header names session {id:?}, not the one its directory {:?} is for", dir.to_string_lossy()))
        }
        _ => Ok(()),
    }
}

/// Reads only the header line of the log at `path` (opened as `open_log` does; at most
/// `HEADER_LIMIT` bytes, ending in a newline), with the log's length and modification time
/// from the same `fstat`.
pub(crate) fn read_header(path: &Path) -> Result<(SessionHeader, LogStat), String> {
    use std::io::BufRead;
    let (file, meta) = open_log_statted(path).map_err(|e| e.to_string())?;
    let stat = LogStat::of(&meta);
    let mut line = String::new();
    std::io::BufReader::new(std::io::Read::take(file, HEADER_LIMIT)).read_line(&mut line).map_err(|e| e.to_string())?;
    let Some(line) = line.strip_suffix('\n') else {
        return Err("header line is incomplete".into());
    };
    Ok((SessionHeader::parse(line)?, stat))
}

/// A log as one `stat` found it: its length, modification time and status-change time. Equal
/// stats mean an unchanged log (what kin caches of a log is keyed by them): an append moves the
/// length, and any write, `chmod` or rename the ctime, which no one can set back (unlike the
/// mtime, which `touch` sets). Only a rewrite within the same timestamp tick as the stat that
/// recorded it goes unseen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LogStat {
    pub(crate) len: u64,
    pub(crate) modified: SystemTime,
    /// The ctime.
    pub(crate) changed: SystemTime,
}

impl LogStat {
    pub(crate) fn of(meta: &std::fs::Metadata) -> LogStat {
        use std::os::unix::fs::MetadataExt;
        LogStat {
            len: meta.len(),
            modified: since_epoch(meta.mtime(), meta.mtime_nsec()),
            changed: since_epoch(meta.ctime(), meta.ctime_nsec()),
        }
    }

    /// The stat of a `libc::stat` buffer.
    pub(crate) fn of_raw(st: &libc::stat) -> LogStat {
        LogStat {
            len: u64::try_from(st.st_size).unwrap_or(0),
            modified: since_epoch(st.st_mtime, st.st_mtime_nsec),
            changed: since_epoch(st.st_ctime, st.st_ctime_nsec),
        }
    }
}

/// A time from `stat`'s seconds and nanoseconds (a time before the epoch reads as the epoch).
fn since_epoch(seconds: i64, nanos: i64) -> SystemTime {
    SystemTime::UNIX_EPOCH
        + std::time::Duration::new(u64::try_from(seconds).unwrap_or(0), u32::try_from(nanos).unwrap_or(0))
}

/// The longest line `read_title` looks into: a title event is far shorter, and a longer line is
/// read past without being held.
const TITLE_LINE_LIMIT: usize = 64 * 1024;

/// Where a read of a log's title stopped, to go on from there once the log has grown: the title
/// found so far, the end of the last complete line read, where that line starts and a digest of
/// its first `TITLE_LINE_LIMIT` bytes. A log is only appended to, but repair cuts an unreadable
/// line and what follows it, and kin then writes other lines there: the line at the mark is
/// read and checked before going on, and a log cut below it is read from its start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TitleMark {
    pub(crate) title: Option<String>,
    line_start: u64,
    end: u64,
    digest: u64,
}

impl TitleMark {
    /// A mark as the catalog index holds one, `None` unless its line is a line (it starts
    /// before it ends); whether the log holds it is checked when a read goes on from it.
    pub(crate) fn new(title: Option<String>, line_start: u64, end: u64, digest: u64) -> Option<TitleMark> {
        (line_start < end).then_some(TitleMark { title, line_start, end, digest })
    }

    /// Where the read stopped: the end of the last complete line it read.
    pub(crate) fn end(&self) -> u64 {
        self.end
    }

    /// That line's start and end, and its digest (what `new` takes).
    pub(crate) fn line(&self) -> (u64, u64, u64) {
        (self.line_start, self.end, self.digest)
    }

    /// Whether `file` still holds the line this mark ends with, where it was; the bytes read to
    /// check it.
    fn holds(&self, file: &std::fs::File) -> (bool, u64) {
        use std::os::unix::fs::FileExt;
        let line = self.end - self.line_start;
        let mut kept = vec![0; usize::try_from(line).unwrap_or(usize::MAX).min(TITLE_LINE_LIMIT)];
        if file.read_exact_at(&mut kept, self.line_start).is_err() {
            return (false, 0);
        }
        let mut read = kept.len() as u64;
        let mut ends = kept.last() == Some(&b'\n');
        if line > kept.len() as u64 {
            let mut last = [0u8];
            ends = file.read_exact_at(&mut last, self.end - 1).is_ok() && last[0] == b'\n';
            read += 1;
        }
        (ends && xxhash_rust::xxh3::xxh3_64(&kept) == self.digest, read)
    }
}

/// What `read_title` found, and how many bytes of the log it read.
#[derive(Debug)]
pub(crate) struct TitleRead {
    /// `None` when the log cannot be read or holds no complete line.
    pub(crate) mark: Option<TitleMark>,
    pub(crate) bytes: u64,
}

/// The title of the log at `path` as its first `len` bytes hold it: its last `session/title`
/// event among the complete lines there. Only a line that starts as one is parsed; every other
/// line is read past, holding at most `TITLE_LINE_LIMIT` bytes of it. A read goes on from
/// `from` (a mark of an earlier read of the same log) when the log still holds the mark's line
/// below `len`, else from the start. A log that cannot be read, or fails part way, has no mark.
pub(crate) fn read_title(path: &Path, len: u64, from: Option<&TitleMark>) -> TitleRead {
    use std::io::{BufRead, Seek};
    const PREFIX: &[u8] = br#"{"type":"session/title","#;
    let Ok(mut file) = open_log(path) else {
        return TitleRead { mark: None, bytes: 0 };
    };
    // The mark read on from, if it holds, and the bytes read to check it.
    let (mut start, mut checked) = (None, 0);
    if let Some(from) = from.filter(|from| from.end <= len) {
        let holds;
        (holds, checked) = from.holds(&file);
        if holds && file.seek(std::io::SeekFrom::Start(from.end)).is_ok() {
            start = Some(from);
        }
    }
    let mut title = start.and_then(|from| from.title.clone());
    let read_from = start.map_or(0, |from| from.end);
    let mut at = read_from;
    let mut reader = std::io::BufReader::with_capacity(1 << 16, std::io::Read::take(file, len - at));
    // The last complete line read (its kept bytes, start and end), and the line being read.
    let (mut last, mut last_at) = (Vec::new(), start.map(|from| (from.line_start, from.end)));
    let mut line = Vec::new();
    'lines: loop {
        // One line: its first `TITLE_LINE_LIMIT` bytes kept, the rest consumed.
        line.clear();
        let line_start = at;
        loop {
            let Ok(buf) = reader.fill_buf() else {
                return TitleRead { mark: None, bytes: checked + (at - read_from) };
            };
            if buf.is_empty() {
                // The end, or a line without its newline (not counted).
                break 'lines;
            }
            let (take, done) = match memchr::memchr(b'\n', buf) {
                Some(end) => (end + 1, true),
                None => (buf.len(), false),
            };
            let room = TITLE_LINE_LIMIT.saturating_sub(line.len());
            line.extend_from_slice(&buf[..take.min(room)]);
            reader.consume(take);
            at += take as u64;
            if done {
                break;
            }
        }
        if line.starts_with(PREFIX) && line.ends_with(b"\n") {
            let text = std::str::from_utf8(&line[..line.len() - 1]).ok();
            let event = text.and_then(|t| Record::parse(t).ok());
            if let Some(Record::Event(event)) = event
                && let Some(found) = event.get::<super::event::SessionTitle>()
            {
                title = Some(found.title);
            }
        }
        std::mem::swap(&mut last, &mut line);
        last_at = Some((line_start, at));
    }
    let mark = last_at.map(|(line_start, end)| {
        let digest = match start {
            Some(from) if from.end == end => from.digest,
            _ => xxhash_rust::xxh3::xxh3_64(&last),
        };
        TitleMark { title, line_start, end, digest }
    });
    TitleRead { mark, bytes: checked + (at - read_from) }
}

/// Reads and scans the log at `path`, a line at a time: the file is never held whole, only
/// the events it holds.
pub fn scan_file(path: &Path) -> Result<Scanned, ScanError> {
    let file = open_log(path).map_err(|e| io_error(path, &e))?;
    scan_reader(path, &mut std::io::BufReader::with_capacity(1 << 16, file), |_, _| true)
}

/// One event's line in a log: the event's seq and the line's bytes without the newline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct EventLine {
    pub seq: u64,
    pub bytes: Vec<u8>,
}

/// `scan_file`, also keeping the line of every event of `kind` (the catalog index keeps a
/// child's descriptor line, so the next kin lists the child without reading its log).
pub(crate) fn scan_file_keeping(path: &Path, kind: &Kind) -> Result<(Scanned, Vec<EventLine>), ScanError> {
    let file = open_log(path).map_err(|e| io_error(path, &e))?;
    let mut found = Vec::new();
    let scanned = scan_reader(path, &mut std::io::BufReader::with_capacity(1 << 16, file), |event, raw| {
        if event.kind == *kind {
            found.push(EventLine { seq: event.seq, bytes: raw.to_vec() });
        }
        true
    })?;
    Ok((scanned, found))
}

/// `scan_file` keeping only the events a live session holds in memory (see `resident`): what
/// a load needs, without ever holding a model call's chunks after its first.
pub(crate) fn scan_file_resident(path: &Path) -> Result<Scanned, ScanError> {
    let file = open_log(path).map_err(|e| io_error(path, &e))?;
    let mut resident = Resident::default();
    scan_reader(path, &mut std::io::BufReader::with_capacity(1 << 16, file), |event, _| {
        let chunk = ChunkOf::event(event);
        resident.keep(event, chunk)
    })
}

/// Opens a log for reading without following a symlink and without blocking on a FIFO, and
/// refuses anything that is not a regular file (a directory, a FIFO, a device).
pub(crate) fn open_log(path: &Path) -> std::io::Result<std::fs::File> {
    open_log_statted(path).map(|(file, _)| file)
}

/// `open_log`, with the metadata its check read (one `fstat`).
fn open_log_statted(path: &Path) -> std::io::Result<(std::fs::File, std::fs::Metadata)> {
    regular(open_no_follow(path, std::fs::OpenOptions::new().read(true))?)
}

/// `file` and its metadata when it is a regular file, else the error saying it is not.
fn regular(file: std::fs::File) -> std::io::Result<(std::fs::File, std::fs::Metadata)> {
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a regular file"));
    }
    Ok((file, meta))
}

/// Opens a log as `options` say (the writer's: for appending) with `open_log`'s checks: no
/// symlink followed, no FIFO blocked on, nothing but a regular file.
pub(crate) fn open_log_as(path: &Path, options: &mut std::fs::OpenOptions) -> std::io::Result<std::fs::File> {
    regular(open_no_follow(path, options)?).map(|(file, _)| file)
}

/// `open_log` without its `fstat`, for a caller that has just statted the path as a regular
/// file and checks what it reads (anything else at the path fails the read or the check).
pub(crate) fn open_log_unchecked(path: &Path) -> std::io::Result<std::fs::File> {
    open_no_follow(path, std::fs::OpenOptions::new().read(true))
}

/// `options` opening `path` without following a symlink at it or blocking on a FIFO.
fn open_no_follow(path: &Path, options: &mut std::fs::OpenOptions) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    options.custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK).open(path).map_err(|e| match e.raw_os_error() {
        Some(libc::ELOOP) => std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "the session log is a symlink, which kin does not follow",
        ),
        // A FIFO opened for writing with no reader (or a device without one).
        Some(libc::ENXIO) => std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a regular file"),
        _ => e,
    })
}

fn io_error(path: &Path, e: &std::io::Error) -> ScanError {
    ScanError::Io { path: path.to_path_buf(), message: e.to_string() }
}

/// Scans raw log bytes (see `scan_file`).
pub fn scan_bytes(path: &Path, bytes: &[u8]) -> Result<Scanned, ScanError> {
    scan_reader(path, &mut std::io::Cursor::new(bytes), |_, _| true)
}

/// The next line of a log, as `next_line` read it.
#[derive(Debug, PartialEq)]
enum Line {
    /// The end of the file.
    End,
    /// A line with its newline, this many bytes long, in the buffer.
    Whole(u64),
    /// The file's last bytes, this many, without a newline (not held).
    Unterminated(u64),
    /// A long line with its newline that cannot be an event, this many bytes (not held): longer
    /// than `MAX_LINE_BYTES`, or not a JSON object (an event line starts with `{`).
    Damaged(u64, String),
}

/// Reads the next line, which starts at byte `start` of the reader, into `line` (cleared first,
/// newline included), holding no more than `HELD_WHILE_READING` bytes of a line until it is
/// known to end in a newline and to be at most `MAX_LINE_BYTES` long (then it is read again,
/// whole).
fn next_line<R: std::io::BufRead + std::io::Seek>(
    reader: &mut R,
    start: u64,
    line: &mut Vec<u8>,
    max_line: u64,
) -> std::io::Result<Line> {
    line.clear();
    let mut taken = 0u64;
    // The line's first byte that is not blank.
    let mut first = None;
    loop {
        let buf = reader.fill_buf()?;
        if buf.is_empty() {
            line.clear();
            return Ok(if taken == 0 { Line::End } else { Line::Unterminated(taken) });
        }
        let (n, ended) = match memchr::memchr(b'\n', buf) {
            Some(at) => (at + 1, true),
            None => (buf.len(), false),
        };
        if first.is_none() {
            first = buf[..n].iter().copied().find(|b| !b.is_ascii_whitespace());
        }
        if line.len() + n <= HELD_WHILE_READING {
            line.extend_from_slice(&buf[..n]);
        } else if !line.is_empty() {
            line.clear();
            line.shrink_to(HELD_WHILE_READING);
        }
        reader.consume(n);
        taken += n as u64;
        if !ended {
            continue;
        }
        if line.len() as u64 == taken {
            return Ok(Line::Whole(taken));
        }
        if taken > max_line {
            return Ok(Line::Damaged(
                taken,
                format!("a line of {taken} bytes, longer than any event kin reads ({max_line} bytes)"),
            ));
        }
        if first != Some(b'{') {
            return Ok(Line::Damaged(taken, format!("a line of {taken} bytes that is not a JSON object")));
        }
        // A long line that ends in a newline: read it again, whole.
        reader.seek(std::io::SeekFrom::Start(start))?;
        line.resize(usize::try_from(taken).unwrap_or(usize::MAX), 0);
        std::io::Read::read_exact(reader, line)?;
        return Ok(Line::Whole(taken));
    }
}

/// The scan of `scan_file` over any reader. The header is checked first, from at most
/// `HEADER_LIMIT` bytes (a huge file of garbage is refused at once); then each line is parsed as
/// it is read. A bad line is corruption when a complete `turn/end` line follows it, else it and
/// everything after it are the torn tail.
/// Only the events `keep` says yes to are kept; it is given each event with its line's bytes
/// (without the newline).
fn scan_reader<R: std::io::BufRead + std::io::Seek>(
    path: &Path,
    reader: &mut R,
    mut keep: impl FnMut(&mut Event, &[u8]) -> bool,
) -> Result<Scanned, ScanError> {
    use std::io::{BufRead, Read};
    let corrupt = |line: usize, reason: String| ScanError::Corrupt { path: path.to_path_buf(), line, reason };
    let read_error = |e: std::io::Error| io_error(path, &e);
    let mut line = Vec::new();
    reader.by_ref().take(HEADER_LIMIT).read_until(b'\n', &mut line).map_err(read_error)?;
    let Some(header_raw) = line.strip_suffix(b"\n") else {
        return Err(corrupt(1, "the header line is missing or incomplete".into()));
    };
    let header_text = std::str::from_utf8(header_raw).map_err(|_| corrupt(1, "header is not UTF-8".into()))?;
    let header = SessionHeader::parse(header_text).map_err(|e| corrupt(1, e))?;
    let mut events: Vec<Event> = Vec::new();
    let mut length = 0u64;
    let mut committed = line.len() as u64;
    let mut torn = None;
    for number in 2.. {
        let (read, parsed) = match next_line(reader, committed, &mut line, MAX_LINE_BYTES).map_err(read_error)? {
            Line::End => break,
            Line::Unterminated(read) => {
                torn = Some(TornTail { line: number, bytes: read, reason: "last line has no newline".into() });
                break;
            }
            Line::Damaged(read, reason) => (read, Err(reason)),
            Line::Whole(read) => (read, Ok(())),
        };
        let raw = line.strip_suffix(b"\n").unwrap_or(&line);
        match parsed.and_then(|()| parse_line(raw, length)) {
            Ok(more) => {
                length += more.len() as u64;
                events.extend(more.into_iter().filter_map(|mut e| keep(&mut e, raw).then_some(e)));
                committed += read;
            }
            Err(reason) => {
                let mut rest = read;
                loop {
                    let more =
                        match next_line(reader, committed + rest, &mut line, MAX_LINE_BYTES).map_err(read_error)? {
                            Line::End => break,
                            Line::Whole(_) if line.strip_suffix(b"\n").is_some_and(is_turn_end) => {
                                return Err(corrupt(number, reason));
                            }
                            Line::Whole(more) | Line::Unterminated(more) | Line::Damaged(more, _) => more,
                        };
                    rest += more;
                }
                torn = Some(TornTail { line: number, bytes: rest, reason });
                break;
            }
        }
    }
    events.shrink_to_fit();
    Ok(Scanned { path: path.to_path_buf(), header, events, length, committed_bytes: committed, torn })
}

fn parse_line(raw: &[u8], next_seq: u64) -> Result<Vec<Event>, String> {
    let text = std::str::from_utf8(raw).map_err(|_| "line is not UTF-8".to_string())?;
    let events = Record::parse(text)?.into_events();
    for (offset, event) in events.iter().enumerate() {
        let expected = next_seq + offset as u64;
        if event.seq != expected {
            return Err(format!("seq {} where {expected} was expected", event.seq));
        }
    }
    Ok(events)
}

fn is_turn_end(raw: &[u8]) -> bool {
    std::str::from_utf8(raw)
        .ok()
        .and_then(|t| Record::parse(t).ok())
        .is_some_and(|r| matches!(r, Record::Event(e) if e.kind == Kind::TurnEnd))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A log's stat is the same read through `std::fs::metadata` or a raw `fstatat` (the scan's),
    /// whatever its times, one before the epoch included (the query compares the two).
    #[test]
    fn a_stat_is_the_same_from_metadata_or_a_raw_stat() {
        use std::os::unix::ffi::OsStrExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        std::fs::write(&path, "x").unwrap();
        let c_path = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
        for (seconds, nanos) in [(1_700_000_000, 5), (-5, 7)] {
            let times = [libc::timespec { tv_sec: seconds, tv_nsec: nanos }; 2];
            // SAFETY: a NUL-terminated path and two timespecs.
            assert_eq!(unsafe { libc::utimensat(libc::AT_FDCWD, c_path.as_ptr(), times.as_ptr(), 0) }, 0);
            // SAFETY: an all-zero `stat` is a valid value for stat to fill.
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            // SAFETY: a NUL-terminated path and a writable stat buffer.
            assert_eq!(unsafe { libc::stat(c_path.as_ptr(), &mut st) }, 0);
            assert_eq!(LogStat::of(&std::fs::metadata(&path).unwrap()), LogStat::of_raw(&st), "mtime {seconds}");
        }
    }

    const LOG: &str = concat!(
        r#"{"type":"session","version":0,"id":"s","createdAt":0,"delegationDepth":0}"#,
        "\n",
        r#"{"type":"turn/start","seq":0,"time":0,"data":{"turn":1}}"#,
        "\n",
        r#"{"type":"turn/end","seq":1,"time":0,"data":{"turn":1,"reason":{"kind":"completed"}}}"#,
        "\n",
        r#"{"type":"turn/start","seq":2,"time":0,"data":{"turn":2}}"#,
        "\n",
    );

    fn title_event(seq: u64, text: &str) -> String {
        format!(
            "{{\"type\":\"session/title\",\"seq\":{seq},\"time\":0,\"data\":{{\"title\":\"{text}\",\"messageSeqs\":[1],\"source\":{{\"kind\":\"fallback\"}}}}}}\n"
        )
    }

    /// The title of a whole read of the first `len` bytes.
    fn title_at(path: &Path, len: u64) -> Option<String> {
        read_title(path, len, None).mark.and_then(|mark| mark.title)
    }

    #[test]
    fn a_title_is_the_last_title_event_among_complete_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log.jsonl");
        let title = title_event;
        let long = format!("{{\"type\":\"tool/result\",\"x\":\"{}\"}}\n", "y".repeat(3 * TITLE_LINE_LIMIT));
        let text = format!("{LOG}{}{long}{}", title(3, "First"), title(4, "Second"));
        std::fs::write(&path, &text).unwrap();
        let all = text.len() as u64;
        assert_eq!(title_at(&path, all).as_deref(), Some("Second"));
        assert_eq!(read_title(&path, all, None).bytes, all, "read once, whole");
        // Only the first `len` bytes count: a title past them, or cut by them, does not.
        let first_ends = (LOG.len() + title(3, "First").len()) as u64;
        assert_eq!(title_at(&path, first_ends).as_deref(), Some("First"));
        assert_eq!(title_at(&path, all - 1).as_deref(), Some("First"), "the last line cut by the length");
        assert_eq!(title_at(&path, first_ends - 1), None);
        // A title on a torn last line does not count.
        let torn = title(5, "Torn");
        std::fs::write(&path, format!("{LOG}{}{}", title(3, "First"), torn.trim_end())).unwrap();
        assert_eq!(title_at(&path, u64::MAX).as_deref(), Some("First"));
        std::fs::write(&path, LOG).unwrap();
        assert_eq!(title_at(&path, u64::MAX), None);
        assert!(read_title(&dir.path().join("missing"), u64::MAX, None).mark.is_none());
    }

    /// A read goes on from an earlier read's mark when the log only grew, reading just what was
    /// added (and the mark's line, to check it), with what a whole read gives; a log cut below the
    /// mark and written again, or shorter than it, is read from its start.
    #[test]
    fn a_title_read_goes_on_from_its_mark() {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log.jsonl");
        let append = |text: &str| {
            std::fs::OpenOptions::new().append(true).open(&path).unwrap().write_all(text.as_bytes()).unwrap();
            std::fs::metadata(&path).unwrap().len()
        };
        let long = format!("{{\"type\":\"tool/result\",\"x\":\"{}\"}}\n", "y".repeat(2 * TITLE_LINE_LIMIT));
        std::fs::write(&path, format!("{LOG}{}", title_event(3, "First"))).unwrap();
        let len = std::fs::metadata(&path).unwrap().len();
        let first = read_title(&path, len, None).mark.unwrap();
        assert_eq!(first.title.as_deref(), Some("First"));
        // Grown by lines without a title, then a long one (checked by its head and last byte),
        // then a title, then a torn line: each read from the last mark reads only what was added.
        let mut mark = first.clone();
        for (added, expected) in [
            (LOG.to_string(), "First"),
            (long.clone(), "First"),
            (title_event(9, "Second"), "Second"),
            (title_event(10, "Torn").trim_end().to_string(), "Second"),
        ] {
            let before = len_of(&path);
            let now = append(&added);
            let read = read_title(&path, now, Some(&mark));
            let next = read.mark.unwrap();
            assert_eq!(next.title.as_deref(), Some(expected), "after {} bytes", added.len());
            assert_eq!(next, read_title(&path, now, None).mark.unwrap(), "what a whole read gives");
            let checked = (mark.end - mark.line_start).min(TITLE_LINE_LIMIT as u64)
                + u64::from(mark.end - mark.line_start > TITLE_LINE_LIMIT as u64);
            assert_eq!(read.bytes, checked + (now - before), "only the mark's line and what was added");
            mark = next;
        }
        // Nothing new: the same mark.
        let now = len_of(&path);
        assert_eq!(read_title(&path, now, Some(&mark)).mark.unwrap(), mark);
        // A mark past the length read: from the start.
        assert_eq!(read_title(&path, len, Some(&mark)).mark.unwrap(), first);
        assert_eq!(read_title(&path, len, Some(&mark)).bytes, len);
        // Cut below the mark (as repair cuts an unreadable line) and written again past it.
        let cut = std::fs::read(&path).unwrap()[..len as usize].to_vec();
        std::fs::write(&path, [cut.as_slice(), long.as_bytes(), long.as_bytes(), LOG.as_bytes()].concat()).unwrap();
        let now = len_of(&path);
        assert!(now > mark.end);
        let read = read_title(&path, now, Some(&mark));
        assert_eq!(read.mark.as_ref().unwrap().title.as_deref(), Some("First"), "the later titles are gone");
        assert_eq!(read.mark.unwrap(), read_title(&path, now, None).mark.unwrap());
        assert!(read.bytes >= now, "read from the start: {} of {now}", read.bytes);
    }

    fn len_of(path: &Path) -> u64 {
        std::fs::metadata(path).unwrap().len()
    }

    #[test]
    fn read_header_reads_the_first_line_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("session.jsonl");
        std::fs::write(&path, format!("{LOG}{{not json\n")).unwrap();
        assert_eq!(read_header(&path).unwrap().0.id, "s", "the rest of the log is not read");
        let header = LOG.lines().next().unwrap();
        std::fs::write(&path, header).unwrap();
        assert_eq!(read_header(&path).unwrap_err(), "header line is incomplete");
        std::fs::write(&path, " ".repeat(HEADER_LIMIT as usize + 1) + "\n").unwrap();
        assert_eq!(read_header(&path).unwrap_err(), "header line is incomplete", "a line past the cap");
    }

    #[test]
    fn long_lines_are_held_only_when_they_can_be_events() {
        let object = format!("{{{}}}\n", "x".repeat(3 << 20));
        let plain = format!("{}\n", "y".repeat(2 << 20));
        let overlong = format!("{{{}}}\n", "z".repeat(5 << 20));
        let tail = "w".repeat(4 << 20);
        let bytes = format!("a\n{object}{plain}{overlong}b\n{tail}");
        let mut reader = std::io::Cursor::new(bytes.as_bytes());
        let (mut line, mut at) = (Vec::new(), 0u64);
        let mut next = |line: &mut Vec<u8>| {
            let read = next_line(&mut reader, at, line, 4 << 20).unwrap();
            at += match &read {
                Line::Whole(n) | Line::Unterminated(n) | Line::Damaged(n, _) => *n,
                Line::End => 0,
            };
            read
        };
        assert_eq!(next(&mut line), Line::Whole(2));
        assert_eq!(line, b"a\n");
        assert_eq!(next(&mut line), Line::Whole(object.len() as u64), "read again, whole");
        assert_eq!(line, object.as_bytes());
        let Line::Damaged(n, why) = next(&mut line) else { panic!() };
        assert_eq!((n, why.contains("not a JSON object")), (plain.len() as u64, true), "{why}");
        assert!(line.is_empty(), "not held");
        let Line::Damaged(n, why) = next(&mut line) else { panic!() };
        assert_eq!((n, why.contains("longer than any event kin reads")), (overlong.len() as u64, true), "{why}");
        assert_eq!(next(&mut line), Line::Whole(2), "the line after a damaged one");
        assert_eq!(line, b"b\n");
        let mut fresh = Vec::new();
        assert_eq!(next(&mut fresh), Line::Unterminated(tail.len() as u64));
        assert!(fresh.capacity() <= 2 * HELD_WHILE_READING, "a torn tail is not held: {}", fresh.capacity());
        assert_eq!(next(&mut line), Line::End);
    }

    #[test]
    fn clean_log_scans_fully() {
        let s = scan_bytes(Path::new("x"), LOG.as_bytes()).unwrap();
        assert_eq!(s.events.len(), 3);
        assert_eq!(s.committed_bytes, LOG.len() as u64);
        assert!(s.torn.is_none());
    }

    #[test]
    fn missing_newline_is_a_torn_tail() {
        let cut = &LOG[..LOG.len() - 1];
        let s = scan_bytes(Path::new("x"), cut.as_bytes()).unwrap();
        assert_eq!(s.events.len(), 2);
        assert_eq!(s.torn.unwrap().reason, "last line has no newline");
    }

    #[test]
    fn garbage_before_last_turn_end_is_corruption() {
        let bad = LOG.replacen(r#""seq":0"#, r#""seq":7"#, 1);
        let err = scan_bytes(Path::new("f.jsonl"), bad.as_bytes()).unwrap_err();
        assert_eq!(err.to_string(), "f.jsonl:2: corrupt session log: seq 7 where 0 was expected");
    }

    #[test]
    fn garbage_after_last_turn_end_is_torn() {
        let bad = format!("{LOG}{{not json\n");
        let s = scan_bytes(Path::new("x"), bad.as_bytes()).unwrap();
        assert_eq!(s.events.len(), 3);
        assert_eq!(s.torn.unwrap().line, 5);
        assert_eq!(s.committed_bytes, LOG.len() as u64);
    }
}
