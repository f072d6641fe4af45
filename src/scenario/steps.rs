//! The client steps of `input.json`: dsh's ops (initialize, newSession, prompt, waits, cancel…)
//! plus kin's own (`restart`, `loadSession`, `listSessions`, `request`, `raw`).

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::{Value, json};

use super::client::{exists, wait_for};
use super::{Run, read_log};
use crate::acp::peer::Answer;
use crate::session::event::TurnStart;
use crate::session::{Event, Kind};

const DEFAULT_WAIT: Duration = Duration::from_secs(10);
const RESPONSE_WAIT: Duration = Duration::from_secs(60);

fn timeout_of(step: &Value) -> Duration {
    step["timeoutMs"].as_u64().map_or(DEFAULT_WAIT, Duration::from_millis)
}

pub(super) async fn run_step(run: &mut Run, step: &Value) -> Result<()> {
    let op = step["op"].as_str().context("step has no \"op\"")?;
    match op {
        "initialize" => {
            run.call("initialize", json!({"protocolVersion": 1, "clientCapabilities": {}})).await?;
        }
        "newSession" | "newSessionExpectError" => {
            let mut params = json!({"cwd": run.cwd.display().to_string(), "mcpServers": []});
            if let Some(servers) = step.get("mcpServers") {
                params["mcpServers"] = servers.clone();
            }
            if let Some(dirs) = step.get("additionalDirectories") {
                params["additionalDirectories"] = dirs.clone();
            }
            let answer = run.call("session/new", params).await?;
            if op == "newSession" {
                let sid = match &answer {
                    Answer::Result(result) => result["sessionId"].as_str(),
                    Answer::Error { .. } => None,
                };
                run.session_id = Some(sid.context("session/new returned no sessionId")?.to_string());
            }
        }
        "prompt" | "promptExpectError" => {
            let answer = run.prompt(step)?;
            response(answer).await?;
        }
        "promptAndWaitForAgentMessage" => {
            let want = step["waitForText"].as_str().context("waitForText")?.to_string();
            let start = run.transcript.snapshot().len();
            run.pending_prompt = Some(Box::pin(run.prompt(step)?));
            let transcript = run.transcript.clone();
            wait_for(&format!("agent text {want:?}"), timeout_of(step).max(RESPONSE_WAIT), || {
                agent_text(&transcript.snapshot()[start..]).contains(&want)
            })
            .await?;
        }
        "promptAndCancel" => {
            let answer = run.prompt(step)?;
            run.wait_file(&step["waitForFile"]).await?;
            run.cancel().await?;
            response(answer).await?;
        }
        "cancel" => {
            run.wait_file(&step["waitForFile"]).await?;
            run.cancel().await?;
            if let Some(answer) = run.pending_prompt.take() {
                response(answer).await?;
            }
        }
        "waitForFile" => run.wait_file(step).await?,
        "touch" => {
            let path = step["path"].as_str().context("touch needs a path")?;
            std::fs::write(run.cwd.join(path), b"")?;
        }
        "removeFile" => {
            let path = step["path"].as_str().context("removeFile needs a path")?;
            let _ = std::fs::remove_file(run.cwd.join(path));
        }
        "waitForTurnStart" => {
            let minimum = step["minimumTurn"].as_u64().unwrap_or(1);
            let log = run.parent_log().context("no session yet")?;
            wait_for(&format!("turn {minimum} to start"), timeout_of(step), || {
                read_log(&log).is_some_and(|(_, ev)| {
                    ev.iter().filter_map(Event::get::<TurnStart>).any(|start| start.turn >= minimum)
                })
            })
            .await?;
        }
        "waitForTurnEnd" => {
            let log = run.parent_log().context("no session yet")?;
            wait_for("the turn to end", timeout_of(step), || read_log(&log).is_some_and(|(_, ev)| turn_closed(&ev)))
                .await?;
        }
        "waitForSubagentTurnEnd" => {
            let index = step["child"].as_u64().unwrap_or(1) as usize;
            let parent = run.session_id.clone().context("no session yet")?;
            let sessions = run.sessions.clone();
            wait_for(&format!("subagent {index} to end a turn"), timeout_of(step), || {
                child_logs(&sessions, &parent)
                    .get(index.saturating_sub(1))
                    .and_then(|p| read_log(p))
                    .is_some_and(|(_, ev)| turn_closed(&ev))
            })
            .await?;
        }
        "restart" => {
            if step["kill"].as_bool() == Some(true) {
                if let Some(client) = run.client.take() {
                    client.kill().await?;
                }
            } else {
                run.stop().await?;
            }
            run.start().await?;
        }
        "loadSession" => {
            let sid = run.session_id.clone().context("no session to load")?;
            let servers = step.get("mcpServers").cloned().unwrap_or_else(|| json!([]));
            let params = json!({"sessionId": sid, "cwd": run.cwd.display().to_string(), "mcpServers": servers});
            run.call("session/load", params).await?;
        }
        "listSessions" => {
            run.call("session/list", json!({})).await?;
        }
        "request" => {
            let method = step["method"].as_str().context("request needs a method")?;
            let params = run.substitute(step.get("params").cloned().unwrap_or(Value::Null));
            run.call(method, params).await?;
        }
        "raw" => {
            let line = step["line"].as_str().context("raw needs a line")?;
            let before = run.transcript.snapshot().len();
            run.client()?.write_line(line).await?;
            if step["expectResponse"].as_bool() != Some(false) {
                let transcript = run.transcript.clone();
                wait_for("a response to the raw line", RESPONSE_WAIT, || {
                    transcript.snapshot()[before..].iter().any(|f| f.get("method").is_none())
                })
                .await?;
            }
        }
        other => anyhow::bail!("unknown step op {other:?}"),
    }
    Ok(())
}

