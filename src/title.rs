//! A session's model-written title (config `title_model`, off by default): after the turn that
//! gave the session its fallback title (the first prompt's first words, written by the turn
//! itself), one short model call without tools names the conversation from that prompt's own
//! words (not the text of a file attached to it) and the answer, and the title is recorded as a `session/title` with a `model` source. Bounded: the
//! request carries at most `MAX_INPUT_CHARS` of each text, the answer is read up to
//! `MAX_ANSWER_CHARS`, and the call is given `TIMEOUT`; any failure keeps the fallback title.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::model::{Model, ModelEvent, ModelRequest, ModelRoute, StreamChunk};
use crate::session::event::{self, EventBody, SessionTitle};
use crate::session::{Event, Kind};

/// What the title model is asked.
const SYSTEM: &str = "You name conversations. Reply with a title of at most six words for the \
                      conversation below: no quotes, no trailing punctuation, nothing else.";
/// The most characters of the prompt and of the answer the title model reads.
const MAX_INPUT_CHARS: usize = 2000;
/// The most characters of the title model's answer kept.
const MAX_ANSWER_CHARS: usize = 400;
/// The output cap of the title call.
const MAX_ANSWER_TOKENS: u32 = 64;
/// How long the title call may take.
const TIMEOUT: Duration = Duration::from_secs(30);

/// What a title is made from: the prompt the fallback title names and the answer to it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Basis {
    pub message_seq: u64,
    pub prompt: String,
    pub answer: String,
}

/// The basis for a model title, when the session's last turn wrote its fallback title (so the
/// model names each session once, right after its first answered prompt).
pub(crate) fn basis(events: &[Event]) -> Option<Basis> {
    let last_turn = events.iter().rposition(|e| e.kind == Kind::TurnStart)?;
    let title_at = events.iter().rposition(|e| e.kind == Kind::SessionTitle)?;
    let title = events[title_at].get::<SessionTitle>()?;
    if title_at < last_turn || title.source.kind != "fallback" {
        return None;
    }
    let message_seq = *title.message_seqs.first()?;
    // The user's own words: an attached file's text is not sent to the title model (which may
    // be another provider's) and does not name the session.
    let prompt = match events.iter().find(|e| e.seq == message_seq)?.body() {
        EventBody::UserMessage(message) => event::own_words(&texts(&message.content)).trim().to_string(),
        _ => return None,
    };
    let answer = events[last_turn..]
        .iter()
        .rev()
        .filter_map(|e| e.get::<event::AssistantMessage>())
        .map(|m| texts(&m.message.content))
        .find(|t| !t.is_empty())
        .unwrap_or_default();
    Some(Basis { message_seq, prompt, answer })
}

fn texts(blocks: &[Value]) -> String {
    let text: Vec<&str> = blocks.iter().filter(|b| b["type"] == "text").filter_map(|b| b["text"].as_str()).collect();
    text.join("\n")
}

fn cut(text: &str, chars: usize) -> String {
    text.chars().take(chars).collect()
}

