//! The durable inbox of one session, folded from its own log (dsh's later design): every change
//! to a pending list is one `agent/inbox/spliced` event, written before the change takes effect.
//! Two lists: `next-turn` (messages waiting for their own turn, FIFO) and `next-step` (messages
//! waiting for the next step of a running turn). A splice removes `removedCount` messages at
//! `start` and inserts `inserted` there; removed messages are claimed (a turn or step took them)
//! or, with `outcome: "canceled"`, discarded.
//!
//! Only the session's own events count (seq >= `seedLength`), so a fork never inherits the
//! pending messages of the log it was seeded from. A claimed message is confirmed by the
//! `user/message` with its id that follows the claim (the turn or step that took it); a claim
//! whose message never reached the log (a crash tore the batch between them) is reported as
//! unconfirmed, and `load` re-inserts it. A splice that does not fit the lists fails the fold
//! with `invalid persisted inbox splice at session seq <n>: <reason>`.

use std::collections::HashSet;

use serde::Deserialize;
use serde_json::Value;

use super::event::{InboxOutcome, InboxSplice, InboxTarget, Kind, UserMessage};
use super::record::Event;

impl InboxSplice {
    /// Inserts `messages` at `start` of `target`.
    pub fn insert(target: InboxTarget, start: usize, messages: Vec<UserMessage>) -> Self {
        InboxSplice { target, start: start as u64, removed_count: 0, inserted: messages, outcome: None }
    }

    /// A claim: the first `count` messages of `target` were taken by a turn (or a step).
    pub fn claim(target: InboxTarget, count: usize) -> Self {
        InboxSplice { target, start: 0, removed_count: count as u64, inserted: Vec::new(), outcome: None }
    }

    /// A discard: `count` messages of `target` from `start` on will never run.
    pub fn discard(target: InboxTarget, start: usize, count: usize) -> Self {
        InboxSplice {
            target,
            start: start as u64,
            removed_count: count as u64,
            inserted: Vec::new(),
            outcome: Some(InboxOutcome::Canceled),
        }
    }
}

/// A splice that does not fit the lists folded so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InboxError {
    pub seq: u64,
    pub reason: String,
}

impl std::fmt::Display for InboxError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "invalid persisted inbox splice at session seq {}: {}", self.seq, self.reason)
    }
}

impl std::error::Error for InboxError {}

/// The inbox as the log leaves it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Inbox {
    /// Waiting for their own turns, oldest first.
    pub next_turn: Vec<UserMessage>,
    /// Waiting for the next step of a turn, oldest first.
    pub next_step: Vec<UserMessage>,
    /// Claimed, but no `user/message` of theirs followed: taken by a turn or step the log does
    /// not hold. They never ran; `load` puts them back at the front of their list.
    pub unconfirmed: Vec<(InboxTarget, UserMessage)>,
    /// Messages discarded since a turn last took one (what the sender has not seen run).
    pub discarded: usize,
}

/// What a listing shows of a session's inbox.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InboxCounts {
    /// Messages accepted and not yet run (unconfirmed claims included).
    pub pending: usize,
    /// Messages discarded since a turn last took one.
    pub discarded: usize,
}

impl Inbox {
    /// The counts a listing shows.
    pub fn counts(&self) -> InboxCounts {
        InboxCounts {
            pending: self.next_turn.len() + self.next_step.len() + self.unconfirmed.len(),
            discarded: self.discarded,
        }
    }

    /// True when nothing waits (no pending and no unconfirmed message).
    pub fn is_idle(&self) -> bool {
        self.next_turn.is_empty() && self.next_step.is_empty() && self.unconfirmed.is_empty()
    }

    fn list(&mut self, target: InboxTarget) -> &mut Vec<UserMessage> {
        match target {
            InboxTarget::NextTurn => &mut self.next_turn,
            InboxTarget::NextStep => &mut self.next_step,
        }
    }

    fn is_pending(&self, id: &str) -> bool {
        self.next_turn.iter().chain(&self.next_step).any(|m| m.id == id)
    }

