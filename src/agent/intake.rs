//! The agent's inbox in memory, and how messages enter it. Acceptance is durable: a message
//! another session sends (a follow-up, a background child's first prompt, a report) is written
//! to this session's log as an `agent/inbox/spliced` insertion and `fsync`ed before the sender
//! hears it was accepted, and the lists change only after that (`session::inbox` folds them back
//! from the log). Messages that arrive together are written with one `fsync`. A prompt the
//! editor sends is not an inbox entry: its answer is its turn's end, so there is nothing to keep.
//!
//! Arrivals are written by whoever holds the session: the actor between turns, the running turn
//! at each of its await points (so a sender never waits for a turn to end).
//!
//! A setting the editor chose for the session (its mode, model or sandbox) arrives the same way
//! (`Arrival::Log`): its log-only event is written and `fsync`ed with the rest, the setting takes
//! effect only then, and its sender hears the outcome after that.

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard, PoisonError};

use tokio::sync::{Notify, oneshot};

use super::{Queued, TurnEnd};
use crate::session::event::{InboxSplice, InboxTarget, UserMessage};
use crate::session::{EventBody, Session, inbox};

/// Why a message was not accepted: nothing of it was kept, and the sender must not say it was.
#[derive(Debug, Clone, PartialEq)]
pub enum NotAccepted {
    /// The agent has shut down.
    Gone(String),
    /// The recipient's log could not be written (the cause, e.g. a full disk).
    Unwritten { session: String, cause: String },
}

impl std::fmt::Display for NotAccepted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotAccepted::Gone(id) => write!(f, "agent {id} has shut down"),
            NotAccepted::Unwritten { session, cause } => {
                write!(f, "the message could not be written to the log of session {session}: {cause}")
            }
        }
    }
}

impl std::error::Error for NotAccepted {}

/// What the sender of an inbox message hears once it is written (or is not).
pub(super) type Accepted = oneshot::Sender<Result<(), String>>;

/// What a recorded setting does once its event is on disk (on the actor, in log order).
pub(super) type Apply = Box<dyn FnOnce() + Send>;

/// A message handed to the agent, not yet in its lists.
pub(super) enum Arrival {
    /// A message for its own turn; `accepted` is `Some` for an inbox message (written first),
    /// `None` for a prompt (queued as it is).
    Turn { queued: Queued, accepted: Option<Accepted> },
    /// A message for the next step: (durably staged) before the next step of a running turn;
    /// between turns appended at once, or with `wake` (dsh's `steer`) queued for a turn of its
    /// own, as it is when the turn ends before a step took it.
    Step { message: UserMessage, accepted: Accepted, wake: bool },
    /// A log-only event of a setting (`session/mode`, `session/model`, `session/sandbox`): written
    /// like a message, then `apply` runs (only when it was written) before `recorded` is answered.
    Log { body: EventBody, apply: Apply, recorded: Accepted },
}

#[derive(Default)]
struct Lists {
    arrivals: Vec<Arrival>,
    /// Messages waiting for their own turns, FIFO (inbox messages and prompts).
    queue: VecDeque<Queued>,
    /// Inbox messages waiting for the next step of the running turn, and whether each wants a
    /// turn of its own if no step takes it.
    staged: Vec<(UserMessage, bool)>,
}

/// The lists, shared by the actor and the turn it runs (both on the actor's task).
#[derive(Default)]
pub(super) struct Intake {
    lists: Mutex<Lists>,
    arrived: Notify,
}

impl Intake {
    /// An intake whose queue starts with `restored` (inbox messages read back from the log).
    pub(super) fn with_queue(restored: VecDeque<Queued>) -> Self {
        Intake { lists: Mutex::new(Lists { queue: restored, ..Lists::default() }), arrived: Notify::new() }
    }

    fn lists(&self) -> MutexGuard<'_, Lists> {
        self.lists.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Hands a message to the agent; the holder of the session writes it.
    pub(super) fn arrive(&self, arrival: Arrival) {
        self.lists().arrivals.push(arrival);
        self.arrived.notify_one();
    }

    /// Resolves when something arrived (possibly already taken: `accept` then does nothing).
    pub(super) async fn arrived(&self) {
        self.arrived.notified().await;
    }

