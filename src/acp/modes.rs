//! Permission modes as ACP session modes: the state advertised by `session/new` and
//! `session/load`, and the parsing of `session/set_mode`'s mode id.

use agent_client_protocol::v1::schema::{SessionMode, SessionModeState};

use crate::permission::PermissionMode;

/// The four modes, `current` selected.
pub(super) fn state(current: PermissionMode) -> SessionModeState {
    let modes = PermissionMode::ALL
        .into_iter()
        .map(|mode| SessionMode::new(mode.id(), mode.name()).description(mode.description()))
        .collect();
    SessionModeState::new(current.id(), modes)
}

/// The mode with this id, or an error naming it and listing the valid ids.
pub(super) fn parse(id: &str) -> Result<PermissionMode, String> {
    PermissionMode::parse(id)
        .ok_or_else(|| format!("unknown mode \"{id}\"; valid modes are {}", PermissionMode::valid_ids()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_state_lists_every_mode() {
        let wire = serde_json::to_value(state(PermissionMode::AcceptEdits)).unwrap();
        assert_eq!(wire["currentModeId"], "accept-edits");
        let ids: Vec<&str> =
            wire["availableModes"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap()).collect();
        assert_eq!(ids, ["ask", "accept-edits", "read-only", "bypass"]);
        assert_eq!(wire["availableModes"][0]["name"], json!("Ask"));
        assert!(wire["availableModes"][0]["description"].is_string());
    }

    #[test]
    fn unknown_ids_are_named() {
        assert_eq!(parse("read-only"), Ok(PermissionMode::ReadOnly));
        assert_eq!(
            parse("yolo").unwrap_err(),
            "unknown mode \"yolo\"; valid modes are ask, accept-edits, read-only, bypass"
        );
    }
}
