//! The history a compaction's summary request carries, fitted to the summariser's context
//! window. A range whose estimate fits the room goes as it is: byte for byte the head of the
//! session's own requests, so a provider's prefix cache still serves it. A range that does not
//! fit is shortened to the longest head that fits and ends at a balanced cut (no tool call apart
//! from its result). Items go whole; one that does not fit waits for the next round, unless the
//! round would make no progress without it (it is among the first two, parts a call from its
//! result, or what went before it is smaller than a summary may be, which the summary would not
//! shrink): then it is cut to half the room left, its long texts keeping their head and tail
//! with a note of how much was left out (a tool call's arguments stay JSON; a cut reasoning
//! block loses its signature, which no longer matches). The compaction shadows only what it
//! sent; the rest is the next round's.

use serde_json::Value;

use crate::session::estimate::message_tokens;
use crate::tools::capture::{Capture, Limits};

/// A text is never cut below this many bytes.
const MIN_TEXT: usize = 256;

/// What one summary request carries.
#[derive(Debug, PartialEq)]
pub(crate) struct Fitted {
    /// How many items from the head it summarises (and the compaction shadows).
    pub(crate) keep: usize,
    /// Those items as the request sends them.
    pub(crate) input: Vec<Value>,
}

/// The first `keep` of `messages` (estimated at `tokens`), fitted to `room` estimated tokens
/// (`None`: the summariser's window is not known, and they go as they are). `balanced[i]` says
/// whether the cut before `messages[i]` keeps every tool call with its result. `min_progress`:
/// while less than this many estimated tokens went before it, an item that does not fit is cut
/// instead of left for the next round (a round over a small head fails when its summary is not
/// smaller than the head, and every round after it would start from the same head).
pub(crate) fn fit(
    messages: &[Value],
    tokens: &[u64],
    keep: usize,
    room: Option<u64>,
    balanced: &[bool],
    min_progress: u64,
) -> Result<Fitted, String> {
    let whole: u64 = tokens[..keep].iter().sum();
    let Some(room) = room.filter(|&room| whole > room) else {
        return Ok(Fitted { keep, input: messages[..keep].to_vec() });
    };
    let mut input = Vec::new();
    let mut left = room;
    let mut fitted = 0;
    for (message, &estimate) in messages[..keep].iter().zip(tokens) {
        // An item that does not fit goes to the next round, unless this one would make no
        // progress without it: then it is cut to half of what is left.
        let (message, cost) = if estimate <= left {
            (message.clone(), estimate)
        } else if fitted == 0 || input.len() < 2 || room - left < min_progress {
            let cut = shrink(message, left / 2);
            let cost = message_tokens(&cut);
            (cut, cost)
        } else {
            break;
        };
        if cost > left {
            break;
        }
        left -= cost;
        input.push(message);
        if balanced[input.len()] {
            fitted = input.len();
        }
    }
    if fitted == 0 {
        return Err(format!(
            "the oldest history does not fit the summariser's window even with its long texts cut down \
             (no cut that keeps each tool call with its result fits in the ~{room} estimated tokens left \
             after the system prompt, the tools, the instruction and the output cap)"
        ));
    }
    input.truncate(fitted);
    Ok(Fitted { keep: fitted, input })
}

/// `message` with its long texts cut (halving the length each keeps) until its estimate is at
/// most `cap`, or no text is longer than `MIN_TEXT`.
fn shrink(message: &Value, cap: u64) -> Value {
    let mut limit = usize::try_from(cap).unwrap_or(usize::MAX).saturating_mul(4);
    loop {
        let mut out = message.clone();
        cut_blocks(&mut out["content"], limit);
        if message_tokens(&out) <= cap || limit <= MIN_TEXT {
            return out;
        }
        limit /= 2;
    }
}

/// Cuts every text of `content`'s blocks longer than `limit` bytes.
fn cut_blocks(content: &mut Value, limit: usize) {
    let Some(blocks) = content.as_array_mut() else {
        return;
    };
    for block in blocks {
        match block["type"].as_str() {
            Some("text") => cut(&mut block["text"], limit),
            Some("reasoning") if block["text"].as_str().is_some_and(|t| t.len() > limit) => {
                cut(&mut block["text"], limit);
                if let Some(block) = block.as_object_mut() {
                    block.remove("signature");
                }
            }
            Some("tool-result") => cut_blocks(&mut block["content"], limit),
            Some("tool-call") => cut_arguments(&mut block["arguments"], limit),
            _ => {}
        }
    }
}

/// A tool call's arguments: each long string value cut, still JSON (cut as text when they are
/// not JSON).
fn cut_arguments(arguments: &mut Value, limit: usize) {
    let Some(text) = arguments.as_str().filter(|t| t.len() > limit) else {
        return;
    };
    match serde_json::from_str::<Value>(text) {
        Ok(mut parsed) => {
            cut_strings(&mut parsed, limit);
            *arguments = Value::String(parsed.to_string());
        }
        Err(_) => cut(arguments, limit),
    }
}

fn cut_strings(value: &mut Value, limit: usize) {
    match value {
        Value::String(_) => cut(value, limit),
        Value::Array(items) => items.iter_mut().for_each(|item| cut_strings(item, limit)),
        Value::Object(fields) => fields.values_mut().for_each(|field| cut_strings(field, limit)),
        _ => {}
    }
}

