//! Model-visible names of MCP tools: `mcp__<server>__<tool>`, limited to what the model APIs
//! accept (`^[a-zA-Z0-9_-]{1,64}$`). Every other character becomes `_`; the server part never
//! holds `__` (runs of `_` collapse), so the first `__` after the prefix always ends it. A name
//! over 64 characters, or one another tool already took, is cut and given `_` plus 8 hex digits
//! of a hash of the server's and the tool's own names. Names are assigned in (server, tool) order,
//! so the same tools always get the same names; an exact duplicate is dropped.

use std::collections::HashSet;

/// What every MCP tool name starts with (no built-in tool does).
pub(crate) const PREFIX: &str = "mcp__";

const MAX_LEN: usize = 64;

/// `[A-Za-z0-9_-]` kept, everything else `_`.
fn sanitize(text: &str) -> String {
    text.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' }).collect()
}

/// The server part: sanitised, runs of `_` collapsed, never empty.
fn server_part(name: &str) -> String {
    let mut out = String::new();
    for c in sanitize(name).chars() {
        if !(c == '_' && out.ends_with('_')) {
            out.push(c);
        }
    }
    if out.is_empty() { "server".into() } else { out }
}

fn tool_part(name: &str) -> String {
    let part = sanitize(name);
    if part.is_empty() { "tool".into() } else { part }
}

/// FNV-1a: a stable hash (std's hashers are seeded per process).
fn fnv1a(parts: &[&str]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            hash ^= 0xff;
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
        for byte in part.bytes() {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    }
    hash
}

/// Names for `(server, tool)` pairs, in the input order; `None` for a pair that gets no name
/// (an exact duplicate, or a hashed name that is taken too). `taken` holds names already in use
/// (the built-in tools).
pub(super) fn assign(pairs: &[(&str, &str)], taken: &HashSet<String>) -> Vec<Option<String>> {
    let mut order: Vec<usize> = (0..pairs.len()).collect();
    order.sort_by(|&a, &b| pairs[a].cmp(&pairs[b]));
    let mut used: HashSet<String> = taken.clone();
    let mut seen: HashSet<(&str, &str)> = HashSet::new();
    let mut names = vec![None; pairs.len()];
    for i in order {
        let (server, tool) = pairs[i];
        if !seen.insert((server, tool)) {
            tracing::warn!(server, tool, "MCP server lists the tool twice; the second is dropped");
            continue;
        }
        let plain = format!("{PREFIX}{}__{}", server_part(server), tool_part(tool));
        let name = if plain.len() <= MAX_LEN && !used.contains(&plain) {
            plain
        } else {
            let suffix = format!("_{:08x}", fnv1a(&[server, tool]) & 0xffff_ffff);
            let keep = plain.len().min(MAX_LEN - suffix.len());
            format!("{}{suffix}", &plain[..keep])
        };
        if used.contains(&name) {
            tracing::warn!(server, tool, name, "no free name for the MCP tool; it is dropped");
            continue;
        }
        used.insert(name.clone());
        names[i] = Some(name);
    }
    names
}

/// The start of every tool name of `server`: `mcp__<server part>__`.
pub(super) fn prefix_for(server: &str) -> String {
    format!("{PREFIX}{}__", server_part(server))
}

/// Whether a tool name is an MCP tool's.
pub(crate) fn is_mcp_tool(name: &str) -> bool {
    name.starts_with(PREFIX)
}

/// `server: tool` for an MCP tool name (as sanitised), else `None`.
pub(super) fn display_title(name: &str) -> Option<String> {
    let rest = name.strip_prefix(PREFIX)?;
    let (server, tool) = rest.split_once("__")?;
    Some(format!("{server}: {tool}"))
}

/// The longest arguments text a title shows (the rest is cut, marked `…`).
const TITLE_ARGUMENTS: usize = 120;

/// The title of a call of an MCP tool: `server: tool {arguments}` (the arguments cut to 120
/// characters), or `None` for a name that is not an MCP tool's. It is known from the name alone,
/// so a call shows the same while the server runs and in a loaded session after it is gone.
pub(crate) fn call_title(name: &str, arguments: &serde_json::Value) -> Option<String> {
    let call = display_title(name)?;
    let text = arguments.to_string();
    let shown = match text.char_indices().nth(TITLE_ARGUMENTS) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text,
    };
    Some(format!("{call} {shown}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn valid(name: &str) -> bool {
        (1..=MAX_LEN).contains(&name.len()) && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    }

    #[test]
    fn names_are_sanitised_and_split_back_into_server_and_tool() {
        let pairs = [("github", "create_issue"), ("my server.v2", "read/file"), ("a__b", "x"), ("", "")];
        let names = assign(&pairs, &HashSet::new());
        let names: Vec<String> = names.into_iter().map(Option::unwrap).collect();
        assert_eq!(
            names,
            ["mcp__github__create_issue", "mcp__my_server_v2__read_file", "mcp__a_b__x", "mcp__server__tool"]
        );
        assert_eq!(display_title(&names[1]).as_deref(), Some("my_server_v2: read_file"));
        assert_eq!(display_title(&names[2]).as_deref(), Some("a_b: x"));
        assert_eq!(display_title("read"), None);
        let title = call_title("mcp__gh__search", &serde_json::json!({"q": "x".repeat(200)})).unwrap();
        assert!(title.starts_with("gh: search {\"q\":\"xxx") && title.ends_with('…'), "{title}");
        assert_eq!(title.chars().count(), "gh: search ".len() + TITLE_ARGUMENTS + 1);
        assert_eq!(call_title("bash", &serde_json::json!({})), None);
        assert!(is_mcp_tool(&names[0]) && !is_mcp_tool("bash"));
    }

    #[test]
    fn long_and_colliding_names_get_a_stable_hash() {
        let long = "t".repeat(100);
        let pairs = [("srv", long.as_str()), ("srv", "a.b"), ("srv", "a_b"), ("srv", "a_b")];
        let names = assign(&pairs, &HashSet::new());
        let first = names[0].clone().unwrap();
        assert!(valid(&first) && first.len() == MAX_LEN, "{first}");
        assert!(first.starts_with("mcp__srv__ttt"), "{first}");
        // `a.b` and `a_b` both sanitise to `a_b`: the one that sorts first keeps it.
        assert_eq!(names[1].as_deref(), Some("mcp__srv__a_b"));
        assert_eq!(names[2].as_deref().map(|n| n.starts_with("mcp__srv__a_b_") && n.len() == 22), Some(true));
        assert_eq!(names[3], None, "an exact duplicate is dropped");
        // Deterministic: the same input, in another order, gets the same names.
        let reversed: Vec<(&str, &str)> = pairs.iter().rev().copied().collect();
        let again = assign(&reversed, &HashSet::new());
        assert_eq!(again[3], names[0]);
        assert_eq!(again[2], names[1]);
        // A taken name (a built-in) is never given out.
        let taken: HashSet<String> = ["mcp__srv__a_b".to_string()].into();
        let names = assign(&[("srv", "a_b")], &taken);
        assert_ne!(names[0].as_deref(), Some("mcp__srv__a_b"));
        assert!(valid(names[0].as_deref().unwrap()));
    }
}
