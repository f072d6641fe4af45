//! A live session: the header, its events in memory (all but a model call's chunks after its first, see
//! `resident`), and the log writer. Appends assign `seq` and `time`, notify observers
//! synchronously (so what an editor sees follows log order), and queue the line for the next
//! batched write.

use std::sync::Arc;

use anyhow::Result;
use serde_json::{Value, json};

use super::event::{self, EventBody, Kind};
use super::record::{Event, SessionHeader};
use super::repair::Closer;
use super::resident::{ChunkOf, Resident};
use super::surface::{self, HistoryMessage, Nodes};
use super::writer::LogWriter;

/// Sees every event appended to a session, in order, on the appending task.
pub trait SessionObserver: Send + Sync {
    fn on_event(&self, header: &SessionHeader, event: &Event);
}

/// Milliseconds since the Unix epoch.
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// One session held in memory with its writer.
pub struct Session {
    pub header: SessionHeader,
    /// The resident events (every event but the chunks `resident` leaves on disk), in
    /// seq order, shared with `snapshot` holders (copy on write: an append while a snapshot is
    /// held copies the list once).
    events: Arc<Vec<Event>>,
    /// The seq of the next event (the log's event count).
    next_seq: u64,
    /// What stays in memory of what is appended.
    resident: Resident,
    /// Some events of the log are not in `events` (`history` reads them back).
    partial: bool,
    writer: LogWriter,
    observers: Vec<Arc<dyn SessionObserver>>,
    /// The surface fold of `events`, kept up to date on every append (O(1) per appended event):
    /// each message is its event's text, shared with the resident event.
    messages: Vec<HistoryMessage>,
    /// The seq of each message's node, in the same order.
    nodes: Vec<u64>,
}

impl Session {
    /// A session of `events` (contiguous from seq 0, as a scan or a seed gives them); only the
    /// resident ones stay in memory.
    pub fn new(header: SessionHeader, events: Vec<Event>, writer: LogWriter) -> Self {
        let length = events.last().map_or(0, |e| e.seq + 1);
        Session::restore(header, events, length, writer)
    }

    /// A session of a log of `length` events, of which `events` are given in seq order (all of
    /// them, or those a resident scan kept).
    pub fn restore(header: SessionHeader, mut events: Vec<Event>, length: u64, writer: LogWriter) -> Self {
        let Nodes { seqs, messages } = Nodes::of(&events);
        let next_seq = length;
        let mut resident = Resident::default();
        events.retain_mut(|e| {
            let chunk = ChunkOf::event(e);
            resident.keep(e, chunk)
        });
        events.shrink_to_fit();
        let partial = events.len() as u64 != next_seq;
        Session {
            header,
            events: Arc::new(events),
            next_seq,
            resident,
            partial,
            writer,
            observers: Vec::new(),
            messages,
            nodes: seqs,
        }
    }

    pub fn id(&self) -> &str {
        &self.header.id
    }

    /// The resident events, in seq order: every event of the log except a model call's chunks
    /// after its first (an `assistant/message` then without its chunk seqs). A position in it
    /// is not a seq; `history` is the whole log.
    pub fn events(&self) -> &[Event] {
        &self.events
    }

    /// The number of events in the log (the seq the next one gets).
    pub fn len(&self) -> u64 {
        self.next_seq
    }

    /// The log's size in bytes, counting what is queued to be written.
    pub fn log_bytes(&self) -> u64 {
        self.writer.appended_bytes()
    }

    /// Whether the log has no events yet.
    pub fn is_empty(&self) -> bool {
        self.next_seq == 0
    }

    /// Every event of the log, as written: the resident ones, or, when some stayed on disk only,
    /// the log read back (everything appended so far is written to the OS first).
    pub fn history(&mut self) -> Result<Vec<Event>> {
        if !self.partial {
            return Ok(self.events.to_vec());
        }
        self.writer.write_eager();
        let scanned = super::scan::scan_file(self.writer.path())?;
        anyhow::ensure!(
            scanned.events.len() as u64 == self.next_seq,
            "the log of {} holds {} events, {} were appended (a write is pending: {})",
            self.header.id,
            scanned.events.len(),
            self.next_seq,
            self.writer.path().display()
        );
        Ok(scanned.events)
    }