    /// Writes every arrival to `session` (one `fsync` for all of them), then puts them in their
    /// lists (a setting: applies it) and answers their senders; when the write fails nothing of
    /// them is kept or applied. `running`: a turn is running (a step message is staged for its
    /// next step rather than appended at once).
    pub(super) fn accept(&self, session: &mut Session, running: bool) {
        let arrivals = std::mem::take(&mut self.lists().arrivals);
        if arrivals.is_empty() {
            return;
        }
        let (mut turn_len, mut step_len) = {
            let lists = self.lists();
            (lists.queue.iter().filter(|q| q.durable).count(), lists.staged.len())
        };
        let mut bodies: Vec<EventBody> = Vec::new();
        for arrival in &arrivals {
            match arrival {
                Arrival::Turn { queued, accepted: Some(_) } => {
                    bodies.push(
                        InboxSplice::insert(InboxTarget::NextTurn, turn_len, vec![queued.message.clone()]).into(),
                    );
                    turn_len += 1;
                }
                Arrival::Turn { accepted: None, .. } => {}
                Arrival::Step { message, .. } if running => {
                    bodies.push(InboxSplice::insert(InboxTarget::NextStep, step_len, vec![message.clone()]).into());
                    step_len += 1;
                }
                Arrival::Step { message, wake: true, .. } => {
                    bodies.push(InboxSplice::insert(InboxTarget::NextTurn, turn_len, vec![message.clone()]).into());
                    turn_len += 1;
                }
                Arrival::Step { message, wake: false, .. } => bodies.push(message.clone().into()),
                Arrival::Log { body, .. } => bodies.push(body.clone()),
            }
        }
        let written = if bodies.is_empty() { Ok(()) } else { session.push_durably(bodies).map(|_| ()) };
        let mut lists = self.lists();
        for arrival in arrivals {
            match arrival {
                Arrival::Turn { queued, accepted: None } => lists.queue.push_back(queued),
                Arrival::Turn { queued, accepted: Some(accepted) } => {
                    if written.is_ok() {
                        lists.queue.push_back(queued);
                    }
                    let _ = accepted.send(written.clone());
                }
                Arrival::Step { message, accepted, wake } => {
                    if written.is_ok() {
                        if running {
                            lists.staged.push((message, wake));
                        } else if wake {
                            lists.queue.push_back(Queued::inbox(message));
                        }
                    }
                    let _ = accepted.send(written.clone());
                }
                Arrival::Log { apply, recorded, .. } => {
                    if written.is_ok() {
                        apply();
                    }
                    let _ = recorded.send(written.clone());
                }
            }
        }
    }

    /// True when a message waits for its own turn (held or not).
    pub(super) fn has_queued(&self) -> bool {
        !self.lists().queue.is_empty()
    }

    /// The next message to run, unless the queue is held.
    pub(super) fn next(&self) -> Option<Queued> {
        self.lists().queue.pop_front()
    }

    /// Lands the staged step messages: their claim, then each message appended to the history
    /// (at a step's start, `late` false); or, for those no step took before the turn ended
    /// (`late`), each that wants a turn (`wake`) inserted at the end of the turn queue for one.
    pub(super) fn land_staged(&self, session: &mut Session, late: bool) {
        let (staged, mut turn_len) = {
            let mut lists = self.lists();
            (std::mem::take(&mut lists.staged), lists.queue.iter().filter(|q| q.durable).count())
        };
        if staged.is_empty() {
            return;
        }
        session.push(InboxSplice::claim(InboxTarget::NextStep, staged.len()));
        let mut turns = Vec::new();
        for (message, wake) in staged {
            if late && wake {
                session.push(InboxSplice::insert(InboxTarget::NextTurn, turn_len, vec![message.clone()]));
                turn_len += 1;
                turns.push(Queued::inbox(message));
            } else {
                session.push(message);
            }
        }
        self.lists().queue.extend(turns);
    }

