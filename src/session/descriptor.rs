//! The `subagent/descriptor` event, format v2 (dsh-design.md §1.6.2): the durable identity of a
//! session-backed subagent. Parsing is strict: a malformed current-version payload is corrupt,
//! another version is unsupported. It is disk format, so it lives in `session/`; `subagent/`
//! re-exports it as `subagent::descriptor`.
//!
//! kin adds one optional field to dsh's v2 shape, in both modes: `agent`, the named agent a child
//! was started as (`{name, permissionMode?, maxTurns?}`). It is written only for such a child, so
//! every other descriptor is exactly dsh's; a dsh reader would take one that has it for corrupt.

use serde_json::{Map, Value, json};

use super::data::Data;
use super::event::{DescriptorPayload, EventBody, Kind};
use super::record::Event;

/// The only descriptor version this kin understands.
pub const DESCRIPTOR_VERSION: u64 = 2;

/// Which tools a child may use.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ToolFilter {
    pub allow: Option<Vec<String>>,
    pub deny: Option<Vec<String>>,
}

/// True when `name` matches `pattern`, where `*` stands for any run of characters (`mcp__gh__*`);
/// a pattern without `*` matches only itself.
pub fn name_matches(pattern: &str, name: &str) -> bool {
    let Some((head, rest)) = pattern.split_once('*') else {
        return pattern == name;
    };
    let Some(mut tail) = name.strip_prefix(head) else {
        return false;
    };
    let mut parts: Vec<&str> = rest.split('*').collect();
    let last = parts.pop().unwrap_or_default();
    for part in parts {
        match tail.find(part) {
            Some(at) => tail = &tail[at + part.len()..],
            None => return false,
        }
    }
    tail.len() >= last.len() && tail.ends_with(last)
}

impl ToolFilter {
    /// True when `name` passes the filter: an allow entry and no deny entry matches it (entries
    /// may be `*` patterns, see [`name_matches`]).
    pub fn permits(&self, name: &str) -> bool {
        let allowed = self.allow.as_ref().is_none_or(|a| a.iter().any(|p| name_matches(p, name)));
        let denied = self.deny.as_ref().is_some_and(|d| d.iter().any(|p| name_matches(p, name)));
        allowed && !denied
    }

    /// This filter within `outer`: every deny of both, and only the allow entries `outer` allows
    /// too (a pattern is kept when `outer` allows it as written, so it never reaches further than
    /// `outer`); without an allow list of its own, `outer`'s.
    pub fn within(&self, outer: &ToolFilter) -> ToolFilter {
        let allow = match (&self.allow, &outer.allow) {
            (Some(own), Some(theirs)) => {
                Some(own.iter().filter(|e| theirs.iter().any(|p| name_matches(p, e))).cloned().collect())
            }
            (Some(own), None) => Some(own.clone()),
            (None, theirs) => theirs.clone(),
        };
        let mut deny: Vec<String> = self.deny.clone().unwrap_or_default();
        for entry in outer.deny.iter().flatten() {
            if !deny.contains(entry) {
                deny.push(entry.clone());
            }
        }
        ToolFilter { allow, deny: (!deny.is_empty()).then_some(deny) }
    }

    fn to_value(&self) -> Value {
        let mut map = Map::new();
        if let Some(allow) = &self.allow {
            map.insert("allow".into(), json!(allow));
        }
        if let Some(deny) = &self.deny {
            map.insert("deny".into(), json!(deny));
        }
        Value::Object(map)
    }
}

/// The named agent a child was started as (kin's `agent` field): its name and what else it
/// fixed besides the persona, tool filter and model, which the descriptor records anyway.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentRecord {
    pub name: String,
    /// The permission mode the child never goes above (a mode id).
    pub permission_mode: Option<String>,
    /// The child's model calls per turn.
    pub max_turns: Option<u64>,
}

impl AgentRecord {
    /// A record of just the name.
    pub fn named(name: &str) -> Self {
        AgentRecord { name: name.to_string(), permission_mode: None, max_turns: None }
    }

    fn to_value(&self) -> Value {
        let mut map = Map::new();
        map.insert("name".into(), json!(self.name));
        if let Some(mode) = &self.permission_mode {
            map.insert("permissionMode".into(), json!(mode));
        }
        if let Some(turns) = self.max_turns {
            map.insert("maxTurns".into(), json!(turns));
        }
        Value::Object(map)
    }

