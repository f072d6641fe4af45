//! The runtime: the live agents of one `kin` process and the operations the protocol layer
//! calls (new, prompt, cancel, load, list, shutdown). It knows nothing about ACP.

mod agents;
mod build;
mod deps;
mod error;
mod factory;
mod listing;
mod load;
mod permission;
mod replay;
mod sessions;
mod settings;
mod tree;
mod turns;
mod view;

pub(crate) use error::RuntimeError;
pub(crate) use sessions::absolute_cwd;
pub(crate) use turns::Prompted;
pub(crate) use view::{Loaded, SessionView};

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::config::Config;
use crate::model::Model;
use crate::permission::PermissionPrompt;
use crate::session::query::{SessionQuery, StoreSource};
use crate::session::{Event, Session, SessionHeader, SessionObserver, SessionStore};
use crate::subagent::agents::Defaults;
use crate::subagent::continuation::ContinuationManager;
use crate::subagent::inprocess::ChildDisplay;
use crate::subagent::tools::DelegateTool;
use crate::subagent::{Descriptor, SubagentService};
use crate::tools::ToolRegistry;
use crate::tools::files::FileAccess;
use crate::tools::terminal::Terminals;

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

/// Makes the observer of each child session (the protocol layer's child forwarder).
pub trait ChildObservers: Send + Sync {
    /// Called when a child's agent is about to start, before the child's next event is appended:
    /// the observer may announce the child here.
    fn child_observer(&self, session: &Session, display: &ChildDisplay) -> Arc<dyn SessionObserver>;
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

/// The sessions of one process.
pub struct Runtime {
    config: Config,
    store: SessionStore,
    model: Arc<dyn Model>,
    /// Every tool an agent may have (children get a filtered view).
    tools: ToolRegistry,
    subagents: Arc<SubagentService>,
    continuation: Arc<ContinuationManager>,
    /// Every live agent, top-level and child, with its parent link and role.
    agents: agents::Registry,
    client: Mutex<ClientLink>,
    /// One gate per session being loaded or resumed: a second load or resume of the same
    /// session waits for the first instead of racing it for the log.
    loading: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Per session, the loads and resumes read and not answered yet (`Runtime::opening`).
    opening: Mutex<HashMap<String, usize>>,
    /// The sessions whose `session/close` was read and has not finished: no longer live, their
    /// load gate held until their agents are stopped and their logs closed.
    closing: Mutex<std::collections::HashSet<String>>,
    /// Replay: the recorded MCP results that stand in for the servers.
    mcp_recording: Option<Arc<crate::mcp::Recording>>,
    /// A replay's hooks (`scenario::fixture`); none in a real run.
    fixture: Option<Arc<dyn crate::scenario::fixture::Fixture>>,
    /// The HTTP models' key check; none for other models (replay and scripted need no key).
    keys: Option<Arc<crate::model::routed::Routed>>,
    /// The in-process delegation tools as registered (offering only the built-in agents); each
    /// session gets copies offering its own agents.
    delegates: Vec<DelegateTool>,
    /// What the default child runs with (`[subagents]`), which named agents build on.
    defaults: Defaults,
    /// The sandbox settings kin started with (shared by every session's `SessionSandbox`).
    sandbox_settings: Arc<crate::sandbox::SandboxSettings>,
    /// The catalog's session query (`list_agents`, the agent tree and `session/list` read
    /// through it).
    query: Arc<SessionQuery<StoreSource>>,
}

impl Runtime {
    pub fn subagents(&self) -> &Arc<SubagentService> {
        &self.subagents
    }

    pub fn continuation(&self) -> &Arc<ContinuationManager> {
        &self.continuation
    }

    pub fn store(&self) -> &SessionStore {
        &self.store
    }

    /// The catalog's session query (a test's fence holds its cache).
    #[cfg(test)]
    pub(crate) fn query(&self) -> &SessionQuery<StoreSource> {
        &self.query
    }

    /// A runtime keeping its sessions under `dir/sessions`, with a model that is never called.
    #[cfg(test)]
    pub(crate) fn for_tests(dir: &std::path::Path) -> Arc<Runtime> {
        use crate::model::script::{ReplayEntry, ScriptedModel};
        let overrides = crate::config::Overrides { sessions: Some(dir.join("sessions")), ..Default::default() };
        let config = Config::resolve(&overrides, &|_| None).expect("a config of defaults");
        let model = Arc::new(ScriptedModel::new(Vec::<ReplayEntry>::new())) as Arc<dyn Model>;
        Runtime::new(config, model, ToolRegistry::new()).expect("a runtime")
    }

    /// Each route's context window and price.
    pub fn models(&self) -> Arc<crate::model::capacity::ModelTable> {
        self.config.compaction.models.clone()
    }

    /// Every tool an agent of this runtime may have (how the editor titles and kinds its calls).
    pub fn tools(&self) -> &ToolRegistry {
        &self.tools
    }

    /// Connects the client (the editor): sessions created or loaded from now on ask it for
    /// permission and read and write files through it.
    pub fn connect_client(&self, link: ClientLink) {
        *self.client.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = link;
    }

    fn client(&self) -> ClientLink {
        self.client.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }
}
