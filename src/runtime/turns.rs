//! Prompts: a user turn or a command kin runs itself (`/compact`), slash expansion, cancel.

use std::path::Path;
use std::sync::atomic::Ordering;

use anyhow::Result;
use futures::FutureExt;
use futures::future::BoxFuture;
use serde_json::{Value, json};
use tokio::sync::oneshot;

use super::Runtime;
use super::error::RuntimeError;
use crate::agent::TurnEnd;
use crate::slash;

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

impl Runtime {
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
    pub(super) fn compact(&self, session_id: &str, focus: String) -> Result<Prompted, RuntimeError> {
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
    pub(super) fn slash_expansion(&self, cwd: Option<&Path>, content: &[Value]) -> Option<slash::Expansion> {
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
}