    fn parse(value: &Value) -> Result<AgentRecord, String> {
        let map = value.as_object().ok_or("agent must be an object")?;
        if let Some(unknown) = map.keys().find(|k| !["name", "permissionMode", "maxTurns"].contains(&k.as_str())) {
            return Err(format!("unknown agent field {unknown:?}"));
        }
        let max_turns = match map.get("maxTurns") {
            None => None,
            Some(n) => Some(n.as_u64().filter(|n| *n > 0).ok_or("agent.maxTurns must be a positive integer")?),
        };
        Ok(AgentRecord {
            name: string(map, "name")?.ok_or("agent.name must be a string")?,
            permission_mode: string(map, "permissionMode")?,
            max_turns,
        })
    }
}

/// A descriptor, by mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Descriptor {
    OneShot {
        provider: String,
        label: Option<String>,
        agent: Option<AgentRecord>,
    },
    Continuable {
        provider: String,
        label: String,
        agent_provider: Option<String>,
        agent_model: Option<String>,
        persona: Option<String>,
        tool_filter: Option<ToolFilter>,
        agent: Option<AgentRecord>,
    },
}

impl Descriptor {
    pub fn provider(&self) -> &str {
        match self {
            Descriptor::OneShot { provider, .. } | Descriptor::Continuable { provider, .. } => provider,
        }
    }

    pub fn label(&self) -> Option<&str> {
        match self {
            Descriptor::OneShot { label, .. } => label.as_deref(),
            Descriptor::Continuable { label, .. } => Some(label),
        }
    }

    /// The named agent the child was started as.
    pub fn agent(&self) -> Option<&AgentRecord> {
        match self {
            Descriptor::OneShot { agent, .. } | Descriptor::Continuable { agent, .. } => agent.as_ref(),
        }
    }

    /// The `subagent/descriptor` event of this descriptor.
    pub fn event(&self) -> EventBody {
        EventBody::SubagentDescriptor(DescriptorPayload(self.to_value()))
    }

    /// The event payload; absent optional fields are omitted.
    pub fn to_value(&self) -> Value {
        let mut map = Map::new();
        map.insert("version".into(), json!(DESCRIPTOR_VERSION));
        match self {
            Descriptor::OneShot { provider, label, agent: _ } => {
                map.insert("mode".into(), json!("one-shot"));
                map.insert("provider".into(), json!(provider));
                if let Some(label) = label {
                    map.insert("label".into(), json!(label));
                }
            }
            Descriptor::Continuable {
                provider,
                label,
                agent_provider,
                agent_model,
                persona,
                tool_filter,
                agent: _,
            } => {
                map.insert("mode".into(), json!("continuable"));
                map.insert("provider".into(), json!(provider));
                map.insert("label".into(), json!(label));
                for (key, value) in
                    [("agentProvider", agent_provider), ("agentModel", agent_model), ("persona", persona)]
                {
                    if let Some(value) = value {
                        map.insert(key.into(), json!(value));
                    }
                }
                if let Some(filter) = tool_filter {
                    map.insert("toolFilter".into(), filter.to_value());
                }
            }
        }
        if let Some(agent) = self.agent() {
            map.insert("agent".into(), agent.to_value());
        }
        Value::Object(map)
    }

    /// dsh `foldSubagentDescriptor` on one payload: `Ok(None)` for another version
    /// (unsupported), `Err` for a malformed current-version payload (corrupt).
    pub fn parse(payload: &Value) -> Result<Option<Descriptor>, String> {
        let map = payload.as_object().ok_or("payload must be an object")?;
        let version = map.get("version").and_then(Value::as_f64).ok_or("version must be a number")?;
        if version != DESCRIPTOR_VERSION as f64 {
            return Ok(None);
        }
        let mode = map.get("mode").and_then(Value::as_str).ok_or("mode must be \"one-shot\" or \"continuable\"")?;
        let allowed: &[&str] = match mode {
            "one-shot" => &["version", "mode", "provider", "label", "agent"],
            "continuable" => &[
                "version",
                "mode",
                "provider",
                "label",
                "agentProvider",
                "agentModel",
                "persona",
                "toolFilter",
                "agent",
            ],
            other => {
                return Err(format!("mode must be \"one-shot\" or \"continuable\", not {other:?}"));
            }
        };
        if let Some(unknown) = map.keys().find(|k| !allowed.contains(&k.as_str())) {
            return Err(format!("unknown descriptor field {unknown:?}"));
        }
        let provider = string(map, "provider")?.ok_or("provider must be a string")?;
        let label = string(map, "label")?;
        let agent = map.get("agent").map(AgentRecord::parse).transpose()?;
        if mode == "one-shot" {
            return Ok(Some(Descriptor::OneShot { provider, label, agent }));
        }
        Ok(Some(Descriptor::Continuable {
            provider,
            label: label.ok_or("a continuable descriptor needs a string label")?,
            agent_provider: string(map, "agentProvider")?,
            agent_model: string(map, "agentModel")?,
            persona: string(map, "persona")?,
            tool_filter: map.get("toolFilter").map(parse_filter).transpose()?,
            agent,
        }))
    }

