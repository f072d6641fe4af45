//! kin's stdio transport: newline-delimited JSON-RPC frames, each at most `max_frame_bytes` long
//! (`--max-frame-bytes`, `max_frame_bytes`; default 64 MiB, room for prompts with pasted files
//! and images). It replaces the SDK's `Stdio`, which reads a line whole however long it is.
//!
//! After an `initialize` request, the input is held back until its response is written
//! ([`Ledger`]): the SDK refuses any request that reaches it while initialization is under way,
//! so a client that writes its first requests without waiting for the answer (a script piping
//! them in) would otherwise have them refused; held back, they are served in order. For the same
//! client, the end of the input does not end the transport before the requests already read are
//! answered (the SDK ends the connection, and drops the answers still to come, once its input
//! ends): the other requests first, then the prompts, whose turns are stopped.
//!
//! A longer frame is never held (`jsonrpc::next_frame`): its first `ID_PREFIX_BYTES` are kept to
//! recover the id cheaply, the rest is read and dropped. A request (or anything that is not a response) is answered with
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

mod ledger;

use std::pin::Pin;
use std::sync::Arc;

use agent_client_protocol::Lines;
use futures::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use futures::lock::Mutex;
use futures::{Sink, Stream};
use serde_json::{Value, json};

use crate::jsonrpc::{Frame, ID_PREFIX_BYTES, Shape, check_json, next_frame};
use ledger::Ledger;

/// The default maximum frame size.
pub(crate) const DEFAULT_MAX_FRAME_BYTES: usize = 64 * 1024 * 1024;
/// The smallest maximum frame size accepted (an `initialize` must fit).
pub(crate) const MIN_MAX_FRAME_BYTES: usize = 64 * 1024;
/// The largest maximum frame size accepted: a prompt's line in the log stays well within the
/// longest line a log scan reads back (`session::scan`).
pub(crate) const MAX_MAX_FRAME_BYTES: usize = 128 * 1024 * 1024;
/// The buffer between kin's async side and the blocking reads of stdin and writes of stdout.
const PIPE_BYTES: usize = 256 * 1024;

type Writer = Arc<Mutex<Pin<Box<dyn AsyncWrite + Send>>>>;

/// The SDK transport over kin's stdin and stdout, and kin's output to drain when it is done.
pub(crate) fn stdio(
    max_frame_bytes: usize,
    stop_turns: impl Fn() + Send + Sync + 'static,
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
    framed(stdin, stdout, max_frame_bytes, stop_turns)
}

/// The transport over any byte streams: frames of `input` (each at most `max_frame_bytes`) in,
/// lines to `output` out (unflushed: see [`Output`]); the answers to refused frames are written to
/// `output` too, never in the middle of another line.
pub(crate) fn framed(
    input: impl AsyncRead + Send + 'static,
    output: impl AsyncWrite + Send + 'static,
    max_frame_bytes: usize,
    stop_turns: impl Fn() + Send + Sync + 'static,
) -> (Lines<impl Sink<String, Error = std::io::Error> + Send, impl Stream<Item = std::io::Result<String>> + Send>, Output)
{
    let writer: Writer = Arc::new(Mutex::new(Box::pin(output)));
    let ledger = Arc::new(Ledger::new(stop_turns));
    let sent = (writer.clone(), ledger.clone());
    let outgoing = futures::sink::unfold(sent, |(writer, ledger): (Writer, Arc<Ledger>), line: String| async move {
        let line = bounded_error(line);
        let update = is_session_update(&line);
        let answers = if update { None } else { ledger.answers(&line) };
        write_line(&writer, line).await?;
        if let Some(id) = answers {
            ledger.answered(&id);
        }
        if update {
            crate::outflow::outflow().written();
        }
        Ok::<_, std::io::Error>((writer, ledger))
    });
    let output = Output { writer: writer.clone(), ledger: ledger.clone() };
    (Lines::new(outgoing, incoming(input, writer, ledger, max_frame_bytes)), output)
}

/// The transport's output, written line by line and never flushed until [`Output::flush`].
pub(crate) struct Output {
    writer: Writer,
    ledger: Arc<Ledger>,
}

