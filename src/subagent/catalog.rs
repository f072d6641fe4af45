//! The durable subagent catalog (seed 000, dsh-design.md §1.6.4): `list_children` enumerates
//! the session-backed subagents directly below a parent from session query alone. One trace
//! gives the candidates (the direct children, in sibling order); a candidate is a subagent iff
//! exactly one `subagent/descriptor` sits in its own suffix (seq >= `seedLength`, so a fork seed
//! never leaks an ancestor's descriptor). Per-child failures become diagnostics; trace failures,
//! window errors and unrecognised failures fail the whole call; cancellation anywhere is
//! `CANCELLED`, never a partial result.
//!
//! Listing consults no Activation, agent registry or provider, creates no agent and writes
//! nothing: every read goes through the query, whose persisted reads never repair.

use tokio_util::sync::CancellationToken;

use super::descriptor::Descriptor;
use super::error::{ErrorCode, SubagentError};
use crate::session::Kind;
use crate::session::inbox::InboxCounts;
use crate::session::query::{
    QueryError, QueryFault, QueryService, ReadRequest, SessionRecord, assert_headers_compatible,
};

/// The message of `ErrorCode::SessionQueryUnavailable`.
pub const QUERY_UNAVAILABLE: &str = "listing subagents requires session query (load a dsh-session-query backend)";
/// The message of a cancelled listing (`ErrorCode::Cancelled`).
pub(crate) const LISTING_CANCELLED: &str = "subagent listing was cancelled";

/// A subagent's durable creation policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    OneShot,
    Continuable,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::OneShot => "one-shot",
            Mode::Continuable => "continuable",
        }
    }
}

/// A process-local snapshot: the child's session is live here, or only stored. Neither an
/// outcome nor a delivery promise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activity {
    Running,
    Inactive,
}

impl Activity {
    pub fn as_str(self) -> &'static str {
        match self {
            Activity::Running => "running",
            Activity::Inactive => "inactive",
        }
    }
}

/// Why a candidate could not be listed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// A malformed event surface, a header that changed between the trace and the read, a read
    /// target that is no longer the descriptor, malformed descriptor content, or more than one
    /// descriptor.
    Corrupt,
    /// A descriptor version this kin does not read.
    Unsupported,
    /// The child's session, its descriptor event or the store vanished or failed during the read.
    Unavailable,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Corrupt => "corrupt",
            Reason::Unsupported => "unsupported",
            Reason::Unavailable => "unavailable",
        }
    }
}

/// One entry of a listing, in the trace's candidate order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListEntry {
    /// A subagent with a valid descriptor. `label` is always present for continuable children
    /// and optional for one-shot ones; `agent` is the named agent it was started as, if any.
    /// `inbox` counts what its own log holds pending and discarded (the sender's view of
    /// messages that have not run).
    Child {
        id: String,
        mode: Mode,
        label: Option<String>,
        agent: Option<String>,
        activity: Activity,
        inbox: InboxCounts,
    },
    /// A candidate that could not be read; its descriptor content is never exposed.
    Diagnostic { id: String, reason: Reason },
}

impl ListEntry {
    pub fn id(&self) -> &str {
        match self {
            ListEntry::Child { id, .. } | ListEntry::Diagnostic { id, .. } => id,
        }
    }
}

fn cancelled() -> SubagentError {
    SubagentError::new(ErrorCode::Cancelled, LISTING_CANCELLED)
}

fn check(cancel: &CancellationToken) -> Result<(), SubagentError> {
    if cancel.is_cancelled() { Err(cancelled()) } else { Ok(()) }
}

/// A query failure as an operation failure: query errors keep their own code, anything else is
/// an infrastructure failure with its message.
pub(crate) fn fault_error(fault: QueryFault) -> SubagentError {
    match fault {
        QueryFault::Query(e) => SubagentError::new(ErrorCode::Query(e.code()), e.to_string()),
        QueryFault::Other(message) => SubagentError::new(ErrorCode::Infrastructure, message),
    }
}

