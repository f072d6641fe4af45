//! Session query (dsh-design.md §1.5): a read model over the sessions of this process and the
//! persisted logs, live preferred. `trace_session` (lineage: the target, its ancestors, its
//! descendants as a tree), `list_events` (every event with its surface status, after validating
//! the surface fold) and `read_event` (one event and a bounded window around it). Errors carry the
//! stable `SESSION_QUERY_*` codes.
//!
//! The query never writes: persisted logs are read through the non-mutating scan of `inspect`
//! (no torn-tail truncation, no closers). Where the sessions come from is a `SessionSource`:
//! `StoreSource` is the real one (the JSONL store plus the runtime's live set); tests wrap it to
//! inject failures.
//!
//! Cost. One corpus scan per trace: a stat per log (`store_scan`: relative to its project
//! directory, the logs shared among a few threads in chunks); headers are read only from new or
//! changed logs, and the merged corpus is rebuilt only when some log was added, removed or changed;
//! it keeps the maps a trace walks (each session's record, each parent's children in sibling
//! order), so a trace copies only the sessions it returns. Per log, `StoreSource` keeps a derived
//! `LogSummary` (header, event count, the `subagent/descriptor` events, the surface verdict) keyed
//! by path and stat (length, mtime, ctime: `scan::LogStat`) and rebuilt on any mismatch; the summary is never an authority, only a
//! cache of what a full read of the same bytes returns. Exact reads reuse the scan's paths instead
//! of rescanning the corpus. A listing pins its candidates' summaries as of its trace's scan (`pin`
//! / `release`), so it stats each log once. With `with_index` (the runtime's), the source also
//! keeps the derived catalog index file (`catalog_index`): the first scan takes unchanged logs'
//! headers and summaries from it (descriptor lines included), reading no log; its `watch`
//! (`session::watch`), which the runtime's store reports its writes to, keeps the cache and the
//! file current as kin writes children, in batches on the watch's thread. A file rewritten to the
//! same length within the timestamp tick of its last stat would be missed until it changes again:
//! logs are append-only, so only a hand edit can do that.

use foldhash::{HashMap, HashMapExt, HashSet, HashSetExt};
use std::cmp::Ordering;
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::catalog_index::{self, Facts, KeptLine, Titled};
use super::dir_memo::{self, Memo};
use super::event::Kind;
use super::inbox::InboxCounts;
use super::layout::LOG_FILE;
use super::record::{Event, SessionHeader};
use super::scan::{EventLine, LogStat, TitleMark, read_filed_header, read_title, scan_file, scan_file_keeping};
use super::store::{SessionStore, StoreError, StoredSession};
use super::store_scan::{Memoizing, ProjectScan, each_in_parallel, in_parallel, scan_store, workers_for};
pub use super::surface::Surface;
use super::surface::validate;
use super::watch::LogWatch;

/// The largest `before` / `after` of a `read_event` window (dsh `readWindowMax`).
pub(crate) const READ_WINDOW_MAX: u64 = 50;

/// Why a query failed; `code()` is the stable dsh `SessionQueryErrorCode`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QueryError {
    /// The caller's cancellation token fired.
    Aborted,
    EventNotFound {
        session_id: String,
        seq: u64,
    },
    /// A cycle in the lineage connected to the target.
    InvalidLineage(String),
    /// A log that fails the surface fold (seqs, surface ops, provenance, replacements).
    InvalidSurface(String),
    InvalidWindow(String),
    /// The store could not be read.
    PersistenceFailed(String),
    /// The session id (its value) is not in the corpus.
    SessionNotFound(String),
    /// Two sources disagree about an immutable header.
    SourceConflict(String),
}

impl QueryError {
    pub fn code(&self) -> &'static str {
        match self {
            QueryError::Aborted => "SESSION_QUERY_ABORTED",
            QueryError::EventNotFound { .. } => "SESSION_QUERY_EVENT_NOT_FOUND",
            QueryError::InvalidLineage(_) => "SESSION_QUERY_INVALID_LINEAGE",
            QueryError::InvalidSurface(_) => "SESSION_QUERY_INVALID_SURFACE",
            QueryError::InvalidWindow(_) => "SESSION_QUERY_INVALID_WINDOW",
            QueryError::PersistenceFailed(_) => "SESSION_QUERY_PERSISTENCE_FAILED",
            QueryError::SessionNotFound(_) => "SESSION_QUERY_SESSION_NOT_FOUND",
            QueryError::SourceConflict(_) => "SESSION_QUERY_SOURCE_CONFLICT",
        }
    }
}

impl std::fmt::Display for QueryError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            QueryError::Aborted => f.write_str("session query was aborted"),
            QueryError::EventNotFound { session_id, seq } => write!(f, "session {session_id} has no event {seq}"),
            QueryError::SessionNotFound(id) => write!(f, "session {id} was not found"),
            QueryError::InvalidLineage(m)
            | QueryError::InvalidSurface(m)
            | QueryError::InvalidWindow(m)
            | QueryError::PersistenceFailed(m)
            | QueryError::SourceConflict(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for QueryError {}

/// What a `QueryService` operation fails with: a query error (stable code), or a failure that is
/// not a query error at all (a broken backend), which consumers must not reinterpret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QueryFault {
    Query(QueryError),
    Other(String),
}

impl From<QueryError> for QueryFault {
    fn from(e: QueryError) -> Self {
        QueryFault::Query(e)
    }
}

impl std::fmt::Display for QueryFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            QueryFault::Query(e) => e.fmt(f),
            QueryFault::Other(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for QueryFault {}

/// One logical session of the corpus.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionRecord {
    /// Shared with the source's cache: a corpus of thousands of sessions is not copied per call.
    pub header: Arc<SessionHeader>,
    /// Live in this process.
    pub live: bool,
    /// Has a log in the store.
    pub persisted: bool,
}

/// A session and its descendants.
#[derive(Debug, Clone, PartialEq)]
pub struct LineageNode {
    pub session: SessionRecord,
    pub descendants: Vec<LineageNode>,
}

/// Whether the ancestor chain reached a session without a parent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lineage {
    Complete {
        root: String,
    },
    /// An ancestor names a parent the corpus does not hold.
    Incomplete {
        unresolved_parent_id: String,
    },
}

/// `trace_session`'s result.
#[derive(Debug, Clone, PartialEq)]
pub struct Trace {
    pub target: SessionRecord,
    /// Immediate parent first, then outward.
    pub ancestors: Vec<SessionRecord>,
    /// Direct children in sibling order (`createdAt`, then id), each with its own subtree.
    pub descendants: Vec<LineageNode>,
    pub lineage: Lineage,
}

/// One event as `list_events` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventRecord {
    pub session_id: String,
    pub seq: u64,
    pub kind: Kind,
    pub time: u64,
    pub surface: Surface,
}

/// `read_event`'s request: the event `seq` of a session, with up to `before` / `after`
/// neighbours (each at most `READ_WINDOW_MAX`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadRequest {
    pub session_id: String,
    pub seq: u64,
    pub before: u64,
    pub after: u64,
}

impl ReadRequest {
    /// Just the one event.
    pub fn exact(session_id: &str, seq: u64) -> Self {
        ReadRequest { session_id: session_id.to_string(), seq, before: 0, after: 0 }
    }
}

/// `read_event`'s result.
#[derive(Debug, Clone, PartialEq)]
pub struct Window {
    /// The header of the log the event was read from.
    pub session: Arc<SessionHeader>,
    pub target: Event,
    /// `start_seq..=end_seq`, the target included.
    pub events: Vec<Event>,
    pub start_seq: u64,
    pub end_seq: u64,
}

/// A session's raw log: a live session's events, or a persisted log's valid stored prefix.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionLog {
    pub header: SessionHeader,
    pub events: Vec<Event>,
}

/// Derived facts about one log: exactly what a full read of the same bytes would give for them.
#[derive(Debug, Clone, PartialEq)]
pub struct LogSummary {
    pub header: Arc<SessionHeader>,
    pub event_count: u64,
    /// Every `subagent/descriptor` event (the one kind the subagent catalog asks for), whole,
    /// in seq order.
    pub indexed: Vec<Event>,
    /// The surface fold's verdict (`Err` holds the violation).
    pub surface: Result<(), String>,
    /// What its own inbox holds (zero when its splices do not fold).
    pub inbox: InboxCounts,
}

impl LogSummary {
    pub fn of(log: &SessionLog) -> LogSummary {
        LogSummary {
            header: Arc::new(log.header.clone()),
            event_count: log.events.len() as u64,
            indexed: log.events.iter().filter(|e| e.kind == Kind::SubagentDescriptor).cloned().collect(),
            surface: validate(&log.events).map(|_| ()),
            inbox: super::inbox::fold(&log.events, log.header.seed_length.unwrap_or(0))
                .map(|inbox| inbox.counts())
                .unwrap_or_default(),
        }
    }
}

/// Where the query's sessions come from.
pub trait SessionSource: Send + Sync {
    /// Every session, one record per id, live preferred (build it with `merge_records`); a live
    /// and a persisted header that disagree are `SourceConflict`, an unreadable store is
    /// `PersistenceFailed`.
    fn records(&self, cancel: &CancellationToken) -> Result<Vec<SessionRecord>, QueryError>;

    /// The lineage of `id` from one `records` read (`trace_session`). A source that keeps its
    /// corpus walkable may answer from that instead: the same trace.
    fn trace(&self, id: &str, cancel: &CancellationToken) -> Result<Trace, QueryError> {
        let records = self.records(cancel)?;
        if cancel.is_cancelled() {
            return Err(QueryError::Aborted);
        }
        trace(&RecordLineage::of(&records, id), id, cancel)
    }

    /// The raw log of one session (live preferred; a persisted log read without repair).
    fn log(&self, id: &str) -> Result<SessionLog, QueryError>;

    /// `LogSummary::of(&self.log(id)?)`; a source may answer from a cache it keeps in step with
    /// the log.
    fn summary(&self, id: &str) -> Result<Arc<LogSummary>, QueryError> {
        self.log(id).map(|log| Arc::new(LogSummary::of(&log)))
    }

    /// Opens a listing over `ids`, right after its trace: until `release(ids)`, a caching source
    /// may answer `summary` for them as of the trace's corpus scan (building the missing ones now,
    /// in parallel) instead of checking each log again, so a listing stats each log once. The
    /// default does nothing (every `summary` reads as of its call).
    fn pin(&self, _ids: &[&str], _cancel: &CancellationToken) {}

    /// Closes what one `pin(ids)` opened.
    fn release(&self, _ids: &[&str]) {}
}

/// The operations the subagent catalog consumes, as a seam tests can wrap.
pub trait QueryService: Send + Sync {
    fn trace_session(&self, id: &str, cancel: &CancellationToken) -> Result<Trace, QueryFault>;

    /// Takes no cancellation token (as in dsh): callers check theirs around it.
    fn list_events(&self, id: &str) -> Result<Vec<EventRecord>, QueryFault>;

    fn read_event(&self, request: &ReadRequest, cancel: &CancellationToken) -> Result<Window, QueryFault>;

    /// `list_events` reduced to the seqs of the events of `kind`, with the same validation and
    /// errors; a backend may answer it from a derived summary.
    fn event_seqs(&self, id: &str, kind: &Kind) -> Result<Vec<u64>, QueryFault> {
        Ok(self.list_events(id)?.into_iter().filter(|r| r.kind == *kind).map(|r| r.seq).collect())
    }

    /// What the session's own inbox holds (pending and discarded messages); a backend may
    /// answer it from a derived summary. The default knows nothing (zero).
    fn inbox(&self, _id: &str) -> Result<InboxCounts, QueryFault> {
        Ok(InboxCounts::default())
    }

