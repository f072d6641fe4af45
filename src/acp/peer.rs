//! kin as an ACP client of an agent process: the SDK's client connection (`agent_client_protocol`
//! `Builder::new(Client)`) over the process's pipes (`wire`). One client for every place kin
//! drives an agent: an external agent as a child (`child`), the scenario runner and the bench
//! driving kin itself.
//!
//! The builder is the SDK's raw one: it sends what kin gives it and checks no protocol version,
//! because kin checks `initialize` itself (to name a mismatch in its own words) and the scenario
//! runner must send exactly what a scenario says. Requests run on their own tasks, so dropping a
//! caller's future never withdraws one (the SDK would send `$/cancel_request`). The agent's
//! requests go to a `ClientSide` and are answered in turn on the dispatch loop (a question to
//! the user holds the agent's later frames until it is answered, as it always did); the wire
//! reads no further ahead of that loop than its flow allows.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::AtomicI64;

use agent_client_protocol::v1::schema::{
    PermissionOptionKind, ReadTextFileRequest, ReadTextFileResponse, RequestPermissionOutcome,
    RequestPermissionRequest, RequestPermissionResponse, SelectedPermissionOutcome, SessionNotification,
    WriteTextFileRequest,
};
use agent_client_protocol::{
    Agent, Builder, Client, ConnectionTo, Dispatch, Error, Handled, JsonRpcNotification, JsonRpcRequest,
    RawJsonRpcMessage, UntypedMessage, on_receive_dispatch, on_receive_notification, on_receive_request,
};
use futures::future::BoxFuture;
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::wire::{Wire, WireOptions};

/// How kin, as the client, answers the agent's requests and hears its updates.
pub(crate) trait ClientSide: Send + Sync + 'static {
    fn permission(&self, request: RequestPermissionRequest) -> BoxFuture<'_, Result<RequestPermissionResponse, Error>>;

    fn read_text_file(&self, _request: ReadTextFileRequest) -> BoxFuture<'_, Result<ReadTextFileResponse, Error>> {
        Box::pin(async { Err(Error::method_not_found().data("fs/read_text_file")) })
    }

    /// `fs/write_text_file`; its success is answered with `null`, as kin always answered it.
    fn write_text_file(&self, _request: WriteTextFileRequest) -> BoxFuture<'_, Result<(), Error>> {
        Box::pin(async { Err(Error::method_not_found().data("fs/write_text_file")) })
    }

    /// A `session/update`, on the dispatch loop in arrival order: it must not wait.
    fn update(&self, _notification: SessionNotification) {}
}

/// `fs/write_text_file` with its success answered `null` (the schema's answer type would say
/// `{}`; agents written against kin read `null`).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, agent_client_protocol::JsonRpcRequest)]
#[serde(transparent)]
#[request(method = "fs/write_text_file", response = serde_json::Value)]
struct WriteAnsweredNull(WriteTextFileRequest);

