//! Permission lookup: a live session's `Permissions`, how a child asks the user, the
//! `forward` policy's prompt, and a session's mode.

use std::sync::{Arc, Weak};

use anyhow::Result;
use futures::FutureExt;
use futures::future::BoxFuture;

use super::error::RuntimeError;
use super::settings::PendingSetting;
use super::{ClientLink, Runtime};
use crate::permission::{PermissionAnswer, PermissionMode, PermissionPrompt, PermissionRequest, Permissions};
use crate::session::event;
use crate::subagent::inprocess::ChildDisplay;

/// Where the `forward` policy of external ACP children asks: the permission mode of the
/// top-level session above the delegating one answers where it decides, else the connected
/// client is asked (looked up when asked: it connects after the runtime is built); with no
/// client connected the question is dismissed.
pub(super) struct ForwardPrompt(pub(super) Weak<Runtime>);

impl PermissionPrompt for ForwardPrompt {
    fn ask(&self, request: PermissionRequest) -> BoxFuture<'static, PermissionAnswer> {
        let Some(rt) = self.0.upgrade() else {
            return async { PermissionAnswer::Dismissed }.boxed();
        };
        match (self.decided_by_mode(&request), rt.client().prompt) {
            (Some(answer), _) => async move { answer }.boxed(),
            (None, Some(prompt)) => prompt.ask(request),
            (None, None) => async { PermissionAnswer::Dismissed }.boxed(),
        }
    }

    /// The mode of the session asking (a child's under its cap); once the runtime is gone,
    /// `Dismissed`, as `ask` answers then.
    fn decided_by_mode(&self, request: &PermissionRequest) -> Option<PermissionAnswer> {
        let Some(rt) = self.0.upgrade() else {
            return Some(PermissionAnswer::Dismissed);
        };
        rt.permissions_of(&request.session_id)?.decide_forwarded(&request.access, request.in_workspace, &request.cwd)
    }
}

impl Runtime {
    /// The permissions of a live session, top-level or child (a child's are its parent's,
    /// narrowed by its agent).
    pub(super) fn permissions_of(&self, id: &str) -> Option<Arc<Permissions>> {
        self.agents.permissions_of(id)
    }

    /// Changes the permission mode of a live session once it is recorded in its log
    /// (`session/mode`, so that a later `session/load` keeps it); from then on it applies to
    /// every call decided. A child or unknown session is refused at once; the returned
    /// `PendingSetting` tells whether the mode was written (if not, it is unchanged).
    pub fn set_permission_mode(&self, session_id: &str, mode: PermissionMode) -> Result<PendingSetting, RuntimeError> {
        self.reject_child(session_id)?;
        let (handle, top) = self.agents.top_level(session_id).ok_or_else(|| self.not_live(session_id))?;
        let permissions = top.permissions.clone();
        let recorded = handle.record(event::SessionMode { mode: mode.id().to_string() }, move || {
            permissions.set_mode(mode);
        });
        Ok(PendingSetting::of("mode", recorded))
    }

    /// How a child below `parent` asks the user: the editor's prompt when it shows child sessions
    /// (the question carries the child's id); otherwise on the parent session (`OnDelegatingCall`:
    /// on the `delegating` call while it runs), through the parent's own way of asking when the
    /// parent is a child.
    pub(super) fn child_prompt(
        &self,
        client: &ClientLink,
        parent: Option<&str>,
        display: &ChildDisplay,
        delegating: Option<(String, crate::tools::Progress)>,
    ) -> Option<Arc<dyn PermissionPrompt>> {
        let (Some(parent), None) = (parent, client.children.as_ref()) else {
            return client.prompt.clone();
        };
        let above = match self.agents.child(parent) {
            Some((_, child)) => child.prompt,
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
}
