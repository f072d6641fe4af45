//! Scripted model calls: one `ReplayEntry` per call (chunks, throw, or hang until cancelled),
//! played onto a channel. `ScriptedModel` serves one queue to every session (unit tests); the
//! replay model keeps one queue per recorded session (and builds on this file, never the other
//! way: the prompt a call serves, `prompt_of`, is read here).

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::Mutex;

use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{ChunkStream, Failure, Model, ModelEvent, ModelRequest, StreamChunk};

/// What one scripted model call does.
#[derive(Debug, Clone, PartialEq)]
pub enum ReplayEntry {
    /// Stream these chunks.
    Chunks(Vec<StreamChunk>),
    /// Stream these chunks, then fail with `message` / `code`.
    Throw { chunks: Vec<StreamChunk>, message: String, code: String },
    /// Stream these chunks, create `ready_file` (relative to the session cwd), then wait for
    /// cancellation.
    Hang { chunks: Vec<StreamChunk>, ready_file: Option<String> },
    /// Wait until `file` (relative to the session cwd) exists, then play `entry` (kin's
    /// extension, `waitForFile` on an override entry: orders a child's call after a client step).
    Gated { file: String, entry: Box<ReplayEntry> },
}

impl ReplayEntry {
    /// Parses the `replay.override.json` entry shape
    /// `{kind, chunks?, message?, code?, readyFile?, waitForFile?}`.
    pub fn parse(value: &Value) -> Result<Self, String> {
        let entry = Self::parse_plain(value)?;
        Ok(match value.get("waitForFile").and_then(Value::as_str) {
            Some(file) => ReplayEntry::Gated { file: file.to_string(), entry: Box::new(entry) },
            None => entry,
        })
    }

    fn parse_plain(value: &Value) -> Result<Self, String> {
        let chunks = match value.get("chunks") {
            None => Vec::new(),
            Some(c) => serde_json::from_value(c.clone()).map_err(|e| format!("replay entry chunks: {e}"))?,
        };
        let text = |key: &str| value.get(key).and_then(Value::as_str).map(str::to_string);
        match value.get("kind").and_then(Value::as_str) {
            Some("chunks") => Ok(ReplayEntry::Chunks(chunks)),
            Some("throw") => Ok(ReplayEntry::Throw {
                chunks,
                message: text("message").unwrap_or_else(|| "replayed model failure".into()),
                code: text("code").unwrap_or_else(|| "REPLAY_THROW".into()),
            }),
            Some("hang") => Ok(ReplayEntry::Hang { chunks, ready_file: text("readyFile") }),
            other => Err(format!("replay entry kind must be chunks, throw or hang, not {other:?}")),
        }
    }
}

/// Plays one entry onto a fresh channel on a background task.
pub(crate) fn play(entry: ReplayEntry, cwd: Option<PathBuf>, cancel: CancellationToken) -> ChunkStream {
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        // A file an entry names, relative to the session cwd.
        let in_cwd = |name: &str| cwd.as_ref().map_or_else(|| PathBuf::from(name), |cwd| cwd.join(name));
        let mut entry = entry;
        while let ReplayEntry::Gated { file, entry: inner } = entry {
            let path = in_cwd(&file);
            while !path.exists() {
                tokio::select! {
                    () = cancel.cancelled() => return,
                    () = tokio::time::sleep(std::time::Duration::from_millis(10)) => {}
                }
            }
            entry = *inner;
        }
        let (chunks, tail) = match entry {
            ReplayEntry::Gated { .. } => return,
            ReplayEntry::Chunks(chunks) => (chunks, None),
            ReplayEntry::Throw { chunks, message, code } => (chunks, Some(Ok(Failure::new(message, code)))),
            ReplayEntry::Hang { chunks, ready_file } => (chunks, Some(Err(ready_file))),
        };
        for chunk in chunks {
            if cancel.is_cancelled() || tx.send(Ok(ModelEvent::Chunk(chunk))).await.is_err() {
                return;
            }
        }
        match tail {
            None => {}
            Some(Ok(failure)) => {
                let _ = tx.send(Err(failure)).await;
            }
            Some(Err(ready_file)) => {
                // Ready means the consumer has taken every prefix chunk, not only that they are
                // queued: a cancel sent on seeing the file must find them already in the log.
                match tx.reserve_many(tx.max_capacity()).await {
                    Ok(permits) => drop(permits),
                    Err(_) => return,
                }
                if let Some(name) = ready_file {
                    let path = in_cwd(&name);
                    if let Err(e) = std::fs::write(&path, b"") {
                        tracing::warn!(path = %path.display(), "cannot write replay ready file: {e}");
                    }
                }
                tokio::select! {
                    () = cancel.cancelled() => {}
                    () = tx.closed() => {}
                }
            }
        }
    });
    rx
}