    /// The resident events so far, shared rather than copied (what a `session/load` replays).
    pub fn snapshot(&self) -> Arc<Vec<Event>> {
        self.events.clone()
    }

    pub fn add_observer(&mut self, observer: Arc<dyn SessionObserver>) {
        self.observers.push(observer);
    }

    /// Appends a typed event: a surface kind with `surfaceOp: "append"`, any other kind
    /// log-only.
    pub fn push(&mut self, body: impl Into<EventBody>) -> u64 {
        self.push_body(body.into(), None)
    }

    /// `push`, naming the events this one was built from (`sourceEventSeqs`).
    pub fn push_from(&mut self, body: impl Into<EventBody>, sources: Vec<u64>) -> u64 {
        self.push_body(body.into(), Some(sources))
    }

    fn push_body(&mut self, body: EventBody, sources: Option<Vec<u64>>) -> u64 {
        let chunk = ChunkOf::body(&body);
        let event = Event::new(self.next_seq, now_ms(), body, sources);
        self.writer.append(&event);
        self.record(event, chunk)
    }

    /// Appends a surface event whose message replaces the current nodes from seq `start` through
    /// seq `end` (`surfaceOp: {op: "replace", start, end}`: a compaction's checkpoint), naming its
    /// sources. Refused, with nothing written, unless both bounds are current nodes, `start` not
    /// after `end`, and `sources` names every node it shadows (dsh's provenance rule).
    pub fn push_replace(
        &mut self,
        body: impl Into<EventBody>,
        start: u64,
        end: u64,
        sources: Vec<u64>,
    ) -> Result<u64, String> {
        let range = surface::resolve(&self.nodes, start, end)?;
        surface::check_provenance(&self.nodes, range, &sources)?;
        let body = body.into();
        if !body.kind().is_surface() {
            return Err(format!("a {} event cannot replace surface nodes", body.kind()));
        }
        let mut event = Event::new(self.next_seq, now_ms(), body, Some(sources));
        event.surface_op = Some(surface::replace_op(start, end));
        Ok(self.push_event(event))
    }

    /// The seq of each node of the model history, in the order of `messages`.
    pub fn surface_seqs(&self) -> &[u64] {
        &self.nodes
    }

    /// Appends a log-only event of any kind, its payload as given (tests, recorded lines).
    pub fn append(&mut self, kind: &str, data: Value) -> u64 {
        self.push_raw(Kind::parse(kind), data, None, None)
    }

    /// Appends a surface event of any kind (`surfaceOp: "append"`), its payload as given,
    /// optionally naming its source events.
    pub fn append_surface(&mut self, kind: &str, data: Value, sources: Option<Vec<u64>>) -> u64 {
        self.push_raw(Kind::parse(kind), data, sources, Some(json!("append")))
    }

    pub(super) fn append_closer(&mut self, closer: Closer) -> u64 {
        self.push_body(closer.body, closer.source_event_seqs)
    }

    fn push_raw(&mut self, kind: Kind, data: Value, sources: Option<Vec<u64>>, surface_op: Option<Value>) -> u64 {
        let seq = self.next_seq;
        self.push_event(Event { kind, seq, time: now_ms(), data: data.into(), source_event_seqs: sources, surface_op })
    }

    fn push_event(&mut self, event: Event) -> u64 {
        self.writer.append(&event);
        let chunk = ChunkOf::event(&event);
        self.record(event, chunk)
    }

