//! The runtime: the live agents of one `kin` process and the operations the protocol layer
//! calls (new, prompt, cancel, load, list, shutdown). It knows nothing about ACP.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

use anyhow::Result;
use futures::FutureExt;
use futures::future::BoxFuture;
use serde_json::{Value, json};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use crate::agent::{AgentDeps, AgentHandle, Restored, TurnEnd, spawn_restored};
use crate::config::Config;
use crate::mcp::{McpNotice, McpSession, ServerSpec};
use crate::model::Model;
use crate::model::replay::ReplayModel;
use crate::permission::{PermissionAnswer, PermissionMode, PermissionPrompt, PermissionRequest, Permissions};
use crate::prompt::{self, PromptSettings};
use crate::sandbox::{SandboxPolicy, SessionSandbox};
use crate::session::event;
use crate::session::query::{QueryService, SessionQuery, StoreSource};
use crate::session::{Event, Session, SessionHeader, SessionObserver, SessionStore, StoreError, StoredSession, now_ms};
use crate::slash;
use crate::subagent::agents::{Agents, Defaults, Launch};
use crate::subagent::catalog::{Activity, TreeEntry, list_tree};
use crate::subagent::continuation::{ChildTools, ContinuationManager};
use crate::subagent::control::{InterruptTool, ReportTool, SendMessageTool};
use crate::subagent::external::AcpProvider;
use crate::subagent::inprocess::{ChildDisplay, ChildFactory, ChildSetup, InProcessProvider, ReportToolCalls};
use crate::subagent::list_agents::ListAgentsTool;
use crate::subagent::tools::{DelegateConfig, DelegateTool};
use crate::subagent::{Descriptor, ErrorCode, Lifecycle, SubagentError, SubagentService, ToolFilter};
use crate::tools::bash::BashTool;
use crate::tools::files::FileAccess;
use crate::tools::terminal::Terminals;
use crate::tools::{Tool, ToolRegistry};

/// A request the caller got wrong (maps to invalid params), a session id that names no session
/// (not stored, deleted, or not live where it must be), or a failure of kin itself.
#[derive(Debug, Clone, PartialEq)]
pub enum RuntimeError {
    InvalidParams(String),
    /// The session id.
    NotFound(String),
    Internal(String),
}

impl std::fmt::Display for RuntimeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RuntimeError::InvalidParams(m) | RuntimeError::Internal(m) => f.write_str(m),
            RuntimeError::NotFound(id) => write!(f, "unknown session: {id}"),
        }
    }
}

/// A store error as the runtime reports it: a bad id or a refusal is the caller's, a missing
/// log is not found, anything else is kin's.
fn store_error(e: StoreError) -> RuntimeError {
    match e {
        StoreError::NotFound(id) => RuntimeError::NotFound(id),
        StoreError::InvalidId(_) | StoreError::Refused(_) => RuntimeError::InvalidParams(e.to_string()),
        StoreError::Scan(_) | StoreError::Io(_) => RuntimeError::Internal(e.to_string()),
    }
}

impl std::error::Error for RuntimeError {}

struct Live {
    handle: AgentHandle,
    prompt_in_flight: Arc<AtomicBool>,
    permissions: Arc<Permissions>,
    /// The model route the session's next turn uses.
    model: Mutex<crate::model::ModelRoute>,
    /// The session's MCP servers (its children use them too).
    mcp: Arc<McpSession>,
    /// The named agents its delegation tools offer (its children's too), read when it started.
    agents: Arc<Agents>,
    /// The session's working directory (its workspace slash commands; what its sandbox lets write).
    cwd: Option<PathBuf>,
    /// The sandbox its commands (and its children's) run in.
    sandbox: Arc<SessionSandbox>,
}

/// What the connected client (the editor) offers top-level sessions: a way to ask the user for
/// permission, and its view of files; and, when it watches the agent tree, the observers of child
/// sessions. Set by the protocol layer at `initialize`.
#[derive(Clone, Default)]
pub struct ClientLink {
    pub prompt: Option<Arc<dyn PermissionPrompt>>,
    pub files: Option<Arc<dyn FileAccess>>,
    /// The editor's terminals (`bash` of a top-level session runs unconfined commands there).
    pub terminals: Option<Arc<dyn Terminals>>,
    pub children: Option<Arc<dyn ChildObservers>>,
}

/// Where the `forward` policy of external ACP children asks: the permission mode of the
/// top-level session above the delegating one answers where it decides, else the connected
/// client is asked (looked up when asked: it connects after the runtime is built); with no
/// client connected the question is dismissed.
struct ForwardPrompt(Weak<Runtime>);

impl PermissionPrompt for ForwardPrompt {
    fn ask(&self, request: PermissionRequest) -> BoxFuture<'static, PermissionAnswer> {
        let Some(rt) = self.0.upgrade() else {
            return async { PermissionAnswer::Dismissed }.boxed();
        };
        let decided = rt
            .permissions_of(&request.session_id)
            .and_then(|p| p.decide_forwarded(&request.access, request.in_workspace));
        match (decided, rt.client().prompt) {
            (Some(answer), _) => async move { answer }.boxed(),
            (None, Some(prompt)) => prompt.ask(request),
            (None, None) => async { PermissionAnswer::Dismissed }.boxed(),
        }
    }
}

