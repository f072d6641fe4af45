//! One named agent: what the model reads to choose it, and what a child started as it runs with
//! (persona, tool filter, model, turn limit, permission cap, background default). Files and
//! config tables give the same fields in their own syntax; both end in `Fields::build`, so a
//! value means the same wherever it is written.

use std::path::PathBuf;

use crate::model::ModelRoute;
use crate::permission::PermissionMode;
use crate::subagent::ToolFilter;

/// The longest agent name, in bytes.
pub(crate) const MAX_NAME: usize = 64;
/// The longest description kept, in characters (a longer one is cut with `…`).
pub(crate) const MAX_DESCRIPTION: usize = 1024;

/// Where a definition comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// Shipped with kin.
    Builtin,
    /// A `[agents.NAME]` table of the config file.
    Config,
    /// An agent file.
    File(PathBuf),
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Origin::Builtin => f.write_str("built in"),
            Origin::Config => f.write_str("the config file"),
            Origin::File(path) => write!(f, "{}", path.display()),
        }
    }
}

/// Which model a child runs on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelChoice {
    /// Not set: as the default child (`[subagents] model`, else the parent's route).
    Default,
    /// `inherit`: the parent's route.
    Inherit,
    /// A kin route, written as one or through `[model_aliases]`.
    Route(ModelRoute),
    /// Neither a route nor a configured alias: the parent's route (the load warned about it).
    Unknown(String),
}

/// A named agent.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentDef {
    pub name: String,
    pub description: String,
    /// `None` for `general`, which keeps the default child's `[subagents]` persona.
    pub persona: Option<String>,
    /// Tool names or `*` patterns the child may use (`None`: every tool).
    pub tools: Option<Vec<String>>,
    /// Tool names or patterns it may not use.
    pub disallowed: Vec<String>,
    pub model: ModelChoice,
    /// At most this many model calls per turn (capped by `agent.max_steps`).
    pub max_turns: Option<u32>,
    /// `run_in_background` when a call does not say.
    pub background: Option<bool>,
    /// The child's permission mode is never looser than this (nor than its parent's).
    pub permission_mode: Option<PermissionMode>,
    /// `general`: the default child's persona, tools and model, whatever this definition says.
    pub is_default: bool,
    pub origin: Origin,
}

impl AgentDef {
    /// What the user is told when this agent asks for a model kin cannot resolve: it runs on its
    /// parent's model instead (`None` when its model resolves).
    pub fn model_notice(&self) -> Option<String> {
        match &self.model {
            ModelChoice::Unknown(model) => Some(format!(
                "agent \"{}\" ({}) asks for model {model:?}, which is neither a kin route (provider/model) nor \
                 an alias in [model_aliases]; it runs on its parent's model",
                self.name, self.origin
            )),
            ModelChoice::Default | ModelChoice::Inherit | ModelChoice::Route(_) => None,
        }
    }
}

/// A definition's fields as written, before they are checked.
#[derive(Debug, Clone, Default)]
pub(crate) struct Fields {
    pub(crate) name: String,
    pub(crate) description: Option<String>,
    pub(crate) persona: Option<String>,
    pub(crate) tools: Option<Vec<String>>,
    pub(crate) disallowed: Vec<String>,
    pub(crate) model: Option<String>,
    pub(crate) max_turns: Option<u64>,
    pub(crate) background: Option<bool>,
    pub(crate) permission_mode: Option<String>,
}

/// A field that does not hold: which one and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FieldError {
    pub(crate) field: &'static str,
    pub(crate) message: String,
}

fn bad(field: &'static str, message: impl Into<String>) -> FieldError {
    FieldError { field, message: message.into() }
}