    /// Opens a listing over these candidates of the trace just made (`SessionSource::pin`): until
    /// `release(ids)` their reads (`event_seqs`, exact reads, `inbox`) may answer as of that
    /// trace's scan, a snapshot, rather than checking every log again. The default does nothing.
    fn pin(&self, _ids: &[&str], _cancel: &CancellationToken) {}

    /// Closes what one `pin(ids)` opened.
    fn release(&self, _ids: &[&str]) {}
}

/// Fails unless two headers of one session agree (dsh `assertSessionHeadersCompatible`): every
/// header field is immutable, so they must be equal.
pub(crate) fn assert_headers_compatible(a: &SessionHeader, b: &SessionHeader) -> Result<(), QueryError> {
    if a == b {
        return Ok(());
    }
    let json = |h: &SessionHeader| serde_json::to_string(h).unwrap_or_default();
    Err(QueryError::SourceConflict(format!("session {} has conflicting headers: {} and {}", a.id, json(a), json(b))))
}

/// The live-preferred corpus: one record per id. A live header and a persisted one (or two
/// persisted ones) for the same id must agree.
pub fn merge_records(
    live: Vec<Arc<SessionHeader>>,
    persisted: Vec<Arc<SessionHeader>>,
) -> Result<Vec<SessionRecord>, QueryError> {
    let all: Vec<(Arc<SessionHeader>, bool)> =
        live.into_iter().map(|h| (h, true)).chain(persisted.into_iter().map(|h| (h, false))).collect();
    // Positions in `out` by id, borrowed from `all` (no id is copied).
    let mut index: HashMap<&str, usize> = HashMap::with_capacity(all.len());
    let mut out: Vec<SessionRecord> = Vec::with_capacity(all.len());
    for (header, is_live) in &all {
        match index.get(header.id.as_str()).copied() {
            Some(i) => {
                assert_headers_compatible(&out[i].header, header)?;
                if *is_live {
                    out[i].live = true;
                } else {
                    out[i].persisted = true;
                }
            }
            None => {
                index.insert(header.id.as_str(), out.len());
                out.push(SessionRecord { header: header.clone(), live: *is_live, persisted: !*is_live });
            }
        }
    }
    Ok(out)
}

/// Sibling order: `createdAt` ascending, then the id.
///
/// dsh compares ids with JS `localeCompare` (ICU root collation). kin approximates it: ids are
/// compared case-insensitively first, then, at the first character differing only in case, the
/// lowercase one sorts first, then by bytes. For the lowercase UUIDs kin and dsh mint this is byte
/// order; it differs from ICU only for punctuation other than `-` (ICU sorts `_` before `-` and
/// both before digits).
pub fn sibling_order(a: &SessionHeader, b: &SessionHeader) -> Ordering {
    a.created_at.cmp(&b.created_at).then_with(|| compare_ids(&a.id, &b.id))
}

/// The id part of `sibling_order`.
pub(crate) fn compare_ids(a: &str, b: &str) -> Ordering {
    let folded = a.chars().flat_map(char::to_lowercase).cmp(b.chars().flat_map(char::to_lowercase));
    folded.then_with(|| {
        for (x, y) in a.chars().zip(b.chars()) {
            if x != y && x.to_lowercase().eq(y.to_lowercase()) {
                return y.is_lowercase().cmp(&x.is_lowercase());
            }
        }
        a.cmp(b)
    })
}

/// The query service over one source.
pub struct SessionQuery<S: SessionSource = StoreSource> {
    source: S,
}

impl<S: SessionSource> SessionQuery<S> {
    pub fn new(source: S) -> Self {
        SessionQuery { source }
    }

    pub fn source(&self) -> &S {
        &self.source
    }

    /// The target's lineage from one corpus read.
    pub fn trace_session(&self, id: &str, cancel: &CancellationToken) -> Result<Trace, QueryError> {
        self.trace_impl(id, cancel)
    }

    /// Every event of the session with its surface status (the log is validated first).
    pub fn list_events(&self, id: &str) -> Result<Vec<EventRecord>, QueryError> {
        self.list_events_impl(id)
    }

    /// The seqs of the session's events of `kind` (`list_events`, filtered; answered from the
    /// source's summary for `subagent/descriptor`).
    pub fn event_seqs(&self, id: &str, kind: &Kind) -> Result<Vec<u64>, QueryError> {
        self.event_seqs_impl(id, kind)
    }

    /// One event and up to `before` / `after` neighbours, from a validated log.
    pub fn read_event(&self, request: &ReadRequest, cancel: &CancellationToken) -> Result<Window, QueryError> {
        self.read_event_impl(request, cancel)
    }

    fn trace_impl(&self, id: &str, cancel: &CancellationToken) -> Result<Trace, QueryError> {
        if cancel.is_cancelled() {
            return Err(QueryError::Aborted);
        }
        self.source.trace(id, cancel)
    }

    fn list_events_impl(&self, id: &str) -> Result<Vec<EventRecord>, QueryError> {
        let log = self.source.log(id)?;
        let surfaces = validate(&log.events).map_err(|e| invalid_surface(id, &e))?;
        Ok(log
            .events
            .into_iter()
            .zip(surfaces)
            .map(|(e, surface)| EventRecord {
                session_id: id.to_string(),
                seq: e.seq,
                kind: e.kind,
                time: e.time,
                surface,
            })
            .collect())
    }

    fn event_seqs_impl(&self, id: &str, kind: &Kind) -> Result<Vec<u64>, QueryError> {
        if *kind != Kind::SubagentDescriptor {
            return Ok(self.list_events_impl(id)?.into_iter().filter(|r| r.kind == *kind).map(|r| r.seq).collect());
        }
        let summary = self.source.summary(id)?;
        if let Err(e) = &summary.surface {
            return Err(invalid_surface(id, e));
        }
        Ok(summary.indexed.iter().map(|e| e.seq).collect())
    }

    fn read_event_impl(&self, request: &ReadRequest, cancel: &CancellationToken) -> Result<Window, QueryError> {
        if cancel.is_cancelled() {
            return Err(QueryError::Aborted);
        }
        if request.before > READ_WINDOW_MAX || request.after > READ_WINDOW_MAX {
            return Err(QueryError::InvalidWindow(format!(
                "a read window holds at most {READ_WINDOW_MAX} events before and after its target (asked for {} and {})",
                request.before, request.after
            )));
        }
        let id = request.session_id.as_str();
        if request.before == 0 && request.after == 0 {
            let summary = self.source.summary(id)?;
            if let Err(e) = &summary.surface {
                return Err(invalid_surface(id, e));
            }
            if let Some(target) = summary.indexed.iter().find(|e| e.seq == request.seq) {
                if cancel.is_cancelled() {
                    return Err(QueryError::Aborted);
                }
                return Ok(Window {
                    session: summary.header.clone(),
                    target: target.clone(),
                    events: vec![target.clone()],
                    start_seq: request.seq,
                    end_seq: request.seq,
                });
            }
        }
        let log = self.source.log(id)?;
        validate(&log.events).map_err(|e| invalid_surface(id, &e))?;
        let found = usize::try_from(request.seq).ok().and_then(|i| log.events.get(i)).cloned();
        let Some(target) = found else {
            return Err(QueryError::EventNotFound { session_id: id.to_string(), seq: request.seq });
        };
        let last = log.events.len() as u64 - 1;
        let start = request.seq.saturating_sub(request.before);
        let end = request.seq.saturating_add(request.after).min(last);
        let events = log.events[start as usize..=end as usize].to_vec();
        if cancel.is_cancelled() {
            return Err(QueryError::Aborted);
        }
        Ok(Window { session: Arc::new(log.header), target, events, start_seq: start, end_seq: end })
    }
}

impl<S: SessionSource> QueryService for SessionQuery<S> {
    fn trace_session(&self, id: &str, cancel: &CancellationToken) -> Result<Trace, QueryFault> {
        self.trace_impl(id, cancel).map_err(QueryFault::Query)
    }

    fn list_events(&self, id: &str) -> Result<Vec<EventRecord>, QueryFault> {
        self.list_events_impl(id).map_err(QueryFault::Query)
    }

    fn read_event(&self, request: &ReadRequest, cancel: &CancellationToken) -> Result<Window, QueryFault> {
        self.read_event_impl(request, cancel).map_err(QueryFault::Query)
    }

    fn event_seqs(&self, id: &str, kind: &Kind) -> Result<Vec<u64>, QueryFault> {
        self.event_seqs_impl(id, kind).map_err(QueryFault::Query)
    }

    fn inbox(&self, id: &str) -> Result<InboxCounts, QueryFault> {
        self.source.summary(id).map(|summary| summary.inbox).map_err(QueryFault::Query)
    }

    fn pin(&self, ids: &[&str], cancel: &CancellationToken) {
        self.source.pin(ids, cancel);
    }

    fn release(&self, ids: &[&str]) {
        self.source.release(ids);
    }
}

fn invalid_surface(id: &str, violation: &str) -> QueryError {
    QueryError::InvalidSurface(format!("session {id}: {violation}"))
}

/// The sessions of one corpus snapshot as `trace` walks them: by id, and each one's children in
/// sibling order.
trait Lineages<'r> {
    fn session(&self, id: &str) -> Option<&'r SessionRecord>;
    fn children(&self, id: &str) -> Vec<&'r SessionRecord>;
}

/// A list of records made walkable (`SessionSource::trace`'s default).
struct RecordLineage<'r> {
    records: &'r [SessionRecord],
    by_id: HashMap<&'r str, &'r SessionRecord>,
    children: HashMap<String, Vec<usize>>,
}

impl<'r> RecordLineage<'r> {
    fn of(records: &'r [SessionRecord], id: &str) -> Self {
        let children = children_of(records);
        // By id, only what the walk up can meet: the target and the sessions some session names
        // as its parent (an ancestor is one). Most of a store has no children: it is not mapped.
        let by_id = records
            .iter()
            .filter(|r| r.header.id == id || children.contains_key(r.header.id.as_str()))
            .map(|r| (r.header.id.as_str(), r))
            .collect();
        RecordLineage { records, by_id, children }
    }
}

impl<'r> Lineages<'r> for RecordLineage<'r> {
    fn session(&self, id: &str) -> Option<&'r SessionRecord> {
        self.by_id.get(id).copied()
    }

    fn children(&self, id: &str) -> Vec<&'r SessionRecord> {
        kids(self.records, &self.children, id)
    }
}

/// The records of `id`'s children (`children_of`'s positions).
fn kids<'r>(records: &'r [SessionRecord], children: &HashMap<String, Vec<usize>>, id: &str) -> Vec<&'r SessionRecord> {
    children.get(id).map(Vec::as_slice).unwrap_or_default().iter().filter_map(|&i| records.get(i)).collect()
}

/// Lineage from one corpus snapshot.
fn trace<'r>(sessions: &impl Lineages<'r>, id: &str, cancel: &CancellationToken) -> Result<Trace, QueryError> {
    let target = sessions.session(id).ok_or_else(|| QueryError::SessionNotFound(id.to_string()))?;
    let cycle = |at: &str| QueryError::InvalidLineage(format!("the lineage of session {id} has a cycle through {at}"));
    let mut seen: HashSet<&str> = HashSet::new();
    seen.insert(target.header.id.as_str());
    let mut ancestors = Vec::new();
    let mut lineage = Lineage::Complete { root: id.to_string() };
    let mut next = target.header.parent_session.as_deref();
    while let Some(parent_id) = next {
        if !seen.insert(parent_id) {
            return Err(cycle(parent_id));
        }
        match sessions.session(parent_id) {
            Some(parent) => {
                ancestors.push(parent.clone());
                lineage = Lineage::Complete { root: parent_id.to_string() };
                next = parent.header.parent_session.as_deref();
            }
            None => {
                lineage = Lineage::Incomplete { unresolved_parent_id: parent_id.to_string() };
                next = None;
            }
        }
    }
    // Depth-first, without recursion (a long fork chain must not overflow the stack).
    struct Frame<'r> {
        record: &'r SessionRecord,
        kids: Vec<&'r SessionRecord>,
        next: usize,
        built: Vec<LineageNode>,
    }
    let mut stack = vec![Frame { record: target, kids: sessions.children(id), next: 0, built: Vec::new() }];
    let mut steps: u64 = 0;
    loop {
        steps += 1;
        if steps.is_multiple_of(1024) && cancel.is_cancelled() {
            return Err(QueryError::Aborted);
        }
        let Some(top) = stack.last_mut() else {
            unreachable!("the target frame is popped last");
        };
        if let Some(&kid) = top.kids.get(top.next) {
            top.next += 1;
            if !seen.insert(kid.header.id.as_str()) {
                return Err(cycle(kid.header.id.as_str()));
            }
            stack.push(Frame { record: kid, kids: sessions.children(&kid.header.id), next: 0, built: Vec::new() });
            continue;
        }
        let Some(done) = stack.pop() else {
            unreachable!("the stack is not empty here");
        };
        match stack.last_mut() {
            Some(parent) => parent.built.push(LineageNode { session: done.record.clone(), descendants: done.built }),
            None => {
                return Ok(Trace { target: target.clone(), ancestors, descendants: done.built, lineage });
            }
        }
    }
}