/// Asks `route` for a title of the conversation `basis` describes; `None` when the call fails,
/// times out or answers nothing usable.
pub(crate) async fn ask(
    model: Arc<dyn Model>,
    route: ModelRoute,
    session_id: &str,
    basis: &Basis,
) -> Option<SessionTitle> {
    let conversation =
        format!("User: {}\n\nAssistant: {}", cut(&basis.prompt, MAX_INPUT_CHARS), cut(&basis.answer, MAX_INPUT_CHARS));
    let messages = vec![json!({
        "role": "user",
        "content": [{"type": "text", "text": conversation}],
        "source": {"kind": "user"},
        "id": uuid::Uuid::new_v4().to_string(),
    })];
    let request = ModelRequest {
        // Its own id: the title call is not one of the session's calls.
        session_id: format!("{session_id}#title"),
        turn: 0,
        step: 0,
        cwd: None,
        route: route.clone(),
        system: SYSTEM.into(),
        messages: Arc::new(messages),
        tools: Vec::new(),
        purpose: crate::model::Purpose::Title,
        max_tokens: Some(MAX_ANSWER_TOKENS),
    };
    let cancel = CancellationToken::new();
    let mut stream = model.stream(request, cancel.clone());
    let read = async {
        let mut text = String::new();
        while let Some(item) = stream.recv().await {
            match item {
                Ok(ModelEvent::Chunk(StreamChunk::TextDelta { text: delta, .. })) => {
                    text.push_str(&delta);
                    if text.chars().count() > MAX_ANSWER_CHARS {
                        break;
                    }
                }
                Ok(ModelEvent::Chunk(StreamChunk::Finish { .. })) => break,
                // A retry of the title call is not the session's: it is not written.
                Ok(ModelEvent::Chunk(_) | ModelEvent::Retry(_)) => {}
                Err(failure) => {
                    tracing::debug!(session = session_id, "the title model failed: {}", failure.message);
                    return None;
                }
            }
        }
        Some(text)
    };
    let text = tokio::time::timeout(TIMEOUT, read).await.ok().flatten();
    cancel.cancel();
    let text = text?;
    let first = text.lines().map(str::trim).find(|l| !l.is_empty())?;
    SessionTitle::by_model(
        // Quotes first, then the trailing punctuation they may have held in.
        first.trim_matches(['"', '\'', '`', '*']).trim_end_matches(['.', '!', '?']),
        vec![basis.message_seq],
        &route.provider,
        &route.model,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::script::{ReplayEntry, ScriptedModel};
    use crate::session::event::{ModelMessage, TurnStart, UserMessage};

    fn events(bodies: Vec<EventBody>) -> Vec<Event> {
        bodies.into_iter().enumerate().map(|(seq, body)| Event::new(seq as u64, 0, body, None)).collect()
    }

    fn turn() -> EventBody {
        TurnStart { turn: 1, trigger: event::Trigger::message(json!({"kind": "user"})) }.into()
    }

    fn prompt(text: &str) -> UserMessage {
        UserMessage::new(vec![json!({"type": "text", "text": text})], json!({"kind": "user"}))
    }

    fn answer(text: &str) -> EventBody {
        let message = ModelMessage::new(vec![json!({"type": "text", "text": text})], "p", "m");
        event::AssistantMessage { turn: 1, step: 1, message, usage: None }.into()
    }

    #[test]
    fn the_basis_is_the_turn_that_wrote_the_fallback_title() {
        let first = prompt("Fix the flaky parser test please");
        let title = SessionTitle::fallback(&first, 1).unwrap();
        let log = events(vec![turn(), first.clone().into(), title.clone().into(), answer("Done: it was a race.")]);
        assert_eq!(
            basis(&log),
            Some(Basis {
                message_seq: 1,
                prompt: "Fix the flaky parser test please".into(),
                answer: "Done: it was a race.".into()
            })
        );
        // A later turn, or a title a model wrote: no second request.
        let mut later = log.clone();
        later.push(Event::new(4, 0, turn(), None));
        assert_eq!(basis(&later), None);
        // An attached file's text is left out, its words and the user's kept.
        let attached = prompt(
            "Review this\n[resource uri=\"file:///w/.env\"]\nAPI_KEY=sk-secret\n[/resource]\n\
             [resource_link name=\"b.rs\" uri=\"file:///w/b.rs\"]\nand that",
        );
        let title = SessionTitle::fallback(&attached, 1).unwrap();
        let log = events(vec![turn(), attached.into(), title.into(), answer("Looks fine.")]);
        assert_eq!(basis(&log).unwrap().prompt, "Review this\nand that");
        let named = SessionTitle::by_model("Parser race", vec![1], "p", "m").unwrap();
        let log = events(vec![turn(), first.into(), named.into()]);
        assert_eq!(basis(&log), None);
    }

    #[tokio::test]
    async fn the_model_answers_a_title_and_a_failure_keeps_none() {
        let basis = Basis { message_seq: 1, prompt: "p".into(), answer: "a".into() };
        let route = ModelRoute::parse("p/titler").unwrap();
        let answer = crate::model::text_response(&["\"Parser race", " fixed.\"\nmore"]);
        let model = Arc::new(ScriptedModel::new(vec![ReplayEntry::Chunks(answer)]));
        let title = ask(model, route.clone(), "s", &basis).await.unwrap();
        assert_eq!(title.title, "Parser race fixed");
        assert_eq!((title.source.kind.as_str(), title.source.model.as_deref()), ("model", Some("titler")));
        let throw = ReplayEntry::Throw { chunks: Vec::new(), message: "down".into(), code: "X".into() };
        let failing = Arc::new(ScriptedModel::new(vec![throw]));
        assert_eq!(ask(failing, route, "s", &basis).await, None);
    }
}