    /// Appends typed events and makes them durable (written after everything pending, and
    /// `fsync`ed) before anything else sees them: all of them, or, when the log cannot be
    /// written, none (the error names the cause). What kin acknowledges as accepted is appended
    /// this way.
    pub fn push_durably(&mut self, bodies: Vec<EventBody>) -> Result<Vec<u64>, String> {
        let first = self.next_seq;
        let time = now_ms();
        let chunk: Vec<Option<ChunkOf>> = bodies.iter().map(ChunkOf::body).collect();
        let events: Vec<Event> =
            bodies.into_iter().enumerate().map(|(i, body)| Event::new(first + i as u64, time, body, None)).collect();
        self.writer.append_durably(&events).map_err(|e| format!("{e:#}"))?;
        Ok(events.into_iter().zip(chunk).map(|(event, chunk)| self.record(event, chunk)).collect())
    }

    /// Shows an appended event to the observers, folds it into the history and keeps it in
    /// memory if it is resident.
    fn record(&mut self, mut event: Event, chunk: Option<ChunkOf>) -> u64 {
        let seq = event.seq;
        self.next_seq = seq + 1;
        for observer in &self.observers {
            observer.on_event(&self.header, &event);
        }
        if event.kind.is_surface() {
            surface::apply(&mut self.nodes, &mut self.messages, &event);
        }
        if self.resident.keep(&mut event, chunk) {
            Arc::make_mut(&mut self.events).push(event);
        } else {
            self.partial = true;
        }
        seq
    }

    /// Makes every appended event durable (write + `fsync`).
    pub fn flush(&mut self) -> Result<()> {
        self.writer.flush()
    }

    /// Removes a new session's log whose creation failed before the session was handed out
    /// (see `LogWriter::discard`).
    pub fn discard(self) {
        self.writer.discard();
    }

    /// Writes queued events to the OS without `fsync` (see `LogWriter::write_eager`).
    pub fn write_eager(&mut self) {
        self.writer.write_eager();
    }

    /// The model-visible history (the surface fold of dsh `deriveMessages`), parsed afresh from
    /// the text the session keeps: what a request holds for its life and then lets go.
    pub fn messages(&self) -> Arc<Vec<Value>> {
        Arc::new(self.messages.iter().map(HistoryMessage::value).collect())
    }

    /// Each history message's token estimate (`session::estimate`), in surface order; a message
    /// is parsed for it once, not at every step that prices the next request.
    pub(crate) fn message_tokens(&self) -> Vec<u64> {
        self.messages.iter().map(HistoryMessage::tokens).collect()
    }