type LiveSet = Box<dyn Fn(&str) -> bool + Send + Sync>;

/// The real source: the JSONL store, plus which sessions are live in this process.
///
/// kin publishes a session's header on disk before its agent goes live and writes events eagerly
/// (at every await point of a turn), so a live session's header is its persisted one and its log
/// is read from disk too, like any other (the valid prefix, without repair). The live side of the
/// corpus is therefore the live *set*; activity is the only thing it adds.
pub struct StoreSource {
    live: LiveSet,
    /// Shared with the thread of `watch`, which keeps it (and the index) current as kin writes.
    state: Arc<SourceState>,
    /// With the index: told of the logs kin writes (`watch`).
    watch: Option<Arc<LogWatch>>,
}

/// What a `StoreSource` knows of its store.
struct SourceState {
    store: SessionStore,
    cache: Mutex<Cache>,
    /// Held while the index file is written (a listing and the watch's thread both write it).
    writing: Mutex<()>,
    /// What this source did to the logs (`io`).
    io: IoCounters,
}

/// What a `StoreSource` has done to the logs of its store, counted: a listing's cost in file
/// operations, for tests and `kin bench`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SourceIo {
    /// Stats of a log (the scan's `fstatat`, and the check before a read outside a listing).
    pub stats: u64,
    /// Header lines read.
    pub header_reads: u64,
    /// Logs read whole.
    pub whole_reads: u64,
    /// Summaries made from the catalog index's facts of a log, without reading it (its
    /// descriptor lines are in the index).
    pub index_summaries: u64,
    /// Logs read for their title (`titles`).
    pub title_reads: u64,
    /// Bytes of logs read for their titles.
    pub title_bytes: u64,
    /// Project directories listed by scans (not those whose memoized listing held: `dir_memo`).
    pub dir_listings: u64,
}

#[derive(Default)]
struct IoCounters {
    stats: AtomicU64,
    header_reads: AtomicU64,
    whole_reads: AtomicU64,
    index_summaries: AtomicU64,
    title_reads: AtomicU64,
    title_bytes: AtomicU64,
    dir_listings: AtomicU64,
}

fn count(counter: &AtomicU64) {
    counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

#[derive(Default)]
struct Cache {
    /// Per project directory name, its logs by session directory name.
    logs: HashMap<OsString, HashMap<OsString, CachedLog>>,
    /// The corpus built from `logs`; reused while every scan finds the same logs at the same
    /// stat (length, mtime, ctime).
    corpus: Option<Arc<Corpus>>,
    /// Counts scans, to find the logs the current one did not see.
    generation: u64,
    /// The summaries open listings hold (`pin`): per id, how many listings hold it and the
    /// summary as of their scan (`None`: it could not be built then, so reads check the log).
    pinned: HashMap<String, (usize, Option<Arc<LogSummary>>)>,
    /// The catalog index, when this source keeps one (`with_index`).
    index: Option<IndexState>,
}

/// The source's side of the catalog index file (and of the directory memo, written with it).
struct IndexState {
    file: IndexFile,
    /// The directory memo as the last scan left it (`None` until the first scan reads the file).
    dirs: Option<Memo>,
    /// How settled a directory must be for a scan to memoize its listing (`dir_memo::SETTLE`).
    settle: Duration,
    /// The file is behind the cache: it is written when a listing closes.
    dirty: bool,
    /// A write failed: this process stops writing (and warned once).
    write_failed: bool,
}

enum IndexFile {
    /// Not read yet: the first scan reads it.
    Unread,
    /// Being read on a thread of its own while the first scan stats the logs (`start_index`);
    /// the scan then waits for it.
    Loading(std::thread::JoinHandle<Result<catalog_index::Entries, String>>),
    /// Read, waiting for a complete scan to use it.
    Loaded(catalog_index::Entries),
    /// Used by a scan (or unusable): from here on the cache holds what it knew.
    Used,
}

/// Derived state of one log file at one stat (length, mtime, ctime).
struct CachedLog {
    /// The stat it was found at (its key: anything the cache knows of it is of the log at this
    /// stat).
    stat: LogStat,
    /// Its header, or why it could not be read (the log is left out of the corpus until it
    /// changes).
    header: Result<Arc<SessionHeader>, String>,
    summary: Option<Arc<LogSummary>>,
    /// The last scan that saw the file.
    seen: u64,
    /// That scan (or the read that cached it) statted it as a regular file at `stat`.
    statted: bool,
    /// The catalog-index facts of the log at `stat`: from the index file, or from
    /// the read that built `summary`.
    facts: Option<Arc<Facts>>,
    /// Its title at `stat`, once read (`titles`) or given by the index file.
    title: Option<Titled>,
    /// Where the last read of its title stopped, kept while the log grows under the same
    /// header: the next read goes on from there (`scan::read_title`).
    title_mark: Option<Box<TitleMark>>,
}

impl CachedLog {
    /// Whether this is what the cache knows of the file at this stat (its key).
    fn is_at(&self, stat: LogStat) -> bool {
        self.stat == stat
    }

    /// Whether this is the log `stored` lists, as the listing found it.
    fn is_as_listed(&self, stored: &StoredSession) -> bool {
        self.is_at(stored.stat) && self.header.is_ok()
    }
}

/// One project's part of the cache and of the index, while a scan matches it (`match_project`).
struct ProjectCache {
    logs: HashMap<OsString, CachedLog>,
    indexed: Option<catalog_index::Logs>,
}

/// What `match_project` made of one project: its cached logs, the index entries it did not
/// take, its counts, and each log the corpus holds (its place in the project's scan, with its
/// header when it was made).
struct Matched {
    logs: HashMap<OsString, CachedLog>,
    indexed: Option<catalog_index::Logs>,
    seen: usize,
    from_index: usize,
    read: usize,
    changed: bool,
    headers: Vec<(Option<Arc<SessionHeader>>, usize)>,
}

/// The persisted sessions as of one scan.
struct Corpus {
    /// One record per id (as `merge_records` over every readable log, nothing live yet), or why
    /// the logs cannot be merged.
    merged: Result<Vec<SessionRecord>, QueryError>,
    /// Where the scan found each session (the last log in scan order that names it), and its
    /// record in `merged`.
    located: HashMap<IdKey, Place>,
    /// Per parent id, its children's records in `merged`, in sibling order (the trace's map,
    /// made once per corpus).
    children: HashMap<String, Vec<usize>>,
    /// What the scan found (a path is made only for a log that is read).
    projects: Vec<ProjectScan>,
    root: PathBuf,
}

impl Corpus {
    /// The (project, session) directory names of session `id`'s log, where the scan found it.
    fn names(&self, id: &str) -> Option<(&OsStr, &OsStr)> {
        let place = self.located.get(id)?;
        let project = &self.projects[place.project];
        Some((&project.name, project.session(&project.logs[place.log])))
    }

    /// The log file of session `id`, where the scan found it.
    fn path(&self, id: &str) -> Option<PathBuf> {
        let (project, session) = self.names(id)?;
        Some(log_file(&self.root, project, session))
    }
}

/// The log file `<root>/<project>/<session>/<LOG_FILE>` (`log_key` reads the names back).
fn log_file(root: &Path, project: &OsStr, session: &OsStr) -> PathBuf {
    // One allocation (`join` after `join` grows the path three times): a listing makes one
    // path per candidate, `session/list` one per log.
    let parts = [root.as_os_str(), project, session, OsStr::new(LOG_FILE)];
    let mut path = PathBuf::with_capacity(parts.iter().map(|part| part.len() + 1).sum());
    for part in parts {
        path.push(part);
    }
    path
}

/// Where a corpus holds one session: the log the scan found (its project and log in
/// `Corpus::projects`) and its record in `Corpus::merged`.
struct Place {
    project: usize,
    log: usize,
    record: usize,
}

/// A corpus's sessions as `trace` walks them.
struct CorpusLineage<'c> {
    records: &'c [SessionRecord],
    corpus: &'c Corpus,
}

impl<'c> Lineages<'c> for CorpusLineage<'c> {
    fn session(&self, id: &str) -> Option<&'c SessionRecord> {
        self.records.get(self.corpus.located.get(id)?.record)
    }

    fn children(&self, id: &str) -> Vec<&'c SessionRecord> {
        kids(self.records, &self.corpus.children, id)
    }
}

/// Per parent id, the positions of its children in `records`, in sibling order.
fn children_of(records: &[SessionRecord]) -> HashMap<String, Vec<usize>> {
    let mut children: HashMap<String, Vec<usize>> = HashMap::new();
    for (i, record) in records.iter().enumerate() {
        if let Some(parent) = &record.header.parent_session {
            match children.get_mut(parent.as_str()) {
                Some(kids) => kids.push(i),
                None => {
                    children.insert(parent.clone(), vec![i]);
                }
            }
        }
    }
    for kids in children.values_mut() {
        kids.sort_by(|&a, &b| sibling_order(&records[a].header, &records[b].header));
    }
    children
}

/// A session id as a map key, held by its header (a corpus of thousands is indexed without
/// copying an id).
struct IdKey(Arc<SessionHeader>);

impl PartialEq for IdKey {
    fn eq(&self, other: &Self) -> bool {
        self.0.id == other.0.id
    }
}

impl Eq for IdKey {}

impl std::hash::Hash for IdKey {
    /// As the id's `str` hashes (`Borrow<str>` lookups).
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.id.as_str().hash(state);
    }
}

impl std::borrow::Borrow<str> for IdKey {
    fn borrow(&self) -> &str {
        &self.0.id
    }
}

impl StoreSource {
    /// `live(id)` says whether a session is live in this process.
    pub fn new(store: SessionStore, live: impl Fn(&str) -> bool + Send + Sync + 'static) -> Self {
        let state =
            SourceState { store, cache: Mutex::default(), writing: Mutex::default(), io: IoCounters::default() };
        StoreSource { live: Box::new(live), state: Arc::new(state), watch: None }
    }

    /// A source where nothing is live (another process's store, tools, benchmarks).
    pub fn persisted_only(store: SessionStore) -> Self {
        Self::new(store, |_| false)
    }

    /// This source with the derived catalog index of its sessions directory
    /// (`session::catalog_index`): the first scan takes the headers of unchanged logs from it,
    /// summaries of unchanged logs are made from it without a read, and a listing that left the
    /// file behind writes it again when it closes. Results are those of a source without it.
    pub fn with_index(mut self) -> Self {
        self.state.cache().index = Some(IndexState {
            file: IndexFile::Unread,
            dirs: None,
            settle: dir_memo::SETTLE,
            dirty: false,
            write_failed: false,
        });
        let state = Arc::downgrade(&self.state);
        self.watch = Some(LogWatch::new(move |paths| {
            if let Some(state) = state.upgrade() {
                state.refresh(paths);
            }
        }));
        self
    }

