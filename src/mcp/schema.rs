//! An MCP tool's description and input schema as the model gets them: unchanged when the model
//! APIs take them, otherwise normalised, and the description says what was changed. The APIs
//! want an object-rooted schema with `properties`; MCP servers sometimes omit `type` or
//! `properties`, or send a `required` that is not a list of names.

use serde_json::{Map, Value, json};

/// The longest description kept (the rest is cut, marked `…`).
const MAX_DESCRIPTION: usize = 4096;

/// The largest schema kept, serialised; a larger one is replaced by an open object schema.
const MAX_SCHEMA_BYTES: usize = 64 * 1024;

/// `(schema, note)`: the schema to send, and a sentence for the description when the server's
/// schema could not be used as it is.
pub(super) fn normalise(schema: &Value) -> (Value, Option<String>) {
    let open = || json!({"type": "object", "properties": {}, "additionalProperties": true});
    let Some(object) = schema.as_object() else {
        return (open(), Some("its input schema is not a JSON object".into()));
    };
    if serde_json::to_vec(schema).map_or(0, |bytes| bytes.len()) > MAX_SCHEMA_BYTES {
        return (open(), Some(format!("its input schema is larger than {} KiB", MAX_SCHEMA_BYTES / 1024)));
    }
    match object.get("type") {
        None => {}
        Some(Value::String(t)) if t == "object" => {}
        Some(other) => return (open(), Some(format!("its input schema has type {other}, not \"object\""))),
    }
    let mut fixed: Map<String, Value> = object.clone();
    fixed.insert("type".into(), json!("object"));
    if !fixed.get("properties").is_some_and(Value::is_object) {
        fixed.insert("properties".into(), json!({}));
    }
    let names_only = |r: &Value| r.as_array().is_some_and(|list| list.iter().all(Value::is_string));
    if !fixed.get("required").is_none_or(names_only) {
        fixed.remove("required");
    }
    (Value::Object(fixed), None)
}

/// The description the model reads: the server's (or the tool's title), cut to 4 KiB, with the
/// note of a replaced schema.
pub(super) fn description(text: Option<&str>, title: Option<&str>, note: Option<&str>) -> String {
    let mut out = text.or(title).unwrap_or_default().trim().to_string();
    if out.len() > MAX_DESCRIPTION {
        let mut cut = MAX_DESCRIPTION;
        while !out.is_char_boundary(cut) {
            cut -= 1;
        }
        out.truncate(cut);
        out.push('…');
    }
    if let Some(note) = note {
        if !out.is_empty() {
            out.push_str("\n\n");
        }
        out.push_str(&format!(
            "(kin could not pass this tool's input schema on: {note}; send the arguments it needs as a JSON object.)"
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_schemas_pass_unchanged() {
        let schema =
            json!({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"], "$schema": "x"});
        assert_eq!(normalise(&schema), (schema.clone(), None));
    }

    #[test]
    fn missing_pieces_are_filled_in() {
        assert_eq!(normalise(&json!({})), (json!({"type": "object", "properties": {}}), None));
        let (fixed, note) = normalise(&json!({"properties": {"a": {}}, "required": "a"}));
        assert_eq!(fixed, json!({"type": "object", "properties": {"a": {}}}));
        assert_eq!(note, None);
        let (fixed, _) = normalise(&json!({"type": "object", "required": ["a", 3]}));
        assert_eq!(fixed, json!({"type": "object", "properties": {}}));
    }

    #[test]
    fn unusable_schemas_are_replaced_and_said_so() {
        let (fixed, note) = normalise(&json!({"type": "string"}));
        assert_eq!(fixed["type"], "object");
        assert_eq!(fixed["additionalProperties"], true);
        assert!(note.as_deref().unwrap().contains("\"string\""), "{note:?}");
        let (_, note) = normalise(&json!([1]));
        assert!(note.is_some());
        let huge = json!({"type": "object", "description": "x".repeat(70_000)});
        let (fixed, note) = normalise(&huge);
        assert!(fixed.get("description").is_none());
        assert!(note.unwrap().contains("64 KiB"));
        let text = description(Some("Echo it."), None, Some("its input schema is not a JSON object"));
        assert!(text.starts_with("Echo it.\n\n(kin could not pass"), "{text}");
    }

    #[test]
    fn descriptions_are_capped() {
        let long = "é".repeat(3000);
        let text = description(Some(&long), None, None);
        assert!(text.len() <= MAX_DESCRIPTION + '…'.len_utf8() && text.ends_with('…'));
        assert_eq!(description(None, Some("Title"), None), "Title");
        assert_eq!(description(None, None, None), "");
    }
}
