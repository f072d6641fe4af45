//! kin's stdio transport: newline-delimited JSON-RPC frames, each at most `max_frame_bytes` long
//! (`--max-frame-bytes`, `max_frame_bytes`; default 64 MiB, room for prompts with pasted files
//! and images). It replaces the SDK's `Stdio`, which reads a line whole however long it is.
//!
//! After an `initialize` request, the input is held back until its response is written
//! ([`InitGate`]): the SDK refuses any request that reaches it while initialization is under way,
//! so a client that writes its first requests without waiting for the answer (a script piping
//! them in) would otherwise have them refused; held back, they are served in order.
//!
//! A longer frame is never held: its first `ID_PREFIX_BYTES` are kept to recover the id cheaply,
//! the rest is read and dropped. A request (or anything that is not a response) is answered with
//! a JSON-RPC error (-32600, with the id if the prefix holds it, else null) written here, between
//! the SDK's lines; an oversize *response* to one of kin's own requests reaches the SDK as an
//! error response for that id, so the request fails instead of waiting forever. A frame that is
//! not UTF-8 is answered the same way with -32700. Either way kin keeps serving.
//!
//! Lines go out through a pipe of `PIPE_BYTES` to a blocking thread that writes them to stdout
//! as they come, and are not flushed one by one: a flush of the `blocking` crate's writer stops
//! that thread and drops its pipe, so the next line started a new one (a 256 KiB buffer and a
//! thread hand-off per line, most of the cost of a finely streamed turn). [`Output::flush`]
//! drains the pipe once, when kin is done serving.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use agent_client_protocol::Lines;
use futures::io::{AsyncBufRead, AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use futures::lock::Mutex;
use futures::{Sink, Stream};
use serde::de::{IgnoredAny, MapAccess, Visitor};
use serde_json::{Value, json};

/// The default maximum frame size.
pub(crate) const DEFAULT_MAX_FRAME_BYTES: usize = 64 * 1024 * 1024;
/// The smallest maximum frame size accepted (an `initialize` must fit).
pub(crate) const MIN_MAX_FRAME_BYTES: usize = 64 * 1024;
/// The buffer between kin's async side and the blocking reads of stdin and writes of stdout.
const PIPE_BYTES: usize = 256 * 1024;
/// Bytes of an oversize frame kept to recover its id.
const ID_PREFIX_BYTES: usize = 64 * 1024;
/// The longest the input waits for the response to an `initialize` request (`InitGate`): a
/// safety net only, as every request is answered.
const INIT_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

type Writer = Arc<Mutex<Pin<Box<dyn AsyncWrite + Send>>>>;

/// The SDK transport over kin's stdin and stdout, and kin's output to drain when it is done.
pub(crate) fn stdio(
    max_frame_bytes: usize,
) -> (Lines<impl Sink<String, Error = std::io::Error> + Send, impl Stream<Item = std::io::Result<String>> + Send>, Output)
{
    // The client's pace bounds what model calls produce (`outflow`).
    crate::outflow::outflow().attach();
    // The blocking crate's default pipes hold 8 MiB each, all of it touched once a stream has
    // filled them (RSS kept for the life of the process); lines are framed here anyway.
    let (stdin, stdout) = (
        blocking::Unblock::with_capacity(PIPE_BYTES, std::io::stdin()),
        blocking::Unblock::with_capacity(PIPE_BYTES, std::io::stdout()),
    );
    framed(stdin, stdout, max_frame_bytes)
}

/// The transport over any byte streams: frames of `input` (each at most `max_frame_bytes`) in,
/// lines to `output` out (unflushed: see [`Output`]); the answers to refused frames are written to
/// `output` too, never in the middle of another line.
pub(crate) fn framed(
    input: impl AsyncRead + Send + 'static,
    output: impl AsyncWrite + Send + 'static,
    max_frame_bytes: usize,
) -> (Lines<impl Sink<String, Error = std::io::Error> + Send, impl Stream<Item = std::io::Result<String>> + Send>, Output)
{
    let writer: Writer = Arc::new(Mutex::new(Box::pin(output)));
    let gate = Arc::new(InitGate::default());
    let sent = (writer.clone(), gate.clone());
    let outgoing = futures::sink::unfold(sent, |(writer, gate): (Writer, Arc<InitGate>), line: String| async move {
        let update = is_session_update(&line);
        let answered = gate.answers_initialize(&line);
        write_line(&writer, line).await?;
        if answered {
            gate.open();
        }
        if update {
            crate::outflow::outflow().written();
        }
        Ok::<_, std::io::Error>((writer, gate))
    });
    (Lines::new(outgoing, incoming(input, writer.clone(), gate, max_frame_bytes)), Output(writer))
}

/// The transport's output, written line by line and never flushed until [`Output::flush`].
pub(crate) struct Output(Writer);

impl Output {
    /// How long kin waits at exit for its last lines to reach a client that stopped reading.
    const DRAIN: std::time::Duration = std::time::Duration::from_secs(5);

    /// Writes out whatever is still on its way (waiting at most `DRAIN`).
    pub(crate) async fn flush(&self) {
        let flushed = async { self.0.lock().await.flush().await };
        match tokio::time::timeout(Self::DRAIN, flushed).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!("cannot write kin's last output: {e}"),
            Err(_) => tracing::warn!("the client did not read kin's last output within {:?}", Self::DRAIN),
        }
    }
}