    /// With the index, memoizes the listings of project directories that last changed at least
    /// `settle` before a scan (`dir_memo::SETTLE` unless set: a test's directories are seconds old).
    pub fn with_dir_settle(self, settle: Duration) -> Self {
        if let Some(state) = self.state.cache().index.as_mut() {
            state.settle = settle;
        }
        self
    }

    /// With the index, the watch a `SessionStore` that writes this source's logs reports to
    /// (`SessionStore::watched`): each log it publishes, flushes, closes or deletes is brought
    /// into the cache and the index, in batches on the watch's thread.
    pub fn watch(&self) -> Option<Arc<LogWatch>> {
        self.watch.clone()
    }

    /// Waits until every log reported to `watch` so far is in the cache and the index file.
    pub fn settle(&self) {
        if let Some(watch) = &self.watch {
            watch.settle();
        }
    }

    pub fn store(&self) -> &SessionStore {
        &self.state.store
    }

    /// Holds this source's cache until the guard drops: a scan, a listing or a refresh waits
    /// for it meanwhile (a test's fence).
    #[cfg(test)]
    pub(crate) fn hold_cache(&self) -> CacheHeld<'_> {
        CacheHeld(self.state.cache())
    }
}

/// A `StoreSource`'s cache, held (`hold_cache`).
#[cfg(test)]
pub(crate) struct CacheHeld<'a>(#[expect(dead_code, reason = "held for its drop")] MutexGuard<'a, Cache>);

impl Drop for StoreSource {
    /// What kin wrote is in the index before the source goes (a runtime shutting down).
    fn drop(&mut self) {
        self.settle();
    }
}

impl SourceState {
    /// Reads the index file, the first time it is needed, or waits for the read `start_index`
    /// began (`Unread` or `Loading` becomes `Loaded`, or `Used` and dirty when the file cannot be
    /// used: it is then written again).
    fn read_index(&self, cache: &mut Cache) {
        let Some(state) = cache.index.as_mut() else { return };
        let loaded = match std::mem::replace(&mut state.file, IndexFile::Used) {
            IndexFile::Unread => catalog_index::load(self.store.root()),
            IndexFile::Loading(reading) => {
                reading.join().unwrap_or_else(|_| Err("the thread reading the catalog index panicked".into()))
            }
            file @ (IndexFile::Loaded(_) | IndexFile::Used) => {
                state.file = file;
                return;
            }
        };
        state.file = match loaded {
            Ok(entries) => IndexFile::Loaded(entries),
            Err(e) => {
                let missing = catalog_index::path(self.store.root()).is_none_or(|path| !path.exists());
                if !missing {
                    tracing::warn!("ignoring the catalog index (it is rebuilt): {e}");
                }
                state.dirty = true;
                IndexFile::Used
            }
        };
    }

    /// With the index, the directory memo for the scan about to run, and the settle margin: the
    /// last scan's, or the file's before the first (none when it cannot be used).
    fn dir_memo(&self) -> Option<(Memo, Duration)> {
        let (dirs, settle) = {
            let cache = self.cache();
            let state = cache.index.as_ref()?;
            (state.dirs.clone(), state.settle)
        };
        let dirs = dirs.unwrap_or_else(|| {
            dir_memo::load(self.store.root()).unwrap_or_else(|e| {
                tracing::debug!("no directory memo (project directories are listed): {e}");
                Memo::default()
            })
        });
        Some((dirs, settle))
    }

    /// Starts reading the index file on a thread of its own if it is still unread (at the start
    /// of a scan, which uses it once its stats are done); a thread that cannot be made leaves it
    /// to `read_index`.
    fn start_index(&self) {
        let mut cache = self.cache();
        let Some(state) = cache.index.as_mut().filter(|state| matches!(state.file, IndexFile::Unread)) else {
            return;
        };
        let root = self.store.root().to_path_buf();
        if let Ok(reading) =
            std::thread::Builder::new().name("kin-catalog-index".into()).spawn(move || catalog_index::load(&root))
        {
            state.file = IndexFile::Loading(reading);
        }
    }

    /// The index entries for the scan about to run: the file's, the first time (`None` once used,
    /// or when it cannot be used).
    fn take_index(&self, cache: &mut Cache) -> Option<catalog_index::Entries> {
        self.read_index(cache);
        let state = cache.index.as_mut()?;
        match std::mem::replace(&mut state.file, IndexFile::Used) {
            IndexFile::Loaded(entries) => Some(entries),
            IndexFile::Used | IndexFile::Unread | IndexFile::Loading(_) => None,
        }
    }

    /// Writes the catalog index if the cache is ahead of it (when a listing closes, and after a
    /// batch of logs kin wrote). Before the first scan, the file's entries for logs the cache does
    /// not know are written back as they were (each is checked again where it is used).
    fn write_index(&self) {
        let _one_writer = self.writing.lock().unwrap_or_else(PoisonError::into_inner);
        let (entries, dirs): (Vec<(OsString, OsString, catalog_index::Entry)>, Option<Memo>) = {
            let mut guard = self.cache();
            let cache = &mut *guard;
            let Some(state) = cache.index.as_mut() else { return };
            if !state.dirty || state.write_failed || matches!(state.file, IndexFile::Unread | IndexFile::Loading(_)) {
                return;
            }
            state.dirty = false;
            let dirs = state.dirs.clone();
            let known = &cache.logs;
            let unscanned: Vec<(OsString, OsString, catalog_index::Entry)> = match &state.file {
                IndexFile::Loaded(entries) => entries
                    .iter()
                    .flat_map(|(project, logs)| logs.iter().map(move |(session, entry)| (project, session, entry)))
                    .filter(|(project, session, _)| known.get(*project).is_none_or(|logs| !logs.contains_key(*session)))
                    .map(|(project, session, entry)| (project.clone(), session.clone(), entry.clone()))
                    .collect(),
                IndexFile::Used | IndexFile::Unread | IndexFile::Loading(_) => Vec::new(),
            };
            // Each project's logs in the order the last scan found them: the next start's scan of
            // an unchanged directory finds them in that order again, and takes each in step.
            let scanned: HashMap<&OsStr, &ProjectScan> = (cache.corpus.iter())
                .flat_map(|corpus| &corpus.projects)
                .map(|project| (project.name.as_os_str(), project))
                .collect();
            let entries = cache
                .logs
                .iter()
                .flat_map(|(project, logs)| {
                    in_scan_order(logs, scanned.get(project.as_os_str()).copied()).into_iter().filter_map(
                        move |(session, log)| match &log.header {
                            Ok(header) if log.statted => Some((
                                project.clone(),
                                session.clone(),
                                catalog_index::Entry {
                                    stat: log.stat,
                                    header: header.clone(),
                                    facts: log.facts.clone(),
                                    title: log.title.clone(),
                                    title_mark: log.title_mark.clone(),
                                },
                            )),
                            _ => None,
                        },
                    )
                })
                .chain(unscanned)
                .collect();
            (entries, dirs)
        };
        let written = catalog_index::write(
            self.store.root(),
            entries.iter().map(|(project, session, entry)| (project.as_os_str(), session.as_os_str(), entry.clone())),
        )
        .and_then(|()| dirs.map_or(Ok(()), |dirs| dir_memo::write(self.store.root(), &dirs)));
        if let Err(e) = written {
            tracing::warn!("the catalog index cannot be written (listings read logs instead): {e}");
            if let Some(state) = self.cache().index.as_mut() {
                state.write_failed = true;
            }
        }
    }

