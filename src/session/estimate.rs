//! The heuristic token estimate of a model history message (dsh `token-meter`'s; the agent's
//! meter, `agent::meter`, prices requests with it). It counts UTF-16 units (JavaScript
//! `.length`): a text or reasoning block `ceil(len/4)+4`, a tool call
//! `ceil(name/4)+ceil(arguments/4)+4`, a tool result its content `+4`, any other block
//! `4+ceil(JSON/4)`, `+4` per message — but an image block, which dsh prices as its JSON (its
//! base64 data: a 1 MB screenshot came to ~333,000 tokens and set off a compaction at every
//! step), is kin's `IMAGE_TOKENS`. A history message keeps its estimate once made
//! (`surface::HistoryMessage::tokens`), so a step does not parse the whole history to price it.

use serde_json::Value;

pub(crate) fn units(text: &str) -> u64 {
    text.encode_utf16().count() as u64
}

pub(crate) fn quarter(units: u64) -> u64 {
    units.div_ceil(4)
}

/// What an image block is priced at: about what the providers charge for the largest image kin
/// passes on (Anthropic's ~1,600 tokens for 1.15 megapixels; OpenAI's high detail is less), and
/// more than the placeholder a route without images gets.
pub(crate) const IMAGE_TOKENS: u64 = 1600;

/// The estimate of one content block.
pub(crate) fn block_tokens(block: &Value) -> u64 {
    let text = |key: &str| units(block[key].as_str().unwrap_or_default());
    match block["type"].as_str() {
        Some("text" | "reasoning") => quarter(text("text")) + 4,
        Some("tool-call") => quarter(text("name")) + quarter(text("arguments")) + 4,
        Some("tool-result") => block["content"].as_array().map_or(0, |c| c.iter().map(block_tokens).sum::<u64>()) + 4,
        Some("image") => IMAGE_TOKENS + 4,
        _ => 4 + quarter(units(&block.to_string())),
    }
}

/// The estimate of one model message (its blocks, plus 4).
pub(crate) fn message_tokens(message: &Value) -> u64 {
    message["content"].as_array().map_or(0, |c| c.iter().map(block_tokens).sum::<u64>()) + 4
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_image_is_priced_as_an_image_not_as_its_base64() {
        let data = "A".repeat(1_333_336);
        let image = json!({"type": "image", "mediaType": "image/png", "data": data});
        assert_eq!(block_tokens(&image), IMAGE_TOKENS + 4);
        let result =
            json!({"type": "tool-result", "toolCallId": "c", "content": [{"type": "text", "text": "abcd"}, image]});
        assert_eq!(block_tokens(&result), (1 + 4) + (IMAGE_TOKENS + 4) + 4, "inside a tool result too");
        let other = json!({"type": "audio", "data": "AAAA"});
        assert_eq!(block_tokens(&other), 4 + quarter(units(&other.to_string())), "other blocks as dsh prices them");
    }
}