/// One client connection to an agent process.
pub(crate) struct AgentPeer {
    cx: ConnectionTo<Agent>,
    wire: Wire,
    /// Ends the SDK's connection (its main function returns).
    done: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl AgentPeer {
    /// Connects over `input` (the agent's stdin) and `output` (its stdout).
    pub(crate) async fn connect<W, R>(
        name: &str,
        input: W,
        output: R,
        side: Arc<dyn ClientSide>,
        options: WireOptions,
    ) -> Result<AgentPeer, String>
    where
        W: AsyncWrite + Unpin + Send + 'static,
        R: AsyncRead + Unpin + Send + 'static,
    {
        let (transport, wire) = Wire::open(input, output, options);
        let (cx_tx, cx_rx) = oneshot::channel();
        let (done, finished) = oneshot::channel::<()>();
        let (s_permission, s_read, s_write, s_update) = (side.clone(), side.clone(), side.clone(), side);
        let flow = wire.flow();
        let ended = wire.output_ended();
        let (p_ended, r_ended, w_ended) = (ended.clone(), ended.clone(), ended);
        let builder = Builder::new(Client)
            .name(name)
            // First in the chain: each message's dispatch frees its room in the wire.
            .on_receive_dispatch(
                async move |dispatch: Dispatch, _cx| {
                    flow.dispatched();
                    Ok(Handled::No { message: dispatch, retry: false })
                },
                on_receive_dispatch!(),
            )
            // The agent's requests are answered in turn, on the dispatch loop, as kin always
            // answered them: one at a time, the next frame read once this one is answered.
            .on_receive_request(
                async move |request: RequestPermissionRequest, responder, _cx| {
                    let answer = unless_gone(&p_ended, s_permission.permission(request)).await;
                    responder.respond_with_result(answer)
                },
                on_receive_request!(),
            )
            .on_receive_request(
                async move |request: ReadTextFileRequest, responder, _cx| {
                    let answer = unless_gone(&r_ended, s_read.read_text_file(request)).await;
                    responder.respond_with_result(answer)
                },
                on_receive_request!(),
            )
            .on_receive_request(
                async move |request: WriteAnsweredNull, responder, _cx| {
                    let written = unless_gone(&w_ended, s_write.write_text_file(request.0)).await.map(|()| Value::Null);
                    responder.respond_with_result(written)
                },
                on_receive_request!(),
            )
            .on_receive_notification(
                async move |notification: SessionNotification, _cx| {
                    s_update.update(notification);
                    Ok(())
                },
                on_receive_notification!(),
            );
        let label = name.to_string();
        let task = tokio::spawn(async move {
            let ended = builder
                .connect_with(transport, async move |cx: ConnectionTo<Agent>| {
                    let _ = cx_tx.send(cx);
                    let _ = finished.await;
                    Ok(())
                })
                .await;
            if let Err(e) = ended {
                tracing::debug!(peer = %label, "ACP client connection ended: {e}");
            }
        });
        match cx_rx.await {
            Ok(cx) => Ok(AgentPeer { cx, wire, done: Some(done), task }),
            Err(_) => Err("the ACP client connection ended before it started".into()),
        }
    }

    /// Sends `request` and resolves with its raw result (the caller parses it) or the error the
    /// agent answered (or the SDK's, when the connection ended first).
    pub(crate) fn call<Req: JsonRpcRequest>(
        &self,
        request: &Req,
    ) -> impl Future<Output = Result<Value, Error>> + 'static {
        let untyped = request.to_untyped_message();
        self.send(untyped)
    }

    fn send(&self, message: Result<UntypedMessage, Error>) -> impl Future<Output = Result<Value, Error>> + 'static {
        let task = message.map(|message| tokio::spawn(self.cx.send_request(message).block_task()));
        async move {
            match task {
                Ok(task) => task.await.unwrap_or_else(|e| Err(Error::internal_error().data(e.to_string()))),
                Err(e) => Err(e),
            }
        }
    }

    /// Sends a notification, in order with [`AgentPeer::send_line`] and [`AgentPeer::close`].
    pub(crate) async fn notify<N: JsonRpcNotification>(&self, notification: &N) -> std::io::Result<()> {
        let line = notification
            .to_untyped_message()
            .and_then(|m| {
                let (method, params) = m.into_parts();
                RawJsonRpcMessage::notification(method, params)
            })
            .and_then(|frame| serde_json::to_string(&frame).map_err(Error::into_internal_error))
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()))?;
        self.wire.send_line(line).await
    }

    /// Writes one raw line (a scenario's `raw` step), after what was sent before.
    pub(crate) async fn send_line(&self, line: &str) -> std::io::Result<()> {
        self.wire.send_line(line.to_string()).await
    }

    /// Closes the agent's stdin after what was sent before.
    pub(crate) async fn close(&self) {
        self.wire.close().await;
    }

    /// Why the connection broke.
    pub(crate) fn broken(&self) -> Option<super::wire::Broken> {
        self.wire.broken()
    }

    /// Resolves once everything the agent wrote was read.
    pub(crate) async fn output_ended(&self) {
        self.wire.read_ended().await;
    }
}

impl Drop for AgentPeer {
    fn drop(&mut self) {
        if let Some(done) = self.done.take() {
            let _ = done.send(());
        }
        self.task.abort();
    }
}