    /// `parse` of an event's data, read straight into a descriptor when it is the plain shape
    /// kin writes (no `toolFilter` or `agent`, each field once, no `null`), else through a parsed
    /// tree: the same result either way, without building the tree a listing's every child
    /// would otherwise cost.
    pub fn of_data(data: &Data) -> Result<Option<Descriptor>, String> {
        match Descriptor::plain(data.text()) {
            Some(descriptor) => Ok(Some(descriptor)),
            None => Descriptor::parse(&data.to_value()),
        }
    }

    /// A current-version descriptor of the plain shape `parse` would accept, or `None` for
    /// `parse` to judge.
    fn plain(text: &str) -> Option<Descriptor> {
        /// A string field, present: `null` is not a string (`parse` refuses it).
        fn some<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
            <String as serde::Deserialize>::deserialize(d).map(Some)
        }
        #[derive(serde::Deserialize)]
        #[serde(rename_all = "camelCase", deny_unknown_fields)]
        struct Plain<'a> {
            version: u64,
            #[serde(borrow)]
            mode: std::borrow::Cow<'a, str>,
            provider: String,
            #[serde(default, deserialize_with = "some")]
            label: Option<String>,
            #[serde(default, deserialize_with = "some")]
            agent_provider: Option<String>,
            #[serde(default, deserialize_with = "some")]
            agent_model: Option<String>,
            #[serde(default, deserialize_with = "some")]
            persona: Option<String>,
        }
        let p: Plain = serde_json::from_str(text).ok()?;
        if p.version != DESCRIPTOR_VERSION {
            return None;
        }
        match p.mode.as_ref() {
            "one-shot" if p.agent_provider.is_none() && p.agent_model.is_none() && p.persona.is_none() => {
                Some(Descriptor::OneShot { provider: p.provider, label: p.label, agent: None })
            }
            "continuable" => Some(Descriptor::Continuable {
                provider: p.provider,
                label: p.label?,
                agent_provider: p.agent_provider,
                agent_model: p.agent_model,
                persona: p.persona,
                tool_filter: None,
                agent: None,
            }),
            _ => None,
        }
    }

    /// Folds the first descriptor event among `events` (none → `Ok(None)`).
    pub fn fold<'a>(mut events: impl Iterator<Item = &'a Event>) -> Result<Option<Descriptor>, String> {
        match events.find(|e| e.kind == Kind::SubagentDescriptor) {
            Some(event) => Descriptor::of_data(&event.data),
            None => Ok(None),
        }
    }
}

fn string(map: &Map<String, Value>, key: &str) -> Result<Option<String>, String> {
    match map.get(key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(format!("{key} must be a string")),
    }
}