/// Whether an outgoing line is a `session/update` notification (what `outflow` counts): the
/// SDK writes `jsonrpc` and `method` first.
fn is_session_update(line: &str) -> bool {
    const METHOD: &[u8] = b"\"method\":\"session/update\"";
    let head = &line.as_bytes()[..line.len().min(64)];
    head.windows(METHOD.len()).any(|w| w == METHOD)
}

/// Holds the input back from an `initialize` request until its response is written (see the
/// module comment): the response with its id, or an error with a null id (the SDK answers so a
/// frame it cannot read as a request, whatever id it had), and at most for `INIT_WAIT`. Only the
/// lines before the first such response are looked at.
#[derive(Default)]
struct InitGate {
    /// The id of the `initialize` request whose response is awaited.
    awaiting: std::sync::Mutex<Option<Value>>,
    /// A response to `initialize` was written: no line is looked at any more.
    done: AtomicBool,
    opened: tokio::sync::Notify,
}

impl InitGate {
    fn awaiting(&self) -> std::sync::MutexGuard<'_, Option<Value>> {
        self.awaiting.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// An incoming line on its way to the SDK: an `initialize` request closes the gate behind it.
    fn saw(&self, line: &str) {
        if self.done.load(Ordering::Acquire) {
            return;
        }
        let shape = Shape::of(&line.as_bytes()[..line.len().min(ID_PREFIX_BYTES)]);
        if shape.initialize && !shape.id().is_null() {
            *self.awaiting() = Some(shape.id());
        }
    }

    /// Whether an outgoing line is the response to the awaited `initialize` request.
    fn answers_initialize(&self, line: &str) -> bool {
        if self.done.load(Ordering::Acquire) {
            return false;
        }
        let awaiting = self.awaiting();
        let Some(id) = awaiting.as_ref() else { return false };
        let shape = Shape::of(&line.as_bytes()[..line.len().min(ID_PREFIX_BYTES)]);
        shape.result_or_error && !shape.method && (shape.id() == *id || shape.id().is_null())
    }

    /// The response to `initialize` is written: the input goes on.
    fn open(&self) {
        *self.awaiting() = None;
        self.done.store(true, Ordering::Release);
        self.opened.notify_waiters();
    }

    /// Waits while the response to an `initialize` request is awaited (at most `INIT_WAIT`).
    async fn pass(&self) {
        if self.awaiting().is_none() {
            return;
        }
        let waited = async {
            loop {
                // Made before the check, so an `open` between the two is not missed.
                let opened = self.opened.notified();
                if self.awaiting().is_none() {
                    return;
                }
                opened.await;
            }
        };
        if tokio::time::timeout(INIT_WAIT, waited).await.is_err() {
            tracing::warn!("no response to initialize within {INIT_WAIT:?}; reading the next requests anyway");
            self.open();
        }
    }
}