    fn cache(&self) -> MutexGuard<'_, Cache> {
        self.cache.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Brings the logs at `paths`, which kin just published, flushed, closed or removed (the
    /// watch's batch), into the cache as the next scan finds them, and writes the index if that
    /// put the file behind. A child log (one naming a parent: a listing candidate) is summarised
    /// here, read whole once, so the next process's first listing does not open it; another
    /// log gets its stat (its header is immutable), which alone does
    /// not rewrite the file. A log gone loses its entry. Paths outside the store's layout are
    /// ignored.
    fn refresh(&self, paths: &[PathBuf]) {
        {
            // Until a scan uses the file, it is read again for each batch: what another process
            // wrote since is kept, not overwritten with an older copy.
            let mut cache = self.cache();
            // (A read a scan started and has not waited for yet is left to finish on its own.)
            if let Some(state) =
                cache.index.as_mut().filter(|s| matches!(s.file, IndexFile::Loaded(_) | IndexFile::Loading(_)))
            {
                state.file = IndexFile::Unread;
            }
            self.read_index(&mut cache);
        }
        for path in paths {
            let root = path.parent().and_then(Path::parent).and_then(Path::parent);
            if path.file_name() == Some(OsStr::new(LOG_FILE)) && root == Some(self.store.root()) {
                self.refresh_log(path);
            }
        }
        self.write_index();
    }

    fn refresh_log(&self, path: &Path) {
        let (project, session) = log_key(path);
        let found = match std::fs::symlink_metadata(path) {
            Ok(meta) if meta.is_file() => Some(LogStat::of(&meta)),
            _ => None,
        };
        let (known, earlier) = {
            let mut cache = self.cache();
            let earlier = match cache.index.as_mut().map(|state| &mut state.file) {
                Some(IndexFile::Loaded(entries)) => {
                    entries.get_mut(project).and_then(|logs| logs.take(session)).map(|(_, entry)| entry)
                }
                _ => None,
            };
            let in_file = earlier.is_some();
            let Some(stat) = found else {
                let cached = cache.logs.get_mut(project).and_then(|logs| logs.remove(session)).is_some();
                if cached {
                    cache.corpus = None;
                }
                if let Some(state) = cache.index.as_mut().filter(|_| cached || in_file) {
                    state.dirty = true;
                }
                return;
            };
            let at = cache.logs.get(project).and_then(|logs| logs.get(session));
            if at.is_some_and(|c| c.is_at(stat) && (c.facts.is_some() || c.header.is_err())) {
                return;
            }
            (at.and_then(|c| c.header.clone().ok()).map(|header| (header, stat)), earlier)
        };
        let (header, stat) = match known {
            Some(known) => known,
            None => {
                let Some(stat) = found else { return };
                match self.read_header(path) {
                    Ok((header, _)) => (Arc::new(header), stat),
                    // Left to the next scan, which reports it.
                    Err(_) => return,
                }
            }
        };
        if !super::layout::is_segment_of(session, &header.id) {
            return; // Not where its id puts it: a scan leaves it out of the index too.
        }
        if header.parent_session.is_some() {
            // Builds the summary and the index facts, and makes the file dirty.
            let _ = self.summary_at(path, &header.id, stat);
            return;
        }
        // The index's entry of the log (taken from the file, which the cache now stands for)
        // keeps its title read for the same header: the title at the same stat, and
        // the mark to go on from.
        let earlier = earlier.filter(|entry| entry.header == header);
        let mut cache = self.cache();
        let logs = cache.logs.entry(project.to_owned()).or_default();
        let seen = logs.get(session).map_or(0, |c| c.seen);
        // A title read at this very stat still holds.
        let title = match logs.get(session).filter(|c| c.is_at(stat)) {
            Some(cached) => cached.title.clone(),
            None => earlier.as_ref().filter(|e| e.stat == stat).and_then(|e| e.title.clone()),
        };
        let log = CachedLog {
            stat,
            header: Ok(header),
            summary: None,
            seen,
            statted: true,
            facts: None,
            title,
            title_mark: earlier.and_then(|entry| entry.title_mark),
        };
        if replace(logs, session.to_owned(), log) {
            cache.corpus = None;
        }
    }

    /// Every persisted session (one corpus scan). Headers are read only from logs that are new
    /// or changed since the last scan; the merged corpus is rebuilt only when some log was.
    fn corpus(&self, cancel: &CancellationToken) -> Result<Arc<Corpus>, QueryError> {
        self.start_index();
        let dirs = self.dir_memo();
        let memoizing = dirs.as_ref().map(|(known, settle)| Memoizing { known, settle: *settle });
        let scanned = scan_store(self.store.root(), &self.io.stats, memoizing, cancel)?;
        self.io.dir_listings.fetch_add(scanned.listed as u64, std::sync::atomic::Ordering::Relaxed);
        let projects = scanned.projects;
        let found: usize = projects.iter().map(|p| p.logs.len()).sum();
        let mut cache = self.cache();
        if let Some(state) = cache.index.as_mut() {
            // A memo other than the one the scan was given (a directory changed, or settled)
            // puts the file behind.
            if dirs.is_none_or(|(known, _)| known != scanned.memo) {
                state.dirty = true;
            }
            state.dirs = Some(scanned.memo);
        }
        cache.generation += 1;
        let generation = cache.generation;
        let mut changed = cache.corpus.is_none();
        // The scanned logs the cache now holds for this generation.
        let mut seen = 0usize;
        let mut index = self.take_index(&mut cache);
        let (mut from_index, mut read) = (0usize, 0usize);
        // Every log the corpus holds, where the scan found it, with its header when the loop made
        // it (a merge after the loop would look each log up again; an unchanged one is looked up
        // only if the corpus is rebuilt).
        if cancel.is_cancelled() {
            if let (Some(state), Some(entries)) = (cache.index.as_mut(), index.take()) {
                state.file = IndexFile::Loaded(entries);
            }
            return Err(QueryError::Aborted);
        }
        // Each project's cached logs and index entries, taken out for the thread that matches
        // the project's scan against them (projects are independent; one task each).
        let slots: Vec<Mutex<Option<ProjectCache>>> = projects
            .iter()
            .map(|project| {
                let logs =
                    cache.logs.remove(&project.name).unwrap_or_else(|| HashMap::with_capacity(project.logs.len()));
                let indexed = index.as_mut().and_then(|entries| entries.remove(&project.name));
                Mutex::new(Some(ProjectCache { logs, indexed }))
            })
            .collect();
        let matched = in_parallel(workers_for(projects.len()), projects.len(), |p| {
            let taken = slots[p].lock().unwrap_or_else(PoisonError::into_inner).take();
            taken.map(|project_cache| self.match_project(&projects[p], project_cache, generation))
        })
        .map_err(|_| QueryError::PersistenceFailed("a session scan thread panicked".into()))?;
        // Every log the corpus holds, where the scan found it, with its header when matching made
        // it (a merge after the loop would look each log up again; an unchanged one is looked up
        // only if the corpus is rebuilt).
        let mut headers = Vec::with_capacity(found);
        let mut left_in_index = false;
        for (p, matched) in matched.into_iter().enumerate() {
            let Some(matched) = matched else { continue };
            seen += matched.seen;
            from_index += matched.from_index;
            read += matched.read;
            changed |= matched.changed;
            left_in_index |= matched.indexed.is_some_and(|left| !left.is_empty());
            headers.extend(matched.headers.into_iter().map(|(header, l)| (header, (p, l))));
            cache.logs.insert(projects[p].name.clone(), matched.logs);
        }
        if let Some(state) = cache.index.as_mut() {
            // Logs read instead of taken from the index, and entries of logs no scan found, put
            // the file behind the cache.
            if read > 0 || left_in_index || index.is_some_and(|left| left.values().any(|logs| !logs.is_empty())) {
                state.dirty = true;
            }
            if from_index > 0 {
                tracing::debug!(from_index, read, "the catalog index gave the headers of unchanged logs");
            }
        }
        let cached: usize = cache.logs.values().map(HashMap::len).sum();
        if cached != seen {
            // Some log is gone (or was cached by an exact read and is not where a scan looks).
            for logs in cache.logs.values_mut() {
                logs.retain(|_, log| log.seen == generation);
            }
            cache.logs.retain(|_, logs| !logs.is_empty());
            changed = true;
            if let Some(state) = cache.index.as_mut() {
                state.dirty = true;
            }
        }
        if changed {
            // One pass makes both: where the scan found each session (the last log in scan order
            // that names it), and `merge_records` over the persisted headers, one record per id in
            // first-found order, without a second map of the ids (two logs of one session, in two
            // project directories, must agree).
            let mut located: HashMap<IdKey, Place> = HashMap::with_capacity(headers.len());
            let mut merged: Result<Vec<SessionRecord>, QueryError> = Ok(Vec::with_capacity(headers.len()));
            for (made, (p, l)) in headers {
                let header = made.or_else(|| {
                    let project = &projects[p];
                    cache.logs.get(&project.name)?.get(project.session(&project.logs[l]))?.header.clone().ok()
                });
                let Some(header) = header else { continue };
                let record = merged.as_ref().map_or(0, Vec::len);
                match located.insert(IdKey(header.clone()), Place { project: p, log: l, record }) {
                    None => {
                        if let Ok(records) = &mut merged {
                            records.push(SessionRecord { header, live: false, persisted: true });
                        }
                    }
                    Some(first_place) => {
                        // The map kept the first log's key (its header) and now holds this log's
                        // place; the session's record stays the first one.
                        let first = located.get_key_value(header.id.as_str()).map(|(first, _)| first.0.clone());
                        if let Some(place) = located.get_mut(header.id.as_str()) {
                            place.record = first_place.record;
                        }
                        if merged.is_ok()
                            && let Some(Err(conflict)) = first.map(|first| assert_headers_compatible(&first, &header))
                        {
                            merged = Err(conflict);
                        }
                    }
                }
            }
            let children = merged.as_ref().map(|records| children_of(records)).unwrap_or_default();
            let root = self.store.root().to_path_buf();
            cache.corpus = Some(Arc::new(Corpus { merged, located, children, projects, root }));
        }
        Ok(cache.corpus.clone().unwrap_or_else(|| unreachable!("the corpus was just built")))
    }

    /// One project's scan matched against what the cache knew of it and the index's entries for
    /// it: each log's cached state is kept while it is at the same stat, else its
    /// header comes from the index entry at exactly that state, else from the log.
    fn match_project(&self, project: &ProjectScan, known_here: ProjectCache, generation: u64) -> Matched {
        let ProjectCache { mut logs, mut indexed } = known_here;
        let logs = &mut logs;
        let (mut seen, mut from_index, mut read, mut changed) = (0usize, 0usize, 0usize, false);
        let mut headers = Vec::with_capacity(project.logs.len());
        for (l, f) in project.logs.iter().enumerate() {
            let session = project.session(f);
            let path = || log_file(self.store.root(), &project.name, session);
            let known = |logs: &HashMap<OsString, CachedLog>| match logs.get(session) {
                Some(CachedLog { header: Ok(header), .. }) => Some(header.clone()),
                _ => None,
            };
            let stat = match &f.found {
                Ok(found) => *found,
                Err(e) => {
                    // A session this cache has read before keeps its place under its last
                    // header: its reads fail, so a listing shows it `unavailable` instead of
                    // losing it. One never read names no parent and is left out.
                    match logs.get_mut(session).filter(|log| log.header.is_ok()) {
                        Some(log) => {
                            log.seen = generation;
                            log.summary = None;
                            log.statted = false;
                            seen += 1;
                            headers.push((None, l));
                            tracing::warn!(path = %path().display(), "a session log cannot be read: {e}");
                        }
                        None => tracing::warn!(path = %path().display(), "skipping an unreadable session log: {e}"),
                    }
                    continue;
                }
            };
            seen += 1;
            if let Some(log) = logs.get_mut(session).filter(|c| c.is_at(stat)) {
                log.seen = generation;
                log.statted = true;
                headers.push((None, l));
                continue;
            }
            // The entry's key becomes the cache's (no copy of the name per log).
            let (key, indexed) = match indexed.as_mut().and_then(|entries| entries.take(session)) {
                Some((key, entry)) => (key, Some(entry)),
                None => (session.to_owned(), None),
            };
            // (`catalog_index::load` gives only entries in the directory their header's id names.)
            // An entry of the log at another length keeps only the mark of its title read, for
            // the log under the same header (a title read checks the mark's line before using it).
            let (indexed, earlier) = match indexed {
                Some(entry) if entry.stat == stat => (Some(entry), None),
                earlier => (None, earlier),
            };
            let facts = indexed.as_ref().and_then(|entry| entry.facts.clone());
            let title = indexed.as_ref().and_then(|entry| entry.title.clone());
            let mut title_mark = indexed.as_ref().and_then(|entry| entry.title_mark.clone());
            if indexed.is_some() {
                from_index += 1;
            } else {
                read += 1;
            }
            let header = match indexed.map(|entry| entry.header) {
                Some(header) => Ok(header),
                None => match self.read_header(&path()) {
                    Ok((header, _)) => Ok(Arc::new(header)),
                    Err(e) => match known(logs) {
                        // Its header line broke after it was read: it stays a candidate whose
                        // reads fail, as above.
                        Some(header) => {
                            tracing::warn!(path = %path().display(), "a session log's header cannot be read: {e}");
                            Ok(header)
                        }
                        None => {
                            tracing::warn!(path = %path().display(), "skipping an unreadable session log: {e}");
                            Err(e)
                        }
                    },
                },
            };
            if let Ok(header) = &header {
                headers.push((Some(header.clone()), l));
                if let Some(earlier) = earlier.filter(|earlier| earlier.header == *header) {
                    title_mark = earlier.title_mark;
                }
            }
            let log =
                CachedLog { stat, header, summary: None, seen: generation, statted: true, facts, title, title_mark };
            changed |= replace(logs, key, log);
        }
        Matched { logs: std::mem::take(logs), indexed, seen, from_index, read, changed, headers }
    }

    /// The log file of `id`: where the last scan saw it, else wherever the store finds it.
    fn path_of(&self, id: &str) -> Result<PathBuf, QueryError> {
        let known = self.cache().corpus.as_ref().and_then(|corpus| corpus.path(id));
        if let Some(path) = known {
            return Ok(path);
        }
        match self.store.locate(id) {
            Ok(Some(path)) => Ok(path),
            Ok(None) | Err(StoreError::InvalidId(_)) => Err(QueryError::SessionNotFound(id.to_string())),
            Err(e) => Err(QueryError::PersistenceFailed(e.to_string())),
        }
    }
}

impl SessionSource for StoreSource {
    fn records(&self, cancel: &CancellationToken) -> Result<Vec<SessionRecord>, QueryError> {
        let mut records = self.state.corpus(cancel)?.merged.clone()?;
        for record in &mut records {
            record.live = (self.live)(record.header.id.as_str());
        }
        // Live first, as `merge_records(live, persisted)` orders them.
        records.sort_by_key(|record| !record.live);
        Ok(records)
    }

    /// From the corpus's own maps (no copy of its records, no map of its ids per trace); only the
    /// sessions of the trace are asked whether they are live.
    fn trace(&self, id: &str, cancel: &CancellationToken) -> Result<Trace, QueryError> {
        let corpus = self.state.corpus(cancel)?;
        let records = corpus.merged.as_deref().map_err(Clone::clone)?;
        if cancel.is_cancelled() {
            return Err(QueryError::Aborted);
        }
        let mut trace = trace(&CorpusLineage { records, corpus: &corpus }, id, cancel)?;
        let live = |record: &mut SessionRecord| record.live = (self.live)(record.header.id.as_str());
        live(&mut trace.target);
        trace.ancestors.iter_mut().for_each(live);
        let mut nodes: Vec<&mut LineageNode> = trace.descendants.iter_mut().collect();
        while let Some(node) = nodes.pop() {
            live(&mut node.session);
            nodes.extend(node.descendants.iter_mut());
        }
        Ok(trace)
    }

