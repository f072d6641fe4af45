//! The client's requests kin has not answered yet ([`Ledger`]): what holds the input after
//! `initialize` until its answer is out, and keeps the transport from ending at the end of the
//! input before the requests already read are answered.

use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::Value;

use crate::jsonrpc::Shape;

/// The longest the input waits for the response to an `initialize` request: a safety net only,
/// as every request is answered.
const INIT_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// The client's requests kin has not answered yet, as far as the transport can tell: each frame
/// the SDK reads as a request with an id ([`Shape::is_request`]) is entered, and the response
/// written with that id takes it out. At most `OPEN_TRACKED` are kept (a client may send any
/// number without waiting; the ones past the limit are not waited for).
///
/// It does two things. While an `initialize` request is open (before the first response to one),
/// the input is held back (see the module comment), at most for `INIT_WAIT`. At the end of the
/// input, the requests already read are answered before the transport ends
/// ([`Ledger::answer_before_the_end`]). A frame the SDK cannot read as a request is answered with
/// a null id, which cannot be told apart; such frames are not entered, so they hold nothing.
#[derive(Default)]
pub(super) struct Ledger {
    open: std::sync::Mutex<Vec<Open>>,
    /// A response to `initialize` was written: `initialize` holds nothing back any more.
    initialized: AtomicBool,
    /// Something left `open`.
    answered: tokio::sync::Notify,
    /// The end began ([`Ledger::answer_before_the_end`]), and why: a request read from now on is
    /// refused.
    ending: std::sync::OnceLock<&'static str>,
    /// Ends the running turns (at the end of the input, once the other requests are answered).
    stop_turns: Option<Box<dyn Fn() + Send + Sync>>,
}

/// A request read and not answered yet.
struct Open {
    id: Value,
    kind: Kind,
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    /// The first `initialize` (the input waits for its answer).
    Initialize,
    /// A `session/prompt`: answered when its turn ends.
    Prompt,
    Other,
}

/// The most requests the ledger keeps.
const OPEN_TRACKED: usize = 1024;
/// How long the end of the input waits for the answers to the requests already read.
pub(super) const ANSWER_WAIT: std::time::Duration = std::time::Duration::from_secs(30);
/// How long kin waits after SIGTERM for the answers to the requests it read.
pub(super) const SIGTERM_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

impl Ledger {
    /// A ledger whose end of input calls `stop_turns` once only prompts are unanswered.
    pub(super) fn new(stop_turns: impl Fn() + Send + Sync + 'static) -> Ledger {
        Ledger { stop_turns: Some(Box::new(stop_turns)), ..Ledger::default() }
    }

    fn open(&self) -> std::sync::MutexGuard<'_, Vec<Open>> {
        self.open.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// An incoming frame (its `shape`) on its way to the SDK: a request the SDK answers with its
    /// id is entered.
    pub(super) fn saw(&self, shape: &Shape) {
        if !shape.is_request() {
            return;
        }
        let id = shape.id();
        let kind = match shape.method_name.as_deref() {
            Some("initialize") if !self.initialized.load(Ordering::Acquire) => Kind::Initialize,
            Some("session/prompt") => Kind::Prompt,
            _ => Kind::Other,
        };
        let mut open = self.open();
        if open.len() < OPEN_TRACKED {
            open.push(Open { id, kind });
        } else {
            tracing::debug!("{OPEN_TRACKED} requests open; request {id} is not waited for at the end of the input");
        }
    }

