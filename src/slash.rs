//! Slash commands: the built-ins (`/init`, `/compact`) and the user's prompt files (`.kin/commands/*.md`
//! and `.claude/commands/*.md` in the workspace, then the same under the user's config dirs,
//! Claude Code's convention), offered to the editor as `available_commands_update` and
//! expanded when a prompt begins with `/<name>`. A file command is its text with `$ARGUMENTS`
//! replaced (or the arguments appended when it has none); its front matter gives
//! `description` and `argument-hint`. Knows nothing of ACP.
//!
//! Bounded: at most `MAX_ENTRIES` entries of a directory are looked at, `MAX_FILES` files read
//! per directory and `MAX_COMMANDS` commands offered; a file that is not regular, is over
//! `MAX_FILE_BYTES` or has a name that is not a plain command name is skipped (and logged). A
//! prompt whose first word is not a known command goes to the model unchanged, so
//! `/usr/bin/ls fails` is just text.

use std::path::{Path, PathBuf};

/// The most entries of one directory looked at (in the order the directory lists them).
const MAX_ENTRIES: usize = 4096;
/// The most `.md` files read from one directory (in name order).
const MAX_FILES: usize = 100;
/// The most commands offered to the editor.
const MAX_COMMANDS: usize = 200;
/// A command file larger than this is skipped.
const MAX_FILE_BYTES: u64 = 64 * 1024;
/// A description longer than this is cut (with `…`).
const MAX_DESCRIPTION_CHARS: usize = 120;

/// A command kin runs itself. Each is matched exhaustively where it runs (`Runtime::prompt`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Builtin {
    /// Asks the model to draft an `AGENTS.md` for the workspace.
    Init,
    /// Compacts the conversation now (no model turn); its arguments focus the summary.
    Compact,
}

impl Builtin {
    /// Every built-in, in the order the editor lists them.
    pub const ALL: &'static [Builtin] = &[Builtin::Init, Builtin::Compact];

    pub fn name(self) -> &'static str {
        match self {
            Builtin::Init => "init",
            Builtin::Compact => "compact",
        }
    }

    fn description(self) -> &'static str {
        match self {
            Builtin::Init => "Draft an AGENTS.md for this workspace",
            Builtin::Compact => "Summarize the conversation so far to free up context",
        }
    }

    fn hint(self) -> Option<&'static str> {
        match self {
            Builtin::Init => Some("what to focus on (optional)"),
            Builtin::Compact => Some("what the summary should focus on (optional)"),
        }
    }
}

/// What `/init` asks the model.
const INIT_PROMPT: &str = "Please look around this workspace and write a draft AGENTS.md at its root: \
a short guide for coding agents working here. Cover what the project is, how it is laid out, how \
to build, test and lint it (the exact commands), and the conventions its code and commits follow. \
Read the existing docs and build files rather than guessing; if an AGENTS.md or CLAUDE.md exists, \
improve it instead of starting over. Keep it concise.";

/// What a command does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Builtin(Builtin),
    /// A prompt file: its text after the front matter.
    Prompt {
        body: String,
        path: PathBuf,
    },
}

/// One command as the editor lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlashCommand {
    pub name: String,
    pub description: String,
    /// What to type after the name (`argument-hint`).
    pub hint: Option<String>,
    pub action: Action,
}

/// A directory command files are read from, and the directory they must resolve within: the
/// workspace, for the workspace's own (a cloned repository's `review.md -> ~/.ssh/id_rsa` is not
/// followed out of it); a user directory's may link anywhere (a shared commands directory).
pub(crate) struct CommandDir {
    path: PathBuf,
    within: Option<PathBuf>,
}

/// The directories command files are read from for a session in `cwd`, first wins on a name:
/// the workspace's `.kin/commands` and `.claude/commands`, then `user_dirs` (from the config:
/// kin's config dir's `commands`, then `~/.claude/commands`).
pub(crate) fn dirs(cwd: Option<&Path>, user_dirs: &[PathBuf]) -> Vec<CommandDir> {
    let mut dirs = Vec::new();
    if let Some(cwd) = cwd {
        for dir in [".kin/commands", ".claude/commands"] {
            dirs.push(CommandDir { path: cwd.join(dir), within: Some(cwd.to_path_buf()) });
        }
    }
    dirs.extend(user_dirs.iter().map(|path| CommandDir { path: path.clone(), within: None }));
    dirs
}