/// The frames of `input` for the SDK, none read while `gate` holds them back; refused ones are
/// answered on `writer` (or, for responses to kin's own requests, handed on as an error response).
fn incoming(
    input: impl AsyncRead + Send + 'static,
    writer: Writer,
    gate: Arc<InitGate>,
    max_frame_bytes: usize,
) -> impl Stream<Item = std::io::Result<String>> + Send {
    let reader = Box::pin(BufReader::with_capacity(64 * 1024, input));
    futures::stream::unfold((reader, writer, gate), move |(mut reader, writer, gate)| async move {
        loop {
            gate.pass().await;
            let frame = match next_frame(&mut reader, max_frame_bytes).await {
                Ok(Some(frame)) => frame,
                Ok(None) => return None,
                Err(e) => return Some((Err(e), (reader, writer, gate))),
            };
            let refused = match frame {
                Frame::Line(line) => {
                    gate.saw(&line);
                    return Some((Ok(line), (reader, writer, gate)));
                }
                Frame::Oversize { bytes, prefix } => Refused::oversize(bytes, max_frame_bytes, &prefix),
                Frame::NotUtf8 { prefix } => Refused::not_utf8(&prefix),
            };
            tracing::warn!(code = refused.code, id = %refused.id, "refused an incoming frame: {}", refused.message);
            if refused.answer {
                // A response to a request of kin's: the SDK fails that request with the error.
                return Some((Ok(refused.line()), (reader, writer, gate)));
            }
            if let Err(e) = write_line(&writer, refused.line()).await {
                return Some((Err(e), (reader, writer, gate)));
            }
        }
    })
}

async fn write_line(writer: &Writer, line: String) -> std::io::Result<()> {
    let mut bytes = line.into_bytes();
    bytes.push(b'\n');
    writer.lock().await.write_all(&bytes).await
}

/// One frame read from the input.
#[derive(Debug, PartialEq)]
enum Frame {
    /// A frame within the limit, without its line ending.
    Line(String),
    /// A frame of `bytes` bytes, more than the limit; `prefix` is its start.
    Oversize { bytes: u64, prefix: Vec<u8> },
    /// A frame within the limit that is not UTF-8; `prefix` is its start.
    NotUtf8 { prefix: Vec<u8> },
}

/// Reads one newline-terminated frame, holding at most `max` bytes of it; `None` at the end of
/// the input.
async fn next_frame<R: AsyncBufRead + Unpin>(reader: &mut R, max: usize) -> std::io::Result<Option<Frame>> {
    let mut buf = Vec::new();
    let mut bytes = 0u64;
    let mut oversize = false;
    loop {
        let available = reader.fill_buf().await?;
        if available.is_empty() {
            if bytes == 0 {
                return Ok(None);
            }
            break;
        }
        let newline = available.iter().position(|&b| b == b'\n');
        let part = &available[..newline.unwrap_or(available.len())];
        if !oversize && buf.len() + part.len() > max {
            oversize = true;
            let room = ID_PREFIX_BYTES.saturating_sub(buf.len()).min(part.len());
            buf.extend_from_slice(&part[..room]);
            buf.truncate(ID_PREFIX_BYTES);
            buf.shrink_to_fit();
        } else if !oversize {
            buf.extend_from_slice(part);
        }
        bytes += part.len() as u64;
        let used = newline.map_or(available.len(), |end| end + 1);
        reader.consume_unpin(used);
        if newline.is_some() {
            break;
        }
    }
    if oversize {
        return Ok(Some(Frame::Oversize { bytes, prefix: buf }));
    }
    if buf.last() == Some(&b'\r') {
        buf.pop();
    }
    match String::from_utf8(buf) {
        Ok(line) => Ok(Some(Frame::Line(line))),
        Err(e) => {
            let mut prefix = e.into_bytes();
            prefix.truncate(ID_PREFIX_BYTES);
            Ok(Some(Frame::NotUtf8 { prefix }))
        }
    }
}

