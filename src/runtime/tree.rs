//! The live agent tree: parents, the top-level session above a child, descendants, and the
//! refusal of child ids where only `session/cancel` may name one.

use std::sync::Arc;

use anyhow::Result;

use super::error::{RuntimeError, subagent_only};
use super::{Child, Live, Runtime};
use crate::agent::AgentHandle;
use crate::mcp::McpSession;
use crate::sandbox::SessionSandbox;
use crate::session::SessionHeader;
use crate::subagent::agents::Agents;

impl Runtime {
    /// The parent of a live child session.
    pub fn parent_of(&self, id: &str) -> Option<String> {
        self.children().get(id).and_then(|c| c.parent.clone())
    }

    /// The MCP servers and named agents of the live top-level session at or above `session`.
    pub(super) fn root(&self, session: Option<&str>) -> Option<(Arc<McpSession>, Arc<Agents>)> {
        self.root_live(session, |live| (live.mcp.clone(), live.agents.clone()))
    }

    /// The sandbox of the live top-level session at or above `session`, if there is one.
    pub(super) fn root_sandbox(&self, session: Option<&str>) -> Option<Arc<SessionSandbox>> {
        self.root_live(session, |live| live.sandbox.clone())
    }

    /// `pick` of the live top-level session at or above `session` (walking up through live children).
    pub(super) fn root_live<T>(&self, session: Option<&str>, pick: impl Fn(&Live) -> T) -> Option<T> {
        let children = self.children();
        let live = self.live();
        let mut cursor = session.map(str::to_string);
        for _ in 0..=children.len() {
            let id = cursor?;
            if let Some(entry) = live.get(&id) {
                return Some(pick(entry));
            }
            cursor = children.get(&id).and_then(|c| c.parent.clone());
        }
        None
    }

    /// The live child agents below `id` that are not background children and not below one:
    /// the ones a cancel of `id` reaches.
    pub(super) fn foreground_descendants(&self, id: &str) -> Vec<AgentHandle> {
        let below: Vec<(Vec<String>, AgentHandle)> = {
            let children = self.children();
            children
                .iter()
                .filter_map(|(cid, child)| {
                    let mut path = vec![cid.clone()];
                    let mut parent = child.parent.as_deref();
                    for _ in 0..=children.len() {
                        match parent {
                            Some(p) if p == id => return Some((path, child.handle.clone())),
                            Some(p) => {
                                path.push(p.to_string());
                                parent = children.get(p).and_then(|c| c.parent.as_deref());
                            }
                            None => return None,
                        }
                    }
                    None
                })
                .collect()
        };
        below
            .into_iter()
            .filter(|(path, _)| path.iter().all(|p| !self.continuation.is_resident(p)))
            .map(|(_, handle)| handle)
            .collect()
    }

    /// The live child agents below `id` (children, grandchildren, …), not `id` itself.
    pub(super) fn descendants(&self, id: &str) -> Vec<(String, AgentHandle)> {
        let children = self.children();
        let below = |child: &Child| {
            let mut parent = child.parent.as_deref();
            for _ in 0..=children.len() {
                match parent {
                    Some(p) if p == id => return true,
                    Some(p) => parent = children.get(p).and_then(|c| c.parent.as_deref()),
                    None => return false,
                }
            }
            false
        };
        children.iter().filter(|entry| below(entry.1)).map(|(cid, c)| (cid.clone(), c.handle.clone())).collect()
    }

    /// `Err` (invalid params) when `id` names a subagent child, live or stored: only
    /// `session/cancel` may name one.
    pub(super) fn reject_child(&self, id: &str) -> Result<(), RuntimeError> {
        if self.children().contains_key(id) {
            return Err(subagent_only(id));
        }
        if self.live().contains_key(id) {
            return Ok(());
        }
        match self.stored_header(id) {
            Some(header) if header.parent_session.is_some() && header.origin.as_deref() == Some("subagent") => {
                Err(subagent_only(id))
            }
            _ => Ok(()),
        }
    }

    /// The header line of a stored session, if it can be read.
    pub(super) fn stored_header(&self, id: &str) -> Option<SessionHeader> {
        self.store.header(id).ok()
    }
}