    /// Applies one splice (checked against the lists as they are).
    fn apply(&mut self, splice: InboxSplice) -> Result<(), String> {
        let InboxSplice { target, start, removed_count, inserted, outcome } = splice;
        let len = self.list(target).len();
        let start = usize::try_from(start).ok().filter(|s| *s <= len).ok_or_else(|| {
            format!("start {start} is past the end of the {} list ({len} pending)", target_name(target))
        })?;
        let removed = usize::try_from(removed_count).ok().filter(|n| *n <= len - start).ok_or_else(|| {
            format!(
                "it removes {removed_count} messages at {start} of the {} list, which holds {len}",
                target_name(target)
            )
        })?;
        let mut seen = HashSet::new();
        for message in &inserted {
            if message.id.is_empty() {
                return Err("an inserted message has no id".into());
            }
            if !seen.insert(message.id.as_str()) || self.is_pending(&message.id) {
                return Err(format!("message {} is already pending", message.id));
            }
        }
        // A message put back (the repair of an unconfirmed claim) is no longer unconfirmed.
        self.unconfirmed.retain(|(_, m)| !seen.contains(m.id.as_str()));
        let taken: Vec<UserMessage> = self.list(target).splice(start..start + removed, inserted).collect();
        match outcome {
            Some(InboxOutcome::Canceled) => self.discarded += taken.len(),
            None if !taken.is_empty() => {
                if target == InboxTarget::NextTurn {
                    self.discarded = 0;
                }
                self.unconfirmed.extend(taken.into_iter().map(|m| (target, m)));
            }
            None => {}
        }
        Ok(())
    }

    /// A `user/message` confirms the claim of the message with its id.
    fn confirm(&mut self, id: &str) {
        self.unconfirmed.retain(|(_, m)| m.id != id);
    }
}

fn target_name(target: InboxTarget) -> &'static str {
    match target {
        InboxTarget::NextTurn => "next-turn",
        InboxTarget::NextStep => "next-step",
    }
}

