//! A scripted ACP client driving the real `kin acp` binary over pipes: it sends requests,
//! records every frame kin writes to stdout, and answers kin's own requests (permission
//! requests from the scenario's `permissionAnswers`, anything else with method-not-found).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::Notify;

/// How one kin process is launched.
#[derive(Debug, Clone)]
pub struct Launch {
    pub exe: PathBuf,
    pub args: Vec<String>,
    pub cwd: PathBuf,
    pub stderr_log: PathBuf,
    pub env: Vec<(String, String)>,
}

/// Frames kin wrote, shared with the reader task.
#[derive(Default)]
pub struct Transcript {
    pub frames: Mutex<Vec<Value>>,
    pub changed: Notify,
    /// Set when kin's stdout closes (it exited or crashed).
    pub closed: std::sync::atomic::AtomicBool,
}

impl Transcript {
    pub fn snapshot(&self) -> Vec<Value> {
        self.frames.lock().map(|f| f.clone()).unwrap_or_default()
    }

    fn push(&self, frame: Value) {
        if let Ok(mut frames) = self.frames.lock() {
            frames.push(frame);
        }
        self.changed.notify_waiters();
    }
}

/// One running kin process.
pub struct Client {
    child: Child,
    stdin: Arc<tokio::sync::Mutex<Option<ChildStdin>>>,
    reader: tokio::task::JoinHandle<()>,
}

impl Client {
    pub fn start(launch: &Launch, transcript: Arc<Transcript>, answers: Arc<Mutex<Vec<String>>>) -> Result<Client> {
        let stderr = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&launch.stderr_log)
            .with_context(|| format!("opening {}", launch.stderr_log.display()))?;
        let mut command = Command::new(&launch.exe);
        command
            .args(&launch.args)
            .current_dir(&launch.cwd)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(stderr))
            .kill_on_drop(true);
        for key in ["KIN_SESSIONS_DIR", "KIN_MODEL", "KIN_CONFIG", "KIN_LOG_FILE", "KIN_REPLAY_DIR"] {
            command.env_remove(key);
        }
        for (k, v) in &launch.env {
            command.env(k, v);
        }
        let mut child = command.spawn().with_context(|| format!("starting {}", launch.exe.display()))?;
        transcript.closed.store(false, std::sync::atomic::Ordering::SeqCst);
        let stdout = child.stdout.take().context("kin stdout")?;
        let stdin = Arc::new(tokio::sync::Mutex::new(child.stdin.take()));
        let writer = stdin.clone();
        let reader = tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let frame: Value = serde_json::from_str(&line).unwrap_or_else(|_| json!({"nonJsonStdout": line}));
                if let (Some(method), Some(id)) = (frame.get("method").and_then(Value::as_str), frame.get("id")) {
                    let reply = answer(method, id, &frame, &answers);
                    if let Some(stdin) = writer.lock().await.as_mut() {
                        let _ = stdin.write_all(format!("{reply}\n").as_bytes()).await;
                        let _ = stdin.flush().await;
                    }
                }
                transcript.push(frame);
            }
            transcript.closed.store(true, std::sync::atomic::Ordering::SeqCst);
        });
        Ok(Client { child, stdin, reader })
    }

    /// Writes one raw line to kin's stdin.
    pub async fn write_line(&self, line: &str) -> Result<()> {
        let mut guard = self.stdin.lock().await;
        let stdin = guard.as_mut().context("kin's stdin is closed")?;
        stdin.write_all(line.as_bytes()).await?;
        stdin.write_all(b"\n").await?;
        stdin.flush().await?;
        Ok(())
    }

    /// Closes stdin and waits for kin to exit (killing it after `grace`); returns the exit code.
    pub async fn close(mut self, grace: Duration) -> Result<Option<i32>> {
        self.stdin.lock().await.take();
        let status = match tokio::time::timeout(grace, self.child.wait()).await {
            Ok(status) => status?,
            Err(_) => {
                self.child.kill().await?;
                anyhow::bail!("kin did not exit within {grace:?} after stdin closed");
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(5), self.reader).await;
        Ok(status.code())
    }

    /// Kills kin with SIGKILL (a crash).
    pub async fn kill(mut self) -> Result<()> {
        self.child.kill().await?;
        let _ = tokio::time::timeout(Duration::from_secs(5), self.reader).await;
        Ok(())
    }
}

fn answer(method: &str, id: &Value, frame: &Value, answers: &Mutex<Vec<String>>) -> Value {
    if method == "session/request_permission" {
        let kind = answers
            .lock()
            .ok()
            .and_then(|mut a| (!a.is_empty()).then(|| a.remove(0)))
            .unwrap_or_else(|| "reject_once".into());
        let options = frame["params"]["options"].as_array().cloned().unwrap_or_default();
        let chosen = options.iter().find(|o| o["kind"] == kind.as_str()).and_then(|o| o["optionId"].as_str());
        let outcome = match chosen {
            Some(option_id) => json!({"outcome": "selected", "optionId": option_id}),
            None => json!({"outcome": "cancelled"}),
        };
        return json!({"jsonrpc": "2.0", "id": id, "result": {"outcome": outcome}});
    }
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32601, "message": format!("Method not found: {method}")}})
}

/// Polls `check` until it is true or `timeout` passes.
pub async fn wait_for(what: &str, timeout: Duration, mut check: impl FnMut() -> bool) -> Result<()> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if check() {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            anyhow::bail!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// True when `path` exists.
pub fn exists(path: &Path) -> bool {
    path.exists()
}
