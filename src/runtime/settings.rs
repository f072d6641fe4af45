//! A live session's settings: its sandbox and its model.

use anyhow::Result;

use super::Runtime;
use super::error::RuntimeError;
use crate::sandbox::{SandboxPolicy, SessionSandbox};
use crate::session::event;

impl Runtime {
    /// Changes a live session's sandbox (from its next command on) and records it
    /// (`session/sandbox`) so that a later load keeps it, unless kin starts stricter then.
    pub fn set_sandbox(&self, session_id: &str, policy: &str) -> Result<SandboxPolicy, RuntimeError> {
        self.reject_child(session_id)?;
        let (handle, top) =
            self.agents.top_level(session_id).ok_or_else(|| RuntimeError::NotFound(session_id.to_string()))?;
        let policy = SandboxPolicy::parse_arg(policy).map_err(RuntimeError::InvalidParams)?;
        handle.inject_log(SessionSandbox::event_body(policy)).map_err(|e| RuntimeError::Internal(e.to_string()))?;
        top.sandbox.set(policy);
        Ok(policy)
    }

    /// The key a new session's route needs and nobody has given (neither the environment nor
    /// `kin login`); never in replay, whose model needs none.
    pub fn missing_key(&self) -> Option<crate::model::MissingKey> {
        self.keys.as_ref().and_then(|keys| keys.missing_key(&self.config.model))
    }

    /// Whether the route a live session's next turn uses takes images (false for an unknown
    /// session).
    pub fn takes_images(&self, session_id: &str) -> bool {
        self.session_model(session_id)
            .is_some_and(|route| crate::model::router::takes_images(&route, &self.config.models))
    }

    /// The route a live session's next turn uses.
    pub fn session_model(&self, session_id: &str) -> Option<crate::model::ModelRoute> {
        self.agents.top_level(session_id).map(|(handle, _)| handle.route())
    }

    /// Switches a live session's model from its next turn on, and records the choice in its log
    /// (`session/model`) so a later `session/load` keeps it.
    pub fn set_model(&self, session_id: &str, route: &str) -> Result<crate::model::ModelRoute, RuntimeError> {
        self.reject_child(session_id)?;
        if !self.agents.is_top_level(session_id) {
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
        let (handle, _) =
            self.agents.top_level(session_id).ok_or_else(|| RuntimeError::NotFound(session_id.to_string()))?;
        handle.set_route(route.clone()).map_err(|e| RuntimeError::Internal(e.to_string()))?;
        handle
            .inject_log(event::SessionModel { provider: route.provider.clone(), model: route.model.clone() })
            .map_err(|e| RuntimeError::Internal(e.to_string()))?;
        Ok(route)
    }
}
