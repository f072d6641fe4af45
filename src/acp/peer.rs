//! kin as an ACP client of an agent process: the SDK's client connection (`agent_client_protocol`
//! `Builder::new(Client)`) over the process's pipes (`wire`). One client for every place kin
//! drives an agent: an external agent as a child (`child`), the scenario runner and the bench
//! driving kin itself.
//!
//! The builder is the SDK's raw one: it sends what kin gives it and checks no protocol version,
//! because kin checks `initialize` itself (to name a mismatch in its own words) and the scenario
//! runner must send exactly what a scenario says. Requests run on their own tasks, so dropping a
//! caller's future never withdraws one (the SDK would send `$/cancel_request`). The agent's
//! requests go to a `ClientSide`; those that may wait (a permission question) are answered from
//! spawned tasks, never on the dispatch loop.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::AtomicI64;

use agent_client_protocol::v1::schema::{
    PermissionOptionKind, ReadTextFileRequest, ReadTextFileResponse, RequestPermissionOutcome,
    RequestPermissionRequest, RequestPermissionResponse, SelectedPermissionOutcome, SessionNotification,
    WriteTextFileRequest,
};
use agent_client_protocol::{
    Agent, Builder, Client, ConnectionTo, Error, JsonRpcNotification, JsonRpcRequest, RawJsonRpcMessage,
    UntypedMessage, on_receive_notification, on_receive_request,
};
use futures::future::BoxFuture;
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

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
        let builder = Builder::new(Client)
            .name(name)
            .on_receive_request(
                async move |request: RequestPermissionRequest, responder, cx: ConnectionTo<Agent>| {
                    let side = s_permission.clone();
                    cx.spawn(async move {
                        let _ = responder.respond_with_result(side.permission(request).await);
                        Ok(())
                    })
                },
                on_receive_request!(),
            )
            .on_receive_request(
                async move |request: ReadTextFileRequest, responder, cx: ConnectionTo<Agent>| {
                    let side = s_read.clone();
                    cx.spawn(async move {
                        let _ = responder.respond_with_result(side.read_text_file(request).await);
                        Ok(())
                    })
                },
                on_receive_request!(),
            )
            .on_receive_request(
                async move |request: WriteAnsweredNull, responder, cx: ConnectionTo<Agent>| {
                    let side = s_write.clone();
                    cx.spawn(async move {
                        let written = side.write_text_file(request.0).await.map(|()| Value::Null);
                        let _ = responder.respond_with_result(written);
                        Ok(())
                    })
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

    /// Why the connection broke, completing "the agent …".
    pub(crate) fn broken(&self) -> Option<String> {
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
