//! Scenarios: recorded ACP conversations replayed keyless against the real binary
//! (dsh-design.md §2.3). A scenario directory holds `input.json` (client steps),
//! `stdout.expected.jsonl`, `session.jsonl` / `session.N.jsonl` (the replay model's script and the
//! expected logs), optional `replay.override.json`, `workspace/` and `kin.toml` (config overlay).

mod client;
pub(crate) mod fixture;
pub(crate) mod normalize;
mod steps;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::Value;

use crate::session::{Record, SessionHeader};
use client::{Client, Launch, Transcript};
use normalize::Scrubber;

/// How transcripts are compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compare {
    /// Every stdout frame, and every session log, exactly (after normalisation).
    Exact,
    /// Each response plus the agent text streamed before it; the initialize result by protocol
    /// version only, results without `modes` and `configOptions` (fixtures from a system that emits fewer updates and
    /// other capabilities).
    Text,
}

/// Options of one `kin scenario run`.
#[derive(Debug, Clone)]
pub struct RunOptions {
    pub exe: PathBuf,
    pub compare: Compare,
    pub update: bool,
    pub out: Option<PathBuf>,
    /// Record: run against the configured real model (no replay) and write the expected files
    /// and logs, so the scenario replays keyless afterwards.
    pub record: bool,
}

/// The result of one scenario.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub name: String,
    pub passed: bool,
    /// A readable explanation of every mismatch (empty when passed).
    pub report: String,
}

/// Runs one scenario directory.
pub async fn run(dir: &Path, opts: &RunOptions) -> Outcome {
    let name = dir.file_name().map_or_else(|| dir.display().to_string(), |n| n.to_string_lossy().into_owned());
    match run_inner(dir, opts).await {
        Ok(report) => Outcome { name, passed: report.is_empty(), report },
        Err(e) => Outcome { name, passed: false, report: format!("scenario could not run: {e:#}") },
    }
}

/// kin's answer to a request still awaited.
pub(crate) type PendingAnswer =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<crate::acp::peer::Answer, String>> + Send>>;

/// Shared state of a running scenario.
pub(crate) struct Run {
    pub cwd: PathBuf,
    pub sessions: PathBuf,
    pub launch: Launch,
    pub transcript: Arc<Transcript>,
    pub answers: Arc<Mutex<Vec<String>>>,
    pub client: Option<Client>,
    /// Numbers the runner's requests across restarts.
    pub ids: Arc<std::sync::atomic::AtomicI64>,
    pub session_id: Option<String>,
    /// The answer to a prompt sent by `promptAndWaitForAgentMessage`, awaited by `cancel`.
    pub pending_prompt: Option<PendingAnswer>,
    pub exit_codes: Vec<Option<i32>>,
}