/// Folds the inbox from a log's own events (seq >= `seed_length`).
pub fn fold(events: &[Event], seed_length: u64) -> Result<Inbox, InboxError> {
    let mut inbox = Inbox::default();
    for event in events.iter().filter(|e| e.seq >= seed_length) {
        match event.kind {
            Kind::AgentInboxSpliced => {
                let fail = |reason: String| InboxError { seq: event.seq, reason };
                let splice = event.data.read::<InboxSplice>().map_err(|e| fail(e.to_string()))?;
                inbox.apply(splice).map_err(fail)?;
            }
            Kind::UserMessage if !inbox.unconfirmed.is_empty() => {
                /// The one field of a `user/message` the inbox needs.
                #[derive(Deserialize)]
                struct MessageId {
                    #[serde(default)]
                    id: Value,
                }
                if let Ok(MessageId { id: Value::String(id) }) = event.data.read() {
                    inbox.confirm(&id);
                }
            }
            _ => {}
        }
    }
    Ok(inbox)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::session::EventBody;

    fn message(id: &str) -> UserMessage {
        UserMessage { id: id.into(), ..UserMessage::new(vec![json!({"type": "text", "text": id})], json!({})) }
    }

    fn log(bodies: Vec<EventBody>) -> Vec<Event> {
        bodies.into_iter().enumerate().map(|(seq, body)| Event::new(seq as u64, 0, body, None)).collect()
    }

    fn ids(messages: &[UserMessage]) -> Vec<&str> {
        messages.iter().map(|m| m.id.as_str()).collect()
    }

    const TURN: InboxTarget = InboxTarget::NextTurn;
    const STEP: InboxTarget = InboxTarget::NextStep;

    #[test]
    fn insertions_claims_and_discards_fold_in_order() {
        let events = log(vec![
            InboxSplice::insert(TURN, 0, vec![message("a")]).into(),
            InboxSplice::insert(TURN, 1, vec![message("b"), message("c")]).into(),
            InboxSplice::claim(TURN, 1).into(),
            message("a").into(),
            InboxSplice::insert(STEP, 0, vec![message("r")]).into(),
            InboxSplice::discard(TURN, 1, 1).into(),
        ]);
        let inbox = fold(&events, 0).unwrap();
        assert_eq!(ids(&inbox.next_turn), ["b"]);
        assert_eq!(ids(&inbox.next_step), ["r"]);
        assert!(inbox.unconfirmed.is_empty(), "a's claim was confirmed by its user/message");
        assert_eq!(inbox.discarded, 1);
        assert!(!inbox.is_idle());
        // A later claim resets what the sender has to hear about discards.
        let mut more = events.clone();
        more.extend(log(vec![InboxSplice::claim(TURN, 1).into(), message("b").into()]).into_iter().map(|mut e| {
            e.seq += events.len() as u64;
            e
        }));
        let inbox = fold(&more, 0).unwrap();
        assert_eq!((inbox.next_turn.len(), inbox.discarded), (0, 0));
    }

    #[test]
    fn the_wire_shape_is_dshs_splice() {
        let line = |body: InboxSplice| serde_json::to_string(&Event::new(0, 0, body, None).data).unwrap();
        let m = message("m");
        let m_json = serde_json::to_string(&m).unwrap();
        assert_eq!(
            line(InboxSplice::insert(TURN, 2, vec![m])),
            format!(r#"{{"target":"next-turn","start":2,"inserted":[{m_json}]}}"#)
        );
        assert_eq!(
            line(InboxSplice::claim(STEP, 3)),
            r#"{"target":"next-step","start":0,"removedCount":3,"inserted":[]}"#
        );
        assert_eq!(
            line(InboxSplice::discard(TURN, 1, 2)),
            r#"{"target":"next-turn","start":1,"removedCount":2,"inserted":[],"outcome":"canceled"}"#
        );
        let event = Event::new(0, 0, InboxSplice::claim(TURN, 1), None);
        assert_eq!((event.kind.as_str(), event.surface_op), ("agent/inbox/spliced", None), "log-only");
    }

    #[test]
    fn a_fork_does_not_inherit_pending_messages() {
        let events = log(vec![
            InboxSplice::insert(TURN, 0, vec![message("inherited")]).into(),
            crate::session::event::EndSeed {}.into(),
            InboxSplice::insert(TURN, 0, vec![message("own")]).into(),
        ]);
        assert_eq!(ids(&fold(&events, 1).unwrap().next_turn), ["own"]);
        // The inherited splices are not even read: a claim the seed's list cannot explain fails
        // only when the fold starts before it.
        let claim = log(vec![InboxSplice::claim(TURN, 1).into()]);
        assert!(fold(&claim, 1).is_ok());
    }

    #[test]
    fn a_claim_without_its_message_is_unconfirmed_until_put_back() {
        let mut events = log(vec![
            InboxSplice::insert(TURN, 0, vec![message("a"), message("b")]).into(),
            InboxSplice::claim(TURN, 1).into(),
            crate::session::event::TurnStart { turn: 1, trigger: Default::default() }.into(),
        ]);
        let inbox = fold(&events, 0).unwrap();
        assert_eq!(inbox.unconfirmed, vec![(TURN, message("a"))]);
        assert_eq!(ids(&inbox.next_turn), ["b"]);
        events.push(Event::new(3, 0, InboxSplice::insert(TURN, 0, vec![message("a")]), None));
        let inbox = fold(&events, 0).unwrap();
        assert!(inbox.unconfirmed.is_empty());
        assert_eq!(ids(&inbox.next_turn), ["a", "b"], "back at the front, in order");
    }

    #[test]
    fn a_splice_that_does_not_fit_names_its_seq() {
        let cases: Vec<(EventBody, &str)> = vec![
            (InboxSplice::claim(TURN, 2).into(), "removes 2 messages at 0 of the next-turn list, which holds 1"),
            (InboxSplice::insert(STEP, 4, vec![message("x")]).into(), "start 4 is past the end of the next-step list"),
            (InboxSplice::insert(TURN, 0, vec![message("a")]).into(), "message a is already pending"),
            (InboxSplice::insert(TURN, 0, vec![message("")]).into(), "an inserted message has no id"),
            (
                EventBody::Unknown { kind: "agent/inbox/spliced".into(), data: json!({"target": "later", "start": 0}) },
                "unknown variant",
            ),
        ];
        for (body, reason) in cases {
            let events = log(vec![InboxSplice::insert(TURN, 0, vec![message("a")]).into(), body]);
            let err = fold(&events, 0).unwrap_err();
            assert_eq!(err.seq, 1);
            assert!(
                err.to_string().starts_with("invalid persisted inbox splice at session seq 1: ")
                    && err.reason.contains(reason),
                "{err}"
            );
        }
    }
}
