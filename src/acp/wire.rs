//! The line transport of kin's ACP client connections (`peer`): newline-delimited JSON-RPC over a
//! process's pipes, between the process and the SDK's connection, which sees it as a `Channel`
//! of frames.
//!
//! - Every line read is capped (`max_frame`): a longer one ends the connection instead of
//!   growing a buffer. Each line is shown to the tap (the scenario runner's transcript) before
//!   anything else sees it, then parsed once; a line that is not JSON-RPC ends the connection
//!   or, for a tapped kin under test, is passed over.
//! - The SDK names its requests with UUIDs; on the wire they are numbered 1, 2, 3 as kin's
//!   client always numbered them (agents and scripts that expect numbers keep working), and the
//!   answers are renamed back.
//! - Lines kin sends itself (notifications, raw lines of a scenario) and the end of stdin go
//!   through one queue, so a `session/cancel` is on the wire before stdin closes.
//! - The reader runs at most `MAX_AHEAD` frames and `max_frame` bytes ahead of the SDK's
//!   dispatch loop (`Flow`): the SDK's queues are unbounded, so without this a flooding process would fill
//!   them faster than the handlers drain them. Answers to no request of kin's are dropped here
//!   (the SDK would ignore them).
//! - The process's requests are read only while fewer than `MAX_UNWRITTEN_ANSWERS` of kin's
//!   answers to it wait to be written (`answers`): the SDK queues answers without bound, so a
//!   process that floods requests and never reads its stdin would grow that queue; instead it
//!   stops being read until it reads (each answer is itself bounded, a served file by its cap).
//! - Why the connection broke is kept, in words completing "the child agent …".

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use agent_client_protocol::{Channel, RawJsonRpcId, RawJsonRpcMessage, RawJsonRpcResponse, TransportFrame};
use futures::StreamExt;
use futures::channel::mpsc::{UnboundedReceiver, UnboundedSender};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Sees every line the process writes, as read.
pub(crate) type Tap = Arc<dyn Fn(&str) + Send + Sync>;

/// How a connection reads.
#[derive(Clone)]
pub(crate) struct WireOptions {
    /// The longest line (frame) read, in bytes.
    pub(crate) max_frame: usize,
    pub(crate) tap: Option<Tap>,
    /// Whether a line that is not JSON-RPC ends the connection (else it is passed over).
    pub(crate) strict: bool,
    /// The next wire number of kin's requests (shared by successive connections of one
    /// conversation, such as a scenario across restarts).
    pub(crate) numbering: Arc<AtomicI64>,
}

/// Numbering from 1.
pub(crate) fn numbering() -> Arc<AtomicI64> {
    Arc::new(AtomicI64::new(1))
}

/// What kin writes itself, in order.
enum Out {
    Line(String, oneshot::Sender<std::io::Result<()>>),
    Close(oneshot::Sender<()>),
}

#[derive(Default)]
struct Shared {
    /// Wire number → the SDK's id of each request still unanswered.
    pending: HashMap<i64, RawJsonRpcId>,
    broken: Option<Broken>,
}

/// Why a connection broke.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Broken {
    /// Completes "the child agent …".
    pub(crate) reason: String,
    /// The process broke the protocol (a line that is not JSON-RPC, too long, not UTF-8), as
    /// opposed to ending the connection (closing its stdout, its stdin failing).
    pub(crate) violation: bool,
}