impl Output {
    /// How long kin waits at exit for its last lines to reach a client that stopped reading.
    const DRAIN: std::time::Duration = std::time::Duration::from_secs(5);

    /// After SIGTERM, while the connection still serves: the requests already read are answered,
    /// the running prompts `cancelled` once their turns are stopped, waiting at most
    /// `ledger::SIGTERM_WAIT`; a request read meanwhile is refused (see
    /// `Ledger::answer_before_the_end`).
    pub(crate) async fn answer_before_the_end(&self, signal: &'static str) {
        self.ledger.answer_before_the_end(signal, ledger::SIGTERM_WAIT).await;
    }

    /// Writes out whatever is still on its way (waiting at most `DRAIN`).
    pub(crate) async fn flush(&self) {
        let flushed = async { self.writer.lock().await.flush().await };
        match tokio::time::timeout(Self::DRAIN, flushed).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!("cannot write kin's last output: {e}"),
            Err(_) => tracing::warn!("the client did not read kin's last output within {:?}", Self::DRAIN),
        }
    }
}

/// The most bytes an error response kin writes may take.
const MAX_ERROR_LINE: usize = 64 * 1024;

/// An error response longer than `MAX_ERROR_LINE` with its `data` replaced by a note, and its
/// message cut: the SDK's answer to a malformed request quotes the request whole (a 20 MiB
/// prompt with one bad block was echoed back whole). Any other line as it is.
fn bounded_error(line: String) -> String {
    if line.len() <= MAX_ERROR_LINE || !line.as_bytes()[..line.len().min(256)].windows(8).any(|w| w == b"\"error\":") {
        return line;
    }
    let Ok(mut frame) = serde_json::from_str::<Value>(&line) else { return line };
    let Some(error) = frame.get_mut("error").and_then(Value::as_object_mut) else { return line };
    if let Some(data) = error.get_mut("data") {
        *data = json!(format!("{} bytes of error data not shown (it quoted the request)", data.to_string().len()));
    }
    if let Some(Value::String(message)) = error.get_mut("message")
        && message.len() > MAX_ERROR_LINE / 2
    {
        let cut = crate::tools::capture::cut(message, MAX_ERROR_LINE / 2);
        *message = cut;
    }
    serde_json::to_string(&frame).unwrap_or(line)
}

/// Whether an outgoing line is a `session/update` notification (what `outflow` counts): the
/// SDK writes `jsonrpc` and `method` first.
fn is_session_update(line: &str) -> bool {
    const METHOD: &[u8] = b"\"method\":\"session/update\"";
    let head = &line.as_bytes()[..line.len().min(64)];
    head.windows(METHOD.len()).any(|w| w == METHOD)
}

