//! What the protocol lists: stored top-level sessions and their titles, and the children an
//! editor reloading a parent is shown.

use std::path::Path;

use anyhow::Result;
use tokio_util::sync::CancellationToken;

use super::{ChildRecord, Runtime};
use crate::session::query::QueryError;
use crate::session::store::top_level;
use crate::session::{Event, StoredSession};
use crate::subagent::catalog::{Activity, TreeEntry, list_tree};
use crate::subagent::{Descriptor, SubagentError};

impl Runtime {
    /// The subagents below `parent_id` as `list_agents` sees them (`catalog::list_tree`: one
    /// trace; the same candidates, order, activity and diagnostics at every level), at most
    /// `max_depth` levels deep. Read-only: nothing is repaired.
    pub fn child_tree(&self, parent_id: &str, max_depth: usize) -> Result<Vec<TreeEntry>, SubagentError> {
        list_tree(Some(self.query.as_ref()), parent_id, max_depth, &CancellationToken::new())
    }

    /// What an editor is shown of a listed child: its header and own events (from its
    /// `seedLength` on), read without repair. `None` when the log cannot be read any more.
    pub fn child_record(&self, id: &str, activity: Activity) -> Option<ChildRecord> {
        let scanned = match self.store.inspect(id) {
            Ok(scanned) => scanned,
            Err(e) => {
                tracing::warn!(child = %id, "a listed child session cannot be read: {e}");
                return None;
            }
        };
        let own = scanned.header.seed_length.unwrap_or(0);
        let events: Vec<Event> = scanned.events.into_iter().filter(|e| e.seq >= own).collect();
        let descriptor = Descriptor::fold(events.iter()).ok().flatten();
        let running = self.agents.child(id).is_some_and(|(handle, _)| handle.is_running());
        Some(ChildRecord { header: scanned.header, events, descriptor, live: activity == Activity::Running, running })
    }

    /// Every stored log with a readable header, from the session query's cache (a header is read
    /// only from a log new or changed since its last scan); if the query fails, from every log.
    pub(crate) fn stored(&self) -> Vec<StoredSession> {
        self.query.source().stored(&CancellationToken::new()).unwrap_or_else(|e| self.every_log(&e))
    }

    /// Top-level sessions (never children), newest first, optionally only those in `cwd`, each
    /// with its title (its last `session/title`; kept by the session query and its catalog
    /// index per log). When the query cannot read the store, what the store reads of every log
    /// it can (a project directory it cannot read left out); when that finds none either, the
    /// query's error: "no sessions" would hide every stored one from the user. Blocking file I/O.
    pub fn list_sessions(&self, cwd: Option<&Path>) -> Result<Vec<(StoredSession, Option<String>)>, String> {
        let source = self.query.source();
        source.top_level_titled(cwd, &CancellationToken::new()).or_else(|e| {
            let every = self.every_log(&e);
            if every.is_empty() {
                return Err(format!("cannot read the sessions in {}: {e}", self.store.root().display()));
            }
            let listed = top_level(every, cwd);
            let titles = source.titles(&listed);
            Ok(listed.into_iter().zip(titles).collect())
        })
    }

    /// What the store reads from every log's header, when the session query failed with `e`.
    fn every_log(&self, e: &QueryError) -> Vec<StoredSession> {
        tracing::warn!("the session query could not list the store ({e}); reading every log's header");
        self.store.list()
    }
}
