//! Requests whose params the ACP SDK reads through an untagged enum, and refuses when no variant
//! matches with only "Invalid params" and "data did not match any variant of untagged enum …",
//! naming neither the part of the request nor what is wrong: the transport answers those itself,
//! with the request's id and an error that says both (`answer`). What is refused is read with
//! the SDK's own types, so it is exactly what the SDK would refuse.

use agent_client_protocol::v1::schema::SessionConfigOptionValue;
use serde::Deserialize;
use serde_json::Value;

use crate::tools::capture::cut;

/// The most bytes of a request's value an error about it quotes (a request may hold anything up
/// to a frame's size).
pub(super) const SHOWN_BYTES: usize = 200;

/// `value` as JSON text, cut to `SHOWN_BYTES` with a note of what was left out.
pub(super) fn shown(value: &Value) -> String {
    cut(&value.to_string(), SHOWN_BYTES)
}

/// `text` as a JSON string, cut as `shown` cuts a value (an id a client sent).
pub(super) fn quoted(text: &str) -> String {
    shown(&Value::String(text.to_string()))
}

/// The params of request `line` read as `P`; `None` when they do not read so (the SDK answers).
pub(super) fn params<P: serde::de::DeserializeOwned>(line: &str) -> Option<P> {
    #[derive(Deserialize)]
    struct Request<P> {
        params: P,
    }
    serde_json::from_str::<Request<P>>(line).ok().map(|request| request.params)
}

/// The error answering request `line` (of `method`) when the SDK would refuse a part of its
/// params that it reads through an untagged enum: an `mcpServers` entry (`mcp::unreadable_server`)
/// or `session/set_config_option`'s value. `None` for any other request, or when those parts
/// read (params wrong in another way get the SDK's own answer, which names the field).
pub(super) fn answer(method: &str, line: &str) -> Option<String> {
    super::mcp::unreadable_server(method, line).or_else(|| option_value(method, line))
}

/// `session/set_config_option` with a value that is not one of the SDK's shapes (a value id, or
/// `"type": "boolean"` with a boolean), when its session and option are named: what the option
/// takes (or that kin has no such option), as the handler says for a value of the wrong kind.
fn option_value(method: &str, line: &str) -> Option<String> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Params {
        // Required, never read: a request that names no session is the SDK's to answer.
        #[allow(dead_code)]
        session_id: String,
        config_id: String,
        #[serde(flatten)]
        value: serde_json::Map<String, Value>,
    }
    if method != "session/set_config_option" {
        return None;
    }
    let Params { config_id, value, .. } = params(line)?;
    let value = Value::Object(value);
    SessionConfigOptionValue::deserialize(&value).err()?;
    let sent = value.get("value").map_or_else(|| "no value".to_string(), |v| format!("the value {}", shown(v)));
    let option = quoted(&config_id);
    Some(match super::option_values(&config_id) {
        Ok((_, takes)) => format!(
            "Invalid params: {sent} is not one kin reads for the option {option}: {takes}, sent as \
             {{\"configId\": {option}, \"value\": \"<id>\"}}"
        ),
        Err(unknown) => format!("Invalid params: {unknown}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn set(params: Value) -> String {
        json!({"jsonrpc": "2.0", "id": 3, "method": "session/set_config_option", "params": params}).to_string()
    }

    #[test]
    fn a_config_value_the_sdk_cannot_read_says_what_the_option_takes() {
        let sandbox = "the sandbox option takes one of off, read-only, read-only+network, workspace-write, workspace-write+network";
        for (params, says) in [
            (json!({"sessionId": "s", "configId": "sandbox", "value": 5}), format!("the value 5 is not one kin reads for the option \"sandbox\": {sandbox}")),
            (
                json!({"sessionId": "s", "configId": "model", "value": {"type": "boolean", "value": true}}),
                "the value {\"type\":\"boolean\",\"value\":true} is not one kin reads for the option \"model\": the model option takes a route id such as deepseek/deepseek-v4-pro".to_string(),
            ),
            (json!({"sessionId": "s", "configId": "sandbox", "type": "boolean", "value": null}), format!("the value null is not one kin reads for the option \"sandbox\": {sandbox}")),
            (json!({"sessionId": "s", "configId": "model"}), "no value is not one kin reads for the option \"model\"".to_string()),
            (json!({"sessionId": "s", "configId": "theme", "value": 1}), "unknown config option \"theme\"; kin offers \"model\" and \"sandbox\"".to_string()),
        ] {
            let why = answer("session/set_config_option", &set(params.clone())).unwrap_or_else(|| panic!("{params} is read"));
            assert!(why.starts_with(&format!("Invalid params: {says}")), "{why}");
        }
    }

    /// An option id kin does not offer is quoted cut, with what was left out said (a client may
    /// send one as long as a frame).
    #[test]
    fn an_unknown_option_id_is_quoted_cut() {
        let id = format!("x{}", "y".repeat(100_000));
        let why = super::super::option_values(&id).expect_err("no such option");
        assert!(why.len() < SHOWN_BYTES + 200, "{} bytes", why.len());
        assert!(why.starts_with("unknown config option \"xyyy"), "{why}");
        assert!(why.ends_with("; kin offers \"model\" and \"sandbox\""), "{why}");
        let shown = quoted(&id);
        assert!(why.contains(&shown) && shown.len() < SHOWN_BYTES + 100, "{shown}");
    }

    #[test]
    fn config_values_the_sdk_reads_are_left_to_the_handler() {
        for params in [
            json!({"sessionId": "s", "configId": "sandbox", "value": "read-only"}),
            json!({"sessionId": "s", "configId": "sandbox", "type": "boolean", "value": true}),
            json!({"sessionId": "s", "configId": "model", "type": "later", "value": "x/y"}),
            // A boolean type with a string is read as that value id (the SDK's fallback).
            json!({"sessionId": "s", "configId": "model", "type": "boolean", "value": "yes"}),
            // No session or option named: the SDK's own answer names the missing field.
            json!({"configId": "model", "value": 5}),
            json!({"sessionId": "s", "value": 5}),
        ] {
            assert_eq!(answer("session/set_config_option", &set(params.clone())), None, "{params}");
        }
        assert_eq!(answer("session/set_mode", &set(json!({"sessionId": "s", "configId": "model", "value": 5}))), None);
    }
}
