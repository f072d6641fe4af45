//! The live agent tree: parents, the top-level session above a child, descendants, and the
//! refusal of child ids where only `session/cancel` may name one.

use std::sync::Arc;

use anyhow::Result;

use super::Runtime;
use super::agents::Role;
use super::error::{RuntimeError, subagent_only};
use crate::agent::AgentHandle;
use crate::mcp::McpSession;
use crate::sandbox::SessionSandbox;
use crate::session::SessionHeader;
use crate::subagent::agents::Agents;

impl Runtime {
    /// The parent of a live child session.
    pub fn parent_of(&self, id: &str) -> Option<String> {
        if !self.agents.is_child(id) {
            return None;
        }
        self.agents.parent_of(id)
    }

    /// The MCP servers and named agents of the live top-level session at or above `session`.
    pub(super) fn root(&self, session: Option<&str>) -> Option<(Arc<McpSession>, Arc<Agents>)> {
        let top = self.agents.root_top_level(session?)?;
        Some((top.mcp.clone(), top.named.clone()))
    }

    /// The sandbox of the live top-level session at or above `session`, if there is one.
    pub(super) fn root_sandbox(&self, session: Option<&str>) -> Option<Arc<SessionSandbox>> {
        Some(self.agents.root_top_level(session?)?.sandbox.clone())
    }

    /// The live child agents below `id` that are not background children and not below one:
    /// the ones a cancel of `id` reaches.
    pub(super) fn foreground_descendants(&self, id: &str) -> Vec<AgentHandle> {
        self.agents
            .descendants(id)
            .into_iter()
            .filter(|below| below.via.iter().all(|p| !self.continuation.is_resident(p)))
            .map(|below| below.agent.handle)
            .collect()
    }

    /// The live child agents below `id` (children, grandchildren, …), not `id` itself.
    pub(super) fn descendants(&self, id: &str) -> Vec<(String, AgentHandle)> {
        self.agents.descendants(id).into_iter().map(|below| (below.id, below.agent.handle)).collect()
    }

    /// `Err` (invalid params) when `id` names a subagent child, live or stored: only
    /// `session/cancel` may name one; or when it cannot be a session id at all (`../x`, empty):
    /// that is a bad request, not an unknown session.
    pub(super) fn reject_child(&self, id: &str) -> Result<(), RuntimeError> {
        crate::session::layout::validate_session_id(id)
            .map_err(|reason| RuntimeError::InvalidParams(format!("invalid session id: {reason}")))?;
        match self.agents.get(id).map(|agent| agent.role) {
            Some(Role::Child(_)) => return Err(subagent_only(id)),
            Some(Role::TopLevel(_)) => return Ok(()),
            None => {}
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
