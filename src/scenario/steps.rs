//! The client steps of `input.json`: dsh's ops (initialize, newSession, prompt, waits, cancel…)
//! plus kin's own (`restart`, `loadSession`, `listSessions`, `request`, `raw`).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::{Value, json};

use super::client::{exists, wait_for};
use super::{Run, read_log};

const DEFAULT_WAIT: Duration = Duration::from_secs(10);
const RESPONSE_WAIT: Duration = Duration::from_secs(60);

fn timeout_of(step: &Value) -> Duration {
    step["timeoutMs"].as_u64().map_or(DEFAULT_WAIT, Duration::from_millis)
}

pub(super) async fn run_step(run: &mut Run, step: &Value) -> Result<()> {
    let op = step["op"].as_str().context("step has no \"op\"")?;
    match op {
        "initialize" => {
            let id = run.send("initialize", json!({"protocolVersion": 1, "clientCapabilities": {}})).await?;
            run.response(id).await?;
        }
        "newSession" | "newSessionExpectError" => {
            let mut params = json!({"cwd": run.cwd.display().to_string(), "mcpServers": []});
            if let Some(servers) = step.get("mcpServers") {
                params["mcpServers"] = servers.clone();
            }
            if let Some(dirs) = step.get("additionalDirectories") {
                params["additionalDirectories"] = dirs.clone();
            }
            let id = run.send("session/new", params).await?;
            let response = run.response(id).await?;
            if op == "newSession" {
                let sid = response["result"]["sessionId"].as_str().context("session/new returned no sessionId")?;
                run.session_id = Some(sid.to_string());
            }
        }
        "prompt" | "promptExpectError" => {
            let id = run.prompt(step).await?;
            run.response(id).await?;
        }
        "promptAndWaitForAgentMessage" => {
            let want = step["waitForText"].as_str().context("waitForText")?.to_string();
            let start = run.transcript.snapshot().len();
            let id = run.prompt(step).await?;
            run.pending_prompt = Some(id);
            let transcript = run.transcript.clone();
            wait_for(&format!("agent text {want:?}"), timeout_of(step).max(RESPONSE_WAIT), || {
                agent_text(&transcript.snapshot()[start..]).contains(&want)
            })
            .await?;
        }
        "promptAndCancel" => {
            let id = run.prompt(step).await?;
            run.wait_file(&step["waitForFile"]).await?;
            run.cancel().await?;
            run.response(id).await?;
        }
        "cancel" => {
            run.wait_file(&step["waitForFile"]).await?;
            run.cancel().await?;
            if let Some(id) = run.pending_prompt.take() {
                run.response(id).await?;
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
                    ev.iter().any(|e| e.kind == "turn/start" && e.data["turn"].as_u64() >= Some(minimum))
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
            run.start()?;
        }
        "loadSession" => {
            let sid = run.session_id.clone().context("no session to load")?;
            let servers = step.get("mcpServers").cloned().unwrap_or_else(|| json!([]));
            let params = json!({"sessionId": sid, "cwd": run.cwd.display().to_string(), "mcpServers": servers});
            let id = run.send("session/load", params).await?;
            run.response(id).await?;
        }
        "listSessions" => {
            let id = run.send("session/list", json!({})).await?;
            run.response(id).await?;
        }
        "request" => {
            let method = step["method"].as_str().context("request needs a method")?;
            let params = run.substitute(step.get("params").cloned().unwrap_or(Value::Null));
            let id = run.send(method, params).await?;
            run.response(id).await?;
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

fn agent_text(frames: &[Value]) -> String {
    frames
        .iter()
        .filter(|f| f["params"]["update"]["sessionUpdate"] == "agent_message_chunk")
        .filter_map(|f| f["params"]["update"]["content"]["text"].as_str())
        .collect()
}

fn turn_closed(events: &[crate::session::Event]) -> bool {
    let starts = events.iter().filter(|e| e.kind == "turn/start").count();
    let ends = events.iter().filter(|e| e.kind == "turn/end").count();
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

    async fn send(&mut self, method: &str, params: Value) -> Result<u64> {
        self.next_id += 1;
        let id = self.next_id;
        let frame = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        self.client()?.write_line(&frame.to_string()).await?;
        Ok(id)
    }

    async fn prompt(&mut self, step: &Value) -> Result<u64> {
        let text = step["text"].as_str().context("prompt needs text")?;
        let sid = self.session_id.clone().context("prompt before newSession")?;
        self.send("session/prompt", json!({"sessionId": sid, "prompt": [{"type": "text", "text": text}]})).await
    }

    async fn cancel(&mut self) -> Result<()> {
        let sid = self.session_id.clone().context("cancel before newSession")?;
        let frame = json!({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": sid}});
        self.client()?.write_line(&frame.to_string()).await
    }

    async fn response(&self, id: u64) -> Result<Value> {
        let transcript = self.transcript.clone();
        let find = || transcript.snapshot().into_iter().find(|f| f.get("method").is_none() && f["id"] == json!(id));
        wait_for(&format!("the response to request {id}"), RESPONSE_WAIT, || find().is_some()).await?;
        find().context("response vanished")
    }

    async fn wait_file(&self, spec: &Value) -> Result<()> {
        let Some(path) = spec["path"].as_str() else {
            return Ok(());
        };
        let full = self.cwd.join(path);
        wait_for(&format!("file {path}"), timeout_of(spec), || exists(&full)).await
    }
}
