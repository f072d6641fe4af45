//! The agents every install has: `general` (the default child, as `[subagents]` configures it),
//! `explore` (read-only tools, for searching and reading) and `review` (read-only, reports
//! findings). A file or config table of the same name replaces one.

use super::def::{AgentDef, ModelChoice, Origin};
use crate::permission::PermissionMode;

/// The tools of the read-only built-ins.
pub(crate) const READ_ONLY_TOOLS: [&str; 3] = ["read", "glob", "grep"];

const EXPLORE: &str = "You are an explorer: you search and read the workspace to answer the question you are given. You cannot change files or run commands. Look broadly first (glob, grep), then read what matters. Answer with what you found: the files and lines that matter, quoted briefly, and what they mean for the question; say what you could not find.";

const REVIEW: &str = "You are a reviewer: you read the code you are pointed at and report findings. You cannot change files or run commands. Check correctness first (bugs, unhandled cases, broken invariants), then clarity and tests. Report each finding with its file and line, what is wrong, why it matters and what to do about it, most serious first; say plainly when you found nothing of weight.";

fn read_only(name: &str, description: &str, persona: &str) -> AgentDef {
    AgentDef {
        name: name.into(),
        description: description.into(),
        persona: Some(persona.into()),
        tools: Some(READ_ONLY_TOOLS.map(String::from).to_vec()),
        disallowed: Vec::new(),
        model: ModelChoice::Default,
        max_turns: None,
        background: None,
        permission_mode: Some(PermissionMode::ReadOnly),
        is_default: false,
        origin: Origin::Builtin,
    }
}

/// The built-in definitions.
pub(crate) fn all() -> Vec<AgentDef> {
    vec![
        AgentDef {
            name: "general".into(),
            description: "A general-purpose child with the default tools, for any self-contained task.".into(),
            persona: None,
            tools: None,
            disallowed: Vec::new(),
            model: ModelChoice::Default,
            max_turns: None,
            background: None,
            permission_mode: None,
            is_default: true,
            origin: Origin::Builtin,
        },
        read_only(
            "explore",
            "Searches and reads the workspace (read-only tools) and answers a question about it: where something is, how something works.",
            EXPLORE,
        ),
        read_only(
            "review",
            "Reviews code read-only and reports findings (bugs, risks, missing tests) with file and line; changes nothing.",
            REVIEW,
        ),
    ]
}
