//! The `subagent/descriptor` event, format v2 (dsh-design.md §1.6.2): the durable identity of a
//! session-backed subagent. Parsing is strict: a malformed current-version payload is corrupt,
//! another version is unsupported. It is disk format, so it lives in `session/`; `subagent/`
//! re-exports it as `subagent::descriptor`.

use serde_json::{Map, Value, json};

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

impl ToolFilter {
    /// True when `name` passes the filter.
    pub fn permits(&self, name: &str) -> bool {
        let allowed = self.allow.as_ref().is_none_or(|a| a.iter().any(|n| n == name));
        let denied = self.deny.as_ref().is_some_and(|d| d.iter().any(|n| n == name));
        allowed && !denied
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

/// A descriptor, by mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Descriptor {
    OneShot {
        provider: String,
        label: Option<String>,
    },
    Continuable {
        provider: String,
        label: String,
        agent_provider: Option<String>,
        agent_model: Option<String>,
        persona: Option<String>,
        tool_filter: Option<ToolFilter>,
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

    /// The `subagent/descriptor` event of this descriptor.
    pub fn event(&self) -> EventBody {
        EventBody::SubagentDescriptor(DescriptorPayload(self.to_value()))
    }

    /// The event payload; absent optional fields are omitted.
    pub fn to_value(&self) -> Value {
        let mut map = Map::new();
        map.insert("version".into(), json!(DESCRIPTOR_VERSION));
        match self {
            Descriptor::OneShot { provider, label } => {
                map.insert("mode".into(), json!("one-shot"));
                map.insert("provider".into(), json!(provider));
                if let Some(label) = label {
                    map.insert("label".into(), json!(label));
                }
            }
            Descriptor::Continuable { provider, label, agent_provider, agent_model, persona, tool_filter } => {
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
            "one-shot" => &["version", "mode", "provider", "label"],
            "continuable" => {
                &["version", "mode", "provider", "label", "agentProvider", "agentModel", "persona", "toolFilter"]
            }
            other => {
                return Err(format!("mode must be \"one-shot\" or \"continuable\", not {other:?}"));
            }
        };
        if let Some(unknown) = map.keys().find(|k| !allowed.contains(&k.as_str())) {
            return Err(format!("unknown descriptor field {unknown:?}"));
        }
        let provider = string(map, "provider")?.ok_or("provider must be a string")?;
        let label = string(map, "label")?;
        if mode == "one-shot" {
            return Ok(Some(Descriptor::OneShot { provider, label }));
        }
        Ok(Some(Descriptor::Continuable {
            provider,
            label: label.ok_or("a continuable descriptor needs a string label")?,
            agent_provider: string(map, "agentProvider")?,
            agent_model: string(map, "agentModel")?,
            persona: string(map, "persona")?,
            tool_filter: map.get("toolFilter").map(parse_filter).transpose()?,
        }))
    }

    /// Folds the first descriptor event among `events` (none → `Ok(None)`).
    pub fn fold<'a>(mut events: impl Iterator<Item = &'a Event>) -> Result<Option<Descriptor>, String> {
        match events.find(|e| e.kind == Kind::SubagentDescriptor) {
            Some(event) => Descriptor::parse(&event.data),
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

    #[test]
    fn one_shot_without_label_round_trips() {
        let d = Descriptor::OneShot { provider: "spawn".into(), label: None };
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
        };
        let v = d.to_value();
        assert_eq!(v["toolFilter"], json!({"allow": ["read"]}));
        assert_eq!(Descriptor::parse(&v).unwrap(), Some(d));
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
}
