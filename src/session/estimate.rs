//! The heuristic token estimate of a model history message (dsh `token-meter`'s; the agent's
//! meter, `agent::meter`, prices requests with it). It counts UTF-16 units (JavaScript
//! `.length`): a text or reasoning block `ceil(len/4)+4`, a tool call
//! `ceil(name/4)+ceil(arguments/4)+4`, a tool result its content `+4`, any other block
//! `4+ceil(JSON/4)`, `+4` per message. A history message keeps its estimate once made
//! (`surface::HistoryMessage::tokens`), so a step does not parse the whole history to price it.

use serde_json::Value;

pub(crate) fn units(text: &str) -> u64 {
    text.encode_utf16().count() as u64
}

pub(crate) fn quarter(units: u64) -> u64 {
    units.div_ceil(4)
}

/// The estimate of one content block.
pub(crate) fn block_tokens(block: &Value) -> u64 {
    let text = |key: &str| units(block[key].as_str().unwrap_or_default());
    match block["type"].as_str() {
        Some("text" | "reasoning") => quarter(text("text")) + 4,
        Some("tool-call") => quarter(text("name")) + quarter(text("arguments")) + 4,
        Some("tool-result") => block["content"].as_array().map_or(0, |c| c.iter().map(block_tokens).sum::<u64>()) + 4,
        _ => 4 + quarter(units(&block.to_string())),
    }
}

/// The estimate of one model message (its blocks, plus 4).
pub(crate) fn message_tokens(message: &Value) -> u64 {
    message["content"].as_array().map_or(0, |c| c.iter().map(block_tokens).sum::<u64>()) + 4
}