    /// Discards every queued inbox message (prompts stay): one durable `canceled` splice, then
    /// their turns answer `Aborted`. Returns how many were discarded.
    pub(super) fn discard(&self, session: &mut Session) -> Result<usize, String> {
        let count = self.lists().queue.iter().filter(|q| q.durable).count();
        if count == 0 {
            return Ok(0);
        }
        session.push_durably(vec![InboxSplice::discard(InboxTarget::NextTurn, 0, count).into()])?;
        let discarded: VecDeque<Queued> = {
            let mut lists = self.lists();
            let (gone, kept): (VecDeque<Queued>, VecDeque<Queued>) =
                std::mem::take(&mut lists.queue).into_iter().partition(|q| q.durable);
            lists.queue = kept;
            gone
        };
        for queued in discarded {
            if let Some(reply) = queued.reply {
                let _ = reply.send(TurnEnd::Aborted);
            }
        }
        Ok(count)
    }

    /// Stops: queued turns answer `Disposed` and stay pending in the log (nothing is written);
    /// arrivals not yet written are refused (their senders hear the agent is gone; a setting is
    /// not applied).
    pub(super) fn close(&self) {
        let (queue, arrivals) = {
            let mut lists = self.lists();
            (std::mem::take(&mut lists.queue), std::mem::take(&mut lists.arrivals))
        };
        for queued in queue {
            if let Some(reply) = queued.reply {
                let _ = reply.send(TurnEnd::Disposed);
            }
        }
        drop(arrivals);
    }
}

/// The inbox messages of a loaded session, ready for its agent: its pending `next-turn` messages
/// (they run in order once the agent is woken).
#[derive(Debug, Default)]
pub struct Restored {
    pub(super) next_turn: Vec<UserMessage>,
}

impl Restored {
    /// A session with nothing pending (a new one).
    pub fn none() -> Self {
        Restored::default()
    }

    /// How many turns wait.
    pub fn len(&self) -> usize {
        self.next_turn.len()
    }

    pub fn is_empty(&self) -> bool {
        self.next_turn.is_empty()
    }
}

/// Whether a message staged for a step wants a turn of its own when no step takes it: a
/// settlement notice (dsh's `steer`, `Agent::steer`). The log keeps no other mark of it than the
/// notice's source.
fn wants_turn(message: &UserMessage) -> bool {
    message.source["kind"] == SETTLED_SOURCE
}

/// The source kind of a background child's settlement notice to its parent.
pub(crate) const SETTLED_SOURCE: &str = "subagent-settled";

/// Reads a loaded session's inbox back from its log and settles what needs no turn: a claim
/// whose message never reached the log is put back at the front of its list, and the messages
/// waiting for a step that will never come (kin stopped during their turn) are claimed: a
/// settlement notice is queued for a turn of its own (as at the end of the turn it missed), the
/// others are appended now, as between turns. Returns what waits for turns. Fails (writing
/// nothing) when a splice does not fit, or when the log cannot be written.
pub(crate) fn prepare(session: &mut Session) -> Result<Restored, String> {
    let seed_length = session.header.seed_length.unwrap_or(0);
    let folded = inbox::fold(session.events(), seed_length).map_err(|e| e.to_string())?;
    let back = |target: InboxTarget| -> Vec<UserMessage> {
        folded.unconfirmed.iter().filter(|(t, _)| *t == target).map(|(_, m)| m.clone()).collect()
    };
    let (turn_back, step_back) = (back(InboxTarget::NextTurn), back(InboxTarget::NextStep));
    let mut bodies: Vec<EventBody> = Vec::new();
    if !turn_back.is_empty() {
        bodies.push(InboxSplice::insert(InboxTarget::NextTurn, 0, turn_back.clone()).into());
    }
    if !step_back.is_empty() {
        bodies.push(InboxSplice::insert(InboxTarget::NextStep, 0, step_back.clone()).into());
    }
    let mut next_turn: Vec<UserMessage> = turn_back.into_iter().chain(folded.next_turn).collect();
    let steps: Vec<UserMessage> = step_back.into_iter().chain(folded.next_step).collect();
    if !steps.is_empty() {
        bodies.push(InboxSplice::claim(InboxTarget::NextStep, steps.len()).into());
        for message in steps {
            if wants_turn(&message) {
                bodies.push(InboxSplice::insert(InboxTarget::NextTurn, next_turn.len(), vec![message.clone()]).into());
                next_turn.push(message);
            } else {
                bodies.push(message.into());
            }
        }
    }
    if !bodies.is_empty() {
        session.push_durably(bodies)?;
    }
    Ok(Restored { next_turn })
}