fn parse_filter(value: &Value) -> Result<ToolFilter, String> {
    let map = value.as_object().ok_or("toolFilter must be an object")?;
    if let Some(unknown) = map.keys().find(|k| *k != "allow" && *k != "deny") {
        return Err(format!("unknown toolFilter field {unknown:?}"));
    }
    let list = |key: &str| -> Result<Option<Vec<String>>, String> {
        match map.get(key) {
            None => Ok(None),
            Some(Value::Array(items)) => items
                .iter()
                .map(|i| i.as_str().map(str::to_string).ok_or(format!("toolFilter.{key} must hold strings")))
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
            Some(_) => Err(format!("toolFilter.{key} must be an array of strings")),
        }
    };
    let filter = ToolFilter { allow: list("allow")?, deny: list("deny")? };
    if filter.allow.is_none() && filter.deny.is_none() {
        return Err("toolFilter needs allow or deny".into());
    }
    Ok(filter)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 23: the plain reading of a descriptor is `parse`'s of the tree, for every shape
    /// (the plain one and each way out of it), and takes the plain shape without the tree.
    #[test]
    fn a_descriptor_read_plainly_is_what_parse_makes_of_it() {
        let plain = [
            r#"{"version":2,"mode":"continuable","provider":"spawn","label":"bench child","agentProvider":"b","agentModel":"m"}"#,
            r#"{"version":2,"mode":"continuable","provider":"fork","label":"x","persona":"terse \"quoted\" \u00e9"}"#,
            r#"{"mode":"one-shot","version":2,"provider":"spawn","label":"once"}"#,
            r#"{"version":2,"mode":"one-shot","provider":"spawn"}"#,
        ];
        let other = [
            r#"{"version":2,"mode":"one-shot","provider":"spawn","label":null}"#,
            r#"{"version":2,"mode":"continuable","provider":"spawn"}"#,
            r#"{"version":2,"mode":"continuable","provider":"spawn","label":"a","label":"b"}"#,
            r#"{"version":2.0,"mode":"continuable","provider":"spawn","label":"a"}"#,
            r#"{"version":3,"mode":"continuable","provider":"spawn","label":"a"}"#,
            r#"{"version":"2","mode":"continuable","provider":"spawn","label":"a"}"#,
            r#"{"version":2,"mode":"one-shot","provider":"spawn","agentModel":"m"}"#,
            r#"{"version":2,"mode":"one-shot","provider":"spawn","persona":"p"}"#,
            r#"{"version":2,"mode":"other","provider":"spawn","label":"a"}"#,
            r#"{"version":2,"mode":"continuable","provider":7,"label":"a"}"#,
            r#"{"version":2,"mode":"continuable","provider":"spawn","label":"a","odd":1}"#,
            r#"{"version":2,"mode":"continuable","provider":"spawn","label":"a","toolFilter":{"allow":["read"]}}"#,
            r#"{"version":2,"mode":"continuable","provider":"spawn","label":"a","agent":{"name":"rev","maxTurns":3}}"#,
            r#"{"version":2,"mode":"one-shot","provider":"spawn","agent":{"name":"rev","maxTurns":0}}"#,
            r#"[2]"#,
            r#"null"#,
        ];
        for (text, is_plain) in plain.iter().map(|t| (t, true)).chain(other.iter().map(|t| (t, false))) {
            let data: Data = serde_json::from_str(text).unwrap();
            assert_eq!(Descriptor::plain(data.text()).is_some(), is_plain, "{text}");
            assert_eq!(Descriptor::of_data(&data), Descriptor::parse(&data.to_value()), "{text}");
        }
    }

    #[test]
    fn one_shot_without_label_round_trips() {
        let d = Descriptor::OneShot { provider: "spawn".into(), label: None, agent: None };
        assert_eq!(d.to_value(), json!({"version": 2, "mode": "one-shot", "provider": "spawn"}));
        assert_eq!(Descriptor::parse(&d.to_value()).unwrap(), Some(d));
    }

    #[test]
    fn full_continuable_round_trips() {
        let d = Descriptor::Continuable {
            provider: "fork".into(),
            label: "summarize".into(),
            agent_provider: Some("deepseek".into()),
            agent_model: Some("deepseek-v4-flash".into()),
            persona: Some("terse".into()),
            tool_filter: Some(ToolFilter { allow: Some(vec!["read".into()]), deny: None }),
            agent: None,
        };
        let v = d.to_value();
        assert_eq!(v["toolFilter"], json!({"allow": ["read"]}));
        assert!(v.get("agent").is_none(), "no agent field unless a named agent was chosen: {v}");
        assert_eq!(Descriptor::parse(&v).unwrap(), Some(d));
    }

    #[test]
    fn the_named_agent_round_trips_in_both_modes() {
        let record =
            AgentRecord { name: "review".into(), permission_mode: Some("read-only".into()), max_turns: Some(5) };
        let one_shot =
            Descriptor::OneShot { provider: "spawn".into(), label: Some("l".into()), agent: Some(record.clone()) };
        let v = one_shot.to_value();
        assert_eq!(v["agent"], json!({"name": "review", "permissionMode": "read-only", "maxTurns": 5}));
        assert_eq!(Descriptor::parse(&v).unwrap(), Some(one_shot));
        let continuable = Descriptor::Continuable {
            provider: "spawn".into(),
            label: "l".into(),
            agent_provider: None,
            agent_model: None,
            persona: Some("p".into()),
            tool_filter: None,
            agent: Some(AgentRecord::named("explore")),
        };
        let v = continuable.to_value();
        assert_eq!(v["agent"], json!({"name": "explore"}));
        assert_eq!(
            Descriptor::parse(&v).unwrap().and_then(|d| d.agent().cloned()),
            Some(AgentRecord::named("explore"))
        );
    }

    #[test]
    fn other_versions_are_unsupported_before_mode_is_checked() {
        assert_eq!(Descriptor::parse(&json!({"version": 3, "mode": "one-shot", "provider": "x"})).unwrap(), None);
        assert_eq!(Descriptor::parse(&json!({"version": 1, "mode": "weird"})).unwrap(), None);
    }

    #[test]
    fn malformed_current_version_is_corrupt() {
        for bad in [
            json!("not an object"),
            json!({"mode": "one-shot", "provider": "x"}),
            json!({"version": "2", "mode": "one-shot", "provider": "x"}),
            json!({"version": 2, "mode": "other", "provider": "x"}),
            json!({"version": 2, "mode": "one-shot", "provider": 7}),
            json!({"version": 2, "mode": "one-shot", "provider": "x", "extra": 1}),
            json!({"version": 2, "mode": "continuable", "provider": "x"}),
            json!({"version": 2, "mode": "continuable", "provider": "x", "label": "l", "toolFilter": {}}),
            json!({"version": 2, "mode": "continuable", "provider": "x", "label": "l", "toolFilter": {"allow": [1]}}),
            json!({"version": 2, "mode": "continuable", "provider": "x", "label": "l", "toolFilter": {"only": []}}),
            json!({"version": 2, "mode": "one-shot", "provider": "x", "agentModel": "m"}),
            json!({"version": 2, "mode": "one-shot", "provider": "x", "agent": "review"}),
            json!({"version": 2, "mode": "one-shot", "provider": "x", "agent": {}}),
            json!({"version": 2, "mode": "one-shot", "provider": "x", "agent": {"name": "r", "color": "red"}}),
            json!({"version": 2, "mode": "one-shot", "provider": "x", "agent": {"name": "r", "maxTurns": 0}}),
            json!({"version": 2, "mode": "one-shot", "provider": "x", "agent": {"name": "r", "permissionMode": 1}}),
        ] {
            assert!(Descriptor::parse(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn tool_filter_allows_and_denies() {
        let f = ToolFilter { allow: Some(vec!["read".into(), "bash".into()]), deny: Some(vec!["bash".into()]) };
        assert!(f.permits("read"));
        assert!(!f.permits("bash"));
        assert!(!f.permits("write"));
        assert!(ToolFilter::default().permits("anything"));
    }

    #[test]
    fn patterns_match_runs_of_characters() {
        for (pattern, name, expected) in [
            ("read", "read", true),
            ("read", "reader", false),
            ("mcp__gh__*", "mcp__gh__issue", true),
            ("mcp__gh__*", "mcp__ghx__issue", false),
            ("mcp__*__list", "mcp__gh__list", true),
            ("mcp__*__list", "mcp__gh__listen", false),
            ("*", "anything", true),
            ("a*a", "a", false),
            ("a*a", "aa", true),
            ("*_*", "todo_write", true),
        ] {
            assert_eq!(name_matches(pattern, name), expected, "{pattern} vs {name}");
        }
        let f = ToolFilter {
            allow: Some(vec!["read".into(), "mcp__gh__*".into()]),
            deny: Some(vec!["mcp__gh__delete".into()]),
        };
        assert!(f.permits("mcp__gh__list") && !f.permits("mcp__gh__delete") && !f.permits("mcp__fs__read"));
    }

    #[test]
    fn a_filter_within_another_never_reaches_further() {
        let outer = ToolFilter {
            allow: Some(vec!["read".into(), "grep".into(), "mcp__*".into()]),
            deny: Some(vec!["bash".into()]),
        };
        let own = ToolFilter {
            allow: Some(vec!["read".into(), "write".into(), "mcp__gh__*".into()]),
            deny: Some(vec!["grep".into()]),
        };
        let both = own.within(&outer);
        assert_eq!(both.allow, Some(vec!["read".to_string(), "mcp__gh__*".to_string()]));
        assert_eq!(both.deny, Some(vec!["grep".to_string(), "bash".to_string()]));
        let unrestricted = ToolFilter::default().within(&outer);
        assert_eq!(unrestricted, ToolFilter { allow: outer.allow.clone(), deny: outer.deny.clone() });
        let only_deny = ToolFilter { allow: None, deny: Some(vec!["write".into()]) };
        assert_eq!(only_deny.within(&ToolFilter::default()), only_deny);
    }
}