    /// Why the end began, once it did: a request read now gets no service
    /// ([`Ledger::answer_before_the_end`]).
    pub(super) fn ending(&self) -> Option<&'static str> {
        self.ending.get().copied()
    }

    /// The id an outgoing line answers, if it is a response with an id and a request is open.
    /// Looked at before the line is written, and [`Ledger::answered`] after.
    pub(super) fn answers(&self, line: &str) -> Option<Value> {
        if self.open().is_empty() {
            return None;
        }
        let shape = Shape::of_line(line);
        shape.is_response().then(|| shape.id())
    }

    /// The response with `id` is written: its request is answered.
    pub(super) fn answered(&self, id: &Value) {
        let mut open = self.open();
        let Some(at) = open.iter().position(|o| o.id == *id) else { return };
        if open.remove(at).kind == Kind::Initialize {
            self.initialized.store(true, Ordering::Release);
        }
        drop(open);
        self.answered.notify_waiters();
    }

    /// Waits until no open request is `waited_for`, at most until `deadline`; whether that
    /// happened.
    async fn until_none(&self, waited_for: impl Fn(&Open) -> bool, deadline: tokio::time::Instant) -> bool {
        if !self.open().iter().any(&waited_for) {
            return true;
        }
        let cleared = async {
            loop {
                // Made before the check, so an answer between the two is not missed.
                let answered = self.answered.notified();
                if !self.open().iter().any(&waited_for) {
                    return;
                }
                answered.await;
            }
        };
        tokio::time::timeout_at(deadline, cleared).await.is_ok()
    }

    /// Waits while an `initialize` request is unanswered (at most `INIT_WAIT`).
    pub(super) async fn pass(&self) {
        if self.initialized.load(Ordering::Acquire) {
            return;
        }
        let deadline = tokio::time::Instant::now() + INIT_WAIT;
        if !self.until_none(|o| o.kind == Kind::Initialize, deadline).await {
            tracing::warn!("no response to initialize within {INIT_WAIT:?}; reading the next requests anyway");
            self.initialized.store(true, Ordering::Release);
            self.open().retain(|o| o.kind != Kind::Initialize);
        }
    }

    /// At the end of the input (or at SIGTERM, `why`): waits for the answers to the requests
    /// already read, so a client that writes its requests and closes its end (a script) gets them,
    /// waiting at most `within` in all. First every request but the prompts; then `stop_turns`
    /// ends the running turns, and their prompts are answered as they end (`cancelled`). A
    /// request read from the start of this on (after SIGTERM, the input is still read) is
    /// answered with an error instead of served (`ending`).
    pub(super) async fn answer_before_the_end(&self, why: &'static str, within: std::time::Duration) {
        let _ = self.ending.set(why);
        let open = self.open().len();
        if open == 0 {
            return;
        }
        tracing::info!("{why} with {open} request(s) unanswered; answering them before ending");
        let deadline = tokio::time::Instant::now() + within;
        self.until_none(|o| o.kind != Kind::Prompt, deadline).await;
        if let Some(stop_turns) = &self.stop_turns {
            stop_turns();
        }
        if !self.until_none(|_| true, deadline).await {
            let ids: Vec<String> = self.open().iter().map(|o| o.id.to_string()).collect();
            tracing::warn!(
                "{why} and requests {} were not answered within {within:?}; ending without their answers",
                ids.join(", ")
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{request, wrote};
    use super::*;

    /// The ledger is bounded: past `OPEN_TRACKED` open requests, more are not entered.
    #[test]
    fn at_most_open_tracked_requests_are_kept() {
        let ledger = Ledger::default();
        for id in 0..OPEN_TRACKED as u64 + 10 {
            ledger.saw(&Shape::of_line(&request(id, "session/list")));
        }
        assert_eq!(ledger.open().len(), OPEN_TRACKED);
        wrote(&ledger, r#"{"jsonrpc":"2.0","id":0,"result":{}}"#);
        ledger.saw(&Shape::of_line(&request(5000, "session/list")));
        assert_eq!(ledger.open().last().map(|o| o.id.clone()), Some(serde_json::json!(5000)), "room again");
    }

    /// A frame the SDK cannot read as a request (answered with a null id) is not entered: an
    /// `initialize` of that kind holds nothing back, and nothing waits for it at the end.
    #[tokio::test]
    async fn a_frame_the_sdk_cannot_read_is_not_entered() {
        let ledger = Ledger::default();
        ledger.saw(&Shape::of_line(r#"{"jsonrpc":"1.0","id":7,"method":"initialize","params":{}}"#));
        ledger.saw(&Shape::of_line(r#"{"jsonrpc":"2.0","id":8,"method":"session/list","params":"x"}"#));
        assert!(ledger.open().is_empty());
        assert!(futures::poll!(Box::pin(ledger.pass())).is_ready(), "nothing holds the input");
        ledger.saw(&Shape::of_line(&request(9, "initialize")));
        wrote(&ledger, r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"x"}}"#);
        assert_eq!(ledger.open().len(), 1, "a null id answers nothing");
        wrote(&ledger, r#"{"jsonrpc":"2.0","id":9,"result":{}}"#);
        assert!(ledger.open().is_empty() && ledger.initialized.load(Ordering::Acquire));
    }
}