    fn log(&self, id: &str) -> Result<SessionLog, QueryError> {
        let path = self.state.path_of(id)?;
        self.state.stat(&path, id)?;
        count(&self.state.io.whole_reads);
        read_log(&path, id)
    }

    fn summary(&self, id: &str) -> Result<Arc<LogSummary>, QueryError> {
        if let Some((_, Some(summary))) = self.state.cache().pinned.get(id) {
            return Ok(summary.clone());
        }
        let path = self.state.path_of(id)?;
        let stat = self.state.stat(&path, id)?;
        self.state.summary_at(&path, id, stat)
    }

    /// Pins each id's summary as of the last scan, building the missing ones on up to
    /// `SCAN_THREADS` threads (without a stat: the scan just made one). A log the last scan did not
    /// stat as a regular file is pinned as unknown, so its reads check it and report its failure.
    fn pin(&self, ids: &[&str], cancel: &CancellationToken) {
        // What each candidate needs, under one lock; its summary built without the lock (the
        // threads would contend for it per log); all of them kept under one lock again.
        let planned: Vec<Option<Planned>> = {
            let cache = self.state.cache();
            ids.iter().map(|id| self.state.scanned(&cache, id)).collect()
        };
        // A panicked worker pins nothing: the ids are read as of their calls.
        let built = in_parallel(workers_for(ids.len()), ids.len(), |i| {
            let planned = planned[i].as_ref().filter(|_| !cancel.is_cancelled())?;
            self.state.build_summary(&planned.path, ids[i], planned.toward.clone()).ok()
        })
        .unwrap_or_else(|_| std::iter::repeat_with(|| None).take(ids.len()).collect());
        let mut cache = self.state.cache();
        for ((id, built), planned) in ids.iter().zip(built).zip(&planned) {
            let summary = built.zip(planned.as_ref()).map(|(built, p)| keep(&mut cache, &p.path, p.stat, built));
            let pin = cache.pinned.entry((*id).to_string()).or_insert((0, None));
            pin.0 += 1;
            if summary.is_some() {
                pin.1 = summary;
            }
        }
    }

    /// Also writes the catalog index, if this listing left it behind.
    fn release(&self, ids: &[&str]) {
        {
            let mut cache = self.state.cache();
            for id in ids {
                if let Some(pin) = cache.pinned.get_mut(*id) {
                    pin.0 -= 1;
                    if pin.0 == 0 {
                        cache.pinned.remove(*id);
                    }
                }
            }
        }
        self.write_index_soon();
    }
}

impl StoreSource {
    /// Has the catalog index written, if a listing left it behind, on the watch's thread at the
    /// end of its batch: after the listing has answered, off its path (a write of the whole file,
    /// with its `fsync`s, is tens of milliseconds for a large store, and would share the two
    /// cores with the answer). `settle` waits for it, and so does dropping the source.
    fn write_index_soon(&self) {
        let behind = self.state.cache().index.as_ref().is_some_and(|state| state.dirty);
        if let Some(watch) = self.watch.as_ref().filter(|_| behind) {
            watch.nudge();
        }
    }

    /// Every log of the store with a readable header, as of one corpus scan: what
    /// `SessionStore::list` reads from every log, from the cache instead (the headers of logs
    /// unchanged since the last scan, and after a start the catalog index's). Unordered.
    pub(crate) fn stored(&self, cancel: &CancellationToken) -> Result<Vec<StoredSession>, QueryError> {
        let listed = self.scanned_logs(cancel)?;
        // A scan that read logs the index did not know leaves the index behind.
        self.write_index_soon();
        Ok(listed)
    }

    /// The top-level sessions (only those in `cwd` if given), newest first (`store::top_level`),
    /// each with its title (`titles`): `session/list`. The index is written once, after both
    /// (`write_index_soon`).
    pub(crate) fn top_level_titled(
        &self,
        cwd: Option<&Path>,
        cancel: &CancellationToken,
    ) -> Result<Vec<(StoredSession, Option<String>)>, QueryError> {
        let listed = super::store::top_level(self.scanned_logs(cancel)?, cwd);
        let titles = self.titles(&listed);
        self.write_index_soon();
        Ok(listed.into_iter().zip(titles).collect())
    }

    /// `stored`'s listing, without writing the index.
    fn scanned_logs(&self, cancel: &CancellationToken) -> Result<Vec<StoredSession>, QueryError> {
        self.state.corpus(cancel)?;
        let listed = {
            let cache = self.state.cache();
            let root = self.state.store.root();
            let current = |log: &&CachedLog| log.seen == cache.generation && log.statted;
            cache
                .logs
                .iter()
                .flat_map(|(project, logs)| {
                    logs.iter().filter(|(_, log)| current(log)).filter_map(move |(session, log)| {
                        Some(StoredSession {
                            header: SessionHeader::clone(log.header.as_ref().ok()?),
                            path: log_file(root, project, session),
                            stat: log.stat,
                        })
                    })
                })
                .collect()
        };
        Ok(listed)
    }

    /// The title of each listed log (as `stored` lists them), in order: the one the cache holds
    /// at the stat the listing found (read before, or given by the catalog index),
    /// else read from the log's first `len` bytes on a few threads and kept (the index is then
    /// behind: the next write of it holds them).
    pub(crate) fn titles(&self, listed: &[StoredSession]) -> Vec<Option<String>> {
        let state = &self.state;
        // Each listed log's title if the cache holds it; else the log, with the mark to go on from.
        type Unknown<'l> = (&'l StoredSession, Option<Box<TitleMark>>);
        let (known, unknown): (Vec<Option<Titled>>, Vec<Unknown>) = {
            let cache = state.cache();
            let mut unknown = Vec::new();
            let known = listed
                .iter()
                .map(|stored| {
                    let log = cached_at(&cache, stored);
                    let title = log.and_then(|log| log.title.clone());
                    if title.is_none() {
                        // Read on from the last read of this log, if it only grew since.
                        unknown.push((stored, log.and_then(|log| log.title_mark.clone())));
                    }
                    title
                })
                .collect();
            (known, unknown)
        };
        let read = each_in_parallel(&unknown, |(stored, mark)| {
            count(&state.io.title_reads);
            let read = read_title(&stored.path, stored.stat.len, mark.as_deref());
            state.io.title_bytes.fetch_add(read.bytes, std::sync::atomic::Ordering::Relaxed);
            read.mark
        });
        let titles: Vec<Titled> = read.iter().map(|mark| Titled(mark.as_ref().and_then(|m| m.title.clone()))).collect();
        if !unknown.is_empty() {
            let mut guard = state.cache();
            let cache = &mut *guard;
            let mut kept = false;
            for (((stored, _), mark), title) in unknown.into_iter().zip(read).zip(&titles) {
                let (project, session) = log_key(&stored.path);
                let at = cache.logs.get_mut(project).and_then(|logs| logs.get_mut(session));
                if let Some(log) = at.filter(|log| log.is_as_listed(stored)) {
                    log.title = Some(title.clone());
                    log.title_mark = mark.map(Box::new);
                    kept = true;
                }
            }
            if let Some(index) = cache.index.as_mut().filter(|_| kept) {
                index.dirty = true;
            }
        }
        let mut read = titles.into_iter();
        known.into_iter().map(|known| known.or_else(|| read.next()).and_then(|Titled(title)| title)).collect()
    }

    /// What this source has done to the logs so far.
    pub fn io(&self) -> SourceIo {
        let get = |c: &AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
        let io = &self.state.io;
        SourceIo {
            stats: get(&io.stats),
            header_reads: get(&io.header_reads),
            whole_reads: get(&io.whole_reads),
            index_summaries: get(&io.index_summaries),
            title_reads: get(&io.title_reads),
            title_bytes: get(&io.title_bytes),
            dir_listings: get(&io.dir_listings),
        }
    }
}

impl SourceState {
    fn stat(&self, path: &Path, id: &str) -> Result<LogStat, QueryError> {
        count(&self.io.stats);
        stat(path, id)
    }

    fn read_header(&self, path: &Path) -> Result<(SessionHeader, super::scan::LogStat), String> {
        count(&self.io.header_reads);
        read_filed_header(path)
    }

    /// What a listing's pin needs of `id` as of the last scan, which statted its log (`None`
    /// when that scan did not find it a regular file: the listing's reads then report it).
    fn scanned(&self, cache: &Cache, id: &str) -> Option<Planned> {
        let corpus = cache.corpus.as_ref()?;
        let (project, session) = corpus.names(id)?;
        let log = cache.logs.get(project)?.get(session)?;
        if log.seen != cache.generation || !log.statted {
            return None;
        }
        let toward = toward(log, cache.index.is_some());
        let path = log_file(&corpus.root, project, session);
        Some(Planned { stat: log.stat, toward, path })
    }

    /// The summary of the log at `path` as statted at `stat`: the cached one, else built from a
    /// read of the log.
    fn summary_at(&self, path: &Path, id: &str, stat: LogStat) -> Result<Arc<LogSummary>, QueryError> {
        let (project, session) = log_key(path);
        let toward = {
            let cache = self.cache();
            let at = cache.logs.get(project).and_then(|logs| logs.get(session)).filter(|c| c.is_at(stat));
            let indexing = cache.index.is_some();
            at.map_or(Toward::Nothing { indexing }, |c| toward(c, indexing))
        };
        let built = self.build_summary(path, id, toward)?;
        Ok(keep(&mut self.cache(), path, stat, built))
    }

    /// A log's summary made from what the cache held toward it (`toward`), without the cache's
    /// lock: the index's facts of an unchanged log make it without a read (its descriptor lines
    /// are in them); anything else reads the log whole.
    fn build_summary(&self, path: &Path, id: &str, toward: Toward) -> Result<Built, QueryError> {
        let indexing = match toward {
            Toward::Built(summary) => return Ok(Built::Cached(summary)),
            Toward::Indexed(header, facts) => {
                if header.id == id
                    && let Some(descriptors) = facts.descriptor_events()
                {
                    count(&self.io.index_summaries);
                    return Ok(Built::FromIndex(Arc::new(LogSummary {
                        header,
                        event_count: facts.event_count,
                        indexed: descriptors,
                        surface: facts.surface.clone(),
                        inbox: facts.inbox,
                    })));
                }
                true
            }
            Toward::Nothing { indexing } => indexing,
        };
        count(&self.io.whole_reads);
        let (log, lines) = if indexing { read_log_keeping(path, id)? } else { (read_log(path, id)?, Vec::new()) };
        let summary = Arc::new(LogSummary::of(&log));
        // A descriptor line too long for the index leaves the log without facts.
        let descriptors = indexing.then(|| lines.into_iter().map(KeptLine::of).collect::<Option<Vec<_>>>()).flatten();
        let facts = descriptors.map(|descriptors| {
            Arc::new(Facts {
                event_count: summary.event_count,
                surface: summary.surface.clone(),
                inbox: summary.inbox,
                descriptors,
            })
        });
        Ok(Built::Read { summary, facts })
    }
}

/// `logs` in the order of a scan that found them (`scan`), then those it did not find.
fn in_scan_order<'a>(
    logs: &'a HashMap<OsString, CachedLog>,
    scan: Option<&ProjectScan>,
) -> Vec<(&'a OsString, &'a CachedLog)> {
    let found = scan.into_iter().flat_map(|scan| scan.logs.iter().map(|log| scan.session(log)));
    let mut ordered: Vec<_> = found.filter_map(|session| logs.get_key_value(session)).collect();
    if ordered.len() < logs.len() {
        let placed: HashSet<&OsStr> = ordered.iter().map(|(session, _)| session.as_os_str()).collect();
        ordered.extend(logs.iter().filter(|(session, _)| !placed.contains(session.as_os_str())));
    }
    ordered
}

/// What a pin found of one candidate under the cache's lock, to build its summary after.
struct Planned {
    path: PathBuf,
    stat: LogStat,
    toward: Toward,
}