/// The frames of `input` for the SDK, none read while the ledger holds them back
/// (`Ledger::pass`), and the end only once the requests read are answered
/// (`Ledger::answer_before_the_end`); refused ones are answered on `writer` (or, for responses to
/// kin's own requests, handed on as an error response).
fn incoming(
    input: impl AsyncRead + Send + 'static,
    writer: Writer,
    ledger: Arc<Ledger>,
    max_frame_bytes: usize,
) -> impl Stream<Item = std::io::Result<String>> + Send {
    let reader = Box::pin(BufReader::with_capacity(64 * 1024, input));
    futures::stream::unfold((reader, writer, ledger), move |(mut reader, writer, ledger)| async move {
        loop {
            ledger.pass().await;
            let frame = match next_frame(&mut reader, max_frame_bytes).await {
                Ok(Some(frame)) => frame,
                Ok(None) => {
                    ledger.answer_before_the_end("the input ended", ledger::ANSWER_WAIT).await;
                    return None;
                }
                Err(e) => return Some((Err(e), (reader, writer, ledger))),
            };
            let refused = match frame {
                Frame::Line(line) => match Shape::of_line(&line) {
                    shape
                        if shape.is_request()
                            && let Some(why) = ledger.ending() =>
                    {
                        Refused::ending(shape.id(), why)
                    }
                    // A request the SDK cannot parse it answers with a null id, which the client
                    // cannot match: it is answered here, with its id (as the SDK parses it).
                    shape
                        if shape.is_request()
                            && let Err(e) = check_json(&line) =>
                    {
                        Refused::not_json(shape.id(), &e)
                    }
                    shape if let Some(defect) = shape.answer_defect(line.len() <= ID_PREFIX_BYTES) => {
                        Refused::bad_answer(shape.id(), defect)
                    }
                    // A frame with a method and an id the SDK cannot serve: answered here with
                    // its id and what is wrong (the SDK answers with a null id).
                    shape if let Some((id, code, why)) = shape.request_defect(line.len() <= ID_PREFIX_BYTES) => {
                        Refused::bad_request(id, code, why.to_string())
                    }
                    // Params the SDK cannot read through one of its untagged enums: answered
                    // naming what is wrong (the SDK says only that no variant matched).
                    shape
                        if shape.is_request()
                            && let Some(why) =
                                shape.method_name.as_deref().and_then(|m| super::unreadable::answer(m, &line)) =>
                    {
                        Refused::bad_request(shape.id(), -32602, why)
                    }
                    shape if shape.is_request() && shape.method_name.as_deref() == Some("session/cancel") => {
                        let why = "Invalid request: session/cancel is a notification: send it without an id";
                        Refused::bad_request(shape.id(), -32600, why.to_string())
                    }
                    shape => {
                        ledger.saw(&shape);
                        return Some((Ok(line), (reader, writer, ledger)));
                    }
                },
                Frame::Oversize { bytes, prefix } => Refused::oversize(bytes, max_frame_bytes, &prefix),
                Frame::NotUtf8 { prefix } => Refused::not_utf8(&prefix),
            };
            tracing::warn!(code = refused.code, id = %refused.id, "refused an incoming frame: {}", refused.message);
            if refused.answer {
                // A response to a request of kin's: the SDK fails that request with the error.
                return Some((Ok(refused.line()), (reader, writer, ledger)));
            }
            if let Err(e) = write_line(&writer, refused.line()).await {
                return Some((Err(e), (reader, writer, ledger)));
            }
        }
    })
}