/// Makes the observer of each child session (the protocol layer's child forwarder).
pub trait ChildObservers: Send + Sync {
    /// Called when a child's agent is about to start, before the child's next event is appended:
    /// the observer may announce the child here.
    fn child_observer(&self, session: &Session, display: &ChildDisplay) -> Arc<dyn SessionObserver>;
}

/// A live child agent, its parent session and its permissions (its parent's, narrowed).
struct Child {
    handle: AgentHandle,
    parent: Option<String>,
    permissions: Arc<Permissions>,
    /// How the child asks the user (its own children ask through it).
    prompt: Option<Arc<dyn PermissionPrompt>>,
}

/// A stored child session of some parent, for an editor reloading the parent.
#[derive(Debug, Clone)]
pub struct ChildRecord {
    pub header: SessionHeader,
    /// The child's own events (from its `seedLength` on; a fork's lineage seed is left out).
    pub events: Vec<Event>,
    /// The descriptor recorded in the child's own events, if it has a readable one.
    pub descriptor: Option<Descriptor>,
    /// True while the child's agent is live in this process.
    pub live: bool,
    /// True while a turn of the live child runs.
    pub running: bool,
}

/// The error for any request but `session/cancel` that names a subagent child.
fn subagent_only(id: &str) -> RuntimeError {
    RuntimeError::InvalidParams(format!("{id} is a subagent session; only session/cancel is allowed on it"))
}

/// What a prompt started.
pub enum Prompted {
    /// A model turn: resolves with how it ended.
    Turn(oneshot::Receiver<TurnEnd>),
    /// A command kin ran itself (`/compact`): resolves with what to tell the user.
    Answer(oneshot::Receiver<String>),
}

/// Awaiting what a prompt started gives how its turn ended (a command: `Completed` once it
/// answered; its text is dropped).
impl std::future::IntoFuture for Prompted {
    type Output = Result<TurnEnd, oneshot::error::RecvError>;
    type IntoFuture = BoxFuture<'static, Self::Output>;

    fn into_future(self) -> Self::IntoFuture {
        match self {
            Prompted::Turn(turn) => turn.boxed(),
            Prompted::Answer(answer) => async move { answer.await.map(|_| TurnEnd::Completed) }.boxed(),
        }
    }
}

/// The sessions of one process.
pub struct Runtime {
    config: Config,
    store: SessionStore,
    model: Arc<dyn Model>,
    /// Every tool an agent may have (children get a filtered view).
    tools: ToolRegistry,
    subagents: Arc<SubagentService>,
    continuation: Arc<ContinuationManager>,
    live: Mutex<HashMap<String, Live>>,
    /// Live child agents (subagents), by session id.
    children: Mutex<HashMap<String, Child>>,
    client: Mutex<ClientLink>,
    /// One gate per session being loaded or resumed: a second load or resume of the same
    /// session waits for the first instead of racing it for the log.
    loading: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Replay: the recorded MCP results that stand in for the servers.
    mcp_recording: Option<Arc<crate::mcp::Recording>>,
    /// The in-process delegation tools as registered (offering only the built-in agents); each
    /// session gets copies offering its own agents.
    delegates: Vec<DelegateTool>,
    /// What the default child runs with (`[subagents]`), which named agents build on.
    defaults: Defaults,
    /// The sandbox settings kin started with (shared by every session's `SessionSandbox`).
    sandbox_settings: Arc<crate::sandbox::SandboxSettings>,
    /// The titles `session/list` shows, cached per log.
    titles: crate::session::Titles,
    /// The catalog's session query (`list_agents` and the agent tree read through it).
    query: Arc<dyn QueryService>,
}

/// The empty file written into a child's cwd whenever a subagent ends, in replay mode.
pub const SETTLED_MARKER: &str = ".dsh-snapshot-subagent-settled";

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

impl Runtime {
    /// The permissions of the live top-level session above `parent` (walking up through live
    /// children), if there is one.
    /// The parent of a live child session.
    pub fn parent_of(&self, id: &str) -> Option<String> {
        self.children().get(id).and_then(|c| c.parent.clone())
    }

    /// The permissions of a live session, top-level or child (a child's are its parent's,
    /// narrowed by its agent).
    fn permissions_of(&self, id: &str) -> Option<Arc<Permissions>> {
        if let Some(child) = self.children().get(id) {
            return Some(child.permissions.clone());
        }
        self.live().get(id).map(|l| l.permissions.clone())
    }

    /// The MCP servers and named agents of the live top-level session at or above `session`.
    fn root(&self, session: Option<&str>) -> Option<(Arc<McpSession>, Arc<Agents>)> {
        self.root_live(session, |live| (live.mcp.clone(), live.agents.clone()))
    }

    /// The sandbox of the live top-level session at or above `session`, if there is one.
    fn root_sandbox(&self, session: Option<&str>) -> Option<Arc<SessionSandbox>> {
        self.root_live(session, |live| live.sandbox.clone())
    }

