//! A live session: the header, every event in memory, and the log writer. Appends assign `seq`
//! and `time`, notify observers synchronously (so what an editor sees follows log order), and
//! queue the line for the next batched write.

use std::sync::Arc;

use anyhow::Result;
use serde_json::{Value, json};

use super::event::{self, EventBody, Kind};
use super::record::{Event, SessionHeader};
use super::repair::Closer;
use super::surface::{self, derive_messages};
use super::writer::LogWriter;

/// Sees every event appended to a session, in order, on the appending task.
pub trait SessionObserver: Send + Sync {
    fn on_event(&self, header: &SessionHeader, event: &Event);
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// One session held in memory with its writer.
pub struct Session {
    pub header: SessionHeader,
    events: Vec<Event>,
    writer: LogWriter,
    observers: Vec<Arc<dyn SessionObserver>>,
    /// The surface fold of `events`, kept up to date on every append (O(1) per event) and
    /// shared with model requests (copy on write).
    messages: Arc<Vec<Value>>,
}

impl Session {
    pub fn new(header: SessionHeader, events: Vec<Event>, writer: LogWriter) -> Self {
        let messages = Arc::new(derive_messages(&events));
        Session { header, events, writer, observers: Vec::new(), messages }
    }

    pub fn id(&self) -> &str {
        &self.header.id
    }

    pub fn events(&self) -> &[Event] {
        &self.events
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
        let event = Event::new(self.events.len() as u64, now_ms(), body, sources);
        self.push_event(event)
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
        let seq = self.events.len() as u64;
        self.push_event(Event { kind, seq, time: now_ms(), data, source_event_seqs: sources, surface_op })
    }

    fn push_event(&mut self, event: Event) -> u64 {
        let seq = event.seq;
        self.writer.append(&event);
        for observer in &self.observers {
            observer.on_event(&self.header, &event);
        }
        // Only a surface event may change the history (and only then is a shared one copied).
        if event.kind.is_surface() {
            surface::apply(Arc::make_mut(&mut self.messages), &event);
        }
        self.events.push(event);
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

    /// The model-visible history: the surface fold of dsh `deriveMessages`.
    pub fn messages(&self) -> Arc<Vec<Value>> {
        self.messages.clone()
    }

    /// The number the next turn gets (continuing a fork seed's numbering).
    pub fn next_turn(&self) -> u64 {
        event::last::<event::TurnStart>(&self.events).map_or(1, |start| start.turn + 1)
    }
}
