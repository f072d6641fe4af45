//! Flow control between what kin produces for the editor and what reaches it. The SDK queues
//! outgoing messages without a bound, so a client that reads slower than a model streams (or a
//! stream of a million one-character deltas) would grow that queue with every delta. Once the
//! stdio transport is attached, every `session/update` handed to the SDK is counted until its
//! line is in the stdout pipe (`transport`, 256 KiB, drained to stdout by its own thread); a
//! model call stops pulling its stream while more than `MAX_QUEUED` are on their way, and the
//! model server waits (TCP) instead of kin's memory.
//!
//! A turn that freed a lot asks for its memory to be handed back to the OS (`release_when_drained`):
//! the updates still queued hold their share of it, so that happens once the last is written.
//!
//! One process serves one stdio connection, so the count is process-wide; without the stdio
//! transport (`kin run`, tests in process) nothing is counted and nothing waits.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use tokio::sync::Notify;

/// The most `session/update`s queued for the client before model calls wait. Few: the stdout
/// pipe behind the SDK's queue (`transport`, 256 KiB) is what absorbs a burst, and each update
/// in the queue is a handful of small allocations, freed on another thread. A queue of 1,024 kept
/// that many in flight through a finely streamed turn, spread over the heap, and the freed chunks
/// glibc's per-thread caches hold afterwards pinned pages all over it: after a turn of a million
/// one-character deltas kin kept 2.9-3.1x the text; with 4, 1.5-1.8x (`kin bench --only memory`).
pub(crate) const MAX_QUEUED: usize = 4;

/// The updates on their way to the client.
pub(crate) struct Outflow {
    attached: AtomicBool,
    queued: AtomicUsize,
    drained: Notify,
    /// Free heap memory is handed back when the backlog next empties.
    release: AtomicBool,
}

static OUTFLOW: Outflow = Outflow::new(false);

/// The process's outflow.
pub(crate) fn outflow() -> &'static Outflow {
    &OUTFLOW
}

impl Outflow {
    const fn new(attached: bool) -> Outflow {
        Outflow {
            attached: AtomicBool::new(attached),
            queued: AtomicUsize::new(0),
            drained: Notify::const_new(),
            release: AtomicBool::new(false),
        }
    }

    /// The stdio transport counts what it writes from now on.
    pub(crate) fn attach(&self) {
        self.attached.store(true, Ordering::SeqCst);
    }

    /// Hands an update to the SDK through `send`, counted from before the hand-off: the writer
    /// may write it (and count it written) before `send` returns, and a count taken after would
    /// then never come back to zero (model calls would wait for a backlog that is gone, and the
    /// memory a turn freed would never be handed back). An update `send` refuses is not counted.
    pub(crate) fn send<E>(&self, send: impl FnOnce() -> Result<(), E>) -> Result<(), E> {
        let counted = self.attached.load(Ordering::Relaxed);
        if counted {
            self.queued.fetch_add(1, Ordering::SeqCst);
        }
        let sent = send();
        if sent.is_err() && counted {
            self.written();
        }
        sent
    }

    /// An update's line was written to the client.
    pub(crate) fn written(&self) {
        let before = self.queued.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        if before == Ok(MAX_QUEUED + 1) {
            self.drained.notify_waiters();
        }
        if before == Ok(1) {
            self.release_if_due();
        }
    }

    /// Hands free heap memory back to the OS now if nothing is queued, else once the backlog
    /// empties (see `heap`).
    pub(crate) fn release_when_drained(&self) {
        self.release.store(true, Ordering::SeqCst);
        if self.backlog() == 0 {
            self.release_if_due();
        }
    }

    fn release_if_due(&self) {
        if self.release.swap(false, Ordering::SeqCst) {
            crate::heap::release_freed();
        }
    }

    /// How many updates are on their way.
    pub(crate) fn backlog(&self) -> usize {
        self.queued.load(Ordering::SeqCst)
    }

    /// Returns once at most `MAX_QUEUED` updates are on their way.
    pub(crate) async fn room(&self) {
        loop {
            let drained = self.drained.notified();
            tokio::pin!(drained);
            drained.as_mut().enable();
            if self.backlog() <= MAX_QUEUED {
                return;
            }
            drained.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_call_waits_while_the_backlog_is_over_the_cap_and_goes_on_as_it_drains() {
        let flow = Outflow::new(true);
        for _ in 0..MAX_QUEUED + 2 {
            flow.send(|| Ok::<_, ()>(())).unwrap();
        }
        let waiting = flow.room();
        tokio::pin!(waiting);
        assert!(futures::poll!(waiting.as_mut()).is_pending(), "over the cap");
        flow.written();
        assert!(futures::poll!(waiting.as_mut()).is_pending(), "still one over");
        flow.written();
        assert!(futures::poll!(waiting.as_mut()).is_ready(), "at the cap");
        // Nothing counted before attaching, and a stray write never underflows.
        let idle = Outflow::new(false);
        idle.send(|| Ok::<_, ()>(())).unwrap();
        idle.written();
        assert_eq!(idle.backlog(), 0);
    }

    #[test]
    fn an_update_written_before_its_hand_off_returns_leaves_no_backlog() {
        let flow = Outflow::new(true);
        // The writer (another thread) writes the line while the hand-off is still returning.
        flow.send(|| {
            flow.written();
            Ok::<_, ()>(())
        })
        .unwrap();
        assert_eq!(flow.backlog(), 0, "counted before it was handed off");
        // A refused hand-off is not on its way.
        assert_eq!(flow.send(|| Err("closed")), Err("closed"));
        assert_eq!(flow.backlog(), 0);
        flow.release_when_drained();
        assert!(!flow.release.load(Ordering::SeqCst), "the backlog is empty: released at once");
    }

    #[test]
    fn a_release_waits_for_the_backlog_to_empty() {
        let flow = Outflow::new(true);
        flow.send(|| Ok::<_, ()>(())).unwrap();
        flow.send(|| Ok::<_, ()>(())).unwrap();
        flow.release_when_drained();
        flow.written();
        assert!(flow.release.load(Ordering::SeqCst), "one update is still queued");
        flow.written();
        assert!(!flow.release.load(Ordering::SeqCst), "released as the last was written");
        flow.release_when_drained();
        assert!(!flow.release.load(Ordering::SeqCst), "nothing queued: released at once");
    }
}