    /// `pick` of the live top-level session at or above `session` (walking up through live children).
    fn root_live<T>(&self, session: Option<&str>, pick: impl Fn(&Live) -> T) -> Option<T> {
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

    /// `tools` with each delegation tool it holds offering `agents`.
    fn offering(&self, mut tools: ToolRegistry, agents: &Arc<Agents>) -> ToolRegistry {
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
    fn sandboxed(
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
}

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
        self.model.session_loaded(id, session.events());
        Ok((session, restored))
    }

    fn stored_header(&self, id: &str) -> Option<SessionHeader> {
        Runtime::stored_header(self, id)
    }

    fn stored_events(&self, id: &str) -> Result<Vec<Event>, String> {
        self.store.inspect(id).map(|scanned| scanned.events).map_err(|e| e.to_string())
    }

    fn stored_subagents(&self) -> Vec<SessionHeader> {
        self.store
            .list()
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
        self.children()
            .insert(handle.id().to_string(), Child { handle: handle.clone(), parent: parent_id, permissions, prompt });
        handle
    }

    fn live_agent(&self, id: &str) -> Option<AgentHandle> {
        if let Some(live) = self.live().get(id) {
            return Some(live.handle.clone());
        }
        self.children().get(id).map(|c| c.handle.clone())
    }

    fn release(&self, id: &str) {
        self.children().remove(id);
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
            self.children().remove(id);
            if let Err(e) = self.store.discard_unaccepted(id) {
                tracing::error!(child = %id, "rolling back a child: its log stays: {e}");
            }
        })
    }
}

/// Picks the model for a configuration: replay when a scenario directory is given.
pub fn model_for(config: &Config) -> Result<Arc<dyn Model>> {
    if let Some(dir) = &config.replay {
        return Ok(Arc::new(ReplayModel::from_dir(dir)?));
    }
    let store = config.keys.clone();
    let stored: crate::model::retry_log::KeyLookup =
        Arc::new(move |variable: &str| crate::keys::lookup(&|_| None, &store, variable));
    let routed = crate::model::retry_log::Routed::new(&config.model, config.models.clone(), stored)
        .map_err(|e| anyhow::anyhow!("model route {}: {e}", config.model))?;
    Ok(Arc::new(routed))
}