/// `listChildren(parentSessionId, signal)`: the subagents directly below `parent_id`, with a
/// diagnostic for each candidate that could not be read. Without a query it fails with
/// `SUBAGENT_CONTROL_SESSION_QUERY_UNAVAILABLE` before any work.
pub fn list_children(
    query: Option<&dyn QueryService>,
    parent_id: &str,
    cancel: &CancellationToken,
) -> Result<Vec<ListEntry>, SubagentError> {
    let query = query.ok_or_else(|| SubagentError::new(ErrorCode::SessionQueryUnavailable, QUERY_UNAVAILABLE))?;
    check(cancel)?;
    let trace = match query.trace_session(parent_id, cancel) {
        Ok(trace) => trace,
        Err(fault) => {
            check(cancel)?;
            return Err(fault_error(fault));
        }
    };
    check(cancel)?;
    let candidates: Vec<&str> = trace.descendants.iter().map(|node| node.session.header.id.as_str()).collect();
    let _pinned = Pinned::new(query, candidates, cancel);
    check(cancel)?;
    let mut entries = Vec::new();
    for node in &trace.descendants {
        check(cancel)?;
        let entry = inspect_child(query, parent_id, &node.session, cancel)?;
        check(cancel)?;
        entries.extend(entry);
    }
    Ok(entries)
}

/// The candidates of one listing, pinned as of its trace (`QueryService::pin`) until it returns,
/// on every path: the listing is a snapshot of that trace's scan, and stats each log once.
struct Pinned<'a> {
    query: &'a dyn QueryService,
    ids: Vec<&'a str>,
}

impl<'a> Pinned<'a> {
    fn new(query: &'a dyn QueryService, ids: Vec<&'a str>, cancel: &CancellationToken) -> Self {
        query.pin(&ids, cancel);
        Pinned { query, ids }
    }
}

impl Drop for Pinned<'_> {
    fn drop(&mut self) {
        self.query.release(&self.ids);
    }
}

/// One entry of a listed tree: a child with the subagents below it, or a diagnostic (nothing
/// below an unreadable child is read).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeEntry {
    pub entry: ListEntry,
    pub children: Vec<TreeEntry>,
}

/// `list_children` at every level below `root_id` (at most `max_depth` levels), from **one**
/// trace: each level is judged exactly as `list_children` judges the direct children (same
/// candidates, order, activity and diagnostics), so an editor's agent tree and `list_agents`
/// agree, and the work is linear in the number of sessions below the root.
pub fn list_tree(
    query: Option<&dyn QueryService>,
    root_id: &str,
    max_depth: usize,
    cancel: &CancellationToken,
) -> Result<Vec<TreeEntry>, SubagentError> {
    let query = query.ok_or_else(|| SubagentError::new(ErrorCode::SessionQueryUnavailable, QUERY_UNAVAILABLE))?;
    check(cancel)?;
    let trace = match query.trace_session(root_id, cancel) {
        Ok(trace) => trace,
        Err(fault) => {
            check(cancel)?;
            return Err(fault_error(fault));
        }
    };
    check(cancel)?;
    let mut ids = Vec::new();
    let mut pending: Vec<(&[crate::session::query::LineageNode], usize)> = vec![(&trace.descendants, 0)];
    while let Some((nodes, depth)) = pending.pop() {
        if depth < max_depth {
            ids.extend(nodes.iter().map(|n| n.session.header.id.as_str()));
            pending.extend(nodes.iter().map(|n| (n.descendants.as_slice(), depth + 1)));
        }
    }
    let _pinned = Pinned::new(query, ids, cancel);
    check(cancel)?;
    level(query, root_id, &trace.descendants, max_depth, cancel)
}

/// The entries of one level of a trace, each child with its own level below.
fn level(
    query: &dyn QueryService,
    parent_id: &str,
    nodes: &[crate::session::query::LineageNode],
    depth_left: usize,
    cancel: &CancellationToken,
) -> Result<Vec<TreeEntry>, SubagentError> {
    if depth_left == 0 {
        return Ok(Vec::new());
    }
    let mut entries = Vec::new();
    for node in nodes {
        check(cancel)?;
        let Some(entry) = inspect_child(query, parent_id, &node.session, cancel)? else { continue };
        check(cancel)?;
        let children = match &entry {
            ListEntry::Child { id, .. } => level(query, id, &node.descendants, depth_left - 1, cancel)?,
            ListEntry::Diagnostic { .. } => Vec::new(),
        };
        entries.push(TreeEntry { entry, children });
    }
    Ok(entries)
}

