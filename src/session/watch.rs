//! kin's own writes of session logs, reported to what keeps derived state of them (issue 23: the
//! runtime's session query and its catalog index). A `LogWatch` is handed to a `SessionStore`
//! (`SessionStore::watched`); the store's writers report a log when its header is published,
//! after each `fsync`ed flush and when the writer closes, and the store reports the logs it
//! deletes. A report is a path pushed on a channel — no I/O on the writer's side, no `fsync`, no
//! work per appended event. One thread, started at the first report, takes the reports in
//! batches (what arrives within `BATCH` of the first) and hands each batch, each path once, to
//! the watcher's callback. A `nudge` starts a batch too, which runs the callback even with no
//! path: a listing that left derived state behind has it written after its answer, off the
//! answer's path (the batch's wait leaves the two cores to the answer's own writing). `settle`
//! waits until every report and nudge made so far has been handled (a fence for tests and for
//! shutdown).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How long the thread gathers more reports after the first one of a batch.
const BATCH: Duration = Duration::from_millis(250);

/// What the thread is handed.
enum Message {
    Changed(PathBuf),
    /// Run the handler at the end of a batch, with what is gathered or no path.
    Nudge,
    /// Handle what is gathered now, without waiting out the batch window.
    Flush,
}

type Handler = Box<dyn Fn(&[PathBuf]) + Send + Sync>;

/// Reports of changed logs, handled in batches on one thread.
pub struct LogWatch {
    handler: Arc<Handler>,
    /// The thread's channel, once it runs.
    sender: Mutex<Option<Sender<Message>>>,
    /// (reports made, reports handled), and its signal.
    progress: Arc<(Mutex<(u64, u64)>, Condvar)>,
}

impl std::fmt::Debug for LogWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (made, handled) = *lock(&self.progress.0);
        f.debug_struct("LogWatch").field("made", &made).field("handled", &handled).finish()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl LogWatch {
    /// A watch whose batches go to `handler` (each changed path once per batch, in path order).
    pub fn new(handler: impl Fn(&[PathBuf]) + Send + Sync + 'static) -> Arc<LogWatch> {
        Arc::new(LogWatch {
            handler: Arc::new(Box::new(handler)),
            sender: Mutex::new(None),
            progress: Arc::new((Mutex::new((0, 0)), Condvar::new())),
        })
    }

    /// The log at `path` was written, published, closed or removed by this process.
    pub fn changed(&self, path: &Path) {
        self.send(Message::Changed(path.to_path_buf()), true);
    }

    /// Has the handler run at the end of a batch, with no path if nothing was reported (counted,
    /// for `settle`).
    pub fn nudge(&self) {
        self.send(Message::Nudge, true);
    }

    /// Waits until every report made before this call has been handled.
    pub fn settle(&self) {
        let target = lock(&self.progress.0).0;
        self.send(Message::Flush, false);
        let (counts, signal) = &*self.progress;
        let mut counts = lock(counts);
        while counts.1 < target {
            counts = signal.wait(counts).unwrap_or_else(PoisonError::into_inner);
        }
    }

    fn send(&self, message: Message, counted: bool) {
        let mut sender = lock(&self.sender);
        if sender.is_none() {
            if !counted {
                return; // Nothing was ever reported.
            }
            let (tx, rx) = channel();
            let handler = self.handler.clone();
            let progress = self.progress.clone();
            let spawned =
                std::thread::Builder::new().name("kin-log-watch".into()).spawn(move || run(&rx, &handler, &progress));
            if let Err(e) = spawned {
                // Derived state only: without the thread the reports are dropped (a listing reads
                // the logs instead).
                tracing::warn!("cannot start the log watch thread: {e}");
                return;
            }
            *sender = Some(tx);
        }
        if counted {
            lock(&self.progress.0).0 += 1;
        }
        if let Some(tx) = sender.as_ref()
            && tx.send(message).is_err()
            && counted
        {
            let (counts, signal) = &*self.progress;
            lock(counts).1 += 1;
            signal.notify_all();
        }
    }
}

/// The thread: a batch is the first report and what follows within `BATCH` (or until a flush).
fn run(rx: &Receiver<Message>, handler: &Handler, progress: &(Mutex<(u64, u64)>, Condvar)) {
    while let Ok(first) = rx.recv() {
        let mut paths = BTreeSet::new();
        let (mut count, mut nudged) = (0u64, false);
        let mut take = |message: Message| match message {
            Message::Changed(path) => {
                paths.insert(path);
                count += 1;
                true
            }
            Message::Nudge => {
                nudged = true;
                count += 1;
                true
            }
            Message::Flush => false,
        };
        if take(first) {
            let deadline = Instant::now() + BATCH;
            loop {
                let left = deadline.saturating_duration_since(Instant::now());
                match rx.recv_timeout(left) {
                    Ok(message) => {
                        if !take(message) {
                            break;
                        }
                    }
                    Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => break,
                }
            }
        }
        // A flush also takes what is already queued.
        while let Ok(message) = rx.try_recv() {
            take(message);
        }
        if !paths.is_empty() || nudged {
            let paths: Vec<PathBuf> = paths.into_iter().collect();
            // A panicking handler loses its batch, not the thread (`settle` would wait forever).
            let handled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| handler(&paths)));
            if handled.is_err() {
                tracing::warn!("the log watch's handler panicked; {} reports dropped", paths.len());
            }
        }
        let (counts, signal) = progress;
        lock(counts).1 += count;
        signal.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_are_handled_in_batches_each_path_once_and_settle_fences_them() {
        let seen: Arc<Mutex<Vec<Vec<PathBuf>>>> = Arc::default();
        let into = seen.clone();
        let watch = LogWatch::new(move |paths| lock(&into).push(paths.to_vec()));
        watch.settle(); // Nothing reported: returns at once.
        assert!(lock(&seen).is_empty());
        for path in ["b", "a", "b"] {
            watch.changed(Path::new(path));
        }
        watch.settle();
        assert_eq!(*lock(&seen), vec![vec![PathBuf::from("a"), PathBuf::from("b")]]);
        watch.changed(Path::new("c"));
        watch.settle();
        assert_eq!(lock(&seen).len(), 2);
        assert_eq!(lock(&seen)[1], vec![PathBuf::from("c")]);
        // A nudge runs the handler with no path; `settle` waits for it.
        watch.nudge();
        watch.settle();
        assert_eq!(lock(&seen).len(), 3);
        assert!(lock(&seen)[2].is_empty());
    }
}