/// True for a name an agent may have: 1 to 64 ASCII letters, digits, `-`, `_` or `.`.
pub(crate) fn valid_name(name: &str) -> bool {
    (1..=MAX_NAME).contains(&name.len())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// A permission mode as kin or Claude Code write it.
pub(crate) fn permission_mode(text: &str) -> Option<PermissionMode> {
    PermissionMode::parse(text).or(match text {
        "default" => Some(PermissionMode::Ask),
        "acceptEdits" => Some(PermissionMode::AcceptEdits),
        // Claude Code's `plan` reads and plans; `dontAsk` refuses whatever would ask.
        "plan" | "dontAsk" | "readOnly" => Some(PermissionMode::ReadOnly),
        "bypassPermissions" => Some(PermissionMode::Bypass),
        _ => None,
    })
}

/// What a tool name written in a definition means to kin: Claude Code's tool names map to
/// kin's (`Read` → `read`, `Task` → both delegation tools); `mcp__server` stands for every tool
/// of that server. A name with an argument rule (`Bash(git:*)`) is kept as its tool when
/// `deny` (the whole tool is denied) and dropped otherwise (kin cannot allow part of a tool).
pub(crate) fn tool_names(written: &str, deny: bool) -> Vec<String> {
    let written = written.trim();
    let (base, rule) = match written.split_once('(') {
        Some((base, _)) => (base.trim(), true),
        None => (written, false),
    };
    if rule && !deny {
        tracing::debug!(tool = %written, "an allowed tool with an argument rule is left out: kin allows whole tools");
        return Vec::new();
    }
    let mapped: &[&str] = match base {
        "Read" | "NotebookRead" => &["read"],
        "Write" => &["write"],
        "Edit" | "MultiEdit" | "NotebookEdit" => &["edit"],
        "Glob" | "LS" => &["glob"],
        "Grep" => &["grep"],
        "Bash" | "BashOutput" | "KillShell" => &["bash"],
        "TodoWrite" => &["todo_write"],
        "Task" | "Agent" => &["subagent", "subagent_fork"],
        "SendMessage" => &["send_message"],
        "ListAgents" => &["list_agents"],
        _ => &[],
    };
    if !mapped.is_empty() {
        return mapped.iter().map(|s| s.to_string()).collect();
    }
    match base.strip_prefix("mcp__") {
        Some(server) if !server.is_empty() && !server.contains("__") && !server.contains('*') => {
            vec![format!("mcp__{server}__*")]
        }
        _ if base.is_empty() => Vec::new(),
        _ => vec![base.to_string()],
    }
}

/// Splits a tool list written as one string (`Read, Grep Glob`).
pub(crate) fn split_tools(text: &str) -> Vec<String> {
    text.split(|c: char| c == ',' || c.is_whitespace()).filter(|s| !s.is_empty()).map(str::to_string).collect()
}

/// Cuts a description to `MAX_DESCRIPTION` characters, marking the cut.
fn cut(text: &str) -> String {
    let text = text.trim();
    if text.chars().count() <= MAX_DESCRIPTION {
        return text.to_string();
    }
    let mut kept: String = text.chars().take(MAX_DESCRIPTION).collect();
    kept.push('…');
    kept
}

impl Fields {
    /// Checks the fields and builds the definition. `aliases` resolves model names that are not
    /// routes (`sonnet`); an unknown one falls back to the parent's route with a warning.
    pub(crate) fn build(
        self,
        origin: Origin,
        aliases: &std::collections::BTreeMap<String, ModelRoute>,
    ) -> Result<AgentDef, FieldError> {
        if !valid_name(&self.name) {
            return Err(bad(
                "name",
                format!(
                    "{:?} is not a valid agent name: use 1 to {MAX_NAME} letters, digits, `-`, `_` or `.`",
                    self.name
                ),
            ));
        }
        let description = self.description.filter(|d| !d.trim().is_empty()).ok_or_else(|| {
            bad("description", "an agent needs a `description`: it is what the model reads to choose it")
        })?;
        let model = match self.model.as_deref().map(str::trim) {
            None | Some("") => ModelChoice::Default,
            Some("inherit") => ModelChoice::Inherit,
            Some(text) => match aliases.get(text) {
                Some(route) => ModelChoice::Route(route.clone()),
                None if text.contains('/') => ModelChoice::Route(ModelRoute::parse(text).map_err(|e| bad("model", e))?),
                None => ModelChoice::Unknown(text.to_string()),
            },
        };
        let max_turns = match self.max_turns {
            None => None,
            Some(0) => return Err(bad("max_turns", "max_turns must be a positive whole number")),
            Some(n) => Some(u32::try_from(n).unwrap_or(u32::MAX)),
        };
        let permission_mode = match self.permission_mode.as_deref() {
            None => None,
            Some(text) => Some(permission_mode(text).ok_or_else(|| {
                bad(
                    "permission_mode",
                    format!(
                        "unknown permission mode {text:?}; use one of {} (or Claude Code's default, acceptEdits, plan, dontAsk, bypassPermissions)",
                        PermissionMode::valid_ids()
                    ),
                )
            })?),
        };
        let tools = self.tools.map(|t| t.iter().flat_map(|n| tool_names(n, false)).collect::<Vec<_>>());
        let disallowed = self.disallowed.iter().flat_map(|n| tool_names(n, true)).collect();
        Ok(AgentDef {
            name: self.name,
            description: cut(&description),
            persona: self.persona.map(|p| p.trim().to_string()).filter(|p| !p.is_empty()),
            tools: tools.map(dedup),
            disallowed: dedup(disallowed),
            model,
            max_turns,
            background: self.background,
            permission_mode,
            is_default: false,
            origin,
        })
    }
}

fn dedup(mut names: Vec<String>) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    names.retain(|n| seen.insert(n.clone()));
    names
}

