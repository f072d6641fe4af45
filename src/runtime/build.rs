//! The composition root: `Runtime::new` (and `with_backend`, with a key check or a replay's
//! fixture) wires the subagent
//! service, its providers (`spawn`, `fork`, every `[acp_agents.*]`), the delegation and control
//! tools and the catalog's query.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use anyhow::Result;

use super::permission::ForwardPrompt;
use super::{ClientLink, Runtime};
use crate::config::Config;
use crate::model::Model;
use crate::model::routed::Routed;
use crate::scenario::fixture::Fixture;
use crate::session::SessionStore;
use crate::session::query::{QueryService, SessionQuery, StoreSource};
use crate::subagent::agents::Defaults;
use crate::subagent::continuation::{ChildTools, ContinuationManager};
use crate::subagent::control::{InterruptTool, ReportTool, SendMessageTool};
use crate::subagent::external::AcpProvider;
use crate::subagent::inprocess::{ChildFactory, InProcessProvider};
use crate::subagent::list_agents::ListAgentsTool;
use crate::subagent::tools::{DelegateConfig, DelegateTool};
use crate::subagent::{SubagentService, ToolFilter};
use crate::tools::{Tool, ToolRegistry};

fn delegate_config(config: &Config, tool_name: &str, provider: &str) -> DelegateConfig {
    let s = &config.subagents;
    let tool_filter = (s.allow_tools.is_some() || s.deny_tools.is_some())
        .then(|| ToolFilter { allow: s.allow_tools.clone(), deny: s.deny_tools.clone() });
    DelegateConfig {
        tool_name: tool_name.into(),
        provider: provider.into(),
        max_depth: Some(s.max_depth),
        persona: s.persona.clone(),
        tool_filter,
        route: s.model.clone(),
        output_schema: s.output_schema.clone(),
        note: None,
        external: false,
    }
}

/// The delegation tool of an external ACP agent: none of the start-time capabilities, no
/// background mode.
fn acp_delegate_config(agent: &crate::subagent::external::ExternalAgentConfig) -> DelegateConfig {
    DelegateConfig {
        tool_name: agent.tool_name.clone(),
        provider: agent.name.clone(),
        max_depth: None,
        persona: None,
        tool_filter: None,
        route: None,
        output_schema: None,
        note: Some(agent.tool_note()),
        external: true,
    }
}

/// What a runtime runs on besides its tools.
pub(crate) struct Backend {
    pub(crate) model: Arc<dyn Model>,
    /// The HTTP models' key check (`Runtime::missing_key`); none for other models.
    pub(crate) keys: Option<Arc<Routed>>,
    /// A replay's hooks.
    pub(crate) fixture: Option<Arc<dyn Fixture>>,
}

impl Runtime {
    /// Builds the runtime: the subagent service with the `spawn` and `fork` providers (which
    /// create children through this runtime) and the delegation tools on top of `tools`.
    /// Without a key check or a fixture.
    pub fn new(config: Config, model: Arc<dyn Model>, tools: ToolRegistry) -> Result<Arc<Self>> {
        Self::with_backend(config, Backend { model, keys: None, fixture: None }, tools)
    }

