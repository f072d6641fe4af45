//! Token counts for compaction (dsh `token-meter`): what the next request of a session costs.
//! The anchor is the latest `assistant/message` of the current route with usage: its
//! `inputTokens + outputTokens` (kin's `inputTokens` already includes cache reads and writes), or
//! the heuristic price of that request when that is larger; the total is the anchor plus the
//! signed change of the surface estimate since then (negative after a compaction). Without an
//! anchor the total is the heuristic estimate of the header and the surface. A message's estimate
//! is `session::estimate`'s (kept by the message); the header's is `ceil(system/4)+4` plus
//! `ceil(JSON(tools)/4)+4`, in UTF-16 units.

use serde_json::{Value, json};

use crate::model::{ModelRoute, ToolSchema};
use crate::session::estimate::{quarter, units};
use crate::session::event::AssistantMessage;
use crate::session::surface::Nodes;
use crate::session::{Event, Session};

/// The estimate of what every request carries besides the history: the system prompt and tools.
pub(crate) fn header_tokens(system: &str, tools: &[ToolSchema]) -> u64 {
    let tools: Vec<Value> = tools
        .iter()
        .map(|t| json!({"name": t.name, "description": t.description, "parameters": t.parameters}))
        .collect();
    quarter(units(system)) + 4 + quarter(units(&Value::Array(tools).to_string())) + 4
}

/// What the next request of a session costs, and each current node's estimate.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Measure {
    pub total: u64,
    /// The estimate of each current node, in surface order.
    pub nodes: Vec<u64>,
}

/// Measures `session`'s next request on `route` with this header.
pub(crate) fn measure(session: &Session, route: &ModelRoute, system: &str, tools: &[ToolSchema]) -> Measure {
    let nodes: Vec<u64> = session.message_tokens();
    let surface: u64 = nodes.iter().sum();
    let header = header_tokens(system, tools);
    let total = match anchor(session.events(), route) {
        Some((index, reported)) => {
            let then = surface_at(session, index, &nodes);
            let value = reported.max(header + then);
            (value + surface).saturating_sub(then)
        }
        None => header + surface,
    };
    Measure { total, nodes }
}

/// The estimate of the surface right after `events[index]`. With no replace since, that is the
/// current nodes up to its seq (no fold of the log: a long session's step stays cheap); else the
/// fold of the log up to it.
fn surface_at(session: &Session, index: usize, nodes: &[u64]) -> u64 {
    let events = session.events();
    let replaced = |e: &Event| e.surface_op.as_ref().is_some_and(|op| op["op"] == "replace");
    if events[index + 1..].iter().any(replaced) {
        return Nodes::of(&events[..=index]).messages.iter().map(|m| m.tokens()).sum();
    }
    let seq = events[index].seq;
    session.surface_seqs().iter().zip(nodes).filter(|(s, _)| **s <= seq).map(|(_, t)| t).sum()
}

/// The latest `assistant/message` of `route` with usage: its index and reported tokens.
fn anchor(events: &[Event], route: &ModelRoute) -> Option<(usize, u64)> {
    events.iter().enumerate().rev().find_map(|(i, event)| {
        let message = event.get::<AssistantMessage>()?;
        let source = &message.message.source;
        if source.provider != route.provider || source.model != route.model {
            return None;
        }
        let usage = message.usage.filter(Value::is_object)?;
        let count = |key: &str| usage[key].as_u64().unwrap_or(0);
        Some((i, count("inputTokens") + count("outputTokens")))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::SessionHeader;
    use crate::session::estimate::{block_tokens, message_tokens};
    use crate::session::event::{ModelMessage, UserMessage};
    use crate::session::store::SessionStore;

    #[test]
    fn the_heuristic_counts_utf16_units_per_block() {
        assert_eq!(block_tokens(&json!({"type": "text", "text": "abcde"})), 2 + 4);
        // One emoji is two UTF-16 units.
        assert_eq!(block_tokens(&json!({"type": "reasoning", "text": "😀😀😀"})), 2 + 4);
        let call = json!({"type": "tool-call", "id": "c", "name": "read", "arguments": "{\"p\":1}"});
        assert_eq!(block_tokens(&call), 1 + 2 + 4);
        let result = json!({"type": "tool-result", "toolCallId": "c", "content": [{"type": "text", "text": "1234"}]});
        assert_eq!(block_tokens(&result), (1 + 4) + 4);
        let unknown = json!({"type": "video"});
        assert_eq!(block_tokens(&unknown), 4 + 4, "16 bytes of JSON");
        assert_eq!(message_tokens(&json!({"role": "user", "content": [{"type": "text", "text": "abcd"}]})), 1 + 4 + 4);
        let tools = [ToolSchema { name: "r".into(), description: String::new(), parameters: json!({}) }];
        // `[{"description":"","name":"r","parameters":{}}]` is 47 units.
        assert_eq!(header_tokens("12345678", &tools), 2 + 4 + 12 + 4);
    }

    #[test]
    fn reported_usage_anchors_the_total_and_later_nodes_add_their_estimate() {
        let dir = tempfile::tempdir().unwrap();
        let mut session = SessionStore::new(dir.path()).create(SessionHeader::new("s", 0, None)).unwrap();
        let route = ModelRoute::parse("p/m").unwrap();
        let user = |text: &str| UserMessage::new(vec![json!({"type": "text", "text": text})], json!({"kind": "user"}));
        session.push(user("abcd"));
        let header = header_tokens("", &[]);
        assert_eq!(measure(&session, &route, "", &[]).total, header + 9, "no anchor: the estimate");
        let reply = ModelMessage::new(vec![json!({"type": "text", "text": "ok"})], "p", "m");
        let usage = Some(json!({"inputTokens": 900, "outputTokens": 100}));
        session.push(AssistantMessage { turn: 1, step: 1, message: reply.clone(), usage });
        assert_eq!(measure(&session, &route, "", &[]).total, 1000);
        session.push(user("abcdabcd"));
        assert_eq!(measure(&session, &route, "", &[]).nodes, [9, 9, 10]);
        assert_eq!(measure(&session, &route, "", &[]).total, 1010, "the anchor plus the new node");
        // Another route's usage is no anchor; usage below the estimate counts as the estimate.
        assert_eq!(measure(&session, &ModelRoute::parse("p/other").unwrap(), "", &[]).total, header + 28);
        let usage = Some(json!({"inputTokens": 1, "outputTokens": 1}));
        session.push(AssistantMessage { turn: 2, step: 1, message: reply, usage });
        assert_eq!(measure(&session, &route, "", &[]).total, header + 37);
    }
}
