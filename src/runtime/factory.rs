//! The child factory: the runtime creates, loads, starts and releases child agents for the
//! subagent providers (`subagent::inprocess::ChildFactory`).

use std::path::Path;
use std::sync::Arc;

use anyhow::Result;

use super::Runtime;
use super::agents::{Agent, Child, Role};
use crate::agent::{AgentDeps, AgentHandle, Restored, spawn_restored};
use crate::permission::Permissions;
use crate::sandbox::SessionSandbox;
use crate::session::{Event, Session, SessionHeader};
use crate::subagent::agents::Launch;
use crate::subagent::inprocess::{ChildFactory, ChildSetup, ReportToolCalls};
use crate::subagent::{ErrorCode, SubagentError};

impl ChildFactory for Runtime {
    fn mint_id(&self) -> String {
        self.mint_session_id()
    }

    fn create_session(&self, header: SessionHeader, seed: Vec<Event>) -> Result<Session, SubagentError> {
        let infra = |e: String| SubagentError::new(ErrorCode::Infrastructure, e);
        let mut session = self.store.create_seeded(header, seed).map_err(|e| infra(e.to_string()))?;
        if let Err(e) = session.flush() {
            // Never published: nothing of it may stay on disk.
            session.discard();
            return Err(infra(format!("cannot create the child session log: {e:#}")));
        }
        Ok(session)
    }

    fn load_session(&self, id: &str) -> Result<(Session, Restored), String> {
        let mut session = self.store.load(id).map_err(|e| e.to_string())?;
        let restored = crate::agent::prepare(&mut session)?;
        self.took_back(&session.header, session.events());
        Ok((session, restored))
    }

    fn stored_header(&self, id: &str) -> Option<SessionHeader> {
        Runtime::stored_header(self, id)
    }

    fn stored_events(&self, id: &str) -> Result<Vec<Event>, String> {
        self.store.inspect(id).map(|scanned| scanned.events).map_err(|e| e.to_string())
    }

    fn stored_subagents(&self) -> Vec<SessionHeader> {
        self.stored()
            .into_iter()
            .map(|s| s.header)
            .filter(|h| h.parent_session.is_some() && h.origin.as_deref() == Some("subagent"))
            .collect()
    }

    fn start_agent(&self, mut session: Session, restored: Restored, setup: ChildSetup) -> AgentHandle {
        let ChildSetup { route, persona, tool_filter, extra_tools, display, progress, agent } = setup;
        let delegating = display.call_id.clone().zip(progress.clone());
        let mut tools = match &tool_filter {
            Some(filter) => self.tools.filtered(|name| filter.permits(name)),
            None => self.tools.clone(),
        };
        // Children share their parent's permissions (the top-level session's mode and remembered
        // answers, under every cap above them and their own agent's) and ask the same editor,
        // with their own session id; their prompt is built fresh.
        let cwd = session.header.cwd.clone();
        let parent_id = session.header.parent_session.clone();
        let root = self.root(parent_id.as_deref());
        // The root's MCP servers, under the child's tool filter, and its named agents.
        if let Some((mcp, agents)) = &root {
            let keep = tool_filter.clone().map(|f| Arc::new(move |name: &str| f.permits(name)) as Arc<_>);
            tools.add_source(mcp.clone(), keep);
            tools = self.offering(tools, agents);
        }
        for tool in extra_tools {
            tools.register(tool);
        }
        let cap = agent.as_ref().and_then(|a| a.permission_cap);
        let permissions = match parent_id.as_deref().and_then(|p| self.permissions_of(p)) {
            Some(parent) => parent.narrowed(cap),
            None => Permissions::new(self.config.permission_mode).narrowed(cap),
        };
        let permissions = Arc::new(permissions);
        // And their sandbox (a child without a live ancestor gets the start's).
        let sandbox = self
            .root_sandbox(parent_id.as_deref())
            .unwrap_or_else(|| Arc::new(SessionSandbox::restored(self.sandbox_settings.clone(), None)));
        let tools = Self::sandboxed(tools, &sandbox, cwd.as_deref(), None);
        let client = self.client();
        let prompt = self.child_prompt(&client, parent_id.as_deref(), &display, delegating);
        let mode = permissions.mode();
        let system =
            self.build_prompt(cwd.as_deref().map(Path::new), &tools, persona.as_deref(), mode).unwrap_or_else(|e| {
                tracing::warn!("building a child's system prompt failed, using a minimal one: {e}");
                persona.clone().unwrap_or_default()
            });
        // A named agent's turn limit, within the deployment's.
        let max_steps =
            agent.as_ref().and_then(|a| a.max_turns).map_or(self.config.max_steps, |n| n.min(self.config.max_steps));
        let reporter = progress.map(|progress| ReportToolCalls { progress, tools: tools.clone() });
        let deps = AgentDeps {
            model: self.model.clone(),
            tools,
            route,
            system,
            max_steps,
            max_parallel_tools: self.config.max_parallel_tools,
            depth: session.header.delegation_depth,
            permissions: Some(permissions.clone()),
            prompt: prompt.clone(),
            file_access: client.files.clone(),
            retry: self.config.models.retry,
            compaction: self.config.compaction.clone(),
        };
        // An editor watching the agent tree sees the child from before its first event.
        if let Some(observers) = client.children {
            let observer = observers.child_observer(&session, &display);
            session.add_observer(observer);
        }
        if let Some(reporter) = reporter {
            session.add_observer(Arc::new(reporter));
        }
        let handle = spawn_restored(session, restored, deps);
        let child = Agent { handle: handle.clone(), role: Role::Child(Child { permissions, prompt }) };
        self.agents.insert(handle.id().to_string(), child, parent_id);
        handle
    }

    fn live_agent(&self, id: &str) -> Option<AgentHandle> {
        self.agents.get(id).map(|agent| agent.handle)
    }

    fn live_ancestors(&self, id: &str) -> Vec<String> {
        self.agents.ancestors(id)
    }

    fn release(&self, id: &str) {
        self.agents.remove_if(id, |agent| agent.child().is_some()).ok();
    }

    fn agent_now(&self, session_id: &str, name: &str) -> Option<Launch> {
        let (_, agents) = self.root(Some(session_id))?;
        agents.get(name).map(|def| def.launch(&self.defaults))
    }

    fn roll_back<'a>(&'a self, id: &'a str, handle: Option<AgentHandle>) -> futures::future::BoxFuture<'a, ()> {
        Box::pin(async move {
            if let Some(handle) = handle
                && let Err(e) = handle.dispose().await
            {
                tracing::warn!(child = %id, "rolling back a child: {e}");
            }
            self.agents.remove_if(id, |agent| agent.child().is_some()).ok();
            if let Err(e) = self.store.discard_unaccepted(id) {
                tracing::error!(child = %id, "rolling back a child: its log stays: {e}");
            }
        })
    }
}