    /// Builds the runtime on `backend`: with a fixture (a replay's, see `scenario::fixture`),
    /// its hooks pin new session ids and the system prompt, hear loads and settlements, stand in
    /// for the MCP servers and make the end check.
    pub(crate) fn with_backend(config: Config, backend: Backend, tools: ToolRegistry) -> Result<Arc<Self>> {
        let Backend { model, keys, fixture } = backend;
        let subagents = Arc::new(SubagentService::new());
        let mcp_recording = fixture.as_ref().and_then(|f| f.mcp_recording());
        let runtime = Arc::new_cyclic(|weak: &std::sync::Weak<Runtime>| {
            let factory: std::sync::Weak<dyn ChildFactory> = weak.clone();
            let report_tool: ChildTools = Arc::new(|m| vec![Arc::new(ReportTool(m.clone())) as Arc<dyn Tool>]);
            let continuation = Arc::new(ContinuationManager::new(
                subagents.clone(),
                factory.clone(),
                config.subagents.continuation,
                report_tool,
            ));
            let providers: [Arc<dyn crate::subagent::SubagentProvider>; 2] =
                [Arc::new(InProcessProvider::spawn(factory.clone())), Arc::new(InProcessProvider::fork(factory))];
            let mut tools = tools;
            let mut problems = Vec::new();
            let mut delegates = Vec::new();
            for (provider, tool_name) in providers.into_iter().zip(["subagent", "subagent_fork"]) {
                let provider_name = provider.name().to_string();
                if let Err(e) = subagents.register_provider(provider) {
                    problems.push(e.to_string());
                }
                let background = config.subagents.background.then(|| continuation.clone());
                match DelegateTool::new(
                    delegate_config(&config, tool_name, &provider_name),
                    subagents.clone(),
                    background,
                ) {
                    Ok(tool) => {
                        tools.register(Arc::new(tool.clone()));
                        delegates.push(tool);
                    }
                    Err(e) => problems.push(e.to_string()),
                }
            }
            tools.register(Arc::new(SendMessageTool(continuation.clone())));
            tools.register(Arc::new(InterruptTool(continuation.clone())));
            // `[acp_agents.NAME]`: provider `acp:NAME` and its delegation tool.
            for agent in &config.acp_agents {
                if let Err(e) = subagents.register_provider(Arc::new(
                    AcpProvider::new(agent.clone(), crate::acp::external_agents())
                        .forwarding_to(Arc::new(ForwardPrompt(weak.clone()))),
                )) {
                    problems.push(e.to_string());
                    continue;
                }
                if tools.get(&agent.tool_name).is_some() {
                    problems.push(format!(
                        "ACP agent {}: a tool named {:?} already exists, so it gets no delegation tool",
                        agent.name, agent.tool_name
                    ));
                    continue;
                }
                match DelegateTool::new(acp_delegate_config(agent), subagents.clone(), None) {
                    Ok(tool) => tools.register(Arc::new(tool)),
                    Err(e) => problems.push(e.to_string()),
                }
            }
            // The catalog's session query: this runtime's store, live preferred (a session is live
            // while this runtime holds its agent), with the derived catalog index of the sessions
            // directory (the first listing after a start opens no unchanged child log).
            let live_set = weak.clone();
            let source = StoreSource::new(SessionStore::new(config.sessions_dir.clone()), move |id: &str| {
                live_set.upgrade().is_some_and(|rt| rt.live_agent(id).is_some())
            })
            .with_index();
            // Every log this runtime writes is reported to the query, which keeps the index current.
            let watch = source.watch();
            let query = Arc::new(SessionQuery::new(source));
            tools.register(Arc::new(ListAgentsTool(Some(query.clone() as Arc<dyn QueryService>))));
            for problem in problems {
                tracing::error!("subagent setup: {problem}");
            }
            let store = SessionStore::new(config.sessions_dir.clone()).watched(watch);
            let default_child = delegate_config(&config, "subagent", "spawn");
            let defaults = Defaults {
                persona: default_child.persona,
                tool_filter: default_child.tool_filter,
                route: default_child.route,
            };
            Runtime {
                delegates,
                defaults,
                store,
                model,
                tools,
                subagents: subagents.clone(),
                continuation,
                agents: Default::default(),
                client: Mutex::new(ClientLink::default()),
                loading: Mutex::new(HashMap::new()),
                closing: Mutex::new(std::collections::HashSet::new()),
                opening: Mutex::new(HashMap::new()),
                mcp_recording,
                fixture,
                keys,
                sandbox_settings: Arc::new(config.sandbox.clone()),
                config,
                query,
            }
        });
        runtime.report_settlements();
        Ok(runtime)
    }
}