/// The longest line read from kin under test (a scenario, the bench): 64 MiB.
const DRIVER_MAX_FRAME: usize = 64 << 20;

/// How a request ended for an untyped driver.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Answer {
    Result(Value),
    Error { code: i64, message: String },
}

pub(crate) use super::wire::numbering;

/// `answer` to one of the agent's requests, unless the agent's output ends first (it exited
/// while, say, the editor had its forwarded permission question open): then what `answer` waited
/// on is dropped, and the dispatch loop it held is free to see the connection end.
async fn unless_gone<T>(gone: &CancellationToken, answer: impl Future<Output = Result<T, Error>>) -> Result<T, Error> {
    tokio::select! {
        answered = answer => answered,
        () = gone.cancelled() => Err(Error::internal_error().data("the agent's output ended before kin answered it")),
    }
}

/// Picks a permission option from the offered `(optionId, kind)` pairs (kinds by their wire
/// names, `allow_once` …); `None` answers `cancelled`.
pub(crate) type ChooseOption = Arc<dyn Fn(&[(String, &'static str)]) -> Option<String> + Send + Sync>;

/// The client for drivers that speak by method name with JSON params (the scenario runner and
/// the bench driving kin): every line kin writes goes to the tap, lines that are not JSON-RPC are
/// passed over, permission requests are answered by `choose`, anything else kin asks is
/// method-not-found.
pub(crate) struct Driver {
    peer: AgentPeer,
}

struct DriverSide(ChooseOption);

impl ClientSide for DriverSide {
    fn permission(&self, request: RequestPermissionRequest) -> BoxFuture<'_, Result<RequestPermissionResponse, Error>> {
        let offered: Vec<(String, &'static str)> =
            request.options.iter().map(|o| (o.option_id.0.to_string(), option_kind_name(o.kind))).collect();
        let outcome = match (self.0)(&offered) {
            Some(id) => RequestPermissionOutcome::Selected(SelectedPermissionOutcome::new(id)),
            None => RequestPermissionOutcome::Cancelled,
        };
        Box::pin(async move { Ok(RequestPermissionResponse::new(outcome)) })
    }
}

fn option_kind_name(kind: PermissionOptionKind) -> &'static str {
    match kind {
        PermissionOptionKind::AllowOnce => "allow_once",
        PermissionOptionKind::AllowAlways => "allow_always",
        PermissionOptionKind::RejectOnce => "reject_once",
        PermissionOptionKind::RejectAlways => "reject_always",
        _ => "unknown",
    }
}

impl Driver {
    pub(crate) async fn connect<W, R>(
        name: &str,
        input: W,
        output: R,
        tap: Option<super::wire::Tap>,
        choose: ChooseOption,
        numbering: Arc<AtomicI64>,
    ) -> Result<Driver, String>
    where
        W: AsyncWrite + Unpin + Send + 'static,
        R: AsyncRead + Unpin + Send + 'static,
    {
        let options = WireOptions { max_frame: DRIVER_MAX_FRAME, tap, strict: false, numbering };
        let peer = AgentPeer::connect(name, input, output, Arc::new(DriverSide(choose)), options).await?;
        Ok(Driver { peer })
    }

    /// Sends a request; resolves with kin's answer, or `Err` when none can come (kin's output
    /// ended first).
    pub(crate) fn request(
        &self,
        method: &str,
        params: Value,
    ) -> impl Future<Output = Result<Answer, String>> + 'static {
        let call = self.peer.send(UntypedMessage::new(method, params));
        async move {
            match call.await {
                Ok(result) => Ok(Answer::Result(result)),
                Err(e) if agent_client_protocol::is_incoming_transport_closed(&e) => Err(e.to_string()),
                Err(e) => Ok(Answer::Error { code: i64::from(i32::from(e.code)), message: e.message }),
            }
        }
    }

    pub(crate) async fn notify(&self, method: &str, params: Value) -> std::io::Result<()> {
        let notification = UntypedMessage::new(method, params)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()))?;
        self.peer.notify(&notification).await
    }

    pub(crate) async fn send_line(&self, line: &str) -> std::io::Result<()> {
        self.peer.send_line(line).await
    }

    pub(crate) async fn close(&self) {
        self.peer.close().await;
    }

    pub(crate) async fn output_ended(&self) {
        self.peer.output_ended().await;
    }
}