fn lock(shared: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Records that the connection ended (the first reason wins).
fn break_with(shared: &Mutex<Shared>, reason: String) {
    lock(shared).broken.get_or_insert(Broken { reason, violation: false });
}

/// Records that the process broke the protocol (the first reason wins).
fn violated(shared: &Mutex<Shared>, reason: String) {
    lock(shared).broken.get_or_insert(Broken { reason, violation: true });
}

/// Frames the reader may pass to the SDK ahead of its dispatch loop.
const MAX_AHEAD: usize = 64;

/// Requests of the process the reader may pass on while kin's answers to them are not written
/// to the process yet.
const MAX_UNWRITTEN_ANSWERS: usize = 16;

/// The frames the reader passed to the SDK that its dispatch loop has not reached yet, bounded
/// in number and bytes: the reader waits for room before passing a frame on, and the first
/// handler of the connection (`peer`) frees each frame's room as its dispatch starts, in order.
pub(crate) struct Flow {
    frames: Semaphore,
    bytes: Semaphore,
    budget: usize,
    sizes: Mutex<VecDeque<u32>>,
}

impl Flow {
    fn new(budget: usize) -> Self {
        let budget = budget.clamp(1, u32::MAX as usize);
        Flow {
            frames: Semaphore::new(MAX_AHEAD),
            bytes: Semaphore::new(budget),
            budget,
            sizes: Mutex::new(VecDeque::new()),
        }
    }

    /// Waits until a frame of `size` bytes fits.
    async fn admit(&self, size: usize) {
        // A frame larger than the budget (it cannot be: frames are capped at it) takes it all.
        let size = u32::try_from(size.clamp(1, self.budget)).unwrap_or(u32::MAX);
        let (Ok(frame), Ok(bytes)) = (self.frames.acquire().await, self.bytes.acquire_many(size).await) else {
            return;
        };
        frame.forget();
        bytes.forget();
        self.sizes.lock().unwrap_or_else(PoisonError::into_inner).push_back(size);
    }

    /// Frames passed on whose dispatch has not started.
    #[cfg(test)]
    pub(crate) fn queued(&self) -> usize {
        self.sizes.lock().unwrap_or_else(PoisonError::into_inner).len()
    }

    /// The dispatch of the oldest frame passed on started: its room is free again.
    pub(crate) fn dispatched(&self) {
        if let Some(size) = self.sizes.lock().unwrap_or_else(PoisonError::into_inner).pop_front() {
            self.frames.add_permits(1);
            self.bytes.add_permits(size as usize);
        }
    }
}

/// The kin side of one connection's transport; dropping it stops reading and writing.
pub(crate) struct Wire {
    out: mpsc::UnboundedSender<Out>,
    shared: Arc<Mutex<Shared>>,
    /// Cancelled when the reader stopped (end of output, a broken protocol, or `stop`).
    read_done: CancellationToken,
    flow: Arc<Flow>,
    reader: JoinHandle<()>,
    writer: JoinHandle<()>,
}

impl Wire {
    /// Starts the reader and writer over `input` (the process's stdin) and `output` (its
    /// stdout); returns the SDK's end of the transport too.
    pub(crate) fn open<W, R>(input: W, output: R, options: WireOptions) -> (Channel, Wire)
    where
        W: AsyncWrite + Unpin + Send + 'static,
        R: AsyncRead + Unpin + Send + 'static,
    {
        let (sdk, ours) = Channel::duplex();
        let Channel { rx: from_sdk, tx: to_sdk, .. } = ours;
        let shared = Arc::new(Mutex::new(Shared::default()));
        let stop = CancellationToken::new();
        let (out, queue) = mpsc::unbounded_channel();
        let read_done = CancellationToken::new();
        let numbering = options.numbering.clone();
        let flow = Arc::new(Flow::new(options.max_frame));
        let answers = Arc::new(Semaphore::new(MAX_UNWRITTEN_ANSWERS));
        let reading = read(output, to_sdk, shared.clone(), flow.clone(), answers.clone(), options, stop.clone());
        let done = read_done.clone();
        let reader = tokio::spawn(async move {
            reading.await;
            done.cancel();
        });
        let writer = tokio::spawn(write(input, from_sdk, queue, shared.clone(), answers, numbering, stop));
        (sdk, Wire { out, shared, read_done, flow, reader, writer })
    }

    /// Writes `line` after what kin queued before; waits until it is written.
    pub(crate) async fn send_line(&self, line: String) -> std::io::Result<()> {
        let (done, written) = oneshot::channel();
        if self.out.send(Out::Line(line, done)).is_err() {
            return Err(std::io::ErrorKind::BrokenPipe.into());
        }
        written.await.unwrap_or_else(|_| Err(std::io::ErrorKind::BrokenPipe.into()))
    }

    /// Closes the process's stdin after what kin queued before; waits until it is closed.
    pub(crate) async fn close(&self) {
        let (done, closed) = oneshot::channel();
        if self.out.send(Out::Close(done)).is_ok() {
            let _ = closed.await;
        }
    }

    /// The room of frames between the reader and the SDK's dispatch.
    pub(crate) fn flow(&self) -> Arc<Flow> {
        self.flow.clone()
    }

    /// Resolves once every line the process wrote was read (or reading stopped).
    pub(crate) async fn read_ended(&self) {
        self.read_done.cancelled().await;
    }

    /// Fires once every line the process wrote was read (or reading stopped): its output ended.
    pub(crate) fn output_ended(&self) -> CancellationToken {
        self.read_done.clone()
    }

    /// Why the connection broke, if it did.
    pub(crate) fn broken(&self) -> Option<Broken> {
        lock(&self.shared).broken.clone()
    }
}

impl Drop for Wire {
    fn drop(&mut self) {
        self.reader.abort();
        self.writer.abort();
    }
}

/// Why a line could not be read.
enum LineError {
    TooLong,
    Io(std::io::Error),
}

/// The next line without its end (`\n` or `\r\n`), at most `max` bytes; `None` at the end of
/// the stream. A longer line is an error, read no further than `max` bytes.
async fn read_line<R: AsyncBufRead + Unpin>(reader: &mut R, max: usize) -> Result<Option<Vec<u8>>, LineError> {
    let mut line = Vec::new();
    loop {
        let buf = reader.fill_buf().await.map_err(LineError::Io)?;
        if buf.is_empty() {
            return Ok((!line.is_empty()).then_some(line));
        }
        let (take, end) = match buf.iter().position(|b| *b == b'\n') {
            Some(at) => (at, true),
            None => (buf.len(), false),
        };
        if line.len() + take > max {
            return Err(LineError::TooLong);
        }
        line.extend_from_slice(&buf[..take]);
        reader.consume(take + usize::from(end));
        if end {
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            return Ok(Some(line));
        }
    }
}

/// Reads the process's stdout into the SDK until it ends, breaks the protocol or `stop`; a
/// request waits for one of `answers` (given back when its answer is written).
async fn read<R: AsyncRead + Unpin>(
    output: R,
    to_sdk: UnboundedSender<TransportFrame>,
    shared: Arc<Mutex<Shared>>,
    flow: Arc<Flow>,
    answers: Arc<Semaphore>,
    options: WireOptions,
    stop: CancellationToken,
) {
    let mut reader = BufReader::new(output);
    loop {
        let next = tokio::select! {
            next = read_line(&mut reader, options.max_frame) => next,
            () = stop.cancelled() => break,
        };
        let bytes = match next {
            Ok(Some(bytes)) => bytes,
            Ok(None) => {
                break_with(&shared, "closed its stdout".into());
                break;
            }
            Err(LineError::TooLong) => {
                let max = options.max_frame;
                violated(&shared, format!("wrote a line longer than {max} bytes, the most kin reads as one frame"));
                break;
            }
            Err(LineError::Io(e)) => {
                violated(&shared, format!("wrote unreadable output ({e})"));
                break;
            }
        };
        let Ok(line) = String::from_utf8(bytes) else {
            violated(&shared, "wrote unreadable output (a line that is not UTF-8)".into());
            break;
        };
        if let Some(tap) = &options.tap {
            tap(&line);
        }
        if line.trim().is_empty() {
            continue;
        }
        let message = match serde_json::from_str::<RawJsonRpcMessage>(&line) {
            Ok(message) => message,
            Err(_) if options.strict => {
                violated(&shared, format!("wrote a line that is not JSON-RPC: {}", excerpt(&line)));
                break;
            }
            Err(_) => continue,
        };
        let size = line.len();
        drop(line);
        let Some(message) = answer_renamed(&shared, message) else {
            tracing::debug!("dropping an answer to no request of kin's");
            continue;
        };
        if matches!(message, RawJsonRpcMessage::Request(_)) {
            tokio::select! {
                permit = answers.acquire() => match permit {
                    Ok(permit) => permit.forget(),
                    Err(_) => break,
                },
                () = stop.cancelled() => break,
            }
        }
        tokio::select! {
            () = flow.admit(size) => {}
            () = stop.cancelled() => break,
        }
        if to_sdk.unbounded_send(TransportFrame::Single(message)).is_err() {
            break;
        }
    }
    // Dropping `to_sdk` tells the SDK its input ended: requests still waiting fail.
}

/// An answer to one of kin's numbered requests with the SDK's id back; `None` for an answer to
/// no request of kin's. Requests and notifications pass as they are.
fn answer_renamed(shared: &Mutex<Shared>, message: RawJsonRpcMessage) -> Option<RawJsonRpcMessage> {
    let RawJsonRpcMessage::Response(response) = message else {
        return Some(message);
    };
    let original = match response.id() {
        RawJsonRpcId::Number(n) => lock(shared).pending.remove(n),
        RawJsonRpcId::Null | RawJsonRpcId::Str(_) => None,
    }?;
    let response = match response {
        RawJsonRpcResponse::Result { result, .. } => RawJsonRpcResponse::Result { id: original, result },
        RawJsonRpcResponse::Error { error, .. } => RawJsonRpcResponse::Error { id: original, error },
    };
    Some(RawJsonRpcMessage::Response(response))
}

/// A request of the SDK numbered for the wire.
fn request_numbered(shared: &Mutex<Shared>, numbering: &AtomicI64, message: RawJsonRpcMessage) -> RawJsonRpcMessage {
    let RawJsonRpcMessage::Request(mut request) = message else {
        return message;
    };
    let number = numbering.fetch_add(1, Ordering::Relaxed);
    lock(shared).pending.insert(number, std::mem::replace(&mut request.id, RawJsonRpcId::Number(number)));
    RawJsonRpcMessage::Request(request)
}

/// Writes the SDK's frames and kin's own lines to the process's stdin until both end; a failed
/// write breaks the connection (and stops the reader, so waiting requests fail). Each answer
/// written (or dropped) gives its request's room back to `answers`.
async fn write<W: AsyncWrite + Unpin>(
    input: W,
    mut from_sdk: UnboundedReceiver<TransportFrame>,
    mut queue: mpsc::UnboundedReceiver<Out>,
    shared: Arc<Mutex<Shared>>,
    answers: Arc<Semaphore>,
    numbering: Arc<AtomicI64>,
    stop: CancellationToken,
) {
    let mut input = Some(input);
    let mut sdk_open = true;
    loop {
        let mut answer = false;
        let line = tokio::select! {
            frame = from_sdk.next(), if sdk_open => match frame {
                Some(TransportFrame::Single(message)) => {
                    answer = matches!(message, RawJsonRpcMessage::Response(_));
                    match serde_json::to_string(&request_numbered(&shared, &numbering, message)) {
                        Ok(line) => Some((line, None)),
                        Err(e) => {
                            tracing::debug!("dropping a frame that does not serialize: {e}");
                            None
                        }
                    }
                }
                Some(other) => other.to_json().ok().map(|line| (line, None)),
                None => {
                    // The SDK's connection ended: so does the process's input.
                    sdk_open = false;
                    input = None;
                    None
                }
            },
            out = queue.recv() => match out {
                Some(Out::Line(line, done)) => Some((line, Some(done))),
                Some(Out::Close(done)) => {
                    input = None;
                    let _ = done.send(());
                    None
                }
                None => break,
            },
        };
        let Some((line, done)) = line else {
            if answer {
                answers.add_permits(1);
            }
            continue;
        };
        let written = match input.as_mut() {
            Some(stdin) => write_line(stdin, &line).await,
            None => Err(std::io::Error::new(std::io::ErrorKind::BrokenPipe, "stdin is closed")),
        };
        if answer {
            answers.add_permits(1);
        }
        if let Err(e) = &written
            && input.is_some()
        {
            break_with(&shared, format!("could not be written to ({e})"));
            input = None;
            stop.cancel();
        }
        match done {
            Some(done) => {
                let _ = done.send(written);
            }
            None if written.is_err() => tracing::debug!("a frame to a closed stdin is dropped"),
            None => {}
        }
    }
}

async fn write_line<W: AsyncWrite + Unpin>(input: &mut W, line: &str) -> std::io::Result<()> {
    input.write_all(line.as_bytes()).await?;
    input.write_all(b"\n").await?;
    input.flush().await
}

/// The start of `text`, quoted, for error messages.
pub(crate) fn excerpt(text: &str) -> String {
    const MAX: usize = 200;
    let mut cut: String = text.chars().take(MAX).collect();
    if text.chars().nth(MAX).is_some() {
        cut.push('…');
    }
    format!("{cut:?}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn lines_are_capped_and_split_on_newlines() {
        let data: &[u8] = b"one\r\ntwo\n\nlast";
        let mut reader = BufReader::with_capacity(3, data);
        let mut lines = Vec::new();
        while let Ok(Some(line)) = read_line(&mut reader, 4).await {
            lines.push(String::from_utf8(line).unwrap());
        }
        assert_eq!(lines, ["one", "two", "", "last"]);
        let long: &[u8] = b"12345\n";
        assert!(matches!(read_line(&mut BufReader::new(long), 4).await, Err(LineError::TooLong)));
        assert!(matches!(read_line(&mut BufReader::new(long), 5).await, Ok(Some(_))));
    }

    #[test]
    fn requests_are_numbered_and_their_answers_renamed_back() {
        let shared = Mutex::new(Shared::default());
        let sdk_id = RawJsonRpcId::Str("uuid-a".into());
        let request = RawJsonRpcMessage::request("m".into(), serde_json::json!({}), sdk_id.clone()).unwrap();
        let wire = serde_json::to_value(request_numbered(&shared, &numbering(), request)).unwrap();
        assert_eq!(wire["id"], 1);
        let answer: RawJsonRpcMessage =
            serde_json::from_str(r#"{"jsonrpc":"2.0","id":1,"result":{"ok":true}}"#).unwrap();
        let Some(RawJsonRpcMessage::Response(back)) = answer_renamed(&shared, answer) else { panic!("a response") };
        assert_eq!(back.id(), &sdk_id);
        // A second answer to the same number answers no request.
        let stray: RawJsonRpcMessage = serde_json::from_str(r#"{"jsonrpc":"2.0","id":1,"result":null}"#).unwrap();
        assert_eq!(answer_renamed(&shared, stray), None);
    }

    /// A process that floods requests and does not read its stdin is itself not read past
    /// `MAX_UNWRITTEN_ANSWERS` unwritten answers (the SDK would queue them without bound); once
    /// it reads, every request is answered. The clock is paused: a sleep returns only once every
    /// task waits, so what was read by then is all that can be.
    #[tokio::test(start_paused = true)]
    async fn a_process_that_does_not_read_its_answers_is_not_read_further() {
        use std::sync::atomic::AtomicUsize;
        use tokio::io::AsyncWriteExt;
        const REQUESTS: usize = 1000;
        let (kin_stdin, child_stdin) = tokio::io::duplex(256);
        let (mut child_stdout, kin_stdout) = tokio::io::duplex(4096);
        let options = WireOptions { max_frame: 1 << 20, tap: None, strict: true, numbering: numbering() };
        let (sdk, wire) = Wire::open(kin_stdin, kin_stdout, options);
        // The SDK's side: answers every request at once.
        let Channel { rx: mut requests, tx: replies, .. } = sdk;
        let (flow, taken) = (wire.flow(), Arc::new(AtomicUsize::new(0)));
        let seen = taken.clone();
        tokio::spawn(async move {
            while let Some(frame) = requests.next().await {
                flow.dispatched();
                seen.fetch_add(1, Ordering::SeqCst);
                if let TransportFrame::Single(RawJsonRpcMessage::Request(request)) = frame {
                    let answer =
                        RawJsonRpcMessage::response(request.id, Ok(serde_json::json!({"content": "x".repeat(200)})));
                    let _ = replies.unbounded_send(TransportFrame::Single(answer));
                }
            }
        });
        let flood = tokio::spawn(async move {
            for id in 0..REQUESTS {
                let line =
                    format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"fs/read_text_file\",\"params\":{{}}}}\n");
                child_stdout.write_all(line.as_bytes()).await.unwrap();
            }
            child_stdout
        });
        tokio::time::sleep(std::time::Duration::from_secs(60)).await;
        let read = taken.load(Ordering::SeqCst);
        // Those whose answers are written (as much as the pipe takes), the one being written and
        // MAX_UNWRITTEN_ANSWERS more.
        assert!(read < 40, "{read} requests read from a process that reads no answer");
        assert!(!flood.is_finished(), "the process is held up writing its requests");
        let mut lines = tokio::io::BufReader::new(child_stdin).lines();
        let mut answered = 0;
        while answered < REQUESTS {
            let line = lines.next_line().await.unwrap().expect("an answer per request");
            assert!(line.contains("\"result\""), "{line}");
            answered += 1;
        }
        drop(flood.await.unwrap());
        assert_eq!(taken.load(Ordering::SeqCst), REQUESTS);
    }
}