/// One candidate: `None` when it is not a subagent (no descriptor of its own).
fn inspect_child(
    query: &dyn QueryService,
    parent_id: &str,
    candidate: &SessionRecord,
    cancel: &CancellationToken,
) -> Result<Option<ListEntry>, SubagentError> {
    let id = candidate.header.id.as_str();
    let seed_length = candidate.header.seed_length.unwrap_or(0);
    let seqs = match query.event_seqs(id, &Kind::SubagentDescriptor) {
        Ok(seqs) => seqs,
        Err(fault) => return diagnose(id, fault, cancel),
    };
    check(cancel)?;
    let own: Vec<u64> = seqs.into_iter().filter(|seq| *seq >= seed_length).collect();
    let seq = match own.as_slice() {
        [] => return Ok(None),
        [seq] => *seq,
        _ => return Ok(Some(diagnostic(id, Reason::Corrupt))),
    };
    let window = match query.read_event(&ReadRequest::exact(id, seq), cancel) {
        Ok(window) => window,
        Err(fault) => return diagnose(id, fault, cancel),
    };
    check(cancel)?;
    let same_session = assert_headers_compatible(&window.session, &candidate.header).is_ok()
        && window.session.parent_session.as_deref() == Some(parent_id);
    let same_target = window.target.kind == Kind::SubagentDescriptor && window.target.seq == seq;
    if !same_session || !same_target {
        return Ok(Some(diagnostic(id, Reason::Corrupt)));
    }
    let descriptor = match Descriptor::of_data(&window.target.data) {
        Err(_) => return Ok(Some(diagnostic(id, Reason::Corrupt))),
        Ok(None) => return Ok(Some(diagnostic(id, Reason::Unsupported))),
        Ok(Some(descriptor)) => descriptor,
    };
    let activity = if candidate.live { Activity::Running } else { Activity::Inactive };
    let agent = descriptor.agent().map(|a| a.name.clone());
    let (mode, label) = match descriptor {
        Descriptor::OneShot { label, .. } => (Mode::OneShot, label),
        Descriptor::Continuable { label, .. } => (Mode::Continuable, Some(label)),
    };
    // The inbox is a view, not an identity check: a log whose splices cannot be read lists
    // without counts rather than hiding the child.
    let inbox = query.inbox(id).unwrap_or_default();
    Ok(Some(ListEntry::Child { id: id.to_string(), mode, label, agent, activity, inbox }))
}

/// The descriptor in a stored child's own events (seq >= `seed_length`), judged as a listing
/// judges it: `Ok(None)` without one, `Err(Corrupt)` for more than one or a malformed one,
/// `Err(Unsupported)` for another version. `send_message` resumes only what lists as a child.
pub(crate) fn own_descriptor(events: &[crate::session::Event], seed_length: u64) -> Result<Option<Descriptor>, Reason> {
    let mut own = events.iter().filter(|e| e.seq >= seed_length && e.kind == Kind::SubagentDescriptor);
    let Some(first) = own.next() else {
        return Ok(None);
    };
    if own.next().is_some() {
        return Err(Reason::Corrupt);
    }
    match Descriptor::of_data(&first.data) {
        Ok(Some(descriptor)) => Ok(Some(descriptor)),
        Ok(None) => Err(Reason::Unsupported),
        Err(_) => Err(Reason::Corrupt),
    }
}

fn diagnostic(id: &str, reason: Reason) -> ListEntry {
    ListEntry::Diagnostic { id: id.to_string(), reason }
}

/// A failed candidate read: a diagnostic, or (cancellation, window and unrecognised failures)
/// an operation failure.
fn diagnose(id: &str, fault: QueryFault, cancel: &CancellationToken) -> Result<Option<ListEntry>, SubagentError> {
    check(cancel)?;
    match fault {
        QueryFault::Query(
            QueryError::SessionNotFound(_) | QueryError::EventNotFound { .. } | QueryError::PersistenceFailed(_),
        ) => Ok(Some(diagnostic(id, Reason::Unavailable))),
        QueryFault::Query(QueryError::InvalidSurface(_) | QueryError::SourceConflict(_)) => {
            Ok(Some(diagnostic(id, Reason::Corrupt)))
        }
        other => Err(fault_error(other)),
    }
}