/// A model answering every call, from any session, with the next entry of one script.
pub struct ScriptedModel {
    entries: Mutex<VecDeque<ReplayEntry>>,
    /// Queues reserved for sessions whose prompt (last user message) matches, checked first.
    routed: Mutex<Vec<(String, VecDeque<ReplayEntry>)>>,
    requests: Mutex<Vec<ModelRequest>>,
    /// False when requests are not kept (benchmarks: a long session's histories add up).
    record: bool,
}

impl ScriptedModel {
    pub fn new(entries: impl IntoIterator<Item = ReplayEntry>) -> Self {
        ScriptedModel {
            entries: Mutex::new(entries.into_iter().collect()),
            routed: Mutex::new(Vec::new()),
            requests: Mutex::new(Vec::new()),
            record: true,
        }
    }

    /// The same model, keeping no copy of the requests it serves.
    pub fn unrecorded(mut self) -> Self {
        self.record = false;
        self
    }

    /// Reserves `entries` for calls whose prompt is `prompt` (so concurrent sessions get
    /// deterministic answers).
    pub fn route(self, prompt: &str, entries: impl IntoIterator<Item = ReplayEntry>) -> Self {
        if let Ok(mut routed) = self.routed.lock() {
            routed.push((prompt.to_string(), entries.into_iter().collect()));
        }
        self
    }

    /// A script of plain chunk responses.
    pub fn from_responses(responses: impl IntoIterator<Item = Vec<StreamChunk>>) -> Self {
        Self::new(responses.into_iter().map(ReplayEntry::Chunks))
    }

    /// Every request received so far.
    pub fn requests(&self) -> Vec<ModelRequest> {
        self.requests.lock().map(|r| r.clone()).unwrap_or_default()
    }
}

/// The text of the last user-sourced user message: the prompt a session's call serves.
pub(crate) fn prompt_of(messages: &[Value]) -> Option<String> {
    messages.iter().rev().find(|m| m["role"] == "user" && m["source"]["kind"] == "user").map(message_text)
}

fn message_text(message: &Value) -> String {
    blocks_text(message["content"].as_array().map_or(&[], Vec::as_slice))
}

/// The text of a message's content blocks, concatenated.
pub(crate) fn blocks_text(content: &[Value]) -> String {
    content.iter().filter_map(|b| b["text"].as_str()).collect()
}

impl Model for ScriptedModel {
    fn stream(&self, request: ModelRequest, cancel: CancellationToken) -> ChunkStream {
        let cwd = request.cwd.clone();
        let prompt = prompt_of(&request.messages);
        if self.record
            && let Ok(mut requests) = self.requests.lock()
        {
            requests.push(request);
        }
        let routed = self.routed.lock().ok().and_then(|mut routed| {
            routed
                .iter_mut()
                .find(|(p, q)| Some(p) == prompt.as_ref() && !q.is_empty())
                .and_then(|(_, q)| q.pop_front())
        });
        let next = routed.or_else(|| self.entries.lock().ok().and_then(|mut e| e.pop_front()));
        let entry = next.unwrap_or_else(|| ReplayEntry::Throw {
            chunks: Vec::new(),
            message: "scripted model has no response left".into(),
            code: "SCRIPT_EXHAUSTED".into(),
        });
        play(entry, cwd, cancel)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hang's ready file appears only once the consumer has taken every prefix chunk (a scenario
    /// cancels on seeing it and expects the prefix in the log): queued is not enough.
    #[tokio::test(flavor = "current_thread")]
    async fn a_hang_is_ready_only_after_its_prefix_is_taken() {
        let dir = tempfile::tempdir().expect("temp dir");
        let ready = dir.path().join(".ready");
        let text = |text: &str| StreamChunk::TextDelta { index: 0, text: text.into() };
        let entry = ReplayEntry::Hang { chunks: vec![text("a"), text("b")], ready_file: Some(".ready".into()) };
        let cancel = CancellationToken::new();
        let mut stream = play(entry, Some(dir.path().to_path_buf()), cancel.clone());
        // On one thread, a few yields let the player run until it waits for the consumer.
        for _ in 0..8 {
            tokio::task::yield_now().await;
        }
        assert!(!ready.exists(), "the ready file came before the prefix was taken");
        for _ in 0..2 {
            assert!(matches!(stream.recv().await, Some(Ok(ModelEvent::Chunk(StreamChunk::TextDelta { .. })))));
        }
        let mut yields = 0;
        while !ready.exists() {
            assert!(yields < 64, "the ready file never came after the prefix was taken");
            tokio::task::yield_now().await;
            yields += 1;
        }
        cancel.cancel();
        assert!(stream.recv().await.is_none(), "a cancelled hang ends its stream");
    }
}