/// What the cache holds toward the summary of a log at one stat.
#[derive(Clone)]
enum Toward {
    /// The summary itself.
    Built(Arc<LogSummary>),
    /// The log's header and its catalog-index facts (with the index kept).
    Indexed(Arc<SessionHeader>, Arc<Facts>),
    /// Nothing: the log is read whole (keeping its descriptor lines when `indexing`).
    Nothing { indexing: bool },
}

/// What the cache holds toward `log`'s summary at its stat.
fn toward(log: &CachedLog, indexing: bool) -> Toward {
    if let Some(summary) = &log.summary {
        return Toward::Built(summary.clone());
    }
    match (&log.header, &log.facts) {
        (Ok(header), Some(facts)) if indexing => Toward::Indexed(header.clone(), facts.clone()),
        _ => Toward::Nothing { indexing },
    }
}

/// A summary `build_summary` made, and what the cache learns from it.
enum Built {
    /// The cache had it.
    Cached(Arc<LogSummary>),
    /// From the index's facts.
    FromIndex(Arc<LogSummary>),
    /// From a read of the whole log (its header is the summary's), and its index facts when the
    /// index is kept.
    Read { summary: Arc<LogSummary>, facts: Option<Arc<Facts>> },
}

/// Puts what `build_summary` made of the log at `path` (statted at `stat`) into the
/// cache, and returns the summary. It is keyed by the stat made before the read: if the file grew
/// meanwhile, the next call's stat misses it and it is built again.
fn keep(cache: &mut Cache, path: &Path, stat: LogStat, built: Built) -> Arc<LogSummary> {
    let (project, session) = log_key(path);
    let (summary, facts) = match built {
        Built::Cached(summary) => return summary,
        Built::FromIndex(summary) => {
            if let Some(c) =
                cache.logs.get_mut(project).and_then(|logs| logs.get_mut(session)).filter(|c| c.is_at(stat))
            {
                c.summary = Some(summary.clone());
            }
            return summary;
        }
        Built::Read { summary, facts } => (summary, facts),
    };
    if let Some(state) = cache.index.as_mut() {
        state.dirty = true;
    }
    let logs = cache.logs.entry(project.to_owned()).or_default();
    match logs.get_mut(session) {
        Some(c) if c.is_at(stat) && c.header.is_ok() => {
            c.summary = Some(summary.clone());
            c.facts = facts;
        }
        _ => {
            let entry = CachedLog {
                stat,
                header: Ok(summary.header.clone()),
                summary: Some(summary.clone()),
                seen: 0,
                statted: true,
                facts,
                title: None,
                title_mark: None,
            };
            if replace(logs, session.to_owned(), entry) {
                cache.corpus = None;
            }
        }
    }
    summary
}

/// Puts `log` in `logs` under `key` in place of what was there: whether the log is new to the
/// cache or its header changed (which leaves the corpus behind; a log that only grew, as every
/// live session does, leaves it as it was, and keeps the mark of its last title read unless
/// `log` brings one).
fn replace(logs: &mut HashMap<OsString, CachedLog>, key: OsString, mut log: CachedLog) -> bool {
    match logs.entry(key) {
        std::collections::hash_map::Entry::Occupied(mut at) => {
            let old = at.get_mut();
            let same = old.header == log.header;
            if same {
                log.title_mark = log.title_mark.take().or_else(|| old.title_mark.take());
            }
            *old = log;
            !same
        }
        std::collections::hash_map::Entry::Vacant(at) => {
            at.insert(log);
            true
        }
    }
}

/// What the cache holds of the log `stored` lists, at the stat the listing found.
fn cached_at<'c>(cache: &'c Cache, stored: &StoredSession) -> Option<&'c CachedLog> {
    let (project, session) = log_key(&stored.path);
    cache.logs.get(project)?.get(session).filter(|log| log.is_as_listed(stored))
}

/// The (project directory, session directory) names of a log path `<root>/<project>/<session>/<LOG_FILE>`.
fn log_key(path: &Path) -> (&OsStr, &OsStr) {
    fn name(dir: Option<&Path>) -> &OsStr {
        dir.and_then(Path::file_name).unwrap_or_default()
    }
    let session_dir = path.parent();
    (name(session_dir.and_then(Path::parent)), name(session_dir))
}