async fn run_inner(dir: &Path, opts: &RunOptions) -> Result<String> {
    let input_path = dir.join("input.json");
    let input: Value = serde_json::from_str(
        &std::fs::read_to_string(&input_path).with_context(|| format!("reading {}", input_path.display()))?,
    )
    .with_context(|| format!("parsing {}", input_path.display()))?;
    let tmp = tempfile::tempdir()?;
    let cwd = tmp.path().join("cwd");
    std::fs::create_dir_all(&cwd)?;
    let cwd = cwd.canonicalize()?;
    if dir.join("workspace").is_dir() {
        copy_dir(&dir.join("workspace"), &cwd)?;
    }
    let sessions = tmp.path().join("sessions");
    let config = match dir.join("kin.toml") {
        overlay if overlay.exists() => overlay.canonicalize()?,
        _ => {
            let empty = tmp.path().join("empty.toml");
            std::fs::write(&empty, "")?;
            empty
        }
    };
    let mut args: Vec<String> = vec!["acp".into(), "--sessions".into(), sessions.display().to_string()];
    let mut env = vec![("RUST_LOG".to_string(), "info".to_string())];
    if opts.record {
        // A recording uses the user's own configuration (model route, providers, keys), plus the
        // scenario's overlay when it has one.
        if dir.join("kin.toml").exists() {
            args.extend(["--config".into(), config.display().to_string()]);
        }
        for key in ["KIN_MODEL", "KIN_CONFIG"] {
            if let Some(value) = crate::config::process_env(key) {
                env.push((key.into(), value));
            }
        }
    } else {
        args.extend(["--config".into(), config.display().to_string()]);
        args.extend(["--replay".into(), dir.canonicalize()?.display().to_string()]);
        env.push(("XDG_CONFIG_HOME".into(), tmp.path().display().to_string()));
        // Nor the user's Claude Code agents and commands (`~/.claude/agents`, `commands`): a replay
        // sees only the scenario's.
        env.push(("CLAUDE_CONFIG_DIR".into(), tmp.path().join("claude").display().to_string()));
    }
    // Like dsh's snapshots (which run with full access), a scenario runs in `bypass` unless its
    // kin.toml sets `permission_mode`.
    if !sets_permission_mode(&config)? {
        args.extend(["--permission-mode".into(), "bypass".into()]);
    }
    let launch =
        Launch { exe: opts.exe.clone(), args, cwd: cwd.clone(), stderr_log: tmp.path().join("kin.stderr"), env };
    let answers: Vec<String> = input["permissionAnswers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|a| a["kind"].as_str().map(str::to_string))
        .collect();
    let mut run = Run {
        cwd: cwd.clone(),
        sessions: sessions.clone(),
        transcript: Arc::new(Transcript::default()),
        answers: Arc::new(Mutex::new(answers)),
        client: None,
        launch,
        ids: crate::acp::peer::numbering(),
        session_id: None,
        pending_prompt: None,
        exit_codes: Vec::new(),
    };
    run.start().await?;
    let steps = input["steps"].as_array().cloned().unwrap_or_default();
    for (i, step) in steps.iter().enumerate() {
        steps::run_step(&mut run, step).await.with_context(|| format!("step {} ({})", i + 1, step["op"]))?;
    }
    run.stop().await?;
    let stderr = std::fs::read_to_string(&run.launch.stderr_log).unwrap_or_default();
    let mut report = String::new();
    // A process replaced by `restart` may leave replay calls to its successor (exit 3).
    let (last, earlier) = run.exit_codes.split_last().context("kin never ran")?;
    let bad = earlier.iter().find(|c| !matches!(c, Some(0) | Some(3))).or((*last != Some(0)).then_some(last));
    if let Some(code) = bad {
        report.push_str(&format!("kin exited with {code:?}; its stderr:\n{}\n", tail(&stderr, 40)));
    }
    let scrubber = Scrubber::new(&cwd);
    let actual = normalize::stdout_frames(&run.transcript.snapshot(), &scrubber);
    let logs = produced_logs(&sessions, run.session_id.as_deref())?;
    let produced: Vec<(String, Vec<String>)> =
        logs.iter().map(|(name, text)| (name.clone(), normalize::log_lines(text, &scrubber))).collect();
    if let Some(out) = &opts.out {
        let target = out.join(dir.file_name().unwrap_or_default());
        std::fs::create_dir_all(&target)?;
        for (name, text) in &logs {
            std::fs::write(target.join(name), text)?;
        }
    }
    if opts.update {
        let lines: Vec<String> = actual.iter().map(Value::to_string).collect();
        std::fs::write(dir.join("stdout.expected.jsonl"), lines.join("\n") + "\n")?;
        let keep_ids = scrubber.keeping_ids();
        for (name, text) in &logs {
            std::fs::write(dir.join(name), normalize::log_lines(text, &keep_ids).join("\n") + "\n")?;
        }
        return Ok(report);
    }
    let expected_text =
        std::fs::read_to_string(dir.join("stdout.expected.jsonl")).context("reading stdout.expected.jsonl")?;
    let expected: Vec<Value> = expected_text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).with_context(|| format!("bad expected line: {l}")))
        .collect::<Result<_>>()?;
    match opts.compare {
        Compare::Exact => {
            report.push_str(&diff("stdout", &render(&expected), &render(&actual)));
            for (name, lines) in &produced {
                let want = std::fs::read_to_string(dir.join(name)).unwrap_or_default();
                report.push_str(&diff(name, &normalize::log_lines(&want, &scrubber), lines));
            }
            let expected_logs = expected_log_names(dir)?;
            for name in expected_logs.iter().filter(|n| !produced.iter().any(|(p, _)| p == *n)) {
                report.push_str(&format!("{name}: expected, but kin produced no such session\n"));
            }
        }
        Compare::Text => {
            report.push_str(&diff("stdout (text)", &text_view(&expected), &text_view(&actual)));
            for name in expected_log_names(dir)? {
                let want = std::fs::read_to_string(dir.join(&name)).unwrap_or_default();
                let got = produced.iter().find(|(p, _)| *p == name).map(|(_, l)| l.join("\n")).unwrap_or_default();
                report.push_str(&diff(
                    &format!("{name} tool results"),
                    &tool_results(&want, &scrubber),
                    &tool_results(&got, &scrubber),
                ));
            }
        }
    }
    Ok(report)
}

impl Run {
    pub(crate) async fn start(&mut self) -> Result<()> {
        self.client =
            Some(Client::start(&self.launch, self.transcript.clone(), self.answers.clone(), self.ids.clone()).await?);
        Ok(())
    }

    pub(crate) async fn stop(&mut self) -> Result<()> {
        if let Some(client) = self.client.take() {
            let code = client.close(Duration::from_secs(30)).await?;
            self.exit_codes.push(code);
        }
        Ok(())
    }

