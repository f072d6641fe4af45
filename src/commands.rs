//! The non-protocol subcommands: `kin scenario run` and `kin sessions list|show|check|delete`. These
//! print to stdout (only `kin acp` reserves stdout for the protocol).

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde_json::Value;

use crate::config::Config;
use crate::scenario::{self, Compare, RunOptions};
use crate::session::event::ToolResultPart;
use crate::session::{Event, EventBody, SessionStore};

/// Runs scenarios; returns true when all passed.
pub async fn scenario_run(dirs: &[PathBuf], opts: &RunOptions) -> Result<bool> {
    let mut all = Vec::new();
    for dir in dirs {
        all.extend(scenario_dirs(dir)?);
    }
    let mut out = std::io::stdout().lock();
    let mut failed = 0;
    for dir in &all {
        let outcome = scenario::run(dir, opts).await;
        if outcome.passed {
            writeln!(out, "ok      {}", outcome.name)?;
        } else {
            failed += 1;
            writeln!(out, "FAILED  {}\n{}", outcome.name, outcome.report)?;
        }
    }
    writeln!(out, "{} passed, {failed} failed", all.len() - failed)?;
    Ok(failed == 0)
}

/// A scenario directory itself, or the scenario directories inside it (sorted).
pub fn scenario_dirs(dir: &Path) -> Result<Vec<PathBuf>> {
    if dir.join("input.json").exists() {
        return Ok(vec![dir.to_path_buf()]);
    }
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading scenario directory {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("input.json").exists())
        .collect();
    dirs.sort();
    if dirs.is_empty() {
        anyhow::bail!("{} holds no scenario (no input.json)", dir.display());
    }
    Ok(dirs)
}

impl From<crate::cli::CompareArg> for Compare {
    fn from(c: crate::cli::CompareArg) -> Self {
        match c {
            crate::cli::CompareArg::Exact => Compare::Exact,
            crate::cli::CompareArg::Text => Compare::Text,
        }
    }
}

/// `kin sessions list`: the top-level sessions, newest first, with their titles, read as
/// `session/list` reads them (through the session query and its catalog index).
pub fn sessions_list(config: &Config, cwd: Option<&Path>) -> Result<()> {
    use crate::session::query::StoreSource;
    let source = StoreSource::persisted_only(SessionStore::new(config.sessions_dir.clone())).with_index();
    let sessions = source
        .top_level_titled(cwd, &tokio_util::sync::CancellationToken::new())
        .map_err(|e| anyhow::anyhow!("cannot list the sessions in {}: {e}", config.sessions_dir.display()))?;
    let mut out = std::io::stdout().lock();
    for (s, title) in sessions {
        let title = title.map(|t| format!("  {t}")).unwrap_or_default();
        let line = format!(
            "{}  {}  {}{title}",
            s.header.id,
            crate::timefmt::rfc3339(s.modified()),
            s.header.cwd.as_deref().unwrap_or("-")
        );
        writeln!(out, "{}", for_terminal(&line, false))?;
    }
    Ok(())
}

/// `text` safe to print to a terminal: each control character (an escape sequence that would
/// retitle or recolour it, a bell) written as its escape (`\u{1b}`), line breaks and tabs too
/// unless `multiline`. A log is the user's and the model's text, written by any process.
fn for_terminal(text: &str, multiline: bool) -> std::borrow::Cow<'_, str> {
    crate::tools::escaped_where(text, |c| c.is_control() && !(multiline && (c == '\n' || c == '\t')))
}

pub fn sessions_show(config: &Config, id: &str) -> Result<()> {
    let store = SessionStore::new(config.sessions_dir.clone());
    let scanned = store.inspect(id).map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut out = std::io::stdout().lock();
    let h = &scanned.header;
    let cwd = for_terminal(h.cwd.as_deref().unwrap_or("-"), false);
    writeln!(out, "session {} (cwd {cwd}, depth {})", h.id, h.delegation_depth)?;
    if let Some(parent) = &h.parent_session {
        writeln!(out, "parent  {parent}")?;
    }
    for event in &scanned.events {
        if let Some(line) = describe(event) {
            writeln!(out, "{}", for_terminal(&line, true))?;
        }
    }
    if let Some(torn) = &scanned.torn {
        writeln!(out, "(torn tail at line {}: {})", torn.line, torn.reason)?;
    }
    Ok(())
}

