//! The dsh `StreamChunk` union: what a model stream yields and what `assistant/chunk` events
//! store verbatim. It is part of the log format, so its serde lives here, in `session/`; the
//! model layer re-exports it.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One piece of a model response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case", deny_unknown_fields)]
pub enum StreamChunk {
    BlockStart {
        index: u64,
        #[serde(rename = "blockType")]
        block_type: String,
    },
    TextDelta {
        index: u64,
        text: String,
    },
    ReasoningDelta {
        index: u64,
        text: String,
    },
    ToolCallDelta {
        index: u64,
        id: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        name: Option<String>,
        #[serde(rename = "argumentsDelta")]
        arguments_delta: String,
    },
    /// The finished block: `{type:"text",text}`, `{type:"reasoning",text,...}`,
    /// `{type:"tool-call",id,name,arguments}`; kept as JSON so provider extras survive.
    BlockEnd {
        index: u64,
        block: Value,
    },
    Usage {
        usage: Value,
    },
    Finish {
        reason: FinishReason,
        #[serde(rename = "replayState", default, skip_serializing_if = "Option::is_none")]
        replay_state: Option<Value>,
    },
}

/// Why a model response ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum FinishReason {
    Stop,
    ToolCalls,
    MaxTokens,
    Aborted {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        failure: Option<Failure>,
    },
    Error {
        failure: Failure,
    },
}

/// dsh `LlmFailure`: a message and a stable code, plus whatever the provider added.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Failure {
    pub message: String,
    pub code: String,
    #[serde(flatten)]
    pub extra: serde_json::Map<String, Value>,
}

impl Failure {
    pub fn new(message: impl Into<String>, code: impl Into<String>) -> Self {
        Failure { message: message.into(), code: code.into(), extra: serde_json::Map::new() }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_round_trip_in_dsh_shape() {
        for line in [
            r#"{"type":"block-start","index":0,"blockType":"reasoning"}"#,
            r#"{"type":"tool-call-delta","index":1,"id":"c","name":"read","argumentsDelta":"{"}"#,
            r#"{"type":"finish","reason":{"kind":"tool-calls"}}"#,
            r#"{"type":"finish","reason":{"kind":"error","failure":{"message":"boom","code":"X","status":500}}}"#,
            r#"{"type":"usage","usage":{"inputTokens":1,"outputTokens":2}}"#,
        ] {
            let chunk: StreamChunk = serde_json::from_str(line).unwrap();
            assert_eq!(serde_json::to_string(&chunk).unwrap(), line);
        }
    }
}