async fn write_line(writer: &Writer, line: String) -> std::io::Result<()> {
    let mut bytes = line.into_bytes();
    bytes.push(b'\n');
    writer.lock().await.write_all(&bytes).await
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

    /// A request read once kin began to end (after SIGTERM, `why`): notifications and responses
    /// still pass (a `session/cancel` or a permission answer only helps the turns end).
    fn ending(id: Value, why: &str) -> Self {
        Refused {
            answer: false,
            id,
            code: -32603,
            message: format!(
                "Internal error: kin is shutting down (it got {why}) and serves no new request; send it again to a \
                 new kin process"
            ),
            data: Value::Null,
        }
    }

    /// An answer to one of kin's requests that is not a JSON-RPC response (`Shape::answer_defect`):
    /// handed to the SDK as an error answer to that request, which then fails (a permission
    /// question so answered is a rejection) instead of waiting forever.
    fn bad_answer(id: Value, defect: &str) -> Self {
        Refused {
            answer: true,
            id,
            code: -32600,
            message: format!(
                "Invalid request: the client's answer to this request is not a JSON-RPC response ({defect})"
            ),
            data: Value::Null,
        }
    }

    /// A request kin cannot serve as sent (`Shape::request_defect`, a notification sent as a
    /// request), answered with `id` and why.
    fn bad_request(id: Value, code: i64, message: String) -> Self {
        Refused { answer: false, id, code, message, data: Value::Null }
    }

    /// A request that is not JSON as the SDK parses it (a lone surrogate escape, a number out
    /// of range, trailing text, nesting too deep), answered with its id.
    fn not_json(id: Value, e: &serde_json::Error) -> Self {
        Refused {
            answer: false,
            id,
            code: -32700,
            message: format!("Parse error: the request is not valid JSON ({e}); fix it and send it again"),
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;
    use futures::StreamExt;

    #[test]
    fn a_long_error_response_is_cut_and_says_so_and_other_lines_pass() {
        let echoed = "x".repeat(1 << 20);
        let error = json!({"jsonrpc": "2.0", "id": 7, "error": {"code": -32602, "message": "Invalid params", "data": {"params": echoed}}});
        let cut = bounded_error(error.to_string());
        assert!(cut.len() < 1024, "{}", cut.len());
        let frame: Value = serde_json::from_str(&cut).unwrap();
        assert_eq!((frame["id"].clone(), frame["error"]["code"].clone()), (json!(7), json!(-32602)));
        assert!(
            frame["error"]["data"].as_str().unwrap().ends_with("bytes of error data not shown (it quoted the request)")
        );
        let long_message = json!({"jsonrpc": "2.0", "id": 8, "error": {"code": -32603, "message": echoed}});
        assert!(bounded_error(long_message.to_string()).len() <= MAX_ERROR_LINE);
        // A long update, result or short error is left as it is.
        let update = json!({"jsonrpc": "2.0", "method": "session/update", "params": {"text": echoed}}).to_string();
        assert_eq!(bounded_error(update.clone()), update);
        let short =
            json!({"jsonrpc": "2.0", "id": 9, "error": {"code": -32602, "message": "m", "data": "d"}}).to_string();
        assert_eq!(bounded_error(short.clone()), short);
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
        Output { writer, ledger: Arc::default() }.flush().await;
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

    /// `line` written to the client through `ledger`, as the transport's output does.
    pub(super) fn wrote(ledger: &Ledger, line: &str) {
        if let Some(id) = ledger.answers(line) {
            ledger.answered(&id);
        }
    }

    /// A request frame with `id` for `method`.
    pub(super) fn request(id: u64, method: &str) -> String {
        format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"{method}","params":{{}}}}"#)
    }

    /// After an `initialize` request the next frame is not read until the response to that
    /// request is written; a later `initialize` holds nothing back.
    #[tokio::test]
    async fn the_input_after_initialize_waits_for_its_response() {
        let input: String = [request(1, "initialize"), request(2, "session/list"), request(3, "initialize")]
            .iter()
            .chain([request(4, "session/list")].iter())
            .map(|line| format!("{line}\n"))
            .collect();
        let ledger = Arc::new(Ledger::default());
        let writer: Writer = Arc::new(Mutex::new(Box::pin(Recorder::default())));
        let input = futures::io::Cursor::new(input.into_bytes());
        let mut lines = Box::pin(incoming(input, writer, ledger.clone(), 100_000));
        let mut next = async || lines.next().await.unwrap().unwrap();
        assert!(next().await.contains(r#""id":1"#));
        let mut second = Box::pin(next());
        assert!(futures::poll!(&mut second).is_pending(), "held back until initialize is answered");
        for other in [r#"{"jsonrpc":"2.0","id":2,"result":{}}"#, r#"{"jsonrpc":"2.0","id":1,"method":"x","params":{}}"#]
        {
            wrote(&ledger, other);
            assert!(futures::poll!(&mut second).is_pending(), "{other} does not answer initialize");
        }
        wrote(&ledger, r#"{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":1}}"#);
        assert!(second.await.contains(r#""id":2"#));
        // Once initialized, a second `initialize` (the SDK refuses it) holds nothing back.
        assert!(next().await.contains(r#""id":3"#));
        assert!(next().await.contains(r#""id":4"#));
    }

    /// At the end of the input the stream ends only once the requests read are answered: the
    /// others first, then the turns are stopped and the prompts answered.
    #[tokio::test]
    async fn the_end_of_the_input_waits_for_the_answers_to_the_requests_read() {
        let stopped = Arc::new(AtomicBool::new(false));
        let stop = stopped.clone();
        let ledger = Arc::new(Ledger::new(move || stop.store(true, Ordering::SeqCst)));
        let input: String = [request(1, "session/prompt"), request(2, "session/list")]
            .iter()
            .chain([r#"{"jsonrpc":"2.0","method":"session/cancel","params":{}}"#.to_string()].iter())
            .map(|line| format!("{line}\n"))
            .collect();
        let writer: Writer = Arc::new(Mutex::new(Box::pin(Recorder::default())));
        let input = futures::io::Cursor::new(input.into_bytes());
        let mut lines = Box::pin(incoming(input, writer, ledger.clone(), 100_000));
        for _ in 0..3 {
            lines.next().await.unwrap().unwrap();
        }
        let mut end = Box::pin(lines.next());
        assert!(futures::poll!(&mut end).is_pending(), "two requests are open");
        assert!(!stopped.load(Ordering::SeqCst), "turns run while other requests are open");
        wrote(&ledger, r#"{"jsonrpc":"2.0","id":2,"result":{"sessions":[]}}"#);
        assert!(futures::poll!(&mut end).is_pending(), "the prompt is open");
        assert!(stopped.load(Ordering::SeqCst), "the turns are stopped once only prompts are open");
        wrote(&ledger, r#"{"jsonrpc":"2.0","id":1,"result":{"stopReason":"cancelled"}}"#);
        assert!(end.await.is_none(), "every request read is answered");
    }

    /// Once the end began (SIGTERM, with the input still open), a request read is answered with
    /// an error and not served; notifications and responses to kin's own requests still pass.
    #[tokio::test]
    async fn a_request_read_after_the_end_began_is_refused_and_the_rest_passes() {
        let ledger = Arc::new(Ledger::default());
        let recorder = Recorder::default();
        let writer: Writer = Arc::new(Mutex::new(Box::pin(recorder.clone())));
        let cancel = r#"{"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":"s"}}"#;
        let permission = r#"{"jsonrpc":"2.0","id":0,"result":{"outcome":{"outcome":"cancelled"}}}"#;
        let input: String = [request(1, "session/prompt"), request(2, "session/new"), cancel.into(), permission.into()]
            .iter()
            .map(|line| format!("{line}\n"))
            .collect();
        let input = futures::io::Cursor::new(input.into_bytes());
        let mut lines = Box::pin(incoming(input, writer, ledger.clone(), 100_000));
        assert!(lines.next().await.unwrap().unwrap().contains(r#""id":1"#));
        let mut end = Box::pin(ledger.answer_before_the_end("SIGTERM", ledger::SIGTERM_WAIT));
        assert!(futures::poll!(&mut end).is_pending(), "the prompt is open");
        assert_eq!(lines.next().await.unwrap().unwrap(), cancel, "a notification passes");
        assert_eq!(lines.next().await.unwrap().unwrap(), permission, "an answer to kin passes");
        let written = recorder.0.lock().unwrap().0.clone();
        let refused: Value = serde_json::from_slice(written.strip_suffix(b"\n").unwrap()).unwrap();
        assert_eq!((refused["id"].clone(), refused["error"]["code"].clone()), (json!(2), json!(-32603)), "{refused}");
        assert!(refused["error"]["message"].as_str().unwrap().contains("shutting down"), "{refused}");
        wrote(&ledger, r#"{"jsonrpc":"2.0","id":1,"result":{"stopReason":"cancelled"}}"#);
        assert!(futures::poll!(&mut end).is_ready(), "the refused request was never entered, so not waited for");
    }

    /// A request the SDK cannot parse (it would answer with a null id, leaving the client's
    /// request hanging and the end of the input waiting for it) is answered here with its own
    /// id, and never reaches the SDK or the ledger.
    #[tokio::test]
    async fn a_request_that_is_not_json_is_answered_with_its_id() {
        use agent_client_protocol::TransportFrame;
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        let bad = [
            r#"{"jsonrpc":"2.0","id":1,"method":"session/prompt","params":{"text":"half \ud83d emoji"}}"#.to_string(),
            r#"{"jsonrpc":"2.0","id":2,"method":"session/list","params":{}} x"#.into(),
            r#"{"jsonrpc":"2.0","id":3,"method":"session/list","params":{"a":1,}}"#.into(),
            r#"{"jsonrpc":"2.0","id":"four","method":"session/list","params":{"n":1e999}}"#.into(),
            format!(r#"{{"jsonrpc":"2.0","id":5,"method":"session/list","params":{{"deep":{deep}}}}}"#),
        ];
        for frame in &bad {
            assert!(matches!(TransportFrame::parse_json(frame), TransportFrame::Malformed { .. }), "{frame}");
        }
        let good = request(6, "session/list");
        let input: String = bad.iter().chain([&good]).map(|line| format!("{line}\n")).collect();
        let ledger = Arc::new(Ledger::default());
        let recorder = Recorder::default();
        let writer: Writer = Arc::new(Mutex::new(Box::pin(recorder.clone())));
        let mut lines =
            Box::pin(incoming(futures::io::Cursor::new(input.into_bytes()), writer, ledger.clone(), 100_000));
        assert_eq!(lines.next().await.unwrap().unwrap(), good, "only the valid request reaches the SDK");
        let written = String::from_utf8(recorder.0.lock().unwrap().0.clone()).unwrap();
        let answers: Vec<Value> = written.lines().map(|line| serde_json::from_str(line).unwrap()).collect();
        let ids: Vec<Value> = answers.iter().map(|a| a["id"].clone()).collect();
        assert_eq!(ids, [json!(1), json!(2), json!(3), json!("four"), json!(5)]);
        for answer in &answers {
            assert_eq!(answer["error"]["code"], -32700, "{answer}");
            assert!(answer["error"]["message"].as_str().unwrap().contains("not valid JSON ("), "{answer}");
        }
        wrote(&ledger, r#"{"jsonrpc":"2.0","id":6,"result":{"sessions":[]}}"#);
        assert!(futures::poll!(lines.next()).is_ready(), "nothing refused is waited for at the end");
    }

    /// An answer to one of kin's requests that the SDK would drop (kin's request then waits
    /// forever: a permission question's turn hangs) reaches it as an error answer to that request
    /// instead; well-formed answers, `null` results included, pass as they came.
    #[test]
    fn a_malformed_answer_to_kin_reaches_the_sdk_as_an_error_answer() {
        let malformed = [
            (r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32000}}"#, "its error is not an object"),
            (r#"{"jsonrpc":"2.0","id":2,"error":"no"}"#, "its error is not an object"),
            (r#"{"jsonrpc":"2.0","id":3,"result":{},"error":{"code":1,"message":"m"}}"#, "both a result and an error"),
            (r#"{"jsonrpc":"2.0","id":"four"}"#, "neither a result nor an error"),
            (r#"{"id":5,"result":{"outcome":{"outcome":"cancelled"}}}"#, "lacks \"jsonrpc\""),
        ];
        let fine = [
            r#"{"jsonrpc":"2.0","id":6,"result":null}"#,
            r#"{"jsonrpc":"2.0","id":7,"error":{"code":-32603,"message":"m","data":{"x":1}}}"#,
            r#"{"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":"s"}}"#,
        ];
        let input: String = malformed.iter().map(|(line, _)| *line).chain(fine).map(|l| format!("{l}\n")).collect();
        let lines: Vec<String> = futures::executor::block_on(
            incoming(
                futures::io::Cursor::new(input.into_bytes()),
                Arc::new(Mutex::new(Box::pin(Recorder::default()))),
                Arc::default(),
                100_000,
            )
            .map(|line| line.unwrap())
            .collect::<Vec<_>>(),
        );
        assert_eq!(lines.len(), 8, "{lines:?}");
        for ((line, (sent, defect)), id) in
            lines.iter().zip(malformed).zip([json!(1), json!(2), json!(3), json!("four"), json!(5)])
        {
            let answer: Value = serde_json::from_str(line).unwrap();
            assert_eq!((answer["jsonrpc"].clone(), answer["id"].clone()), (json!("2.0"), id), "{sent}");
            assert_eq!(answer["error"]["code"], -32600, "{sent}");
            let message = answer["error"]["message"].as_str().unwrap();
            assert!(message.contains("not a JSON-RPC response") && message.contains(defect), "{sent}: {message}");
        }
        assert_eq!(lines[5..], fine, "well-formed frames pass untouched");
    }

    /// A request never answered does not keep the transport from ending: it waits `ANSWER_WAIT`.
    #[tokio::test(start_paused = true)]
    async fn the_end_of_the_input_waits_for_answers_at_most_answer_wait() {
        let ledger = Arc::new(Ledger::default());
        let writer: Writer = Arc::new(Mutex::new(Box::pin(Recorder::default())));
        let input = futures::io::Cursor::new(format!("{}\n", request(1, "session/list")).into_bytes());
        let mut lines = Box::pin(incoming(input, writer, ledger, 100_000));
        lines.next().await.unwrap().unwrap();
        let started = tokio::time::Instant::now();
        assert!(lines.next().await.is_none());
        assert_eq!(started.elapsed(), ledger::ANSWER_WAIT);
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