/// The stat of a log; a missing file is a missing session.
fn stat(path: &Path, id: &str) -> Result<LogStat, QueryError> {
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_file() => Ok(LogStat::of(&meta)),
        Ok(_) => Err(QueryError::PersistenceFailed(format!("{} is not a regular file", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(QueryError::SessionNotFound(id.to_string())),
        Err(e) => Err(QueryError::PersistenceFailed(format!("cannot read {}: {e}", path.display()))),
    }
}

/// The valid stored prefix of a log (the scan `SessionStore::inspect` runs: nothing is written).
/// A log damaged before its last complete turn cannot be read: `PersistenceFailed`.
fn read_log(path: &Path, id: &str) -> Result<SessionLog, QueryError> {
    let scanned = scan_file(path).map_err(|e| QueryError::PersistenceFailed(e.to_string()))?;
    check_names(path, &scanned.header, id)?;
    Ok(SessionLog { header: scanned.header, events: scanned.events })
}

/// `read_log`, also keeping the log's descriptor lines (for the catalog index).
fn read_log_keeping(path: &Path, id: &str) -> Result<(SessionLog, Vec<EventLine>), QueryError> {
    let (scanned, lines) =
        scan_file_keeping(path, &Kind::SubagentDescriptor).map_err(|e| QueryError::PersistenceFailed(e.to_string()))?;
    check_names(path, &scanned.header, id)?;
    Ok((SessionLog { header: scanned.header, events: scanned.events }, lines))
}

fn check_names(path: &Path, header: &SessionHeader, id: &str) -> Result<(), QueryError> {
    if header.id != id {
        return Err(QueryError::PersistenceFailed(format!(
            "{}: header names session {:?}, not {id:?}",
            path.display(),
            header.id
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The corpus merges the logs of one session found in two project directories into one
    /// record, and fails the whole corpus when their headers disagree (as `merge_records` does).
    #[test]
    fn two_logs_of_one_session_are_one_record_or_a_conflict() {
        let dir = tempfile::tempdir().unwrap();
        let write = |project: &str, id: &str, created: u64| {
            let session = dir.path().join(project).join(id);
            std::fs::create_dir_all(&session).unwrap();
            let header = format!(
                "{{\"type\":\"session\",\"version\":0,\"id\":\"{id}\",\"createdAt\":{created},\"delegationDepth\":0}}\n"
            );
            std::fs::write(session.join(LOG_FILE), header).unwrap();
        };
        write("a", "s-1", 5);
        write("b", "s-1", 5);
        write("a", "t-2", 7);
        let records = |what: &str| {
            let source = StoreSource::persisted_only(SessionStore::new(dir.path().to_path_buf()));
            let records = source.records(&CancellationToken::new());
            records.map(|r| r.iter().map(|r| (r.header.id.clone(), r.persisted, r.live)).collect::<Vec<_>>()).map_err(
                |e| {
                    assert_eq!(e.code(), "SESSION_QUERY_SOURCE_CONFLICT", "{what}: {e}");
                    e.to_string()
                },
            )
        };
        let mut agreeing = records("agreeing").unwrap();
        agreeing.sort();
        assert_eq!(agreeing, [("s-1".to_string(), true, false), ("t-2".to_string(), true, false)]);
        write("b", "s-1", 6);
        let conflict = records("disagreeing").unwrap_err();
        assert!(conflict.starts_with("session s-1 has conflicting headers"), "{conflict}");
    }

    /// `stored` lists what the store's `list` reads from every log (both logs of a session found
    /// in two projects, a broken header left out), from the cache: only a changed log's header is
    /// read again.
    #[test]
    fn stored_is_the_store_s_listing_from_the_cache() {
        let dir = tempfile::tempdir().unwrap();
        let write = |project: &str, id: &str, text: &str| {
            let session = dir.path().join(project).join(id);
            std::fs::create_dir_all(&session).unwrap();
            std::fs::write(session.join(LOG_FILE), text).unwrap();
        };
        let header = |id: &str, created: u64| {
            format!(
                "{{\"type\":\"session\",\"version\":0,\"id\":\"{id}\",\"createdAt\":{created},\"delegationDepth\":0}}\n"
            )
        };
        write("a", "s-1", &header("s-1", 5));
        write("b", "s-1", &header("s-1", 6));
        write("a", "t-2", &header("t-2", 7));
        write("a", "broken", "not a header\n");
        let store = SessionStore::new(dir.path().to_path_buf());
        let source = StoreSource::persisted_only(store.clone());
        let listing = |listed: Vec<StoredSession>| {
            let mut keys: Vec<_> = listed
                .into_iter()
                .map(|s| (s.path, s.header.id, s.stat.len, s.stat.modified, s.stat.changed))
                .collect();
            keys.sort();
            keys
        };
        let cancel = CancellationToken::new();
        assert_eq!(listing(source.stored(&cancel).unwrap()), listing(store.list()));
        assert_eq!(listing(store.list()).len(), 3);
        let reads = source.io().header_reads;
        let t2 = dir.path().join("a").join("t-2").join(LOG_FILE);
        std::fs::write(&t2, header("t-2", 7) + "{}\n").unwrap();
        assert_eq!(listing(source.stored(&cancel).unwrap()), listing(store.list()), "the grown log at its new length");
        assert_eq!(source.io().header_reads, reads + 1, "only the changed log's header was read again");
    }

    fn title_line(seq: u64, text: &str) -> String {
        format!(
            "{{\"type\":\"session/title\",\"seq\":{seq},\"time\":0,\"data\":{{\"title\":\"{text}\",\"messageSeqs\":[0],\"source\":{{\"kind\":\"fallback\"}}}}}}\n"
        )
    }

    /// Writes the log of a top-level session `id` in `/w`: its header, then `body`.
    fn write_top_level(store: &SessionStore, id: &str, body: &str) -> PathBuf {
        let path = super::super::layout::log_path(store.root(), Some("/w"), id);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let header = serde_json::to_string(&SessionHeader::new(id, 0, Some("/w".into()))).unwrap();
        std::fs::write(&path, format!("{header}\n{body}")).unwrap();
        path
    }

    /// Each top-level session's id and title, as `session/list` lists them.
    fn titles_of(source: &StoreSource) -> Vec<(String, Option<String>)> {
        let listed = source.top_level_titled(None, &CancellationToken::new()).unwrap();
        source.settle(); // The index is written (as when the process ends).
        let mut titled: Vec<(String, Option<String>)> =
            listed.into_iter().map(|(s, title)| (s.header.id, title)).collect();
        titled.sort();
        titled
    }

    /// A long session's title, after a turn added to its log, is read from where the last
    /// read stopped: only the new lines (and the last line read, checked), not the whole log.
    /// A log cut below that point (as repair cuts an unreadable line) and written again is read
    /// whole, and its title is what the log now holds.
    #[test]
    fn a_grown_log_s_title_is_read_from_where_the_last_read_stopped() {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        let store = SessionStore::new(dir.path().join("sessions"));
        let filler: String = (0..2000)
            .map(|seq| format!("{{\"type\":\"turn/start\",\"seq\":{seq},\"time\":0,\"data\":{{\"turn\":{seq}}}}}\n"))
            .collect();
        let path = write_top_level(&store, "long", &(title_line(0, "First") + &filler));
        let whole = std::fs::metadata(&path).unwrap().len();
        let source = StoreSource::persisted_only(store.clone()).with_index();
        let titled = |title: &str| vec![("long".to_string(), Some(title.to_string()))];
        assert_eq!(titles_of(&source), titled("First"));
        assert_eq!(source.io().title_bytes, whole, "the first read reads it whole");
        let added = title_line(2001, "Second");
        std::fs::OpenOptions::new().append(true).open(&path).unwrap().write_all(added.as_bytes()).unwrap();
        assert_eq!(titles_of(&source), titled("Second"));
        let last_line = filler.lines().last().unwrap().len() as u64 + 1;
        assert_eq!(
            source.io().title_bytes,
            whole + last_line + added.len() as u64,
            "the last line read, and the new one"
        );
        // Cut below where the read stopped, and written again longer.
        let text = std::fs::read_to_string(&path).unwrap();
        let cut = text.find(&filler).unwrap() + filler.len() / 2;
        let again = format!("{}{filler}", &text[..cut]);
        std::fs::write(&path, &again).unwrap();
        let before = source.io().title_bytes;
        assert_eq!(titles_of(&source), titled("First"), "the second title was cut");
        assert!(source.io().title_bytes - before >= again.len() as u64, "read from the start");
    }

    /// The mark of a long log's title read is kept in the catalog index, so the next process
    /// reads on from it too once the log has grown: with the title at that length, and (`grown`)
    /// alone, when the index was written after the log grew and before its title was read again.
    /// A short log's mark is not kept: it is read whole.
    #[test]
    fn the_next_process_reads_a_grown_long_log_s_title_from_where_the_last_read_stopped() {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        let store = SessionStore::new(dir.path().join("sessions"));
        let filler = |lines: u64| -> String {
            (0..lines)
                .map(|seq| {
                    format!("{{\"type\":\"turn/start\",\"seq\":{seq},\"time\":0,\"data\":{{\"turn\":{seq}}}}}\n")
                })
                .collect()
        };
        let long_filler = filler(20_000);
        let long = write_top_level(&store, "long", &(title_line(0, "First") + &long_filler));
        let short = write_top_level(&store, "short", &(title_line(0, "Brief") + &filler(100)));
        assert!(std::fs::metadata(&long).unwrap().len() > catalog_index::MARK_KEPT_FROM);
        assert!(std::fs::metadata(&short).unwrap().len() < catalog_index::MARK_KEPT_FROM);
        let fresh = || StoreSource::persisted_only(store.clone()).with_index();
        let append = |path: &Path, text: &str| {
            std::fs::OpenOptions::new().append(true).open(path).unwrap().write_all(text.as_bytes()).unwrap();
        };
        let titled = |long: &str, short: &str| {
            vec![("long".to_string(), Some(long.to_string())), ("short".to_string(), Some(short.to_string()))]
        };
        assert_eq!(titles_of(&fresh()), titled("First", "Brief"));
        // Both grow by a title; the next process reads the long log from the index's mark (the
        // last line read, checked, and the new one) and the short one whole.
        let added = title_line(20_001, "Second");
        append(&long, &added);
        append(&short, &title_line(101, "Briefer"));
        let next = fresh();
        assert_eq!(titles_of(&next), titled("Second", "Briefer"));
        let last_line = long_filler.lines().last().unwrap().len() as u64 + 1;
        let short_len = std::fs::metadata(&short).unwrap().len();
        assert_eq!(next.io().title_bytes, last_line + added.len() as u64 + short_len);
        // The long log grows by a turn and a title, which a process's own writes report to its
        // watch before any scan: the mark in the index entry goes on with the log.
        let (turn, third) = (filler(1), title_line(20_002, "Third"));
        append(&long, &(turn.clone() + &third));
        let watched = fresh();
        watched.watch().unwrap().changed(&long);
        watched.settle();
        assert_eq!(titles_of(&watched), titled("Third", "Briefer"));
        assert_eq!(watched.io().title_bytes, (added.len() + turn.len() + third.len()) as u64);
        drop(watched);
        // It grows by a turn; a process that only scans (no titles) writes the index with the
        // log's new length and the mark alone.
        append(&long, &turn);
        let scanned = fresh();
        scanned.stored(&CancellationToken::new()).unwrap();
        scanned.settle();
        drop(scanned);
        let index = std::fs::read_to_string(catalog_index::path(store.root()).unwrap()).unwrap();
        let entry = index.lines().find(|line| line.contains("\"session\":\"long\"")).unwrap();
        assert!(entry.contains("\"text\":\"Third\",\"mark\":[") && entry.contains("\"grown\":true"), "{entry}");
        let next = fresh();
        assert_eq!(titles_of(&next), titled("Third", "Briefer"));
        assert_eq!(
            next.io().title_bytes,
            (third.len() + turn.len()) as u64,
            "its last title line, checked, and the turn"
        );
    }

    /// `session/list`'s titles (issue 23): each read once at its log's stat and kept
    /// in the catalog index, so the next process (a fresh query) reads none; a log that grew is
    /// read again, alone; and an index whose title was changed, or is not a title, is no index:
    /// the titles are read again and come out the same.
    #[test]
    fn titles_are_read_once_and_kept_in_the_catalog_index() {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        let store = SessionStore::new(dir.path().join("sessions"));
        let (title, write) = (title_line, |id: &str, body: &str| write_top_level(&store, id, body));
        write("a", &(title(0, "First") + &title(1, "Second")));
        let b = write("b", "");
        write("c", &title(0, "Cee \\\"quoted\\\""));
        let fresh = || StoreSource::persisted_only(store.clone()).with_index();
        let expected = |b_title: Option<&str>| {
            vec![
                ("a".to_string(), Some("Second".to_string())),
                ("b".to_string(), b_title.map(str::to_string)),
                ("c".to_string(), Some("Cee \"quoted\"".to_string())),
            ]
        };
        let first = fresh();
        assert_eq!(titles_of(&first), expected(None));
        assert_eq!(first.io().title_reads, 3);
        assert_eq!(titles_of(&first), expected(None));
        assert_eq!(first.io().title_reads, 3, "kept: not read again");
        let next = fresh();
        assert_eq!(titles_of(&next), expected(None));
        assert_eq!((next.io().title_reads, next.io().header_reads), (0, 0), "the index gave every title and header");
        std::fs::OpenOptions::new().append(true).open(&b).unwrap().write_all(title(0, "Bee").as_bytes()).unwrap();
        let next = fresh();
        assert_eq!(titles_of(&next), expected(Some("Bee")));
        assert_eq!(next.io().title_reads, 1, "only the log that changed");
        let next = fresh();
        assert_eq!(titles_of(&next), expected(Some("Bee")));
        assert_eq!(next.io().title_reads, 0, "its new title was kept");
        // Corrupt titles: the index is not used, and the titles are read again.
        let index = catalog_index::path(store.root()).unwrap();
        let good = std::fs::read_to_string(&index).unwrap();
        let with_body = |body: String| {
            let digest = format!("{:032x}", xxhash_rust::xxh3::xxh3_128(body.as_bytes()));
            let entries = body.lines().count();
            format!(
                "{{\"kinCatalogIndex\":{INDEX},\"entries\":{entries},\"digest\":\"{digest}\"}}\n{body}",
                INDEX = catalog_index::INDEX_VERSION
            )
        };
        let body = good.split_once('\n').unwrap().1.to_string();
        assert!(body.contains(r#""title":{"text":"Bee"}"#), "{body}");
        for (what, text) in [
            ("a title changed under the file's digest", good.replacen("\"Bee\"", "\"Bob\"", 1)),
            ("a title that is not text", with_body(body.replacen("{\"text\":\"Bee\"}", "{\"text\":5}", 1))),
            (
                "a title with another field",
                with_body(body.replacen("{\"text\":\"Bee\"}", "{\"text\":\"Bee\",\"x\":1}", 1)),
            ),
            ("a title that is a bare string", with_body(body.replacen("{\"text\":\"Bee\"}", "\"Bee\"", 1))),
        ] {
            std::fs::write(&index, text).unwrap();
            let next = fresh();
            assert_eq!(titles_of(&next), expected(Some("Bee")), "{what}");
            assert_eq!(next.io().title_reads, 3, "{what}: every title read again");
            let after = fresh();
            assert_eq!(titles_of(&after), expected(Some("Bee")), "{what}: rebuilt");
            assert_eq!(after.io().title_reads, 0, "{what}: the rebuilt index holds the titles");
        }
    }

    /// The store's trace (from the corpus's own maps, live asked only of the trace's sessions)
    /// is the trace the records give (`SessionSource::trace`'s default), for every session of a
    /// corpus with grandchildren, siblings created at the same time, a session logged in two
    /// projects, a parent outside the corpus, a cycle, and live sessions; and both see a new log.
    #[test]
    fn the_corpus_trace_is_the_records_trace() {
        let dir = tempfile::tempdir().unwrap();
        let write = |project: &str, id: &str, created: u64, parent: Option<&str>| {
            let session = dir.path().join(project).join(id);
            std::fs::create_dir_all(&session).unwrap();
            let mut header = SessionHeader::new(id, created, None);
            header.parent_session = parent.map(str::to_string);
            std::fs::write(session.join(LOG_FILE), format!("{}\n", serde_json::to_string(&header).unwrap())).unwrap();
        };
        write("a", "root", 1, None);
        for (id, created) in [("c-b", 5), ("c-a", 5), ("C-c", 5), ("c-0", 9), ("c-1", 2)] {
            write("a", id, created, Some("root"));
        }
        write("b", "c-a", 5, Some("root"));
        write("b", "g-1", 3, Some("c-a"));
        write("b", "g-2", 1, Some("c-a"));
        write("a", "gg", 1, Some("g-2"));
        write("a", "orphan", 1, Some("not-here"));
        write("a", "orphan-kid", 1, Some("orphan"));
        write("b", "x", 1, Some("y"));
        write("b", "y", 1, Some("x"));
        write("a", "x-kid", 1, Some("x"));
        struct ByRecords(StoreSource);
        impl SessionSource for ByRecords {
            fn records(&self, cancel: &CancellationToken) -> Result<Vec<SessionRecord>, QueryError> {
                self.0.records(cancel)
            }
            fn log(&self, id: &str) -> Result<SessionLog, QueryError> {
                self.0.log(id)
            }
        }
        let live = |id: &str| ["c-a", "gg", "orphan"].contains(&id);
        let store = StoreSource::new(SessionStore::new(dir.path().to_path_buf()), live);
        let records = ByRecords(StoreSource::new(SessionStore::new(dir.path().to_path_buf()), live));
        let cancel = CancellationToken::new();
        let ids =
            ["root", "c-b", "c-a", "C-c", "c-0", "c-1", "g-1", "g-2", "gg", "orphan", "orphan-kid", "x", "y", "x-kid"];
        let compare = |ids: &[&str]| {
            for id in ids.iter().chain(&["absent"]) {
                assert_eq!(store.trace(id, &cancel), records.trace(id, &cancel), "{id}");
            }
        };
        compare(&ids);
        let root = store.trace("root", &cancel).unwrap();
        let order: Vec<&str> = root.descendants.iter().map(|n| n.session.header.id.as_str()).collect();
        assert_eq!(order, ["c-1", "c-a", "c-b", "C-c", "c-0"]);
        assert!(root.descendants[1].session.live && !root.descendants[0].session.live);
        assert_eq!(root.descendants[1].descendants[0].descendants[0].session.header.id, "gg");
        assert!(root.descendants[1].descendants[0].descendants[0].session.live);
        assert_eq!(store.trace("x-kid", &cancel).unwrap_err().code(), "SESSION_QUERY_INVALID_LINEAGE");
        write("b", "late", 1, Some("g-1"));
        compare(&["root", "g-1", "late"]);
        assert_eq!(store.trace("g-1", &cancel).unwrap().descendants[0].session.header.id, "late");
    }

    #[test]
    fn ids_compare_case_insensitively_with_lowercase_first() {
        assert_eq!(compare_ids("a-2", "B-1"), Ordering::Less, "byte order would put B first");
        assert_eq!(compare_ids("abc", "ABC"), Ordering::Less);
        assert_eq!(compare_ids("0001", "0002"), Ordering::Less);
        assert_eq!(compare_ids("same", "same"), Ordering::Equal);
    }
}