/// The answer to a frame kin refused.
struct Refused {
    id: Value,
    code: i64,
    message: String,
    data: Value,
    /// The frame was a response (to a request of kin's), not a request.
    answer: bool,
}

impl Refused {
    fn oversize(bytes: u64, max: usize, prefix: &[u8]) -> Self {
        let shape = Shape::of(prefix);
        Refused {
            answer: shape.is_response(),
            id: shape.id(),
            code: -32600,
            message: format!(
                "Invalid request: the frame is {bytes} bytes, more than kin's maximum frame size of {max} \
                 bytes, and was discarded; send less (a smaller prompt or file), or raise the limit with \
                 --max-frame-bytes or max_frame_bytes in the config file"
            ),
            data: json!({"frameBytes": bytes, "maxFrameBytes": max}),
        }
    }

    fn not_utf8(prefix: &[u8]) -> Self {
        let shape = Shape::of(prefix);
        Refused {
            answer: shape.is_response(),
            id: shape.id(),
            code: -32700,
            message: "Parse error: the frame is not valid UTF-8; JSON-RPC frames must be UTF-8 JSON".into(),
            data: Value::Null,
        }
    }

    fn line(&self) -> String {
        let mut error = json!({"code": self.code, "message": self.message});
        if !self.data.is_null() {
            error["data"] = self.data.clone();
        }
        json!({"jsonrpc": "2.0", "id": self.id, "error": error}).to_string()
    }
}

/// What the start of a frame says about it: the top-level keys seen before the start ends.
#[derive(Debug, Default, PartialEq)]
struct Shape {
    id: Option<Value>,
    method: bool,
    /// The method is `initialize`.
    initialize: bool,
    result_or_error: bool,
}

impl Shape {
    /// Reads the top-level members of a (possibly cut) JSON object; stops quietly where the
    /// text stops or turns invalid.
    fn of(prefix: &[u8]) -> Shape {
        let mut shape = Shape::default();
        let mut parser = serde_json::Deserializer::from_slice(prefix);
        let _ = serde::Deserializer::deserialize_map(&mut parser, Seek(&mut shape));
        shape
    }

    /// The id to answer with: the frame's, when it is a valid JSON-RPC id, else null.
    fn id(&self) -> Value {
        match &self.id {
            Some(id @ Value::String(_)) => id.clone(),
            Some(Value::Number(n)) if n.is_i64() || n.is_u64() => Value::Number(n.clone()),
            _ => Value::Null,
        }
    }

    /// A response to a request of kin's: an id, a result or error, no method.
    fn is_response(&self) -> bool {
        self.result_or_error && !self.method && !self.id().is_null()
    }
}

struct Seek<'a>(&'a mut Shape);