    /// The parent session's log path, once the session exists.
    pub(crate) fn parent_log(&self) -> Option<PathBuf> {
        let id = self.session_id.as_ref()?;
        Some(crate::session::layout::log_path(&self.sessions, Some(&self.cwd.display().to_string()), id))
    }
}

/// True when the config file at `path` sets the top-level `permission_mode` key.
fn sets_permission_mode(path: &Path) -> Result<bool> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let table: toml::Table = toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    Ok(table.contains_key("permission_mode"))
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

fn copy_dir(from: &Path, to: &Path) -> Result<()> {
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            std::fs::create_dir_all(&target)?;
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

/// Produced logs named like a fixture: the parent `session.jsonl`, every other session
/// `session.N.jsonl` by `createdAt`.
fn produced_logs(sessions: &Path, parent: Option<&str>) -> Result<Vec<(String, String)>> {
    let store = crate::session::SessionStore::new(sessions);
    let mut all = store.list();
    all.sort_by(|a, b| (a.header.created_at, &a.header.id).cmp(&(b.header.created_at, &b.header.id)));
    let mut out = Vec::new();
    let mut n = 0;
    for stored in all {
        let name = if Some(stored.header.id.as_str()) == parent {
            "session.jsonl".to_string()
        } else {
            n += 1;
            format!("session.{n}.jsonl")
        };
        out.push((name, std::fs::read_to_string(&stored.path)?));
    }
    out.sort();
    Ok(out)
}

fn expected_log_names(dir: &Path) -> Result<Vec<String>> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if name.starts_with("session") && name.ends_with(".jsonl") {
            names.push(name);
        }
    }
    Ok(names)
}

fn render(frames: &[Value]) -> Vec<String> {
    frames.iter().map(Value::to_string).collect()
}

/// The text view: per response, the agent text streamed before it and the response itself
/// (initialize by protocol version only; errors by code and message).
fn text_view(frames: &[Value]) -> Vec<String> {
    let mut out = Vec::new();
    let mut text = String::new();
    for frame in frames {
        if frame.get("method").is_none() && frame.get("id").is_some() {
            let body = if let Some(result) = frame.get("result") {
                match result.get("protocolVersion") {
                    Some(version) => serde_json::json!({"protocolVersion": version}),
                    None => {
                        // Session modes (kin's permission modes), config options (its model
                        // selector) and `_meta` (its named agents) are kin's own session
                        // settings, not part of the text.
                        let mut result = result.clone();
                        if let Some(fields) = result.as_object_mut() {
                            fields.remove("modes");
                            fields.remove("configOptions");
                            fields.remove("_meta");
                        }
                        result
                    }
                }
            } else {
                serde_json::json!({"error": {"code": frame["error"]["code"], "message": frame["error"]["message"]}})
            };
            out.push(format!("text {text:?} then {body}"));
            text.clear();
        } else if frame["params"]["update"]["sessionUpdate"] == "agent_message_chunk" {
            text.push_str(frame["params"]["update"]["content"]["text"].as_str().unwrap_or(""));
        }
    }
    if !text.is_empty() {
        out.push(format!("text {text:?} then (no response)"));
    }
    out
}

/// The model-visible tool results of a log, in order: what text compare checks of the logs.
fn tool_results(log: &str, scrubber: &Scrubber) -> Vec<String> {
    log.lines()
        .filter_map(|line| Record::parse(line).ok())
        .flat_map(Record::into_events)
        .filter_map(|e| e.get::<crate::session::event::ToolResult>())
        .flat_map(|result| result.message.content)
        .map(|part| {
            let text: String = part.content.iter().filter_map(|c| c["text"].as_str()).collect();
            let marker = if part.is_error { "error" } else { "ok" };
            format!("{marker}: {}", scrubber.string(&text))
        })
        .collect()
}

/// A readable line diff; empty when equal.
fn diff(what: &str, expected: &[String], actual: &[String]) -> String {
    if expected == actual {
        return String::new();
    }
    let mut out = format!("{what} differs (- expected, + actual):\n");
    let common = expected.iter().zip(actual).take_while(|(a, b)| a == b).count();
    for line in &expected[common.saturating_sub(2)..common] {
        out.push_str(&format!("  {line}\n"));
    }
    for line in &expected[common..] {
        out.push_str(&format!("- {line}\n"));
    }
    for line in &actual[common..] {
        out.push_str(&format!("+ {line}\n"));
    }
    out
}

/// Reads a log's header and events up to a torn tail (the store's read-only scan; for waits).
pub(crate) fn read_log(path: &Path) -> Option<(SessionHeader, Vec<crate::session::Event>)> {
    let scanned = crate::session::scan::scan_file(path).ok()?;
    Some((scanned.header, scanned.events))
}
