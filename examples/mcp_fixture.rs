//! The MCP server kin's MCP tests start (`tests/mcp.rs`): rmcp's server side, over stdio, or
//! over streamable HTTP on 127.0.0.1 with `--http` (it prints `listening <addr>` and serves until
//! killed). `cargo test` builds it; it is no part of the kin binary.
//!
//! Tools: `echo {text}` (annotated read-only), `image` (a PNG and a caption), `fail` (a tool
//! error), `slow {seconds}` (sleeps; notes a cancellation), `structured` (structured content
//! only), `env` (the names of its environment variables), `add_tool` (adds `late` and sends a
//! tool-list change), `late`, and `crash` (exits the process mid-call).
//!
//! With `FIXTURE_LOG=<path>` it appends a line per event to that file: `pid <pid>` at start,
//! `call <tool>` when a call arrives, `cancelled <tool>` when one is cancelled, and (HTTP) `auth
//! <value>` for the first request's `Authorization` header.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation, JsonObject, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool, ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use serde_json::{Value, json};

/// A 1×1 PNG.
const PNG: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==";

fn note(line: &str) {
    if let Ok(path) = std::env::var("FIXTURE_LOG")
        && let Ok(mut file) = std::fs::OpenOptions::new().create(true).append(true).open(path)
    {
        let _ = writeln!(file, "{line}");
    }
}

fn schema(value: Value) -> Arc<JsonObject> {
    match value {
        Value::Object(map) => Arc::new(map),
        _ => Arc::new(JsonObject::new()),
    }
}

#[derive(Clone, Default)]
struct Fixture {
    late: Arc<AtomicBool>,
    /// `stall_list` was called: `tools/list` is never answered from then on.
    stalled: Arc<AtomicBool>,
}