/// A string over `limit` bytes → its first and last `limit / 2` with a note of what is left out.
fn cut(value: &mut Value, limit: usize) {
    if let Value::String(text) = value
        && text.len() > limit
    {
        let mut kept = Capture::new(Limits { head: limit / 2, tail: limit - limit / 2 });
        kept.push(text.as_bytes());
        *text = kept.render();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn text(t: &str) -> Value {
        json!({"role": "user", "content": [{"type": "text", "text": t}]})
    }

    fn fitting(messages: &[Value], room: Option<u64>) -> Result<Fitted, String> {
        let tokens: Vec<u64> = messages.iter().map(message_tokens).collect();
        let balanced = vec![true; messages.len() + 1];
        fit(messages, &tokens, messages.len(), room, &balanced, 0)
    }

    #[test]
    fn a_range_that_fits_goes_as_it_is() {
        let messages = [text(&"a".repeat(400)), text(&"b".repeat(400))];
        let total: u64 = messages.iter().map(message_tokens).sum();
        for room in [None, Some(total), Some(10 * total)] {
            let fitted = fitting(&messages, room).unwrap();
            assert_eq!(fitted, Fitted { keep: 2, input: messages.to_vec() }, "{room:?}");
        }
    }

    #[test]
    fn a_range_too_large_is_shortened_to_the_head_that_fits_at_a_balanced_cut() {
        let messages: Vec<Value> = (0..10).map(|i| text(&format!("{i}").repeat(400))).collect();
        let each = message_tokens(&messages[0]);
        let tokens = vec![each; 10];
        let mut balanced = vec![true; 11];
        let fitted = fit(&messages, &tokens, 10, Some(4 * each + 1), &balanced, 0).unwrap();
        assert_eq!(fitted, Fitted { keep: 4, input: messages[..4].to_vec() });
        // The cut after the fourth would part a call from its result: three go.
        balanced[4] = false;
        let fitted = fit(&messages, &tokens, 10, Some(4 * each + 1), &balanced, 0).unwrap();
        assert_eq!(fitted, Fitted { keep: 3, input: messages[..3].to_vec() });
        // Never more than `keep`, whatever the room.
        let fitted = fit(&messages, &tokens, 5, Some(4 * each + 1), &balanced, 0).unwrap();
        assert_eq!(fitted.keep, 3);
    }

    #[test]
    fn an_item_too_large_is_cut_down_keeping_its_head_and_tail_and_its_arguments_json() {
        let long = format!("HEAD{}TAIL", "x".repeat(400_000));
        let args = json!({"path": "a.txt", "content": long}).to_string();
        let call = json!({"role": "assistant", "content": [
            {"type": "reasoning", "text": long, "signature": "sig"},
            {"type": "tool-call", "id": "c", "name": "write", "arguments": args},
        ]});
        let result = json!({"role": "user", "content": [
            {"type": "tool-result", "toolCallId": "c", "content": [{"type": "text", "text": long}]},
        ]});
        let messages = [call, result, text("newest")];
        let room = 20_000;
        let fitted = fitting(&messages, Some(room)).unwrap();
        assert_eq!(fitted.keep, 3);
        let sent: u64 = fitted.input.iter().map(message_tokens).sum();
        assert!(sent <= room, "{sent} > {room}");
        assert!(message_tokens(&fitted.input[0]) <= room / 2, "the call, cut to half the room");
        assert!(message_tokens(&fitted.input[1]) <= room / 4, "its result, to half what was left");
        let reasoning = &fitted.input[0]["content"][0];
        let kept = reasoning["text"].as_str().unwrap();
        assert!(kept.starts_with("HEAD") && kept.ends_with("TAIL") && kept.contains("bytes omitted"), "{kept:.80}");
        assert!(reasoning.get("signature").is_none(), "a cut thought's signature no longer matches it");
        let arguments: Value =
            serde_json::from_str(fitted.input[0]["content"][1]["arguments"].as_str().unwrap()).unwrap();
        assert_eq!(arguments["path"], "a.txt");
        assert!(arguments["content"].as_str().unwrap().ends_with("TAIL"));
        let output = fitted.input[1]["content"][0]["content"][0]["text"].as_str().unwrap();
        assert!(output.starts_with("HEAD") && output.contains("bytes omitted"));
        assert_eq!(fitted.input[2], messages[2], "an item that fits goes whole");
    }

    /// A short head followed by an item larger than the room: the item is cut and goes in this
    /// round (left for the next, the round would summarise a few words into a longer summary, fail
    /// the shrink rule, and every compaction after it would fail the same way).
    #[test]
    fn an_item_too_large_after_a_small_head_is_cut_into_the_round() {
        let call = json!({"role": "assistant", "content": [
            {"type": "tool-call", "id": "c", "name": "write", "arguments": json!({"content": "x".repeat(60_000)}).to_string()},
        ]});
        let result = json!({"role": "user", "content": [{"type": "tool-result", "toolCallId": "c", "content": []}]});
        let messages = [text("hi"), text("hello"), text("write it"), call, result, text(&"y".repeat(16_000))];
        let tokens: Vec<u64> = messages.iter().map(message_tokens).collect();
        let mut balanced = vec![true; messages.len() + 1];
        balanced[4] = false;
        let room = 9_000;
        // Without a floor, the round stops before the large call: three short messages.
        assert_eq!(fit(&messages, &tokens, 6, Some(room), &balanced, 0).unwrap().keep, 3);
        let fitted = fit(&messages, &tokens, 6, Some(room), &balanced, 5_000).unwrap();
        assert!(fitted.keep >= 5, "the call and its result go in this round: {}", fitted.keep);
        let sent: u64 = fitted.input.iter().map(message_tokens).sum();
        assert!(sent <= room && message_tokens(&fitted.input[3]) <= room / 2, "{sent}");
    }

    #[test]
    fn a_head_that_cannot_fit_is_an_error_naming_the_room() {
        let messages = [text(&"a".repeat(4000))];
        let err = fitting(&messages, Some(10)).unwrap_err();
        assert!(err.contains("does not fit the summariser's window") && err.contains("~10 estimated tokens"), "{err}");
    }
}