/// kin's answer to a request, waited for up to `RESPONSE_WAIT`.
async fn response(answer: impl Future<Output = Result<Answer, String>>) -> Result<Answer> {
    match tokio::time::timeout(RESPONSE_WAIT, answer).await {
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(e)) => anyhow::bail!("kin gave no answer: {e}"),
        Err(_) => anyhow::bail!("timed out after {RESPONSE_WAIT:?} waiting for kin's answer"),
    }
}

fn agent_text(frames: &[Value]) -> String {
    frames
        .iter()
        .filter(|f| f["params"]["update"]["sessionUpdate"] == "agent_message_chunk")
        .filter_map(|f| f["params"]["update"]["content"]["text"].as_str())
        .collect()
}

fn turn_closed(events: &[crate::session::Event]) -> bool {
    let starts = events.iter().filter(|e| e.kind == Kind::TurnStart).count();
    let ends = events.iter().filter(|e| e.kind == Kind::TurnEnd).count();
    ends > 0 && ends >= starts
}

fn child_logs(sessions: &std::path::Path, parent: &str) -> Vec<PathBuf> {
    let mut children: Vec<_> = crate::session::SessionStore::new(sessions)
        .list()
        .into_iter()
        .filter(|s| s.header.parent_session.as_deref() == Some(parent))
        .collect();
    children.sort_by(|a, b| (a.header.created_at, &a.header.id).cmp(&(b.header.created_at, &b.header.id)));
    children.into_iter().map(|s| s.path).collect()
}

impl Run {
    fn client(&self) -> Result<&super::client::Client> {
        self.client.as_ref().context("kin is not running")
    }

    fn substitute(&self, value: Value) -> Value {
        let text = value.to_string();
        let text = text.replace("{{cwd}}", &self.cwd.display().to_string());
        let text = match &self.session_id {
            Some(id) => text.replace("{{sessionId}}", id),
            None => text,
        };
        serde_json::from_str(&text).unwrap_or(value)
    }

    /// Sends a request and waits for kin's answer (a result or an error).
    async fn call(&self, method: &str, params: Value) -> Result<Answer> {
        response(self.client()?.request(method, params)).await
    }

    /// Sends the step's prompt; the answer is awaited later.
    fn prompt(&self, step: &Value) -> Result<impl Future<Output = Result<Answer, String>> + Send + 'static> {
        let text = step["text"].as_str().context("prompt needs text")?;
        let sid = self.session_id.clone().context("prompt before newSession")?;
        let params = json!({"sessionId": sid, "prompt": [{"type": "text", "text": text}]});
        Ok(self.client()?.request("session/prompt", params))
    }

    async fn cancel(&self) -> Result<()> {
        let sid = self.session_id.clone().context("cancel before newSession")?;
        self.client()?.notify("session/cancel", json!({"sessionId": sid})).await
    }

    async fn wait_file(&self, spec: &Value) -> Result<()> {
        let Some(path) = spec["path"].as_str() else {
            return Ok(());
        };
        let full = self.cwd.join(path);
        wait_for(&format!("file {path}"), timeout_of(spec), || exists(&full)).await
    }
}
