//! What a live session keeps of its log in memory: every event except a model call's chunks
//! after its first. An `assistant/chunk` (a streamed delta, a block's start or end, usage, the
//! finish) is written to the log and shown to the observers like any event, but once a chunk of
//! the same model call (turn and step) is already resident it is not kept; nor is the list of
//! chunk seqs an `assistant/message` was built from (`sourceEventSeqs`, one number per chunk).
//! Nothing kin does with a live session needs them: the history is the surface fold, the
//! message holds the finished blocks and the usage, the editor's replay shows committed
//! messages, and each model call keeps its first chunk, so "this call was made" stays visible
//! (replay counts calls by it). A fork, which copies the log verbatim, reads it back from disk.
//!
//! So the memory of a session grows with its messages, not with how finely they were streamed:
//! a message of one million one-character deltas costs its text, not a million events.

use serde::Deserialize;

use super::event::{EventBody, Kind};
use super::record::Event;

/// The model call (turn, step) of the last resident event when it is an `assistant/chunk`, and
/// whether a chunk was left out since the last `assistant/message`.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Resident {
    last_chunk: Option<(u64, u64)>,
    left_out: bool,
}

/// The model call (turn, step) an `assistant/chunk` belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ChunkOf(pub(crate) (u64, u64));

impl ChunkOf {
    /// The call of a typed body (`None`: not an `assistant/chunk`).
    pub(crate) fn body(body: &EventBody) -> Option<ChunkOf> {
        let EventBody::AssistantChunk(c) = body else { return None };
        Some(ChunkOf((c.turn, c.step)))
    }

    /// The call of a stored event, read from its text without building it.
    pub(crate) fn event(event: &Event) -> Option<ChunkOf> {
        if event.kind != Kind::AssistantChunk {
            return None;
        }
        #[derive(Deserialize)]
        struct Head {
            #[serde(default)]
            turn: u64,
            #[serde(default)]
            step: u64,
        }
        // A chunk that does not read as one is kept whole.
        let head: Head = serde_json::from_str(event.data.text()).ok()?;
        Some(ChunkOf((head.turn, head.step)))
    }
}

impl Resident {
    /// Whether `event` (with its call if it is a chunk) stays in memory; an `assistant/message`
    /// built from chunks some of which were left out loses its chunk seqs (so a session whose
    /// resident events differ from its log always has fewer of them than the log).
    pub(crate) fn keep(&mut self, event: &mut Event, chunk: Option<ChunkOf>) -> bool {
        match chunk {
            Some(ChunkOf(call)) if self.last_chunk == Some(call) => {
                self.left_out = true;
                false
            }
            Some(ChunkOf(call)) => {
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
    use crate::session::chunk::StreamChunk;
    use crate::session::event::{AssistantChunk, AssistantMessage, ModelMessage, StepStart};

    fn chunk(seq: u64, step: u64, chunk: StreamChunk) -> Event {
        Event::new(seq, 0, AssistantChunk { turn: 1, step, chunk }, None)
    }

    fn text(index: u64, text: &str) -> StreamChunk {
        StreamChunk::TextDelta { index, text: text.into() }
    }

    fn message(seq: u64, step: u64, sources: Vec<u64>) -> Event {
        let message = ModelMessage::new(vec![json!({"type": "text", "text": "x"})], "p", "m");
        Event::new(seq, 0, AssistantMessage { turn: 1, step, message, usage: None }, Some(sources))
    }

    #[test]
    fn only_the_first_chunk_of_a_call_stays_and_a_message_drops_its_chunk_seqs() {
        let mut events = [
            chunk(0, 1, StreamChunk::BlockStart { index: 0, block_type: "text".into() }),
            chunk(1, 1, text(0, "a")),
            chunk(2, 1, StreamChunk::BlockEnd { index: 0, block: json!({"type": "text", "text": "a"}) }),
            message(3, 1, vec![0, 1, 2]),
            Event::new(4, 0, StepStart { turn: 1, step: 2 }, None),
            chunk(5, 2, text(0, "c")),
            message(6, 2, vec![5]),
        ];
        let mut resident = Resident::default();
        let kept: Vec<u64> = events
            .iter_mut()
            .filter_map(|e| {
                let of = ChunkOf::event(e);
                assert_eq!(of, e.get::<AssistantChunk>().and_then(|c| ChunkOf::body(&c.into())));
                resident.keep(e, of).then_some(e.seq)
            })
            .collect();
        // Each call keeps its first chunk; a message whose chunks all stayed keeps its seqs.
        assert_eq!(kept, [0, 3, 4, 5, 6]);
        assert_eq!(events[3].source_event_seqs, None);
        assert_eq!(events[6].source_event_seqs, Some(vec![5]));
    }
}
