//! What the protocol layer shows of a session after an operation on it (`SessionView`): its
//! mode, its route among the choices, its sandbox and the named agents it offers, read in one
//! look at the registry, so that a handler makes one call and converts.

use std::sync::Arc;

use super::Runtime;
use crate::model::ModelRoute;
use crate::permission::PermissionMode;
use crate::sandbox::SandboxPolicy;
use crate::session::Event;

/// A session as an operation leaves it. For a session that is not live (closed meanwhile) the
/// defaults: the default mode, the first route choice, the default sandbox, no agents.
#[derive(Debug, Clone)]
pub(crate) struct SessionView {
    pub(crate) id: String,
    pub(crate) mode: PermissionMode,
    /// The route the session's next turn uses.
    pub(crate) route: ModelRoute,
    /// The routes it may switch to.
    pub(crate) choices: Vec<ModelRoute>,
    pub(crate) sandbox: SandboxPolicy,
    /// True when the session's commands run unconfined although its policy is a sandbox (this
    /// kernel cannot enforce it).
    pub(crate) unenforced: bool,
    /// The named agents its delegation tools offer (name, description); `None` when not live.
    pub(crate) agents: Option<Vec<(String, String)>>,
}

/// A loaded or resumed session: the events it came back with (none for one that was live) and
/// its view.
pub(crate) struct Loaded {
    pub(crate) events: Arc<Vec<Event>>,
    pub(crate) view: SessionView,
}

impl Runtime {
    /// The view of session `id`.
    pub(crate) fn view(&self, id: &str) -> SessionView {
        let choices = self.config.model_choices.clone();
        let Some((handle, top)) = self.agents.top_level(id) else {
            let route = choices[0].clone();
            let (mode, sandbox) = (PermissionMode::default(), SandboxPolicy::default());
            return SessionView { id: id.to_string(), mode, route, choices, sandbox, unenforced: false, agents: None };
        };
        let agents = top.named.iter().map(|def| (def.name.clone(), def.description.clone())).collect();
        SessionView {
            id: id.to_string(),
            mode: top.permissions.mode(),
            route: handle.route(),
            choices,
            sandbox: top.sandbox.policy(),
            unenforced: !top.sandbox.in_force(top.cwd.as_deref()),
            agents: Some(agents),
        }
    }
}
