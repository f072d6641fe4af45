//! The system prompt, built once per session: who the agent is, its environment (cwd, platform,
//! date, permission mode), how to use each of its tools well, the project's instructions
//! (`AGENTS.md` and `CLAUDE.md` at the workspace root) and the configured persona. Config
//! `system_prompt_file` replaces the built part. A new session records the text in its log as the
//! log-only event `system/prompt {text}`, and a loaded session reuses the last recorded one, so a
//! resumed conversation keeps its prompt. A replayed scenario pins the prompt with a
//! `system/prompt` event in its `session.jsonl` (`{{cwd}}` stands for the run's cwd); without
//! one the built prompt is used but not recorded, so transcripts do not depend on the date.

use std::fmt::Write as _;
use std::path::Path;

use crate::permission::PermissionMode;
use crate::session::event::{SystemPrompt, last};
use crate::session::{Event, Record};
use crate::tools::regular;

/// Project instruction files read from the workspace root, in this order.
const INSTRUCTION_FILES: [&str; 2] = ["AGENTS.md", "CLAUDE.md"];

/// Bytes of one instruction file included at most.
const MAX_INSTRUCTION_BYTES: u64 = 64 * 1024;

/// The largest `system_prompt_file` read, in bytes.
const MAX_SYSTEM_PROMPT_FILE_BYTES: u64 = 1024 * 1024;

/// What a prompt is built from.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PromptSettings<'a> {
    /// The workspace (session cwd).
    pub cwd: Option<&'a Path>,
    pub mode: PermissionMode,
    /// The advice of the tools the agent has, as `(tool name, advice)` (`ToolRegistry::guidance`).
    pub guidance: &'a [(String, &'static str)],
    /// A `# Persona` section.
    pub persona: Option<&'a str>,
    /// Replaces the built prompt (the persona section is still added).
    pub system_prompt_file: Option<&'a Path>,
    /// `YYYY-MM-DD`.
    pub date: &'a str,
}

/// Today's date in UTC, `YYYY-MM-DD`.
pub(crate) fn today() -> String {
    let stamp = crate::timefmt::rfc3339(std::time::SystemTime::now());
    stamp.get(..10).unwrap_or(&stamp).to_string()
}

/// Builds the prompt; fails only when `system_prompt_file` cannot be read (it must be a regular
/// UTF-8 file of at most `MAX_SYSTEM_PROMPT_FILE_BYTES`).
pub(crate) fn build(settings: &PromptSettings<'_>) -> Result<String, String> {
    let mut out = match settings.system_prompt_file {
        Some(path) => regular::read_text(path, MAX_SYSTEM_PROMPT_FILE_BYTES).map_err(|e| {
            format!(
                "cannot read the system prompt file {} (config key `system_prompt_file`): {e}; point the key at a \
                 regular text file of at most {} KiB",
                path.display(),
                MAX_SYSTEM_PROMPT_FILE_BYTES / 1024
            )
        })?,
        None => built(settings),
    };
    if let Some(persona) = settings.persona.filter(|p| !p.trim().is_empty()) {
        let _ = write!(out, "\n\n# Persona\n\n{}", persona.trim());
    }
    Ok(out)
}

/// The text of the last `system/prompt` event of a log.
pub(crate) fn recorded(events: &[Event]) -> Option<String> {
    last::<SystemPrompt>(events).map(|p| p.text)
}

/// The prompt a scenario directory pins: the last `system/prompt` of its `session.jsonl`.
pub(crate) fn pinned(scenario_dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(scenario_dir.join("session.jsonl")).ok()?;
    let events: Vec<Event> =
        text.lines().filter_map(|line| Record::parse(line).ok()).flat_map(Record::into_events).collect();
    recorded(&events)
}

fn built(settings: &PromptSettings<'_>) -> String {
    let mut out = String::from(
        "You are kin, a coding agent working in the user's project through their editor. You \
         read, search, edit and run commands in the workspace to do what the user asks. Be \
         direct and concise; do the work rather than describing it, and say briefly what you \
         changed when you are done.",
    );
    let cwd = settings.cwd.map_or_else(|| "(the process directory)".to_string(), |c| c.display().to_string());
    let _ = write!(
        out,
        "\n\n# Environment\n\n- Working directory (the workspace): {cwd}\n- Platform: {} ({})\n\
         - Date: {}\n- Permission mode: {} — {}",
        std::env::consts::OS,
        std::env::consts::ARCH,
        settings.date,
        settings.mode.id(),
        settings.mode.description(),
    );
    out.push_str(
        "\n\nA tool call the user rejects returns `Error: the user rejected this <tool> call`. \
         Do not retry it unchanged: take another approach or ask the user how to proceed.",
    );
    if !settings.guidance.is_empty() {
        out.push_str("\n\n# Using the tools\n");
        for (name, advice) in settings.guidance {
            let _ = write!(out, "\n- {name}: {advice}");
        }
    }
    if let Some(cwd) = settings.cwd {
        for name in INSTRUCTION_FILES {
            if let Some(text) = instructions(&cwd.join(name), cwd) {
                let _ = write!(
                    out,
                    "\n\n# Project instructions ({name})\n\nThese instructions come from {name} \
                     at the workspace root; follow them.\n\n{text}"
                );
            }
        }
    }
    out
}