impl AgentDef {
    /// The definition's own tool filter (`None`: no restriction).
    pub fn own_filter(&self) -> Option<ToolFilter> {
        if self.tools.is_none() && self.disallowed.is_empty() {
            return None;
        }
        Some(ToolFilter {
            allow: self.tools.clone(),
            deny: (!self.disallowed.is_empty()).then(|| self.disallowed.clone()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claude_code_tool_names_map_to_kin_and_rules_fail_closed() {
        assert_eq!(tool_names("Read", false), ["read"]);
        assert_eq!(tool_names("Task", false), ["subagent", "subagent_fork"]);
        assert_eq!(tool_names("mcp__github", false), ["mcp__github__*"]);
        assert_eq!(tool_names("mcp__github__list_issues", false), ["mcp__github__list_issues"]);
        assert_eq!(tool_names("mcp__*", true), ["mcp__*"]);
        assert_eq!(tool_names("todo_write", false), ["todo_write"]);
        assert!(tool_names("Bash(git status)", false).is_empty(), "kin cannot allow part of a tool");
        assert_eq!(tool_names("Bash(rm:*)", true), ["bash"], "denying part of a tool denies all of it");
        assert_eq!(split_tools("Read, Grep  Glob,,"), ["Read", "Grep", "Glob"]);
    }

    #[test]
    fn permission_modes_read_kin_and_claude_code_ids() {
        for (text, mode) in [
            ("ask", PermissionMode::Ask),
            ("default", PermissionMode::Ask),
            ("acceptEdits", PermissionMode::AcceptEdits),
            ("plan", PermissionMode::ReadOnly),
            ("dontAsk", PermissionMode::ReadOnly),
            ("bypassPermissions", PermissionMode::Bypass),
            ("read-only", PermissionMode::ReadOnly),
        ] {
            assert_eq!(permission_mode(text), Some(mode), "{text}");
        }
        assert_eq!(permission_mode("auto"), None);
    }

    #[test]
    fn long_descriptions_are_cut_and_say_so() {
        let fields =
            Fields { name: "n".into(), description: Some("d".repeat(MAX_DESCRIPTION + 5)), ..Fields::default() };
        let def = fields.build(Origin::Config, &Default::default()).unwrap();
        assert_eq!(def.description.chars().count(), MAX_DESCRIPTION + 1);
        assert!(def.description.ends_with('…'));
    }
}
