//! Agent files (`.kin/agents/*.md`, `.claude/agents/*.md`): Markdown with YAML front matter in
//! Claude Code's shape. The body (or a `prompt` key) is the persona. Keys kin does not use
//! belong to other tools and are ignored with a debug log; a file that cannot be used is an
//! error naming its line, and the caller skips it.

use std::collections::BTreeMap;
use std::path::Path;

use super::def::{AgentDef, Fields, Origin, split_tools};
use super::front::{Field, Node, split};
use crate::model::ModelRoute;

/// The largest agent file read, in bytes.
pub(crate) const MAX_FILE_BYTES: u64 = 256 * 1024;

/// Why a file is skipped: the line (1-based) and what is wrong there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FileError {
    pub(crate) line: usize,
    pub(crate) message: String,
}

/// A key kin reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Key {
    Name,
    Description,
    Prompt,
    Tools,
    Disallowed,
    Model,
    MaxTurns,
    Background,
    PermissionMode,
}

impl Key {
    /// The key of a front-matter name: kin's spelling or Claude Code's.
    fn of(written: &str) -> Option<Key> {
        Some(match written {
            "name" => Key::Name,
            "description" => Key::Description,
            "prompt" => Key::Prompt,
            "tools" => Key::Tools,
            "disallowed_tools" | "disallowedTools" => Key::Disallowed,
            "model" => Key::Model,
            "max_turns" | "maxTurns" => Key::MaxTurns,
            "background" => Key::Background,
            "permission_mode" | "permissionMode" => Key::PermissionMode,
            _ => return None,
        })
    }
}

/// Reads one agent file (a regular file of at most `MAX_FILE_BYTES`).
pub(crate) fn read(path: &Path, aliases: &BTreeMap<String, ModelRoute>) -> Result<AgentDef, FileError> {
    let whole = |message: String| FileError { line: 1, message };
    let file = crate::tools::regular::open_regular(path).map_err(|e| whole(format!("cannot read it: {e}")))?;
    let (bytes, cut) =
        crate::tools::regular::read_at_most(file, MAX_FILE_BYTES).map_err(|e| whole(format!("cannot read it: {e}")))?;
    if cut {
        return Err(whole(format!("it is larger than {} KiB", MAX_FILE_BYTES / 1024)));
    }
    let text = String::from_utf8(bytes).map_err(|_| whole("it is not UTF-8 text".into()))?;
    let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    parse(&text, &stem, Origin::File(path.to_path_buf()), aliases)
}

/// An agent file's text as a definition; `stem` names it when the front matter has no `name`.
pub(crate) fn parse(
    text: &str,
    stem: &str,
    origin: Origin,
    aliases: &BTreeMap<String, ModelRoute>,
) -> Result<AgentDef, FileError> {
    let front = split(text).map_err(|e| FileError { line: e.line, message: e.message })?;
    let mut fields = Fields { name: stem.to_string(), ..Fields::default() };
    let mut lines: BTreeMap<Key, usize> = BTreeMap::new();
    for field in &front.fields {
        let Some(key) = Key::of(&field.key) else {
            tracing::debug!(%origin, key = %field.key, "an agent file key kin does not use is ignored");
            continue;
        };
        if lines.insert(key, field.line).is_some() {
            return Err(at(field, format!("`{}` is given twice (under two spellings)", field.key)));
        }
        if field.value.is_null() {
            continue;
        }
        match key {
            Key::Name => fields.name = text_of(field)?,
            Key::Description => fields.description = Some(text_of(field)?),
            Key::Prompt => fields.persona = Some(text_of(field)?),
            Key::Tools => match &field.value {
                // opencode's shape, `tools: {bash: false}`, turns tools off.
                Node::Map(entries) => {
                    for (name, on) in entries {
                        match on.as_bool() {
                            Some(false) => fields.disallowed.push(name.clone()),
                            Some(true) => {}
                            None => return Err(at(field, format!("`tools.{name}` must be true or false"))),
                        }
                    }
                }
                Node::Scalar { .. } | Node::List(_) => fields.tools = Some(list_of(field)?),
            },
            Key::Disallowed => fields.disallowed.extend(list_of(field)?),
            Key::Model => fields.model = Some(text_of(field)?),
            Key::MaxTurns => {
                let number = match &field.value {
                    Node::Scalar { text, plain: true } => text.parse::<u64>().ok(),
                    Node::Scalar { .. } | Node::List(_) | Node::Map(_) => None,
                };
                fields.max_turns =
                    Some(number.ok_or_else(|| at(field, format!("`{}` must be a positive whole number", field.key)))?);
            }
            Key::Background => {
                fields.background = Some(
                    field.value.as_bool().ok_or_else(|| at(field, format!("`{}` must be true or false", field.key)))?,
                );
            }
            Key::PermissionMode => fields.permission_mode = Some(text_of(field)?),
        }
    }
    if !front.body.is_empty() {
        if fields.persona.is_some() {
            tracing::debug!(%origin, "the body is the persona; the `prompt` key is ignored");
        }
        fields.persona = Some(front.body.clone());
    }
    fields.build(origin, aliases).map_err(|e| FileError {
        line: Key::of(e.field).and_then(|k| lines.get(&k).copied()).unwrap_or(1),
        message: e.message,
    })
}

fn at(field: &Field, message: String) -> FileError {
    FileError { line: field.line, message }
}

fn text_of(field: &Field) -> Result<String, FileError> {
    field.value.as_text().map(str::to_string).ok_or_else(|| at(field, format!("`{}` must be text", field.key)))
}

