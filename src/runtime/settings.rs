//! A live session's settings: its sandbox and its model (its mode is in `permission`), each
//! recorded in its log before it takes effect (`PendingSetting`).

use anyhow::Result;
use futures::future::BoxFuture;

use super::Runtime;
use super::error::RuntimeError;
use crate::agent::NotAccepted;
use crate::sandbox::{SandboxPolicy, SessionSandbox};

/// A setting handed to its session's agent (`set_permission_mode`, `set_sandbox`, `set_model`):
/// it takes effect once its event (`session/mode`, `session/sandbox`, `session/model`) is
/// written and `fsync`ed to the session's log, so that a later load keeps it. Awaiting it hears
/// how that went: `Ok` once the event is on disk and the setting in force; an error naming the
/// cause when the log could not be written (the setting is then unchanged, and nothing of it is
/// kept) or the session stopped first. Between turns that is at once; during a turn, at the turn's
/// next await point (a compaction's summary call holds it until it ends). Dropping it unawaited
/// changes nothing of that: the setting still applies once written.
pub struct PendingSetting(BoxFuture<'static, Result<(), RuntimeError>>);

impl PendingSetting {
    /// `recorded` (an `AgentHandle::record`), its refusal worded for the `what` it sets.
    pub(super) fn of(what: &'static str, recorded: BoxFuture<'static, Result<(), NotAccepted>>) -> Self {
        PendingSetting(Box::pin(async move { recorded.await.map_err(|e| unrecorded(what, e)) }))
    }
}

impl std::future::IntoFuture for PendingSetting {
    type Output = Result<(), RuntimeError>;
    type IntoFuture = BoxFuture<'static, Result<(), RuntimeError>>;

    fn into_future(self) -> Self::IntoFuture {
        self.0
    }
}

/// Why a setting did not take effect.
fn unrecorded(what: &str, e: NotAccepted) -> RuntimeError {
    match e {
        NotAccepted::Gone(id) => {
            RuntimeError::Internal(format!("the {what} of session {id} was not changed: the session has shut down"))
        }
        NotAccepted::Unwritten { session, cause } => RuntimeError::Internal(format!(
            "the {what} of session {session} was not changed: it could not be written to the session's log ({cause})"
        )),
    }
}

impl Runtime {
    /// Changes a live session's sandbox (from its next command on) once it is recorded
    /// (`session/sandbox`), so that a later load keeps it unless kin starts stricter then. A bad
    /// policy or session is refused at once; the returned `PendingSetting` tells whether it was written.
    pub fn set_sandbox(&self, session_id: &str, policy: &str) -> Result<PendingSetting, RuntimeError> {
        self.reject_child(session_id)?;
        let (handle, top) = self.agents.top_level(session_id).ok_or_else(|| self.not_live(session_id))?;
        let policy = SandboxPolicy::parse_arg(policy).map_err(RuntimeError::InvalidParams)?;
        let sandbox = top.sandbox.clone();
        let recorded = handle.record(SessionSandbox::event_body(policy), move || sandbox.set(policy));
        Ok(PendingSetting::of("sandbox", recorded))
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

    /// Switches a live session's model from its next turn on, once the choice is recorded in its
    /// log (`session/model`) so a later `session/load` keeps it. An unknown route or session is
    /// refused at once; the returned `PendingSetting` tells whether it was written.
    pub fn set_model(&self, session_id: &str, route: &str) -> Result<PendingSetting, RuntimeError> {
        self.reject_child(session_id)?;
        if !self.agents.is_top_level(session_id) {
            return Err(self.not_live(session_id));
        }
        let route = crate::model::ModelRoute::parse(route).map_err(RuntimeError::InvalidParams)?;
        if !self.config.model_choices.contains(&route) {
            let valid: Vec<String> = self.config.model_choices.iter().map(ToString::to_string).collect();
            return Err(RuntimeError::InvalidParams(format!(
                "unknown model {route}; choose one of: {}",
                valid.join(", ")
            )));
        }
        let (handle, _) = self.agents.top_level(session_id).ok_or_else(|| self.not_live(session_id))?;
        Ok(PendingSetting::of("model", handle.record_route(route)))
    }
}