/// The text of an instruction file, cut at `MAX_INSTRUCTION_BYTES`; `None` when absent or empty,
/// and when it cannot be read, is not a regular file (a FIFO would block, `/dev/zero` never
/// end; a workspace may hold such a symlink) or links outside the workspace `cwd` (a cloned
/// repository's `AGENTS.md -> ~/.ssh/id_rsa` would reach the model unasked): that is warned about.
fn instructions(path: &Path, cwd: &Path) -> Option<String> {
    let head =
        match regular::resolved_within(path, cwd).and_then(|path| regular::read_head(&path, MAX_INSTRUCTION_BYTES)) {
            Ok(head) => head,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(e) => {
                tracing::warn!(path = %path.display(), "project instructions left out of the system prompt: {e}");
                return None;
            }
        };
    let mut text = String::from_utf8_lossy(&head.bytes).trim().to_string();
    if text.is_empty() {
        return None;
    }
    if head.is_cut() {
        let _ = write!(text, "\n\n(… cut: the file has {} bytes; read it for the rest)", head.size);
    }
    Some(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn settings<'a>(cwd: &'a Path, guidance: &'a [(String, &'static str)]) -> PromptSettings<'a> {
        PromptSettings {
            cwd: Some(cwd),
            mode: PermissionMode::AcceptEdits,
            guidance,
            persona: None,
            system_prompt_file: None,
            date: "2026-12-01",
        }
    }

    #[test]
    fn the_built_prompt_names_the_environment_and_the_tools() {
        let dir = tempfile::tempdir().unwrap();
        let mut registry = crate::tools::ToolRegistry::new();
        crate::tools::builtin::register_coding_tools(&mut registry, crate::tools::fs::FileState::default());
        let guidance = registry.filtered(|name| name == "read" || name == "bash").guidance();
        let text = build(&settings(dir.path(), &guidance)).unwrap();
        assert!(text.contains(&dir.path().display().to_string()), "{text}");
        assert!(text.contains("Date: 2026-12-01"), "{text}");
        assert!(text.contains("Permission mode: accept-edits"), "{text}");
        assert!(text.contains(std::env::consts::OS), "{text}");
        assert!(text.contains("- read: "), "{text}");
        assert!(text.contains("- bash: "), "{text}");
        assert!(!text.contains("- edit: "), "only the tools the agent has: {text}");
        assert!(text.find("- read: ").unwrap() < text.find("- bash: ").unwrap(), "in registration order: {text}");
        assert!(!text.contains("# Persona"), "{text}");
        assert!(!text.contains("Project instructions"), "{text}");
    }

    #[test]
    fn project_instructions_and_persona_are_included() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("AGENTS.md"), "Run `make check` before finishing.\n").unwrap();
        std::fs::write(dir.path().join("CLAUDE.md"), "Use tabs.\n").unwrap();
        let mut s = settings(dir.path(), &[]);
        s.persona = Some("You are terse.");
        let text = build(&s).unwrap();
        let agents = text.find("Run `make check` before finishing.").unwrap();
        let claude = text.find("Use tabs.").unwrap();
        assert!(agents < claude, "AGENTS.md comes first");
        assert!(text.contains("# Project instructions (AGENTS.md)"), "{text}");
        assert!(text.ends_with("# Persona\n\nYou are terse."), "{text}");
    }

    #[test]
    fn a_prompt_file_replaces_the_built_prompt() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("prompt.md");
        std::fs::write(&file, "Custom prompt.").unwrap();
        let mut s = settings(dir.path(), &[]);
        s.system_prompt_file = Some(file.as_path());
        s.persona = Some("Persona text.");
        assert_eq!(build(&s).unwrap(), "Custom prompt.\n\n# Persona\n\nPersona text.");
        let missing = dir.path().join("missing.md");
        s.system_prompt_file = Some(missing.as_path());
        let err = build(&s).unwrap_err();
        assert!(err.contains("missing.md") && err.contains("system_prompt_file"), "{err}");
    }

    #[test]
    fn long_instruction_files_are_cut() {
        let dir = tempfile::tempdir().unwrap();
        let size = MAX_INSTRUCTION_BYTES as usize + 10;
        std::fs::write(dir.path().join("AGENTS.md"), "x".repeat(size)).unwrap();
        let text = build(&settings(dir.path(), &[])).unwrap();
        assert!(text.contains(&format!("(… cut: the file has {size} bytes; read it for the rest)")), "cut note");
        let kept = "x".repeat(MAX_INSTRUCTION_BYTES as usize);
        assert!(text.contains(&format!("\n{kept}\n")), "the first {MAX_INSTRUCTION_BYTES} bytes are kept, no more");
    }

    /// `build` for a workspace at `dir`, failing the test when it does not return within 10 s.
    fn build_promptly(dir: &Path) -> Result<String, String> {
        let dir = dir.to_path_buf();
        let (tx, rx) = std::sync::mpsc::channel();
        let _worker = std::thread::spawn(move || tx.send(build(&settings(&dir, &[]))));
        rx.recv_timeout(std::time::Duration::from_secs(10)).expect("build returns promptly")
    }

    /// A FIFO at `path`.
    fn mkfifo(path: &Path) {
        let c_path = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo with a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
    }

    #[test]
    fn instruction_files_that_are_not_regular_are_left_out() {
        let dir = tempfile::tempdir().unwrap();
        // git stores symlinks: a cloned repo may point AGENTS.md at an endless device.
        std::os::unix::fs::symlink("/dev/zero", dir.path().join("AGENTS.md")).unwrap();
        mkfifo(&dir.path().join("CLAUDE.md"));
        let text = build_promptly(dir.path()).unwrap();
        assert!(!text.contains("Project instructions"), "{text}");
        // A regular file beside them is still read.
        std::fs::remove_file(dir.path().join("CLAUDE.md")).unwrap();
        std::fs::write(dir.path().join("CLAUDE.md"), "Use tabs.\n").unwrap();
        let text = build_promptly(dir.path()).unwrap();
        assert!(!text.contains("# Project instructions (AGENTS.md)"), "{text}");
        assert!(text.contains("# Project instructions (CLAUDE.md)") && text.ends_with("Use tabs."), "{text}");
    }

    /// An instruction file that links outside the workspace is left out (it would reach the
    /// model without the user asking); one linking to a file inside it is read.
    #[test]
    fn instruction_files_linking_outside_the_workspace_are_left_out() {
        let tmp = tempfile::tempdir().unwrap();
        let cwd = tmp.path().join("w");
        std::fs::create_dir_all(cwd.join("docs")).unwrap();
        std::fs::write(tmp.path().join("id_rsa"), "PRIVATE KEY\n").unwrap();
        std::fs::write(cwd.join("docs/rules.md"), "Use tabs.\n").unwrap();
        std::os::unix::fs::symlink(tmp.path().join("id_rsa"), cwd.join("AGENTS.md")).unwrap();
        std::os::unix::fs::symlink("docs/rules.md", cwd.join("CLAUDE.md")).unwrap();
        let text = build_promptly(&cwd).unwrap();
        assert!(!text.contains("PRIVATE KEY") && !text.contains("(AGENTS.md)"), "{text}");
        assert!(text.contains("# Project instructions (CLAUDE.md)") && text.ends_with("Use tabs."), "{text}");
    }

    #[test]
    fn a_prompt_file_must_be_a_bounded_regular_file() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("prompt.fifo");
        mkfifo(&fifo);
        let large = dir.path().join("large.md");
        std::fs::write(&large, "x".repeat(MAX_SYSTEM_PROMPT_FILE_BYTES as usize + 1)).unwrap();
        let zero = dir.path().join("zero.md");
        std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
        let cases = [(&fifo, "is a FIFO"), (&large, "is larger than 1048576 bytes"), (&zero, "is a character device")];
        for (path, why) in cases {
            let mut s = settings(dir.path(), &[]);
            s.system_prompt_file = Some(path.as_path());
            let err = build(&s).unwrap_err();
            assert!(err.contains(&path.display().to_string()) && err.contains(why), "{err}");
            assert!(err.contains("system_prompt_file") && err.contains("at most 1024 KiB"), "{err}");
        }
    }

    #[test]
    fn the_last_recorded_prompt_wins_and_scenarios_pin_one() {
        let event = |seq: u64, kind: &str, text: &str| Event {
            kind: kind.into(),
            seq,
            time: 0,
            data: json!({"text": text}).into(),
            source_event_seqs: None,
            surface_op: None,
        };
        let prompt = "system/prompt";
        let events = vec![event(0, prompt, "first"), event(1, "turn/start", "x"), event(2, prompt, "second")];
        assert_eq!(recorded(&events).as_deref(), Some("second"));
        assert_eq!(recorded(&events[1..2]), None);
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(pinned(dir.path()), None);
        std::fs::write(
            dir.path().join("session.jsonl"),
            "{\"type\":\"session\",\"version\":0,\"id\":\"x\",\"createdAt\":0}\n\
             {\"type\":\"system/prompt\",\"seq\":0,\"time\":0,\"data\":{\"text\":\"Pinned in {{cwd}}.\"}}\n",
        )
        .unwrap();
        assert_eq!(pinned(dir.path()).as_deref(), Some("Pinned in {{cwd}}."));
    }

    #[test]
    fn today_is_a_date() {
        let date = today();
        assert_eq!(date.len(), 10);
        assert_eq!(&date[4..5], "-");
    }
}