/// A tool list: YAML list of names, or one string of names separated by commas or spaces.
fn list_of(field: &Field) -> Result<Vec<String>, FileError> {
    let wrong = || at(field, format!("`{}` must be a list of tool names or one comma-separated string", field.key));
    match &field.value {
        Node::Scalar { text, .. } => Ok(split_tools(text)),
        Node::List(items) => items.iter().map(|i| i.as_text().map(str::to_string).ok_or_else(wrong)).collect(),
        Node::Map(_) => Err(wrong()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::permission::PermissionMode;
    use crate::subagent::agents::ModelChoice;

    fn parse_text(text: &str) -> Result<AgentDef, FileError> {
        let aliases = BTreeMap::from([("sonnet".to_string(), ModelRoute::parse("anthropic/claude-s").unwrap())]);
        parse(text, "stem", Origin::Builtin, &aliases)
    }

    #[test]
    fn a_claude_code_agent_file_reads_with_kin_names() {
        let def = parse_text(
            "---\nname: tester\ndescription: Runs the tests.\ntools: Read, Grep, Bash, mcp__gh\n\
             disallowedTools: [Write, \"Bash(rm:*)\"]\nmodel: sonnet\npermissionMode: acceptEdits\nmaxTurns: 7\n\
             background: true\ncolor: blue\nhooks:\n  PreToolUse: [{matcher: Bash}]\n---\nYou run the tests.\n",
        )
        .unwrap();
        assert_eq!(def.name, "tester");
        assert_eq!(def.description, "Runs the tests.");
        assert_eq!(def.persona.as_deref(), Some("You run the tests."));
        assert_eq!(def.tools, Some(vec!["read".into(), "grep".into(), "bash".into(), "mcp__gh__*".into()]));
        assert_eq!(def.disallowed, ["write", "bash"]);
        assert_eq!(def.model, ModelChoice::Route(ModelRoute::parse("anthropic/claude-s").unwrap()));
        assert_eq!(def.permission_mode, Some(PermissionMode::AcceptEdits));
        assert_eq!((def.max_turns, def.background), (Some(7), Some(true)));
    }

    #[test]
    fn kin_spellings_the_stem_as_name_and_the_prompt_key() {
        let def = parse_text(
            "---\ndescription: d\nprompt: From the key.\ntools: [read, \"Bash(git:*)\"]\ndisallowed_tools: bash\n\
             max_turns: 3\npermission_mode: read-only\nmodel: inherit\n---\n",
        )
        .unwrap();
        assert_eq!(def.name, "stem");
        assert_eq!(def.persona.as_deref(), Some("From the key."));
        assert_eq!(def.tools, Some(vec!["read".to_string()]), "an allowed tool with an argument rule is left out");
        assert_eq!((def.disallowed.clone(), def.max_turns), (vec!["bash".to_string()], Some(3)));
        assert_eq!((def.permission_mode, def.model.clone()), (Some(PermissionMode::ReadOnly), ModelChoice::Inherit));
        let opencode = parse_text("---\ndescription: d\ntools:\n  bash: false\n  read: true\n---\n").unwrap();
        assert_eq!((opencode.tools, opencode.disallowed), (None, vec!["bash".to_string()]));
        let unknown = parse_text("---\ndescription: d\nmodel: haiku\n---\n").unwrap();
        assert_eq!(unknown.model, ModelChoice::Unknown("haiku".into()));
    }

    #[test]
    fn a_field_that_does_not_hold_names_its_line() {
        for (text, line, says) in [
            ("---\nname: x\n---\nbody\n", 1, "needs a `description`"),
            ("---\ndescription: d\nname: \"has space\"\n---\n", 3, "not a valid agent name"),
            ("---\ndescription: d\nmaxTurns: many\n---\n", 3, "positive whole number"),
            ("---\ndescription: d\nmax_turns: 0\n---\n", 3, "positive whole number"),
            ("---\ndescription: d\nbackground: maybe\n---\n", 3, "true or false"),
            ("---\ndescription: d\npermissionMode: yolo\n---\n", 3, "unknown permission mode \"yolo\""),
            ("---\ndescription: d\nmodel: a/\n---\n", 3, "provider/model"),
            ("---\ndescription: d\ntools: {bash: nope}\n---\n", 3, "true or false"),
            ("---\ndescription: [a]\n---\n", 2, "must be text"),
            ("---\ndescription: d\nmaxTurns: 1\nmax_turns: 2\n---\n", 4, "given twice"),
        ] {
            let err = parse_text(text).unwrap_err();
            assert_eq!(err.line, line, "{text:?}: {err:?}");
            assert!(err.message.contains(says), "{text:?}: {err:?}");
        }
    }

    #[test]
    fn files_are_bounded_and_regular() {
        let dir = tempfile::tempdir().unwrap();
        let big = dir.path().join("big.md");
        std::fs::write(&big, format!("---\ndescription: d\n---\n{}", "x".repeat(MAX_FILE_BYTES as usize))).unwrap();
        assert!(read(&big, &BTreeMap::new()).unwrap_err().message.contains("larger than 256 KiB"));
        let bytes = dir.path().join("bytes.md");
        std::fs::write(&bytes, b"---\ndescription: \xff\n---\n").unwrap();
        assert!(read(&bytes, &BTreeMap::new()).unwrap_err().message.contains("not UTF-8"));
        assert!(read(dir.path(), &BTreeMap::new()).unwrap_err().message.contains("cannot read it"));
        let ok = dir.path().join("ok.md");
        std::fs::write(&ok, "---\ndescription: d\n---\n").unwrap();
        assert_eq!(read(&ok, &BTreeMap::new()).unwrap().origin, Origin::File(ok));
    }
}
