//! Prompts: a user turn or a command kin runs itself (`/compact`), slash expansion, cancel.

use std::path::Path;

use anyhow::Result;
use futures::FutureExt;
use futures::future::BoxFuture;
use serde_json::{Value, json};
use tokio::sync::oneshot;

use super::Runtime;
use super::error::RuntimeError;
use super::load::still_opening;
use crate::agent::{PromptRefused, TurnEnd};
use crate::session::event;
use crate::slash;

/// What a prompt started.
pub enum Prompted {
    /// A model turn: resolves with how it ended.
    Turn(oneshot::Receiver<TurnEnd>),
    /// A command kin ran itself (`/compact`): resolves with what to tell the user.
    Answer(oneshot::Receiver<Answered>),
}

/// What a command kin ran itself tells the user, and whether a cancel stopped it.
pub struct Answered {
    pub text: String,
    pub cancelled: bool,
}

impl Answered {
    fn of(outcome: &crate::agent::compact::Manual) -> Self {
        let cancelled = matches!(outcome, crate::agent::compact::Manual::Cancelled);
        Answered { text: outcome.text(), cancelled }
    }
}

/// Awaiting what a prompt started gives how its turn ended (a command: `Completed` once it
/// answered; its text is dropped).
impl std::future::IntoFuture for Prompted {
    type Output = Result<TurnEnd, oneshot::error::RecvError>;
    type IntoFuture = BoxFuture<'static, Self::Output>;

    fn into_future(self) -> Self::IntoFuture {
        match self {
            Prompted::Turn(turn) => turn.boxed(),
            Prompted::Answer(answer) => async move {
                answer.await.map(|answered| if answered.cancelled { TurnEnd::Aborted } else { TurnEnd::Completed })
            }
            .boxed(),
        }
    }
}

impl Runtime {
    /// Starts a user turn (or runs a command kin handles itself, `/compact`). One prompt per
    /// session.
    pub fn prompt(&self, session_id: &str, content: Vec<Value>) -> Result<Prompted, RuntimeError> {
        self.reject_child(session_id)?;
        // Command files are read before the live table is locked.
        let cwd = self.agents.top_level(session_id).and_then(|(_, top)| top.cwd.clone());
        // With what the user typed in place of an expansion: a slash command's session is titled
        // by that, not by the expansion.
        let (content, typed) = match self.slash_expansion(cwd.as_deref(), &content) {
            // A blank command file would send the model an empty message.
            Some(slash::Expansion::Prompt(text)) if text.trim().is_empty() && content.len() == 1 => {
                let typed = content[0]["text"].as_str().unwrap_or_default();
                let command = typed.split_whitespace().next().unwrap_or(typed);
                return Err(RuntimeError::InvalidParams(format!(
                    "{command} expands to an empty prompt (its command file has no text): write text in the file, \
                     or send the prompt without the command"
                )));
            }
            Some(slash::Expansion::Prompt(text)) => {
                let mut content = content;
                let typed = std::mem::replace(&mut content[0], json!({"type": "text", "text": text}));
                (content, typed["text"].as_str().map(str::to_string))
            }
            // Its focus is text: an attached file or image would be dropped unseen (a file or a
            // link is written into the text block, an image is a block of its own).
            Some(slash::Expansion::Compact(_))
                if content.len() > 1 || content[0]["text"].as_str().is_some_and(event::has_attachment) =>
            {
                return Err(RuntimeError::InvalidParams(
                    "/compact takes only text (what the summary should focus on); send the attached files and \
                     images in a later prompt"
                        .into(),
                ));
            }
            Some(slash::Expansion::Compact(focus)) => return self.compact(session_id, focus),
            None => (content, None),
        };
        if self.is_opening(session_id) {
            return Err(still_opening(session_id));
        }
        let Some((handle, _)) = self.agents.top_level(session_id) else {
            return Err(self.not_live(session_id));
        };
        let turn = handle.prompt_typed(content, json!({"kind": "user"}), typed).map_err(|refused| match refused {
            PromptRefused::Busy => RuntimeError::InvalidParams("a prompt is already in flight for this session".into()),
            PromptRefused::Gone(gone) => RuntimeError::Internal(gone.to_string()),
        })?;
        // `title_model`: a title after the turn that wrote the fallback one (never in replay).
        let (Some(route), None) = (&self.config.title_model, &self.fixture) else {
            return Ok(Prompted::Turn(turn));
        };
        let (model, route) = (self.model.clone(), route.clone());
        let (tx, rx) = oneshot::channel();
        tokio::spawn(async move {
            let end = turn.await.unwrap_or(TurnEnd::Disposed);
            let completed = end == TurnEnd::Completed;
            let _ = tx.send(end);
            if !completed {
                return;
            }
            let basis = handle.read(|session| crate::title::basis(session.events())).await.ok().flatten();
            if let Some(basis) = basis
                && let Some(title) = crate::title::ask(model, route, handle.id(), &basis).await
            {
                let _ = handle.inject_log(title);
            }
        });
        Ok(Prompted::Turn(rx))
    }