/// A JSON-RPC request frame with a numeric id, for peers that write frames themselves (the
/// integration tests that drive kin at the wire level).
pub fn request_frame(id: u64, method: &str, params: Value) -> Result<Value, String> {
    let id = i64::try_from(id).map_err(|e| e.to_string())?;
    let frame = RawJsonRpcMessage::request(method.to_string(), params, id).map_err(|e| e.to_string())?;
    serde_json::to_value(frame).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

    use super::*;

    /// Records what the agent sent; allows every permission request by its first option.
    #[derive(Default)]
    struct Recorder {
        updates: Mutex<usize>,
        asked: Mutex<usize>,
    }

    impl ClientSide for Recorder {
        fn permission(
            &self,
            request: RequestPermissionRequest,
        ) -> BoxFuture<'_, Result<RequestPermissionResponse, Error>> {
            *self.asked.lock().unwrap() += 1;
            let id = request.options[0].option_id.clone();
            Box::pin(async move {
                Ok(RequestPermissionResponse::new(RequestPermissionOutcome::Selected(SelectedPermissionOutcome::new(
                    id,
                ))))
            })
        }

        fn update(&self, _: SessionNotification) {
            *self.updates.lock().unwrap() += 1;
        }
    }

    #[tokio::test]
    async fn every_frame_passed_on_frees_its_room_and_ids_are_numbers_on_the_wire() {
        let (kin_in, agent_in) = tokio::io::duplex(1 << 16);
        let (agent_out, kin_out) = tokio::io::duplex(1 << 16);
        let side = Arc::new(Recorder::default());
        let options = WireOptions { max_frame: 4096, tap: None, strict: true, numbering: numbering() };
        let peer = AgentPeer::connect("test", kin_in, kin_out, side.clone(), options).await.unwrap();
        let agent = tokio::spawn(async move {
            let mut out = agent_out;
            let update = r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"x"}}}}"#;
            for _ in 0..500 {
                out.write_all(format!("{update}\n").as_bytes()).await.unwrap();
            }
            let ask = r#"{"jsonrpc":"2.0","id":"p","method":"session/request_permission","params":{"sessionId":"s","toolCall":{"toolCallId":"t"},"options":[{"optionId":"ok","name":"Allow","kind":"allow_once"}]}}"#;
            out.write_all(format!("{ask}\n").as_bytes()).await.unwrap();
            // Answers kin's request (and passes over kin's answer to its own), echoing the id.
            let mut lines = BufReader::new(agent_in).lines();
            let mut seen = Vec::new();
            while let Some(line) = lines.next_line().await.unwrap() {
                let frame: Value = serde_json::from_str(&line).unwrap();
                seen.push(frame.clone());
                if frame.get("method").is_some() {
                    let answer = serde_json::json!({"jsonrpc": "2.0", "id": frame["id"], "result": {"ok": true}});
                    out.write_all(format!("{answer}\n").as_bytes()).await.unwrap();
                    // And a stray answer to nothing kin asked.
                    out.write_all(b"{\"jsonrpc\":\"2.0\",\"id\":99,\"result\":null}\n").await.unwrap();
                }
                if seen.len() == 2 {
                    return seen;
                }
            }
            seen
        });
        let answer = peer.send(UntypedMessage::new("kin/test", serde_json::json!({}))).await.unwrap();
        assert_eq!(answer, serde_json::json!({"ok": true}));
        let seen = agent.await.unwrap();
        let request = seen.iter().find(|f| f.get("method").is_some()).unwrap();
        assert_eq!(request["id"], 1, "kin's first request is number 1 on the wire");
        let allowed = seen.iter().find(|f| f["id"] == "p").unwrap();
        assert_eq!(allowed["result"]["outcome"], serde_json::json!({"outcome": "selected", "optionId": "ok"}));
        assert_eq!((*side.updates.lock().unwrap(), *side.asked.lock().unwrap()), (500, 1));
        assert_eq!(peer.wire.flow().queued(), 0, "every frame passed on was dispatched");
    }
}
