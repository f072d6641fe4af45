//! What an agent runs with: its tools (delegation offering its named agents, `bash` in its
//! sandbox), its system prompt and its `AgentDeps`.

use std::path::Path;
use std::sync::Arc;

use anyhow::Result;

use super::Runtime;
use crate::agent::AgentDeps;
use crate::mcp::McpSession;
use crate::permission::{PermissionMode, Permissions};
use crate::prompt::{self, PromptSettings};
use crate::sandbox::SessionSandbox;
use crate::subagent::agents::Agents;
use crate::tools::bash::BashTool;
use crate::tools::terminal::Terminals;
use crate::tools::{Tool, ToolRegistry};

impl Runtime {
    /// `tools` with each delegation tool it holds offering `agents`.
    pub(super) fn offering(&self, mut tools: ToolRegistry, agents: &Arc<Agents>) -> ToolRegistry {
        for base in &self.delegates {
            if tools.get(base.name()).is_some()
                && let Some(tool) = base.with_agents(agents.clone())
            {
                tools.register(Arc::new(tool));
            }
        }
        tools
    }

    /// `tools` with `bash` (when present) running in `sandbox`, for a session in `cwd`, and its
    /// unconfined commands in the editor's `terminals` when given (top-level sessions only: the
    /// editor shows a terminal in a session it knows).
    pub(super) fn sandboxed(
        mut tools: ToolRegistry,
        sandbox: &Arc<SessionSandbox>,
        cwd: Option<&str>,
        terminals: Option<Arc<dyn Terminals>>,
    ) -> ToolRegistry {
        if tools.get("bash").is_some() {
            let workspace = cwd.map(std::path::PathBuf::from);
            let bash = BashTool::with_sandbox(sandbox.clone(), workspace).with_terminals(terminals);
            tools.register(Arc::new(bash));
        }
        tools
    }

    /// What a top-level session's agent runs with.
    pub(super) fn deps(
        &self,
        permissions: &Arc<Permissions>,
        mcp: &Arc<McpSession>,
        agents: &Arc<Agents>,
        sandbox: &Arc<SessionSandbox>,
        cwd: Option<&str>,
        system: String,
    ) -> AgentDeps {
        let client = self.client();
        let mut tools = self.offering(self.tools.clone(), agents);
        tools.add_source(mcp.clone(), None);
        AgentDeps {
            model: self.model.clone(),
            tools: Self::sandboxed(tools, sandbox, cwd, client.terminals.clone()),
            route: self.config.model.clone(),
            system,
            max_steps: self.config.max_steps,
            max_parallel_tools: self.config.max_parallel_tools,
            depth: 0,
            permissions: Some(permissions.clone()),
            prompt: client.prompt,
            file_access: client.files,
            retry: self.config.models.retry,
            compaction: self.config.compaction.clone(),
        }
    }

    /// The built system prompt for a workspace and tools, with a persona section when one is
    /// given.
    pub(super) fn build_prompt(
        &self,
        cwd: Option<&Path>,
        tools: &ToolRegistry,
        persona: Option<&str>,
        mode: PermissionMode,
    ) -> Result<String, String> {
        let date = prompt::today();
        prompt::build(&PromptSettings {
            cwd,
            mode,
            guidance: &tools.guidance(),
            persona,
            system_prompt_file: self.config.system_prompt_file.as_deref(),
            date: &date,
        })
    }
}