fn texts(content: &[Value]) -> String {
    content
        .iter()
        .filter_map(|b| match b["type"].as_str() {
            Some("text") => b["text"].as_str().map(str::to_string),
            Some("reasoning") => b["text"].as_str().map(|t| format!("(thinking) {t}")),
            Some("image") => Some(format!("[image {}]", b["mediaType"].as_str().unwrap_or("?"))),
            Some("tool-call") => {
                Some(format!("[call {} {}]", b["name"].as_str().unwrap_or("?"), b["arguments"].as_str().unwrap_or("")))
            }
            _ => None,
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn results(parts: &[ToolResultPart]) -> String {
    parts
        .iter()
        .map(|p| format!("[result{}] {}", if p.is_error { " error" } else { "" }, texts(&p.content)))
        .collect::<Vec<_>>()
        .join(" ")
}

fn describe(event: &Event) -> Option<String> {
    Some(match event.body() {
        EventBody::TurnStart(start) => format!("── turn {} ──", start.turn),
        EventBody::TurnEnd(end) => format!("── turn {} ended: {} ──", end.turn, end.reason.name()),
        EventBody::UserMessage(message) => format!("user: {}", texts(&message.content)),
        EventBody::AssistantMessage(m) => format!("assistant: {}", texts(&m.message.content)),
        EventBody::ToolResult(result) => format!("tool: {}", results(&result.message.content)),
        EventBody::McpServers(mcp) => {
            let servers: Vec<String> =
                mcp.servers.iter().map(|s| format!("{} ({}, {})", s.name, s.kind, s.origin)).collect();
            format!("mcp servers: {}", if servers.is_empty() { "none".into() } else { servers.join(", ") })
        }
        EventBody::SessionTitle(title) => format!("title: {} ({})", title.title, title.source.kind),
        EventBody::SubagentRemoteRun(run) => {
            let error = run.error.map(|e| format!(" ({e})")).unwrap_or_default();
            format!(
                "remote run {} by {} ({}), child session {}: {}{error}",
                run.run_id, run.provider, run.command, run.child_session_id, run.stop_reason
            )
        }
        EventBody::CompactStart(start) => match start.turn {
            Some(turn) => format!("compaction started (turn {turn})"),
            None => "compaction started (/compact)".into(),
        },
        EventBody::CompactSummary(summary) => format!(
            "compaction summary by {}/{}: {} history items (~{} tokens)",
            summary.provider,
            summary.model,
            summary.shadowed_seqs.len(),
            summary.shadowed_token_count
        ),
        EventBody::CompactEnd(end) => match end.error {
            Some(error) => format!("compaction failed: {error}"),
            None => "compaction done".into(),
        },
        EventBody::SteeringMessage(_)
        | EventBody::StepStart(_)
        | EventBody::AssistantChunk(_)
        | EventBody::ToolCall(_)
        | EventBody::ToolProgress(_)
        | EventBody::StepEnd(_)
        | EventBody::LlmRetry(_)
        | EventBody::SystemPrompt(_)
        | EventBody::TodoWrite(_)
        | EventBody::SessionMode(_)
        | EventBody::SessionModel(_)
        | EventBody::SessionSandbox(_)
        | EventBody::SessionEndSeed(_)
        | EventBody::SubagentDescriptor(_)
        | EventBody::AgentInboxSpliced(_)
        | EventBody::Unknown { .. } => return None,
    })
}

/// Deletes a top-level session and its subagent sessions, with the store's refusals (a child
/// id, a session a kin process has open).
pub fn sessions_delete(config: &Config, id: &str) -> Result<()> {
    let removed = SessionStore::new(config.sessions_dir.clone()).delete(id).map_err(|e| anyhow::anyhow!("{e}"))?;
    let children = removed.len().saturating_sub(1);
    let plural = if children == 1 { "" } else { "s" };
    writeln!(std::io::stdout().lock(), "deleted session {id} and {children} subagent session{plural}")?;
    Ok(())
}

/// Validates logs; returns true when every checked log is clean.
pub fn sessions_check(config: &Config, id: Option<&str>) -> Result<bool> {
    let store = SessionStore::new(config.sessions_dir.clone());
    let mut out = std::io::stdout().lock();
    let (paths, unreadable) = match id {
        Some(id) => (
            vec![
                store
                    .locate(id)
                    .map_err(|e| anyhow::anyhow!("{e}"))?
                    .with_context(|| format!("unknown session: {id}"))?,
            ],
            Vec::new(),
        ),
        None => all_logs(store.root())?,
    };
    let mut clean = unreadable.is_empty();
    for problem in unreadable {
        writeln!(out, "unreadable {problem}")?;
    }
    if paths.is_empty() && clean {
        writeln!(out, "no session logs under {}", store.root().display())?;
    }
    for path in paths {
        // The directory a log is filed under is the id its header must name.
        let checked = crate::session::scan::scan_file(&path).and_then(|scanned| {
            match crate::session::scan::filed(&path, &scanned.header.id) {
                Ok(()) => Ok(scanned),
                Err(reason) => Err(crate::session::scan::ScanError::Corrupt { path: path.clone(), line: 1, reason }),
            }
        });
        match checked {
            Ok(scanned) => match &scanned.torn {
                None => {
                    let note = if SessionStore::is_open(&path) {
                        " (open in a kin process, which is writing it)"
                    } else if crate::session::repair::closers(&scanned.events).is_empty() {
                        ""
                    } else {
                        " (last turn interrupted; load will close it)"
                    };
                    writeln!(out, "ok       {} ({} events){note}", path.display(), scanned.events.len())?;
                }
                Some(torn) => {
                    clean = false;
                    writeln!(
                        out,
                        "torn     {}:{}: {} ({} bytes ignored)",
                        path.display(),
                        torn.line,
                        torn.reason,
                        torn.bytes
                    )?;
                }
            },
            Err(e) => {
                clean = false;
                let label = match e {
                    crate::session::scan::ScanError::Io { .. } => "unreadable",
                    crate::session::scan::ScanError::Corrupt { .. } => "corrupt ",
                };
                writeln!(out, "{label} {e}")?;
            }
        }
    }
    Ok(clean)
}

/// Every log under the sessions directory `root` (none when it does not exist; an error when it
/// cannot be read), and each project directory that cannot be read, with why.
fn all_logs(root: &Path) -> Result<(Vec<PathBuf>, Vec<String>)> {
    let projects = match std::fs::read_dir(root) {
        Ok(projects) => projects,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((Vec::new(), Vec::new())),
        Err(e) => anyhow::bail!("cannot read the sessions directory {}: {e}", root.display()),
    };
    let (mut out, mut unreadable) = (Vec::new(), Vec::new());
    for project in projects.flatten() {
        if !project.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let sessions = match std::fs::read_dir(project.path()) {
            Ok(sessions) => sessions,
            Err(e) => {
                unreadable.push(format!("{}: {e}", project.path().display()));
                continue;
            }
        };
        for session in sessions.flatten() {
            let path = session.path().join(crate::session::layout::LOG_FILE);
            if std::fs::symlink_metadata(&path).is_ok() {
                out.push(path);
            }
        }
    }
    out.sort();
    Ok((out, unreadable))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn event(kind: &str, data: Value) -> Event {
        Event { kind: kind.into(), seq: 0, time: 0, data: data.into(), source_event_seqs: None, surface_op: None }
    }

    #[test]
    fn a_transcript_names_remote_runs_and_skips_log_only_noise() {
        let run = json!({"runId": "acp-1", "provider": "acp:fw", "command": "sh", "childSessionId": "s1", "output": "x", "stopReason": "error", "error": "it broke"});
        assert_eq!(
            describe(&event("subagent/remote-run", run)).as_deref(),
            Some("remote run acp-1 by acp:fw (sh), child session s1: error (it broke)")
        );
        assert_eq!(describe(&event("tool/progress", json!({"callId": "c1", "text": "Read a"}))), None);
    }

    /// What the session commands print of a log is safe for a terminal: control characters
    /// are written as escapes (line breaks and tabs kept only where the output has lines).
    #[test]
    fn control_characters_are_printed_as_escapes() {
        let title = "hi\u{7}\u{1b}]0;PWNED\u{9b}31m\tx\ny";
        assert_eq!(for_terminal(title, false), "hi\\u{7}\\u{1b}]0;PWNED\\u{9b}31m\\u{9}x\\u{a}y");
        assert_eq!(for_terminal(title, true), "hi\\u{7}\\u{1b}]0;PWNED\\u{9b}31m\tx\ny");
        assert!(matches!(for_terminal("plain é", false), std::borrow::Cow::Borrowed("plain é")));
    }
}