/// The built-ins, then the command files of `dirs` (a name already taken is skipped).
pub(crate) fn discover(dirs: &[CommandDir]) -> Vec<SlashCommand> {
    let mut commands: Vec<SlashCommand> = Builtin::ALL
        .iter()
        .map(|b| SlashCommand {
            name: b.name().into(),
            description: b.description().into(),
            hint: b.hint().map(str::to_string),
            action: Action::Builtin(*b),
        })
        .collect();
    for dir in dirs {
        for command in read_dir(dir) {
            if commands.len() >= MAX_COMMANDS {
                tracing::warn!(dir = %dir.path.display(), "more than {MAX_COMMANDS} slash commands; the rest are not offered");
                return commands;
            }
            if commands.iter().any(|c| c.name == command.name) {
                tracing::debug!(name = %command.name, dir = %dir.path.display(), "slash command already defined earlier; skipped");
                continue;
            }
            commands.push(command);
        }
    }
    commands
}

/// The command files of one directory, in name order; a missing directory has none.
fn read_dir(command_dir: &CommandDir) -> Vec<SlashCommand> {
    let dir = command_dir.path.as_path();
    let Ok(mut entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut paths: Vec<PathBuf> = entries
        .by_ref()
        .take(MAX_ENTRIES)
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    if entries.next().is_some() {
        tracing::warn!(dir = %dir.display(), "more than {MAX_ENTRIES} entries; only the first listed are looked at");
    }
    paths.sort();
    if paths.len() > MAX_FILES {
        tracing::warn!(dir = %dir.display(), "more than {MAX_FILES} command files; only the first are read");
        paths.truncate(MAX_FILES);
    }
    paths.iter().filter_map(|p| read_file(p, command_dir.within.as_deref())).collect()
}

/// The command of the file at `path`; one that resolves outside `within` (when given) is
/// skipped with a warning.
fn read_file(path: &Path, within: Option<&Path>) -> Option<SlashCommand> {
    let name = path.file_stem()?.to_str()?.to_string();
    if !valid_name(&name) {
        tracing::warn!(path = %path.display(), "command file name is not a plain command name (letters, digits, - _ .); skipped");
        return None;
    }
    // A workspace's file is read where it resolves, which must be in the workspace.
    let resolved = match within {
        Some(root) => crate::tools::regular::resolved_within(path, root)
            .map_err(|e| {
                tracing::warn!(
                    path = %path.display(),
                    "command file skipped: {e}; copy it in, or put shared commands in ~/.config/kin/commands"
                )
            })
            .ok()?,
        None => path.to_path_buf(),
    };
    // Through symlinks (a shared commands dir), but only a regular file, and never more of it
    // than the cap.
    let text = crate::tools::regular::read_text(&resolved, MAX_FILE_BYTES)
        .map_err(|e| tracing::warn!(path = %path.display(), "command file skipped: {e}"))
        .ok()?;
    let (front, body) = front_matter(&text);
    let field = |key: &str| front.iter().find(|(k, _)| *k == key).map(|(_, v)| v.to_string()).filter(|v| !v.is_empty());
    let description = field("description")
        .or_else(|| {
            body.lines().map(str::trim).find(|l| !l.is_empty()).map(|l| l.trim_start_matches('#').trim().into())
        })
        .unwrap_or_else(|| format!("Run {}", path.display()));
    Some(SlashCommand {
        name,
        description: cut(&description, MAX_DESCRIPTION_CHARS),
        hint: field("argument-hint"),
        action: Action::Prompt { body: body.to_string(), path: path.to_path_buf() },
    })
}

fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && name.len() <= 64
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

fn cut(text: &str, chars: usize) -> String {
    if text.chars().count() <= chars {
        return text.to_string();
    }
    let mut cut: String = text.chars().take(chars - 1).collect();
    cut.push('…');
    cut
}

/// A file's front matter (`---` lines around `key: value` lines; quotes around a value dropped)
/// and the text after it. Without front matter, all of it is the body.
fn front_matter(text: &str) -> (Vec<(&str, &str)>, &str) {
    let Some(rest) = text.strip_prefix("---\n").or_else(|| text.strip_prefix("---\r\n")) else {
        return (Vec::new(), text);
    };
    let mut fields = Vec::new();
    let mut offset = 0;
    for line in rest.split_inclusive('\n') {
        offset += line.len();
        let line = line.trim_end();
        if line == "---" {
            return (fields, &rest[offset..]);
        }
        if let Some((key, value)) = line.split_once(':') {
            let value = value.trim();
            let value = value
                .strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .or_else(|| value.strip_prefix('\'').and_then(|v| v.strip_suffix('\'')))
                .unwrap_or(value);
            fields.push((key.trim(), value));
        }
    }
    // No closing `---`: not front matter.
    (Vec::new(), text)
}

/// A prompt that invokes a command: its first line is `/<name>` or `/<name> <arguments>`.
/// Returns the name, the arguments and the text after the first line.
pub(crate) fn invocation(text: &str) -> Option<(&str, &str, &str)> {
    let rest = text.trim_start().strip_prefix('/')?;
    let (line, after) = rest.split_once('\n').unwrap_or((rest, ""));
    let (name, arguments) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
    valid_name(name).then_some((name, arguments.trim(), after))
}

/// What a prompt that invokes a command becomes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Expansion {
    /// The text the model gets instead of the invocation.
    Prompt(String),
    /// Compact the history now instead of a turn, the summary focused on this (may be empty).
    Compact(String),
}