    /// `/compact [focus]`: compacts the session's history now; busy (dsh's text, nothing
    /// written) while a turn runs or another prompt is in flight. Holds the session's prompt slot
    /// meanwhile; a cancel of it answers `cancelled`.
    pub(super) fn compact(&self, session_id: &str, focus: String) -> Result<Prompted, RuntimeError> {
        let Some((handle, _)) = self.agents.top_level(session_id) else {
            return Err(self.not_live(session_id));
        };
        let (tx, rx) = oneshot::channel();
        let focus = Some(focus).filter(|f| !f.trim().is_empty());
        let Some(compaction) = handle.compact_prompt(focus) else {
            let _ = tx.send(Answered::of(&crate::agent::compact::Manual::Busy));
            return Ok(Prompted::Answer(rx));
        };
        tokio::spawn(async move {
            let answered = match compaction.await {
                Ok(outcome) => Answered::of(&outcome),
                Err(gone) => Answered { text: format!("Compaction did not run: {gone}."), cancelled: false },
            };
            let _ = tx.send(answered);
        });
        Ok(Prompted::Answer(rx))
    }

    /// The slash commands a live top-level session offers (built-ins, then its workspace's and
    /// the user's command files); none for an unknown session.
    pub fn slash_commands(&self, session_id: &str) -> Vec<slash::SlashCommand> {
        let Some(cwd) = self.agents.top_level(session_id).map(|(_, top)| top.cwd.clone()) else {
            return Vec::new();
        };
        slash::discover(&slash::dirs(cwd.as_deref(), &self.config.command_dirs))
    }

    /// What a prompt whose first text invokes a known slash command becomes (`None`: not an
    /// invocation, or of no command the session offers; it goes to the model as it is).
    pub(super) fn slash_expansion(&self, cwd: Option<&Path>, content: &[Value]) -> Option<slash::Expansion> {
        let text = content.first().filter(|b| b["type"] == "text")?["text"].as_str()?;
        let (name, arguments, after) = slash::invocation(text)?;
        let commands = slash::discover(&slash::dirs(cwd, &self.config.command_dirs));
        let command = commands.iter().find(|c| c.name == name)?;
        Some(slash::expand(command, arguments, after))
    }

    /// `session/cancel` (seed 003): cancels the running turn of a session (and its user prompt
    /// still waiting for a turn, `AgentHandle::cancel`) and of its foreground
    /// children (the one-shot children below it, and theirs); the turns a background
    /// (continuable) child accepted go on. Naming a background child itself (the editor's cancel
    /// in the agent tree) stops its turn and discards its queued messages. Unknown ids are
    /// ignored.
    pub fn cancel(&self, session_id: &str) {
        if let Some((handle, _)) = self.agents.top_level(session_id) {
            handle.cancel();
        }
        if !self.continuation.cancel_child(session_id)
            && let Some((handle, _)) = self.agents.child(session_id)
        {
            handle.cancel();
        }
        for handle in self.foreground_descendants(session_id) {
            handle.cancel();
        }
    }
}