impl Runtime {
    /// Builds the runtime: the subagent service with the `spawn` and `fork` providers (which
    /// create children through this runtime) and the delegation tools on top of `tools`.
    pub fn new(config: Config, model: Arc<dyn Model>, tools: ToolRegistry) -> Result<Arc<Self>> {
        let subagents = Arc::new(SubagentService::new());
        let mcp_recording = config.replay.as_deref().map(|dir| Arc::new(crate::mcp::Recording::from_dir(dir)));
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
            // while this runtime holds its agent).
            let live_set = weak.clone();
            let source = StoreSource::new(SessionStore::new(config.sessions_dir.clone()), move |id: &str| {
                live_set.upgrade().is_some_and(|rt| rt.live_agent(id).is_some())
            });
            let query: Arc<dyn QueryService> = Arc::new(SessionQuery::new(source));
            tools.register(Arc::new(ListAgentsTool(Some(query.clone()))));
            for problem in problems {
                tracing::error!("subagent setup: {problem}");
            }
            let store = SessionStore::new(config.sessions_dir.clone());
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
                live: Mutex::new(HashMap::new()),
                children: Mutex::new(HashMap::new()),
                client: Mutex::new(ClientLink::default()),
                loading: Mutex::new(HashMap::new()),
                mcp_recording,
                sandbox_settings: Arc::new(config.sandbox.clone()),
                titles: crate::session::Titles::default(),
                config,
                query,
            }
        });
        if runtime.config.replay.is_some() {
            // dsh's settlement marker: scenarios fence on it to know a child has ended.
            runtime.subagents.observe(|event| {
                if let Lifecycle::End { cwd: Some(cwd), .. } = event {
                    let marker = Path::new(cwd).join(SETTLED_MARKER);
                    if let Err(e) = std::fs::write(&marker, b"") {
                        tracing::warn!(path = %marker.display(), "cannot write the settlement marker: {e}");
                    }
                }
            });
        }
        Ok(runtime)
    }

    pub fn subagents(&self) -> &Arc<SubagentService> {
        &self.subagents
    }

    pub fn continuation(&self) -> &Arc<ContinuationManager> {
        &self.continuation
    }

    pub fn store(&self) -> &SessionStore {
        &self.store
    }

    /// Each route's context window and price.
    pub fn models(&self) -> Arc<crate::model::capacity::ModelTable> {
        self.config.compaction.models.clone()
    }

    /// Every tool an agent of this runtime may have (how the editor titles and kinds its calls).
    pub fn tools(&self) -> &ToolRegistry {
        &self.tools
    }

    /// What a top-level session's agent runs with.
    fn deps(
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

    /// Connects the client (the editor): sessions created or loaded from now on ask it for
    /// permission and read and write files through it.
    pub fn connect_client(&self, link: ClientLink) {
        *self.client.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = link;
    }

    fn client(&self) -> ClientLink {
        self.client.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// The named agents a live top-level session's delegation tools offer: name and description.
    pub fn session_agents(&self, session_id: &str) -> Option<Vec<(String, String)>> {
        let live = self.live();
        let agents = &live.get(session_id)?.agents;
        Some(agents.iter().map(|def| (def.name.clone(), def.description.clone())).collect())
    }

    /// The permission mode of a live session.
    pub fn permission_mode(&self, session_id: &str) -> Option<PermissionMode> {
        self.live().get(session_id).map(|l| l.permissions.mode())
    }

    /// Changes the permission mode of a live session (it applies to the next tool call).
    pub fn set_permission_mode(&self, session_id: &str, mode: PermissionMode) -> Result<(), RuntimeError> {
        self.reject_child(session_id)?;
        match self.live().get(session_id) {
            Some(entry) => {
                entry.permissions.set_mode(mode);
                // Recorded so that a later `session/load` keeps the mode.
                entry
                    .handle
                    .inject_log(event::SessionMode { mode: mode.id().to_string() })
                    .map_err(|e| RuntimeError::Internal(e.to_string()))?;
                Ok(())
            }
            None => Err(RuntimeError::NotFound(session_id.to_string())),
        }
    }

    /// The sandbox policy of a live session.
    pub fn sandbox(&self, session_id: &str) -> Option<SandboxPolicy> {
        self.live().get(session_id).map(|l| l.sandbox.policy())
    }

    /// Whether a live session's commands run confined by the kernel now.
    pub fn sandbox_in_force(&self, session_id: &str) -> Option<bool> {
        let live = self.live();
        let entry = live.get(session_id)?;
        Some(entry.sandbox.in_force(entry.cwd.as_deref()))
    }

    /// Changes a live session's sandbox (from its next command on) and records it
    /// (`session/sandbox`) so that a later load keeps it, unless kin starts stricter then.
    pub fn set_sandbox(&self, session_id: &str, policy: &str) -> Result<SandboxPolicy, RuntimeError> {
        self.reject_child(session_id)?;
        let live = self.live();
        let entry = live.get(session_id).ok_or_else(|| RuntimeError::NotFound(session_id.to_string()))?;
        let policy = SandboxPolicy::parse_arg(policy).map_err(RuntimeError::InvalidParams)?;
        entry
            .handle
            .inject_log(SessionSandbox::event_body(policy))
            .map_err(|e| RuntimeError::Internal(e.to_string()))?;
        entry.sandbox.set(policy);
        Ok(policy)
    }

    /// How a child below `parent` asks the user: the editor's prompt when it shows child sessions
    /// (the question carries the child's id); otherwise on the parent session (`OnDelegatingCall`:
    /// on the `delegating` call while it runs), through the parent's own way of asking when the
    /// parent is a child.
    fn child_prompt(
        &self,
        client: &ClientLink,
        parent: Option<&str>,
        display: &ChildDisplay,
        delegating: Option<(String, crate::tools::Progress)>,
    ) -> Option<Arc<dyn PermissionPrompt>> {
        let (Some(parent), None) = (parent, client.children.as_ref()) else {
            return client.prompt.clone();
        };
        let above = match self.children().get(parent) {
            Some(child) => child.prompt.clone(),
            None => client.prompt.clone(),
        };
        let title = display.title.clone().unwrap_or_else(|| "subagent".to_string());
        let call = crate::permission::CallShown {
            title,
            tool: "subagent".to_string(),
            access: crate::tools::Access::Delegate,
        };
        above.map(|inner| {
            let asks = crate::permission::OnDelegatingCall {
                inner,
                parent: parent.to_string(),
                delegating: delegating.clone(),
                call,
            };
            Arc::new(asks) as Arc<dyn PermissionPrompt>
        })
    }

    fn children(&self) -> std::sync::MutexGuard<'_, HashMap<String, Child>> {
        self.children.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The live child agents below `id` that are not background children and not below one:
    /// the ones a cancel of `id` reaches.
    fn foreground_descendants(&self, id: &str) -> Vec<AgentHandle> {
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
    fn descendants(&self, id: &str) -> Vec<(String, AgentHandle)> {
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
    fn reject_child(&self, id: &str) -> Result<(), RuntimeError> {
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
    fn stored_header(&self, id: &str) -> Option<SessionHeader> {
        self.store.header(id).ok()
    }

    fn live(&self) -> std::sync::MutexGuard<'_, HashMap<String, Live>> {
        self.live.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Creates a top-level session in `cwd` (absolute) with the config's MCP servers and starts
    /// its agent.
    pub fn new_session(&self, cwd: &Path, observer: Arc<dyn SessionObserver>) -> Result<String, RuntimeError> {
        self.new_session_with(cwd, observer, Vec::new())
    }

    /// `new_session` with the editor's MCP servers (which replace config servers of the same name).
    pub fn new_session_with(
        &self,
        cwd: &Path,
        observer: Arc<dyn SessionObserver>,
        servers: Vec<ServerSpec>,
    ) -> Result<String, RuntimeError> {
        if !cwd.is_absolute() {
            return Err(RuntimeError::InvalidParams(format!("cwd must be an absolute path: {}", cwd.display())));
        }
        let (system, record) = self.session_prompt(cwd)?;
        let id = self.mint_session_id();
        let header = SessionHeader::new(id.clone(), now_ms(), Some(cwd.display().to_string()));
        let mut session = self.store.create(header).map_err(|e| RuntimeError::Internal(e.to_string()))?;
        if record {
            session.push(event::SystemPrompt { text: system.clone() });
        }
        let mcp = self.mcp_for(&mut session, servers);
        // The session exists on disk before the client learns its id.
        if let Err(e) = session.flush() {
            session.discard();
            return Err(RuntimeError::Internal(format!("cannot create the session log: {e:#}")));
        }
        session.add_observer(observer);
        self.start(session, system, mcp, Restored::none());
        Ok(id)
    }

    /// Starts a session's MCP servers (the config's, each replaced by the editor's server of the
    /// same name), and records which ones it has when it has any or had some.
    fn mcp_for(&self, session: &mut Session, editor: Vec<ServerSpec>) -> Arc<McpSession> {
        let specs = crate::mcp::merge(&self.config.mcp_servers, editor);
        let had = session.events().iter().any(|e| e.kind == crate::session::Kind::McpServers);
        if !specs.is_empty() || had {
            session.push(McpSession::describe(&specs));
        }
        let cwd = session.header.cwd.clone().map(Into::into);
        McpSession::start(specs, cwd, self.config.mcp, self.mcp_recording.clone())
    }

    /// The notices of a live session's MCP servers (once: whoever tells the user takes them).
    pub fn take_mcp_notices(&self, session_id: &str) -> Option<tokio::sync::mpsc::UnboundedReceiver<McpNotice>> {
        self.live().get(session_id).and_then(|l| l.mcp.take_notices())
    }

    /// Starts the agent of a top-level session. A session whose log (or fork seed) records a
    /// mode chosen with `session/set_mode` gets it back, but never one more permissive than the
    /// mode kin was started in; one that records a model chosen in the editor gets that route.
    /// `restored` turns wait for `run_restored`.
    fn start(&self, session: crate::session::Session, system: String, mcp: Arc<McpSession>, restored: Restored) {
        let id = session.id().to_string();
        let ceiling = self.config.permission_mode;
        let mode = match event::last::<event::SessionMode>(session.events())
            .and_then(|m| PermissionMode::parse(&m.mode))
        {
            Some(mode) if mode.capped_at(ceiling) != mode => {
                tracing::info!(session = %id, recorded = mode.id(), mode = ceiling.id(), "restoring the session in the mode kin was started in, not its more permissive recorded one");
                ceiling
            }
            Some(mode) => mode,
            None => ceiling,
        };
        let route = event::last::<event::SessionModel>(session.events())
            .map(|m| crate::model::ModelRoute { provider: m.provider, model: m.model })
            .unwrap_or_else(|| self.config.model.clone());
        let permissions = Arc::new(Permissions::new(mode));
        // The session's named agents: its workspace's files over the config's and the user's.
        let agents = Arc::new(Agents::load(&self.config.agents, session.header.cwd.as_deref().map(Path::new)));
        // A sandbox chosen before a restart stays chosen, unless kin was started stricter.
        let recorded =
            event::last::<event::SandboxChoice>(session.events()).and_then(|c| SessionSandbox::from_event(&c));
        let sandbox = Arc::new(SessionSandbox::restored(self.sandbox_settings.clone(), recorded));
        let workspace = session.header.cwd.clone();
        let mut deps = self.deps(&permissions, &mcp, &agents, &sandbox, workspace.as_deref(), system);
        deps.route = route.clone();
        let cwd = session.header.cwd.as_deref().map(PathBuf::from);
        let handle = spawn_restored(session, restored, deps);
        let model = Mutex::new(route);
        let prompt_in_flight = Arc::new(AtomicBool::new(false));
        let live = Live { handle, prompt_in_flight, permissions, model, mcp, agents, sandbox, cwd };
        self.live().insert(id, live);
    }

    /// A new top-level session's system prompt, and whether to record it: the scenario's pinned
    /// prompt in replay (recorded), else the built prompt (recorded, except in replay, where it
    /// would make transcripts depend on the date).
    fn session_prompt(&self, cwd: &Path) -> Result<(String, bool), RuntimeError> {
        let pinned = self.config.replay.as_deref().map(prompt::pinned);
        if let Some(Some(text)) = pinned {
            return Ok((text.replace("{{cwd}}", &cwd.display().to_string()), true));
        }
        let built = self
            .build_prompt(Some(cwd), &self.tools, self.config.persona.as_deref(), self.config.permission_mode)
            .map_err(RuntimeError::Internal)?;
        Ok((built, pinned.is_none()))
    }

    /// The built system prompt for a workspace and tools, with a persona section when one is
    /// given.
    fn build_prompt(
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

    /// A new session id: the model's pinned id (replay) unless already used, else a UUID.
    fn mint_session_id(&self) -> String {
        while let Some(id) = self.model.next_session_id() {
            if matches!(self.store.locate(&id), Ok(None)) && !self.live().contains_key(&id) {
                return id;
            }
        }
        uuid::Uuid::new_v4().to_string()
    }

    /// Starts a user turn (or runs a command kin handles itself, `/compact`). One prompt per
    /// session.
    pub fn prompt(&self, session_id: &str, content: Vec<Value>) -> Result<Prompted, RuntimeError> {
        self.reject_child(session_id)?;
        // Command files are read before the live table is locked.
        let cwd = self.live().get(session_id).map(|l| l.cwd.clone()).unwrap_or_default();
        let content = match self.slash_expansion(cwd.as_deref(), &content) {
            Some(slash::Expansion::Prompt(text)) => {
                let mut content = content;
                content[0] = json!({"type": "text", "text": text});
                content
            }
            Some(slash::Expansion::Compact(focus)) => return self.compact(session_id, focus),
            None => content,
        };
        let live = self.live();
        let Some(entry) = live.get(session_id) else {
            return Err(RuntimeError::NotFound(session_id.to_string()));
        };
        if entry.prompt_in_flight.swap(true, Ordering::SeqCst) {
            return Err(RuntimeError::InvalidParams("a prompt is already in flight for this session".into()));
        }
        let turn = entry.handle.followup(content, json!({"kind": "user"})).map_err(|e| {
            entry.prompt_in_flight.store(false, Ordering::SeqCst);
            RuntimeError::Internal(e.to_string())
        })?;
        let flag = entry.prompt_in_flight.clone();
        let (tx, rx) = oneshot::channel();
        // `title_model`: a title after the turn that wrote the fallback one (never in replay).
        let titler = match (&self.config.title_model, &self.config.replay) {
            (Some(route), None) => Some((self.model.clone(), route.clone(), entry.handle.clone())),
            _ => None,
        };
        tokio::spawn(async move {
            let end = turn.await.unwrap_or(TurnEnd::Disposed);
            flag.store(false, Ordering::SeqCst);
            let completed = end == TurnEnd::Completed;
            let _ = tx.send(end);
            if let Some((model, route, handle)) = titler.filter(|_| completed) {
                let basis = handle.read(|session| crate::title::basis(session.events())).await.ok().flatten();
                if let Some(basis) = basis
                    && let Some(title) = crate::title::ask(model, route, handle.id(), &basis).await
                {
                    let _ = handle.inject_log(title);
                }
            }
        });
        Ok(Prompted::Turn(rx))
    }

    /// `/compact [focus]`: compacts the session's history now; busy (nothing written) while a
    /// turn runs or another prompt is in flight. Holds the session's prompt slot meanwhile.
    fn compact(&self, session_id: &str, focus: String) -> Result<Prompted, RuntimeError> {
        let live = self.live();
        let Some(entry) = live.get(session_id) else {
            return Err(RuntimeError::NotFound(session_id.to_string()));
        };
        let (tx, rx) = oneshot::channel();
        if entry.handle.is_running() || entry.prompt_in_flight.swap(true, Ordering::SeqCst) {
            let _ = tx.send(crate::agent::compact::Manual::Busy.text());
            return Ok(Prompted::Answer(rx));
        }
        let (handle, flag) = (entry.handle.clone(), entry.prompt_in_flight.clone());
        let focus = Some(focus).filter(|f| !f.trim().is_empty());
        tokio::spawn(async move {
            let text = match handle.compact(focus).await {
                Ok(outcome) => outcome.text(),
                Err(gone) => format!("Compaction did not run: {gone}."),
            };
            flag.store(false, Ordering::SeqCst);
            let _ = tx.send(text);
        });
        Ok(Prompted::Answer(rx))
    }

    /// The slash commands a live top-level session offers (built-ins, then its workspace's and
    /// the user's command files); none for an unknown session.
    pub fn slash_commands(&self, session_id: &str) -> Vec<slash::SlashCommand> {
        let Some(cwd) = self.live().get(session_id).map(|l| l.cwd.clone()) else {
            return Vec::new();
        };
        slash::discover(&slash::dirs(cwd.as_deref(), &self.config.command_dirs))
    }

    /// What a prompt whose first text invokes a known slash command becomes (`None`: not an
    /// invocation, or of no command the session offers; it goes to the model as it is).
    fn slash_expansion(&self, cwd: Option<&Path>, content: &[Value]) -> Option<slash::Expansion> {
        let text = content.first().filter(|b| b["type"] == "text")?["text"].as_str()?;
        let (name, arguments, after) = slash::invocation(text)?;
        let commands = slash::discover(&slash::dirs(cwd, &self.config.command_dirs));
        let command = commands.iter().find(|c| c.name == name)?;
        Some(slash::expand(command, arguments, after))
    }

    /// `session/cancel` (seed 003): cancels the running turn of a session and of its foreground
    /// children (the one-shot children below it, and theirs); the turns a background
    /// (continuable) child accepted go on. Naming a background child itself (the editor's cancel
    /// in the agent tree) stops its turn and discards its queued messages. Unknown ids are
    /// ignored.
    pub fn cancel(&self, session_id: &str) {
        if let Some(entry) = self.live().get(session_id) {
            entry.handle.cancel();
        }
        if !self.continuation.cancel_child(session_id)
            && let Some(child) = self.children().get(session_id)
        {
            child.handle.cancel();
        }
        for handle in self.foreground_descendants(session_id) {
            handle.cancel();
        }
    }

    /// Starts the work a loaded (or resumed) session came back with, after its response: its own
    /// pending inbox messages, in order, and each stored background child below it that has
    /// messages pending (cold-resumed, parents first). Nothing to do for a session that was live.
    pub async fn run_restored(&self, session_id: &str) {
        let handle = self.live().get(session_id).map(|l| l.handle.clone());
        let Some(handle) = handle else { return };
        // The turns of a top-level session have no waiter: their results are in its log.
        let _ = handle.wake().await;
        let route = self.session_model(session_id).unwrap_or_else(|| self.config.model.clone());
        self.continuation.restore_below(session_id, &route).await;
    }

    /// Loads a stored session (repairing a crash-interrupted turn), returns its events for
    /// replay to the client, and makes it live. A live idle session is flushed and reloaded. A
    /// load or resume of the same session already under way is waited for first.
    pub async fn load_session(
        &self,
        session_id: &str,
        observer: Arc<dyn SessionObserver>,
        servers: Vec<ServerSpec>,
    ) -> Result<Arc<Vec<Event>>, RuntimeError> {
        let gate = self.load_gate(session_id);
        let loaded = {
            let _turn = gate.lock().await;
            self.load_now(session_id, observer, servers).await
        };
        self.release_load_gate(session_id, gate);
        loaded
    }

    /// The gate of `session_id`'s loads and resumes.
    fn load_gate(&self, session_id: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut loading = self.loading.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        loading.entry(session_id.to_string()).or_default().clone()
    }

    /// Drops a gate; the last holder removes it (holders clone it under the same lock).
    fn release_load_gate(&self, session_id: &str, gate: Arc<tokio::sync::Mutex<()>>) {
        let mut loading = self.loading.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        drop(gate);
        if loading.get(session_id).is_some_and(|g| Arc::strong_count(g) == 1) {
            loading.remove(session_id);
        }
    }

    /// `load_session` with the session's gate held.
    async fn load_now(
        &self,
        session_id: &str,
        observer: Arc<dyn SessionObserver>,
        servers: Vec<ServerSpec>,
    ) -> Result<Arc<Vec<Event>>, RuntimeError> {
        self.reject_child(session_id)?;
        let existing = {
            let mut live = self.live();
            match live.get(session_id) {
                Some(entry) if entry.prompt_in_flight.load(Ordering::SeqCst) => {
                    return Err(RuntimeError::InvalidParams(format!(
                        "session {session_id} has a prompt in flight; cancel it before loading"
                    )));
                }
                Some(_) => live.remove(session_id),
                None => None,
            }
        };
        if let Some(entry) = existing {
            entry.handle.shutdown().await;
            entry.mcp.close().await;
        }
        let mut session = self.store.load(session_id).map_err(store_error)?;
        if session.header.parent_session.is_some() && session.header.origin.as_deref() == Some("subagent") {
            return Err(subagent_only(session_id));
        }
        // Its inbox is read back first: what settles without a turn is in the replayed history.
        let restored = crate::agent::prepare(&mut session)
            .map_err(|e| RuntimeError::Internal(format!("session {session_id} cannot be loaded: {e}")))?;
        let events = session.snapshot();
        self.model.session_loaded(session_id, &events);
        // A resumed session keeps the prompt it was created with.
        let system = match prompt::recorded(&events) {
            Some(text) => text,
            None => {
                let cwd = session.header.cwd.as_deref().map(Path::new);
                self.build_prompt(cwd, &self.tools, self.config.persona.as_deref(), self.config.permission_mode)
                    .map_err(RuntimeError::Internal)?
            }
        };
        let mcp = self.mcp_for(&mut session, servers);
        session.add_observer(observer);
        self.start(session, system, mcp, restored);
        Ok(events)
    }

    /// The key a new session's route needs and nobody has given (neither the environment nor
    /// `kin login`); never in replay, whose model needs none.
    pub fn missing_key(&self) -> Option<crate::model::MissingKey> {
        self.model.missing_key(&self.config.model)
    }

    /// Whether the route a live session's next turn uses takes images (false for an unknown
    /// session).
    pub fn takes_images(&self, session_id: &str) -> bool {
        self.session_model(session_id)
            .is_some_and(|route| crate::model::router::takes_images(&route, &self.config.models))
    }

    /// The routes a session may switch to.
    pub fn model_choices(&self) -> &[crate::model::ModelRoute] {
        &self.config.model_choices
    }

    /// The route a live session's next turn uses.
    pub fn session_model(&self, session_id: &str) -> Option<crate::model::ModelRoute> {
        self.live().get(session_id).map(|l| l.model.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone())
    }

    /// Switches a live session's model from its next turn on, and records the choice in its log
    /// (`session/model`) so a later `session/load` keeps it.
    pub fn set_model(&self, session_id: &str, route: &str) -> Result<crate::model::ModelRoute, RuntimeError> {
        self.reject_child(session_id)?;
        if !self.live().contains_key(session_id) {
            return Err(RuntimeError::NotFound(session_id.to_string()));
        }
        let route = crate::model::ModelRoute::parse(route).map_err(RuntimeError::InvalidParams)?;
        if !self.config.model_choices.contains(&route) {
            let valid: Vec<String> = self.config.model_choices.iter().map(ToString::to_string).collect();
            return Err(RuntimeError::InvalidParams(format!(
                "unknown model {route}; choose one of: {}",
                valid.join(", ")
            )));
        }
        let live = self.live();
        let entry = live.get(session_id).ok_or_else(|| RuntimeError::NotFound(session_id.to_string()))?;
        entry.handle.set_route(route.clone()).map_err(|e| RuntimeError::Internal(e.to_string()))?;
        *entry.model.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = route.clone();
        entry
            .handle
            .inject_log(event::SessionModel { provider: route.provider.clone(), model: route.model.clone() })
            .map_err(|e| RuntimeError::Internal(e.to_string()))?;
        Ok(route)
    }

    /// Reattaches a session without replay (`session/resume`): a live session stays as it is
    /// (its observer keeps forwarding), a stored one is loaded and made live with `observer`.
    /// Returns the events of a session it loaded (none for a live one). A load or resume of the
    /// same session already under way is waited for first (and then usually finds it live).
    pub async fn resume_session(
        &self,
        session_id: &str,
        observer: Arc<dyn SessionObserver>,
        servers: Vec<ServerSpec>,
    ) -> Result<Arc<Vec<Event>>, RuntimeError> {
        self.reject_child(session_id)?;
        let live = self.live().get(session_id).map(|l| (l.mcp.clone(), l.handle.clone()));
        if let Some((mcp, handle)) = live {
            // The servers named now replace other ones (the agent keeps running).
            let specs = crate::mcp::merge(&self.config.mcp_servers, servers);
            if specs != mcp.specs() {
                let _ = handle.inject_log(McpSession::describe(&specs));
                mcp.replace(specs).await;
            }
            return Ok(Arc::default());
        }
        let gate = self.load_gate(session_id);
        let resumed = {
            let _turn = gate.lock().await;
            if self.live().contains_key(session_id) {
                Ok(Arc::default())
            } else {
                self.load_now(session_id, observer, servers).await
            }
        };
        self.release_load_gate(session_id, gate);
        resumed
    }

    /// Closes a live top-level session (`session/close`): drains its continuable children through
    /// the continuation manager, stops every other child below it, then stops its agent
    /// (cancelling a running turn, whose prompt answers `cancelled`), flushes its log and frees
    /// it. The session stays on disk and can be loaded again.
    pub async fn close_session(&self, session_id: &str) -> Result<(), RuntimeError> {
        self.reject_child(session_id)?;
        let removed = self.live().remove(session_id);
        let Some(entry) = removed else {
            return Err(RuntimeError::NotFound(session_id.to_string()));
        };
        entry.handle.stop();
        self.continuation.close_descendants(session_id).await;
        for (id, handle) in self.descendants(session_id) {
            handle.shutdown().await;
            self.children().remove(&id);
        }
        entry.handle.shutdown().await;
        entry.mcp.close().await;
        Ok(())
    }

    /// Forks a top-level session (`session/fork`): a new top-level session in `cwd` seeded with
    /// the source's completed turns as they are on disk (the prompt it was created with comes
    /// along), in the source's recorded mode and model as `start` restores them. Returns the new
    /// session's id.
    pub fn fork_session(
        &self,
        source_id: &str,
        cwd: &Path,
        observer: Arc<dyn SessionObserver>,
        servers: Vec<ServerSpec>,
    ) -> Result<String, RuntimeError> {
        self.reject_child(source_id)?;
        if !cwd.is_absolute() {
            return Err(RuntimeError::InvalidParams(format!("cwd must be an absolute path: {}", cwd.display())));
        }
        let source = self.store.inspect(source_id).map_err(store_error)?;
        let seed = crate::agent::completed_prefix(&source.events).to_vec();
        let system = match prompt::recorded(&seed) {
            Some(text) => text,
            None => self
                .build_prompt(Some(cwd), &self.tools, self.config.persona.as_deref(), self.config.permission_mode)
                .map_err(RuntimeError::Internal)?,
        };
        let id = self.mint_session_id();
        let mut header = SessionHeader::new(id.clone(), now_ms(), Some(cwd.display().to_string()));
        header.seed_length = (!seed.is_empty()).then_some(seed.len() as u64);
        let mut session = self.store.create_seeded(header, seed).map_err(|e| RuntimeError::Internal(e.to_string()))?;
        let mcp = self.mcp_for(&mut session, servers);
        if let Err(e) = session.flush() {
            session.discard();
            return Err(RuntimeError::Internal(format!("cannot create the session log: {e:#}")));
        }
        session.add_observer(observer);
        self.start(session, system, mcp, Restored::none());
        Ok(id)
    }

    /// Deletes a stored top-level session and its subagent sessions (`session/delete`): refused
    /// for a child id, a session live here (close it first) and one whose log another kin writes.
    /// The logs are gone from disk when it returns.
    pub fn delete_session(&self, session_id: &str) -> Result<(), RuntimeError> {
        self.reject_child(session_id)?;
        if self.live().contains_key(session_id) {
            return Err(RuntimeError::InvalidParams(format!(
                "session {session_id} is open; close it (session/close) before deleting it"
            )));
        }
        let removed = self.store.delete(session_id).map_err(store_error)?;
        tracing::info!(session = %session_id, children = removed.len() - 1, "deleted a session");
        Ok(())
    }

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
        let running = self.children().get(id).is_some_and(|c| c.handle.is_running());
        Some(ChildRecord { header: scanned.header, events, descriptor, live: activity == Activity::Running, running })
    }

    /// Top-level sessions (never children), newest first, optionally only those in `cwd`.
    /// The title of a stored session (its last `session/title`; cached per log).
    pub fn session_title(&self, stored: &StoredSession) -> Option<String> {
        self.titles.title(stored)
    }

    pub fn list_sessions(&self, cwd: Option<&Path>) -> Vec<StoredSession> {
        self.store.list_top_level(cwd)
    }

    /// Drains continuable children (child-first), then stops every agent (cancelling running
    /// turns) and flushes every session.
    pub async fn shutdown(&self) {
        // Nothing starts a new turn from here on: what is queued stays pending in the logs.
        for live in self.live().values() {
            live.handle.stop();
        }
        self.continuation.drain().await;
        let children: Vec<AgentHandle> = self.children().drain().map(|(_, c)| c.handle).collect();
        futures::future::join_all(children.iter().map(AgentHandle::shutdown)).await;
        let live: Vec<Live> = self.live().drain().map(|(_, l)| l).collect();
        futures::future::join_all(live.iter().map(|l| l.handle.shutdown())).await;
        // The MCP servers go last: an agent winding down may still call them.
        futures::future::join_all(live.iter().map(|l| l.mcp.close())).await;
    }

    /// Checks that the model served everything it expected (replay).
    pub fn check_model_consumed(&self) -> Result<(), String> {
        self.model.check_consumed()
    }
}