/// The expansion of `command` run with `arguments`, followed by `after` (the rest of the
/// prompt's text: more lines, an attached file).
pub(crate) fn expand(command: &SlashCommand, arguments: &str, after: &str) -> Expansion {
    let mut text = match &command.action {
        Action::Builtin(Builtin::Compact) => {
            let focus = [arguments, after.trim()].iter().filter(|t| !t.is_empty()).copied().collect::<Vec<_>>();
            return Expansion::Compact(focus.join("\n"));
        }
        Action::Builtin(Builtin::Init) if arguments.is_empty() => INIT_PROMPT.to_string(),
        Action::Builtin(Builtin::Init) => format!("{INIT_PROMPT}\n\nFocus on: {arguments}"),
        Action::Prompt { body, .. } if body.contains("$ARGUMENTS") => body.replace("$ARGUMENTS", arguments),
        Action::Prompt { body, .. } if arguments.is_empty() => body.clone(),
        Action::Prompt { body, .. } => format!("{}\n\nARGUMENTS: {arguments}", body.trim_end()),
    };
    if !after.trim().is_empty() {
        text.push('\n');
        text.push_str(after);
    }
    Expansion::Prompt(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_files_are_found_in_order_with_their_front_matter() {
        let tmp = tempfile::tempdir().unwrap();
        let cwd = tmp.path().join("w");
        let user = tmp.path().join("user");
        for dir in [cwd.join(".kin/commands"), cwd.join(".claude/commands"), user.clone()] {
            std::fs::create_dir_all(dir).unwrap();
        }
        std::fs::write(
            cwd.join(".kin/commands/review.md"),
            "---\ndescription: \"Review a file\"\nargument-hint: <path>\n---\nReview $ARGUMENTS carefully.\n",
        )
        .unwrap();
        std::fs::write(cwd.join(".claude/commands/review.md"), "shadowed\n").unwrap();
        std::fs::write(cwd.join(".claude/commands/fix.md"), "\n# Fix the build\nRun the tests and fix them.\n")
            .unwrap();
        std::fs::write(cwd.join(".claude/commands/init.md"), "a built-in name\n").unwrap();
        std::fs::write(cwd.join(".claude/commands/bad name.md"), "x").unwrap();
        std::fs::write(cwd.join(".claude/commands/notes.txt"), "x").unwrap();
        std::fs::write(user.join("big.md"), "x".repeat(MAX_FILE_BYTES as usize + 1)).unwrap();
        // Not regular: skipped without blocking or reading forever.
        std::os::unix::fs::symlink("/dev/zero", user.join("zero.md")).unwrap();
        let fifo = std::ffi::CString::new(user.join("pipe.md").to_str().unwrap()).unwrap();
        // SAFETY: mkfifo with a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        std::fs::create_dir(user.join("dir.md")).unwrap();
        std::fs::write(user.join("hello.md"), "Say hello.").unwrap();
        let found = discover(&dirs(Some(&cwd), std::slice::from_ref(&user)));
        let listed: Vec<(&str, &str, Option<&str>)> =
            found.iter().map(|c| (c.name.as_str(), c.description.as_str(), c.hint.as_deref())).collect();
        assert_eq!(
            listed,
            [
                ("init", "Draft an AGENTS.md for this workspace", Some("what to focus on (optional)")),
                (
                    "compact",
                    "Summarize the conversation so far to free up context",
                    Some("what the summary should focus on (optional)")
                ),
                ("review", "Review a file", Some("<path>")),
                ("fix", "Fix the build", None),
                ("hello", "Say hello.", None),
            ]
        );
        let review = &found[2];
        assert_eq!(expand(review, "src/a.rs", ""), Expansion::Prompt("Review src/a.rs carefully.\n".into()));
        assert_eq!(
            expand(&found[4], "in French", "more\n"),
            Expansion::Prompt("Say hello.\n\nARGUMENTS: in French\nmore\n".into())
        );
        let Expansion::Prompt(init) = expand(&found[0], "", "") else { panic!("/init is a prompt") };
        assert!(init.contains("AGENTS.md"), "{init}");
        assert_eq!(expand(&found[1], "", ""), Expansion::Compact(String::new()), "/compact runs no turn");
        assert_eq!(expand(&found[1], "the tests", "and docs\n"), Expansion::Compact("the tests\nand docs".into()));
    }

    /// A workspace's command file that links outside the workspace (a cloned repository's
    /// `review.md -> ~/.ssh/id_rsa`) is not read; one linking inside it is, and a user
    /// directory's may link anywhere.
    #[test]
    fn a_workspace_command_file_is_not_followed_out_of_the_workspace() {
        let tmp = tempfile::tempdir().unwrap();
        let (cwd, user) = (tmp.path().join("w"), tmp.path().join("user"));
        for dir in [cwd.join(".kin/commands"), cwd.join("docs"), user.clone()] {
            std::fs::create_dir_all(dir).unwrap();
        }
        let secret = tmp.path().join("secret.txt");
        std::fs::write(&secret, "TOP-SECRET-TOKEN=abc123\n").unwrap();
        std::fs::write(cwd.join("docs/ship.md"), "Ship it.\n").unwrap();
        let link = |target: &Path, at: PathBuf| std::os::unix::fs::symlink(target, at).unwrap();
        link(&secret, cwd.join(".kin/commands/review.md"));
        link(Path::new("../../docs/ship.md"), cwd.join(".kin/commands/ship.md"));
        link(&cwd.join("docs/../../secret.txt"), cwd.join(".kin/commands/dotdot.md"));
        link(&secret, user.join("mine.md"));
        let found = discover(&dirs(Some(&cwd), std::slice::from_ref(&user)));
        let listed: Vec<(&str, &str)> =
            found.iter().skip(2).map(|c| (c.name.as_str(), c.description.as_str())).collect();
        assert_eq!(listed, [("ship", "Ship it."), ("mine", "TOP-SECRET-TOKEN=abc123")]);
        // A workspace whose commands directory itself links out is read no further either.
        std::fs::remove_dir_all(cwd.join(".kin/commands")).unwrap();
        link(&user, cwd.join(".kin/commands"));
        let found = discover(&dirs(Some(&cwd), &[]));
        assert_eq!(found.len(), 2, "only the built-ins: {:?}", found.iter().map(|c| &c.name).collect::<Vec<_>>());
    }

    #[test]
    fn an_invocation_is_a_command_name_on_the_first_line() {
        assert_eq!(invocation("/review src/a.rs  \nand more"), Some(("review", "src/a.rs", "and more")));
        assert_eq!(invocation("  /init"), Some(("init", "", "")));
        assert_eq!(invocation("/usr/bin/ls fails"), None, "a path is not a command name");
        assert_eq!(invocation("please /init"), None);
        assert_eq!(invocation("/"), None);
    }

    #[test]
    fn front_matter_needs_its_closing_line() {
        assert_eq!(front_matter("---\na: b\n---\nbody"), (vec![("a", "b")], "body"));
        assert_eq!(front_matter("---\na: b\nbody"), (Vec::new(), "---\na: b\nbody"));
        assert_eq!(front_matter("plain"), (Vec::new(), "plain"));
    }
}