    /// The number the next turn gets (continuing a fork seed's numbering).
    pub fn next_turn(&self) -> u64 {
        event::last::<event::TurnStart>(&self.events).map_or(1, |start| start.turn + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::super::event::UserMessage;
    use super::super::store::SessionStore;
    use super::*;

    fn message(text: &str) -> UserMessage {
        UserMessage::new(vec![json!({"type": "text", "text": text})], json!({"kind": "user"}))
    }

    /// A history message's kept estimate is the estimate of the message as the request carries
    /// it, for a message that is its event's data (a user message) and one carried inside it
    /// (an assistant message), and for a message added after the estimates were kept.
    #[test]
    fn each_history_message_is_priced_as_the_message_the_request_carries() {
        use super::super::estimate::message_tokens;
        use super::super::event::{AssistantMessage, ModelMessage};
        let dir = tempfile::tempdir().unwrap();
        let mut session = SessionStore::new(dir.path()).create(SessionHeader::new("s", 0, None)).unwrap();
        session.push(message("a question of some length"));
        let reply =
            ModelMessage::new(vec![json!({"type": "text", "text": format!("{} 😀", "b".repeat(99))})], "p", "m");
        session.push(AssistantMessage { turn: 1, step: 1, message: reply, usage: None });
        let priced = |session: &Session| session.messages().iter().map(message_tokens).collect::<Vec<u64>>();
        let expected = priced(&session);
        assert_eq!(expected.len(), 2);
        assert_ne!(expected[0], expected[1]);
        assert_eq!(session.message_tokens(), expected);
        assert_eq!(session.message_tokens(), expected, "as kept");
        session.push(message("x"));
        assert_eq!(session.message_tokens(), priced(&session));
    }

    #[test]
    fn a_calls_later_chunks_stay_on_disk_and_the_history_reads_them_back() {
        use super::super::chunk::StreamChunk;
        use super::super::event::{AssistantChunk, AssistantMessage, ModelMessage};
        let dir = tempfile::tempdir().unwrap();
        let store = SessionStore::new(dir.path());
        let mut session = store.create(SessionHeader::new("s", 0, None)).unwrap();
        session.push(message("hi"));
        let chunk = |chunk| AssistantChunk { turn: 1, step: 1, chunk };
        let mut seqs = vec![session.push(chunk(StreamChunk::BlockStart { index: 0, block_type: "text".into() }))];
        for _ in 0..1000 {
            seqs.push(session.push(chunk(StreamChunk::TextDelta { index: 0, text: "x".into() })));
        }
        let text = "x".repeat(1000);
        let block = json!({"type": "text", "text": text});
        seqs.push(session.push(chunk(StreamChunk::BlockEnd { index: 0, block: block.clone() })));
        let answer = ModelMessage::new(vec![block], "p", "m");
        session.push_from(AssistantMessage { turn: 1, step: 1, message: answer, usage: None }, seqs.clone());
        // In memory: the prompt, the call's first chunk, the message without its 1,002 seqs.
        assert_eq!(session.len(), 1004);
        assert_eq!(session.events().iter().map(|e| e.seq).collect::<Vec<_>>(), [0, 1, 1003]);
        assert_eq!(session.events()[2].source_event_seqs, None);
        assert_eq!(session.messages()[1]["content"][0]["text"], text.as_str(), "the history is whole");
        // The history is the log as written, chunks and seqs included.
        let history = session.history().unwrap();
        assert_eq!(history.len(), 1004);
        assert!(history.iter().enumerate().all(|(i, e)| e.seq == i as u64));
        assert_eq!(history[1003].source_event_seqs.as_deref(), Some(seqs.as_slice()));
        session.flush().unwrap();
        drop(session);
        // A load holds the same resident events and appends after the last chunk on disk.
        let mut loaded = store.load("s").unwrap();
        assert_eq!((loaded.len(), loaded.events().len()), (1004, 3));
        assert_eq!(loaded.push(message("again")), 1004);
        assert_eq!(loaded.history().unwrap().len(), 1005);
    }

    #[test]
    fn a_replacement_is_refused_unless_its_bounds_and_sources_fit() {
        let dir = tempfile::tempdir().unwrap();
        let store = SessionStore::new(dir.path());
        let mut session = store.create(SessionHeader::new("s", 0, None)).unwrap();
        for text in ["a", "b", "c"] {
            session.push(message(text));
        }
        let refused = [
            session.push_replace(message("x"), 0, 9, vec![0]),
            session.push_replace(message("x"), 1, 0, vec![0, 1]),
            session.push_replace(message("x"), 0, 1, vec![0]),
            session.push_replace(super::super::event::StepStart { turn: 1, step: 1 }, 0, 0, vec![0]),
        ];
        assert!(refused.iter().all(Result::is_err), "{refused:?}");
        assert_eq!(session.events().len(), 3, "a refused replacement writes nothing");
        let seq = session.push_replace(message("summary"), 0, 1, vec![0, 1]).unwrap();
        assert_eq!(seq, 3);
        assert_eq!(session.surface_seqs(), [3, 2]);
        assert_eq!(session.messages()[0]["content"][0]["text"], "summary");
        assert_eq!(session.events()[3].surface_op, Some(json!({"op": "replace", "start": 0, "end": 1})));
        // A fresh fold of the same events agrees with the live one.
        let again = Nodes::of(session.events());
        let messages: Vec<Value> = again.messages.iter().map(HistoryMessage::value).collect();
        assert_eq!((again.seqs.as_slice(), &messages), (session.surface_seqs(), &*session.messages()));
    }
}
