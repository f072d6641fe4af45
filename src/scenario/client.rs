//! The real `kin acp` binary under a scenario, over pipes: kin's ACP client connection
//! (`acp::peer::Driver`) sends the steps' requests, records every line kin writes to stdout
//! (the transcript, read before the client sees it), and answers kin's permission requests from
//! the scenario's `permissionAnswers` (anything else kin asks is method-not-found).

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::AtomicI64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::{Value, json};
use tokio::process::{Child, Command};

use crate::acp::peer::{Answer, ChooseOption, Driver};

/// How one kin process is launched.
#[derive(Debug, Clone)]
pub(crate) struct Launch {
    pub exe: PathBuf,
    pub args: Vec<String>,
    pub cwd: PathBuf,
    pub stderr_log: PathBuf,
    pub env: Vec<(String, String)>,
}

/// Frames kin wrote, across restarts.
#[derive(Default)]
pub(crate) struct Transcript {
    pub frames: Mutex<Vec<Value>>,
}

impl Transcript {
    pub(crate) fn snapshot(&self) -> Vec<Value> {
        self.frames.lock().map(|f| f.clone()).unwrap_or_default()
    }

    fn push(&self, line: &str) {
        let frame: Value = serde_json::from_str(line).unwrap_or_else(|_| json!({"nonJsonStdout": line}));
        if let Ok(mut frames) = self.frames.lock() {
            frames.push(frame);
        }
    }
}

/// One running kin process.
pub(crate) struct Client {
    child: Child,
    driver: Driver,
}

impl Client {
    /// Starts kin; `ids` numbers the requests of the whole scenario (restarts continue it).
    pub(crate) async fn start(
        launch: &Launch,
        transcript: Arc<Transcript>,
        answers: Arc<Mutex<Vec<String>>>,
        ids: Arc<AtomicI64>,
    ) -> Result<Client> {
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
        let stdout = child.stdout.take().context("kin stdout")?;
        let stdin = child.stdin.take().context("kin stdin")?;
        let tap = Arc::new(move |line: &str| transcript.push(line));
        let driver = Driver::connect("scenario", stdin, stdout, Some(tap), choose_from(answers), ids)
            .await
            .map_err(|e| anyhow::anyhow!("connecting to kin: {e}"))?;
        Ok(Client { child, driver })
    }

    /// Sends a request; resolves with kin's answer (`Err`: kin's output ended without one).
    pub(crate) fn request(
        &self,
        method: &str,
        params: Value,
    ) -> impl Future<Output = Result<Answer, String>> + 'static {
        self.driver.request(method, params)
    }

    pub(crate) async fn notify(&self, method: &str, params: Value) -> Result<()> {
        Ok(self.driver.notify(method, params).await?)
    }

    /// Writes one raw line to kin's stdin.
    pub(crate) async fn write_line(&self, line: &str) -> Result<()> {
        Ok(self.driver.send_line(line).await?)
    }

    /// Closes stdin and waits for kin to exit (killing it after `grace`); returns the exit code.
    pub(crate) async fn close(mut self, grace: Duration) -> Result<Option<i32>> {
        self.driver.close().await;
        let status = match tokio::time::timeout(grace, self.child.wait()).await {
            Ok(status) => status?,
            Err(_) => {
                self.child.kill().await?;
                anyhow::bail!("kin did not exit within {grace:?} after stdin closed");
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(5), self.driver.output_ended()).await;
        Ok(status.code())
    }

    /// Kills kin with SIGKILL (a crash).
    pub(crate) async fn kill(mut self) -> Result<()> {
        self.child.kill().await?;
        let _ = tokio::time::timeout(Duration::from_secs(5), self.driver.output_ended()).await;
        Ok(())
    }
}

/// Answers each permission request with the next of `answers` (an option kind; `reject_once`
/// when they ran out): the offered option of that kind, else `cancelled`.
fn choose_from(answers: Arc<Mutex<Vec<String>>>) -> ChooseOption {
    Arc::new(move |offered: &[(String, &'static str)]| {
        let kind = answers
            .lock()
            .ok()
            .and_then(|mut a| (!a.is_empty()).then(|| a.remove(0)))
            .unwrap_or_else(|| "reject_once".into());
        offered.iter().find(|(_, k)| *k == kind).map(|(id, _)| id.clone())
    })
}

/// Polls `check` until it is true or `timeout` passes.
pub(super) async fn wait_for(what: &str, timeout: Duration, mut check: impl FnMut() -> bool) -> Result<()> {
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
pub(super) fn exists(path: &Path) -> bool {
    path.exists()
}
