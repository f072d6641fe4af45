//! What a live session keeps of its log in memory: every event except the bulk of a model
//! call's streamed deltas. A `text-delta`, `reasoning-delta` or `tool-call-delta` chunk is
//! written to the log and shown to the observers like any event, but once a chunk of the same
//! model call (turn and step) is already resident it is not kept; nor is the list of chunk seqs
//! an `assistant/message` was built from (`sourceEventSeqs`, one number per chunk). Nothing
//! kin does with a live session needs them: the history is the surface fold, the editor's
//! replay shows committed messages, and each model call keeps its first chunk, so "this call
//! streamed" stays visible. A fork, which copies the log verbatim, reads it back from disk.
//!
//! So the memory of a session grows with its messages, not with how finely they were streamed:
//! a message of one million one-character deltas costs its text, not a million events.

use serde::Deserialize;

use super::event::{EventBody, Kind};
use super::record::Event;
use crate::session::chunk::StreamChunk;

/// The (turn, step) of the last resident event when it is an `assistant/chunk`, and whether a
/// delta was left out since the last `assistant/message`.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Resident {
    last_chunk: Option<(u64, u64)>,
    left_out: bool,
}

/// What `keep` needs of an `assistant/chunk`: its call and whether it is a delta.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ChunkFacts {
    pub(crate) call: (u64, u64),
    pub(crate) delta: bool,
}

impl ChunkFacts {
    /// The facts of a typed body (`None`: not an `assistant/chunk`).
    pub(crate) fn of_body(body: &EventBody) -> Option<ChunkFacts> {
        let EventBody::AssistantChunk(c) = body else { return None };
        let delta = match &c.chunk {
            StreamChunk::TextDelta { .. } | StreamChunk::ReasoningDelta { .. } | StreamChunk::ToolCallDelta { .. } => {
                true
            }
            StreamChunk::BlockStart { .. }
            | StreamChunk::BlockEnd { .. }
            | StreamChunk::Usage { .. }
            | StreamChunk::Finish { .. } => false,
        };
        Some(ChunkFacts { call: (c.turn, c.step), delta })
    }

    /// The facts of a stored event, read from its text without building it.
    pub(crate) fn of_event(event: &Event) -> Option<ChunkFacts> {
        if event.kind != Kind::AssistantChunk {
            return None;
        }
        #[derive(Deserialize)]
        struct Head<'a> {
            #[serde(default)]
            turn: u64,
            #[serde(default)]
            step: u64,
            #[serde(borrow)]
            chunk: Type<'a>,
        }
        #[derive(Deserialize)]
        struct Type<'a> {
            #[serde(rename = "type", borrow)]
            kind: &'a str,
        }
        // A chunk that does not read as one (or whose type is escaped) is kept whole.
        let head: Head<'_> = serde_json::from_str(event.data.text()).ok()?;
        let delta = matches!(head.chunk.kind, "text-delta" | "reasoning-delta" | "tool-call-delta");
        Some(ChunkFacts { call: (head.turn, head.step), delta })
    }
}

impl Resident {
    /// Whether `event` (with `facts` if it is a chunk) stays in memory; an `assistant/message`
    /// built from chunks some of which were left out loses its chunk seqs (so a session whose
    /// resident events differ from its log always has fewer of them than the log).
    pub(crate) fn keep(&mut self, event: &mut Event, facts: Option<ChunkFacts>) -> bool {
        match facts {
            Some(ChunkFacts { call, delta: true }) if self.last_chunk == Some(call) => {
                self.left_out = true;
                false
            }
            Some(ChunkFacts { call, .. }) => {
                self.last_chunk = Some(call);
                true
            }
            None => {
                self.last_chunk = None;
                if event.kind == Kind::AssistantMessage && std::mem::take(&mut self.left_out) {
                    event.source_event_seqs = None;
                }
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::session::event::AssistantChunk;

    fn chunk(seq: u64, step: u64, chunk: StreamChunk) -> Event {
        Event::new(seq, 0, AssistantChunk { turn: 1, step, chunk }, None)
    }

    fn text(index: u64, text: &str) -> StreamChunk {
        StreamChunk::TextDelta { index, text: text.into() }
    }

    #[test]
    fn only_the_first_chunk_of_a_call_stays_and_a_message_drops_its_chunk_seqs() {
        let mut events = vec![
            chunk(0, 1, StreamChunk::BlockStart { index: 0, block_type: "text".into() }),
            chunk(1, 1, text(0, "a")),
            chunk(2, 1, text(0, "b")),
            chunk(3, 1, StreamChunk::BlockEnd { index: 0, block: json!({"type": "text", "text": "ab"}) }),
            chunk(4, 2, text(0, "c")),
            chunk(5, 2, StreamChunk::ReasoningDelta { index: 1, text: "d".into() }),
        ];
        let mut message = Event::new(6, 0, crate::session::event::StepEnd { turn: 1, step: 2 }, Some(vec![4, 5]));
        message.kind = Kind::AssistantMessage;
        events.push(message);
        let mut resident = Resident::default();
        let kept: Vec<u64> = events
            .iter_mut()
            .filter_map(|e| {
                let facts = ChunkFacts::of_event(e);
                assert_eq!(facts, e.get::<AssistantChunk>().map(|c| ChunkFacts::of_body(&c.into()).unwrap()));
                resident.keep(e, facts).then_some(e.seq)
            })
            .collect();
        // Step 1 keeps its block start and end; step 2, a delta-only call, its first delta.
        assert_eq!(kept, [0, 3, 4, 6]);
        assert_eq!(events[6].source_event_seqs, None);
    }
}