impl Fixture {
    fn tools(&self) -> Vec<Tool> {
        let text = json!({"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]});
        let seconds = json!({"type": "object", "properties": {"seconds": {"type": "number"}}});
        let none = json!({"type": "object", "properties": {}});
        let mut tools = vec![
            Tool::new("echo", "Echoes the text back.", schema(text)).annotate(ToolAnnotations::new().read_only(true)),
            Tool::new("image", "Returns a tiny PNG.", schema(none.clone())),
            Tool::new("fail", "Always fails.", schema(none.clone())),
            Tool::new("slow", "Sleeps for the given seconds.", schema(seconds)),
            Tool::new("structured", "Returns structured content only.", schema(none.clone())),
            Tool::new("env", "Lists the names of its environment variables.", schema(none.clone())),
            Tool::new("add_tool", "Adds the tool `late`.", schema(none.clone())),
            Tool::new(
                "stall_list",
                "Says its tool list changed, and never answers `tools/list` again.",
                schema(none.clone()),
            ),
            Tool::new("crash", "Exits the server.", schema(none.clone())),
            Tool::new(
                "huge",
                "Answers with 17 MiB of text, more than a client reads as one message.",
                schema(none.clone()),
            ),
        ];
        if self.late.load(Ordering::SeqCst) {
            tools.push(Tool::new("late", "A tool added later.", schema(none.clone())));
        }
        // `FIXTURE_EXTRA_TOOLS=N`: N more tools, `extra_0` …
        let extra = std::env::var("FIXTURE_EXTRA_TOOLS").ok().and_then(|n| n.parse::<usize>().ok()).unwrap_or(0);
        tools.extend((0..extra).map(|i| Tool::new(format!("extra_{i}"), "An extra tool.", schema(none.clone()))));
        tools
    }
}

fn text(t: impl Into<String>) -> ContentBlock {
    ContentBlock::text(t)
}

impl ServerHandler for Fixture {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().enable_tool_list_changed().build())
            .with_server_info(Implementation::new("kin-mcp-fixture", "1.0.0"))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        note("list");
        if self.stalled.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        Ok(ListToolsResult::with_all_items(self.tools()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let name = request.name.to_string();
        note(&format!("call {name}"));
        let args = request.arguments.unwrap_or_default();
        let result = match name.as_str() {
            "echo" => CallToolResult::success(vec![text(format!("echo: {}", args["text"].as_str().unwrap_or("")))]),
            "image" => CallToolResult::success(vec![text("a red pixel"), ContentBlock::image(PNG, "image/png")]),
            "fail" => CallToolResult::error(vec![text("the fixture failed on purpose")]),
            "slow" => {
                let seconds = args["seconds"].as_f64().unwrap_or(30.0);
                tokio::select! {
                    () = tokio::time::sleep(std::time::Duration::from_secs_f64(seconds)) => {
                        CallToolResult::success(vec![text("slept")])
                    }
                    () = context.ct.cancelled() => {
                        note("cancelled slow");
                        CallToolResult::error(vec![text("cancelled")])
                    }
                }
            }
            "structured" => {
                let mut result = CallToolResult::success(Vec::new());
                result.structured_content = Some(json!({"temperature": 21, "unit": "C"}));
                result
            }
            "env" => {
                let mut names: Vec<String> = std::env::vars().map(|(k, _)| k).collect();
                names.sort();
                CallToolResult::success(vec![text(names.join(","))])
            }
            "add_tool" => {
                self.late.store(true, Ordering::SeqCst);
                let _ = context.peer.notify_tool_list_changed().await;
                CallToolResult::success(vec![text("added late")])
            }
            "stall_list" => {
                self.stalled.store(true, Ordering::SeqCst);
                let _ = context.peer.notify_tool_list_changed().await;
                CallToolResult::success(vec![text("stalled")])
            }
            "late" if self.late.load(Ordering::SeqCst) => CallToolResult::success(vec![text("late tool ran")]),
            "crash" => std::process::exit(3),
            "huge" => CallToolResult::success(vec![text("x".repeat(17 << 20))]),
            _ => return Err(ErrorData::invalid_params(format!("tool not found: {name}"), None)),
        };
        Ok(result.into())
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    note(&format!("pid {}", std::process::id()));
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--http") {
        serve_http().await;
        return;
    }
    eprintln!("fixture: serving on stdio");
    match Fixture::default().serve(rmcp::transport::io::stdio()).await {
        Ok(service) => {
            let _ = service.waiting().await;
        }
        Err(e) => eprintln!("fixture: {e}"),
    }
}

async fn serve_http() {
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use hyper_util::server::conn::auto::Builder;
    use hyper_util::service::TowerToHyperService;
    use rmcp::transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService, session::local::LocalSessionManager,
    };

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind 127.0.0.1");
    let service = StreamableHttpService::new(
        || Ok(Fixture::default()),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default(),
    );
    println!("listening {}", listener.local_addr().expect("local address"));
    let _ = std::io::stdout().flush();
    let seen_auth = Arc::new(AtomicBool::new(false));
    loop {
        let Ok((stream, _)) = listener.accept().await else { return };
        let (service, seen_auth) = (service.clone(), seen_auth.clone());
        tokio::spawn(async move {
            let logging = tower_service_fn(service, seen_auth);
            let _ = Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), TowerToHyperService::new(logging))
                .await;
        });
    }
}

/// Wraps the MCP service: notes the first `Authorization` header it sees.
fn tower_service_fn<S>(inner: S, seen: Arc<AtomicBool>) -> Logged<S> {
    Logged { inner, seen }
}

#[derive(Clone)]
struct Logged<S> {
    inner: S,
    seen: Arc<AtomicBool>,
}

impl<S, B> tower_service::Service<hyper::Request<B>> for Logged<S>
where
    S: tower_service::Service<hyper::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: hyper::Request<B>) -> Self::Future {
        if let Some(auth) = request.headers().get("authorization")
            && !self.seen.swap(true, Ordering::SeqCst)
        {
            note(&format!("auth {}", auth.to_str().unwrap_or("?")));
        }
        self.inner.call(request)
    }
}