impl<'de> Visitor<'de> for Seek<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON-RPC object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "id" => self.0.id = Some(map.next_value::<Value>()?),
                "method" => {
                    self.0.method = true;
                    self.0.initialize = map.next_value::<Value>()? == "initialize";
                }
                "result" | "error" => {
                    self.0.result_or_error = true;
                    map.next_value::<IgnoredAny>()?;
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;

    fn frames(input: &[u8], max: usize) -> Vec<Frame> {
        futures::executor::block_on(async {
            let mut reader = BufReader::with_capacity(16, input);
            let mut out = Vec::new();
            while let Some(frame) = next_frame(&mut reader, max).await.unwrap() {
                out.push(frame);
            }
            out
        })
    }

    /// An output that records what it was given and how often it was flushed.
    #[derive(Default, Clone)]
    struct Recorder(Arc<std::sync::Mutex<(Vec<u8>, usize)>>);

    impl AsyncWrite for Recorder {
        fn poll_write(
            self: Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            buf: &[u8],
        ) -> std::task::Poll<std::io::Result<usize>> {
            self.0.lock().unwrap().0.extend_from_slice(buf);
            std::task::Poll::Ready(Ok(buf.len()))
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut std::task::Context<'_>) -> std::task::Poll<std::io::Result<()>> {
            self.0.lock().unwrap().1 += 1;
            std::task::Poll::Ready(Ok(()))
        }
        fn poll_close(self: Pin<&mut Self>, _: &mut std::task::Context<'_>) -> std::task::Poll<std::io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn lines_are_written_unflushed_and_the_output_is_flushed_once_at_the_end() {
        let recorder = Recorder::default();
        let writer: Writer = Arc::new(Mutex::new(Box::pin(recorder.clone())));
        for line in ["{\"a\":1}", "{\"b\":2}"] {
            write_line(&writer, line.to_string()).await.unwrap();
        }
        assert_eq!(*recorder.0.lock().unwrap(), (b"{\"a\":1}\n{\"b\":2}\n".to_vec(), 0));
        Output(writer).flush().await;
        assert_eq!(recorder.0.lock().unwrap().1, 1);
    }

    #[test]
    fn a_session_update_is_told_from_other_lines_as_the_sdk_writes_them() {
        use agent_client_protocol::v1::schema::{ContentBlock, ContentChunk, SessionNotification, SessionUpdate};
        use agent_client_protocol::{JsonRpcMessage, RawJsonRpcMessage};
        let update = SessionUpdate::AgentMessageChunk(ContentChunk::new(ContentBlock::from("hi")));
        let (method, params) = SessionNotification::new("s", update).to_untyped_message().unwrap().into_parts();
        let line = serde_json::to_string(&RawJsonRpcMessage::notification(method, params).unwrap()).unwrap();
        assert!(is_session_update(&line), "{line}");
        assert!(!is_session_update(r#"{"jsonrpc":"2.0","id":1,"method":"session/request_permission","params":{}}"#));
        assert!(!is_session_update(r#"{"jsonrpc":"2.0","id":1,"result":{"stopReason":"end_turn"}}"#));
    }

    #[test]
    fn frames_within_the_limit_pass_and_longer_ones_keep_only_a_prefix() {
        let long = format!("{{\"id\":7,\"method\":\"m\",\"params\":\"{}\"}}", "x".repeat(200_000));
        let input = format!("{{\"a\":1}}\r\n\n{long}\nlast");
        let got = frames(input.as_bytes(), 100_000);
        assert_eq!(got[0], Frame::Line("{\"a\":1}".into()));
        assert_eq!(got[1], Frame::Line(String::new()));
        let Frame::Oversize { bytes, prefix } = &got[2] else { panic!("{:?}", got[2]) };
        assert_eq!((*bytes, prefix.len()), (long.len() as u64, ID_PREFIX_BYTES));
        assert!(prefix.capacity() <= ID_PREFIX_BYTES, "{}", prefix.capacity());
        assert_eq!(got[3], Frame::Line("last".into()));
        assert_eq!(got.len(), 4);
        let got = frames(b"\xff\xfe{}\n{}\n", 100);
        assert!(matches!(&got[0], Frame::NotUtf8 { .. }), "{got:?}");
        assert_eq!(got[1], Frame::Line("{}".into()));
    }

    /// After an `initialize` request the next frame is not read until the response to that
    /// request is written; lines after that are not looked at.
    #[tokio::test]
    async fn the_input_after_initialize_waits_for_its_response() {
        let input = concat!(
            r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}"#,
            "\n",
            r#"{"jsonrpc":"2.0","id":2,"method":"session/list","params":{}}"#,
            "\n",
            r#"{"jsonrpc":"2.0","id":3,"method":"initialize","params":{"protocolVersion":1}}"#,
            "\n",
            r#"{"jsonrpc":"2.0","id":4,"method":"session/list","params":{}}"#,
            "\n",
        );
        let gate = Arc::new(InitGate::default());
        let writer: Writer = Arc::new(Mutex::new(Box::pin(Recorder::default())));
        let input = futures::io::Cursor::new(input.as_bytes().to_vec());
        let mut lines = Box::pin(incoming(input, writer, gate.clone(), 100_000));
        let mut next = async || lines.next().await.unwrap().unwrap();
        assert!(next().await.contains(r#""id":1"#));
        let mut second = Box::pin(next());
        assert!(futures::poll!(&mut second).is_pending(), "held back until initialize is answered");
        for other in [r#"{"jsonrpc":"2.0","id":2,"result":{}}"#, r#"{"jsonrpc":"2.0","id":1,"method":"x","params":{}}"#]
        {
            assert!(!gate.answers_initialize(other), "{other}");
        }
        // The SDK answers a frame it cannot read as a request with a null id.
        assert!(gate.answers_initialize(r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"x"}}"#));
        assert!(gate.answers_initialize(r#"{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":1}}"#));
        gate.open();
        assert!(second.await.contains(r#""id":2"#));
        // Once initialized, a second `initialize` (the SDK refuses it) holds nothing back.
        assert!(next().await.contains(r#""id":3"#));
        assert!(next().await.contains(r#""id":4"#));
    }

    #[test]
    fn the_id_is_recovered_from_the_start_of_a_frame() {
        let shape = |text: &str| Shape::of(text.as_bytes());
        let request =
            shape(r#"{"jsonrpc":"2.0","id":"a-1","method":"session/prompt","params":{"prompt":[{"text":"xxxx"#);
        assert_eq!((request.id(), request.is_response()), (json!("a-1"), false));
        let late = shape(r#"{"jsonrpc":"2.0","method":"session/prompt","params":{"prompt":"xxxx"#);
        assert_eq!((late.id(), late.method), (Value::Null, true));
        let response = shape(r#"{"jsonrpc":"2.0","id":3,"result":{"content":"xxxx"#);
        assert_eq!((response.id(), response.is_response()), (json!(3), true));
        let odd = shape(r#"{"id":1.5,"result":{"#);
        assert_eq!((odd.id(), odd.is_response()), (Value::Null, false));
        assert_eq!(shape("[1,2").id(), Value::Null);
        assert_eq!(shape("not json").id(), Value::Null);
    }

    #[test]
    fn a_refused_frame_is_answered_between_lines_and_serving_goes_on() {
        let big = format!("{{\"jsonrpc\":\"2.0\",\"id\":9,\"method\":\"x\",\"params\":\"{}\"}}", "y".repeat(300_000));
        let answer = format!("{{\"jsonrpc\":\"2.0\",\"id\":4,\"result\":{{\"content\":\"{}\"}}}}", "z".repeat(300_000));
        let input = format!("{{\"first\":1}}\n{big}\n{answer}\n{{\"second\":2}}\n");
        let recorder = Recorder::default();
        let writer: Writer = Arc::new(Mutex::new(Box::pin(recorder.clone())));
        let input = futures::io::Cursor::new(input.into_bytes());
        let lines: Vec<String> = futures::executor::block_on(
            incoming(input, writer, Arc::default(), 100_000).map(|line| line.unwrap()).collect::<Vec<_>>(),
        );
        assert_eq!(lines.len(), 3, "{lines:?}");
        assert_eq!(lines[0], "{\"first\":1}");
        let failed: Value = serde_json::from_str(&lines[1]).unwrap();
        assert_eq!((failed["id"].clone(), failed["error"]["code"].clone()), (json!(4), json!(-32600)));
        assert_eq!(lines[2], "{\"second\":2}");
        let written: Value = serde_json::from_slice(recorder.0.lock().unwrap().0.strip_suffix(b"\n").unwrap()).unwrap();
        assert_eq!(written["id"], 9);
        assert_eq!(written["error"]["code"], -32600);
        assert_eq!(written["error"]["data"], json!({"frameBytes": big.len(), "maxFrameBytes": 100_000}));
        let message = written["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("maximum frame size of 100000 bytes") && message.contains("--max-frame-bytes"),
            "{message}"
        );
    }
}
