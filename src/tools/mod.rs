//! The tool seam: `trait Tool` (name, description, JSON schema, what a call touches, its title
//! and prompt advice, parallel-safe flag, async execute with cancellation) and the registry the
//! agent loop dispatches through. Errors reach the model as `Error: <message>` with
//! `isError: true`; an unknown name is an error result, not a crash.

pub(crate) mod access;
pub(crate) mod args;
pub(crate) mod bash;
pub(crate) mod builtin;
pub(crate) mod capture;
pub(crate) mod files;
pub(crate) mod fs;
pub(crate) mod image;
pub(crate) mod paths;
pub(crate) mod regular;
pub(crate) mod search;
pub(crate) mod terminal;
pub(crate) mod todo;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use futures::future::BoxFuture;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

pub use access::Access;

use crate::model::{ModelRoute, ToolSchema};
use crate::session::{Event, EventBody, SessionHeader};

/// How long a cancelled tool call may take to wind down (kill processes, cancel children)
/// before its future is dropped, unless the tool says otherwise (`Tool::cancel_grace`).
pub(crate) const CANCEL_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// The agent making a tool call.
#[derive(Debug, Clone)]
pub struct Caller {
    pub header: SessionHeader,
    /// Effective delegation depth: max(header depth, runtime depth).
    pub depth: u64,
    pub route: ModelRoute,
    /// The caller's events through its last `turn/end` (present when a tool asked for history).
    pub history: Option<Arc<Vec<Event>>>,
}

/// What a tool call runs with.
#[derive(Debug, Clone)]
pub struct ToolContext {
    pub session_id: String,
    pub cwd: Option<PathBuf>,
    pub call_id: String,
    pub cancel: CancellationToken,
    /// The calling agent; `None` outside an agent (tests, direct calls).
    pub caller: Option<Arc<Caller>>,
    /// Set by the permission gate when it let this call touch a path outside the workspace; the
    /// file and search tools then skip their own workspace check.
    pub allow_outside: bool,
    /// Set by the permission gate when it let a `bash` call asking for `sandbox: "off"` run
    /// (the user allowed it, or the mode is `bypass`): only then does it run unconfined.
    pub allow_unsandboxed: bool,
    /// Where the file tools read and write text (the editor, over ACP); `None`: the disk.
    pub file_access: Option<Arc<dyn files::FileAccess>>,
    /// Where the call reports what it is doing while it runs; `None` outside an agent.
    pub progress: Option<Progress>,
}

/// The most progress reports one call makes (each a `tool/progress` event, kept in memory,
/// logged and sent to the editor); the last one says that progress stops there.
pub(crate) const MAX_PROGRESS_REPORTS: usize = 120;
/// The most bytes of one progress report: a longer text keeps its first bytes and a note of how
/// many more it had. Twice `bash`'s live tail, so its reports pass whole.
pub(crate) const MAX_PROGRESS_REPORT_BYTES: usize = 8192;
/// How a call's last progress report ends, unless its tool says what shows the rest.
pub(crate) const PROGRESS_STOPS: &str = "[progress stops here; the call's result follows when it ends]";

/// A running call's progress reports: the agent records each as a log-only `tool/progress`
/// event (in order, before the call's result), and the editor shows it on the call. Bounded per
/// call, whatever feeds it (a command's output, a child's tool calls): at most
/// `MAX_PROGRESS_REPORTS` reports of at most `MAX_PROGRESS_REPORT_BYTES` each (and their notes),
/// counted across every clone of the call's `Progress`.
#[derive(Debug, Clone)]
pub struct Progress {
    call_id: String,
    tx: tokio::sync::mpsc::UnboundedSender<(String, String)>,
    /// Reports made so far, shared by the clones.
    made: Arc<AtomicUsize>,
}

impl Progress {
    /// A sink for `call_id` whose reports arrive on `tx` as `(call id, text)`.
    pub fn new(call_id: &str, tx: tokio::sync::mpsc::UnboundedSender<(String, String)>) -> Self {
        Progress { call_id: call_id.to_string(), tx, made: Arc::default() }
    }

    /// True while the call's batch runs (reports still reach it).
    pub fn is_open(&self) -> bool {
        !self.tx.is_closed()
    }

    /// True while the call may make more reports (fewer than `MAX_PROGRESS_REPORTS` so far).
    pub(crate) fn has_room(&self) -> bool {
        self.made.load(Ordering::Relaxed) < MAX_PROGRESS_REPORTS
    }

    /// Reports what the call is doing now: `text` cut to `MAX_PROGRESS_REPORT_BYTES` (with a
    /// note), the call's last report ending with `PROGRESS_STOPS`. Dropped once the call's batch
    /// has ended, or once the call made `MAX_PROGRESS_REPORTS`.
    pub fn report(&self, text: impl Into<String>) {
        self.report_ending(text, PROGRESS_STOPS);
    }

    /// [`report`](Self::report), the call's last report ending with `end` instead (what the
    /// call shows from then on).
    pub(crate) fn report_ending(&self, text: impl Into<String>, end: &str) {
        let Some(last) = self.take_report() else {
            return;
        };
        let text: String = text.into();
        let mut text = capture::cut(&text, MAX_PROGRESS_REPORT_BYTES);
        if last {
            text.push('\n');
            text.push_str(end);
        }
        let _ = self.tx.send((self.call_id.clone(), text));
    }

    /// Counts one more report: `None` when the call has made all it may, else whether this one
    /// is its last.
    fn take_report(&self) -> Option<bool> {
        let room = |made: usize| (made < MAX_PROGRESS_REPORTS).then_some(made + 1);
        let before = self.made.fetch_update(Ordering::Relaxed, Ordering::Relaxed, room).ok()?;
        Some(before + 1 == MAX_PROGRESS_REPORTS)
    }
}

impl ToolContext {
    /// A context without a calling agent.
    pub fn detached(cwd: Option<PathBuf>, cancel: CancellationToken) -> Self {
        ToolContext {
            session_id: String::new(),
            cwd,
            call_id: String::new(),
            cancel,
            caller: None,
            allow_outside: false,
            allow_unsandboxed: false,
            file_access: None,
            progress: None,
        }
    }
}

/// A tool's answer: content blocks for the model, plus log-only events the agent records
/// just before the result (e.g. `todo/write`), plus `meta` for the editor (recorded as the
/// result's `data.meta`, e.g. `{"diff": {path, oldText, newText}}` of write and edit).
#[derive(Debug, Clone, PartialEq)]
pub struct ToolOutput {
    pub content: Vec<Value>,
    pub events: Vec<EventBody>,
    pub meta: Option<Value>,
}

impl ToolOutput {
    pub fn text(text: impl Into<String>) -> Self {
        ToolOutput { content: vec![json!({"type": "text", "text": text.into()})], events: Vec::new(), meta: None }
    }

    /// Sets the result's `meta` (never shown to the model).
    pub fn with_meta(mut self, meta: Value) -> Self {
        self.meta = Some(meta);
        self
    }

    /// Adds a log-only event recorded with the result.
    pub fn with_event(mut self, body: impl Into<EventBody>) -> Self {
        self.events.push(body.into());
        self
    }
}

/// The most bytes of a tool error's message kept (`ToolError::named`).
pub(crate) const MAX_ERROR_BYTES: usize = 8192;
/// The most characters of a call's title shown to the editor (`ToolRegistry::shown`); the call's
/// arguments go with it whole.
pub(crate) const MAX_CALL_TITLE_CHARS: usize = 1000;

/// A failed tool call: the message the model reads, plus a name and stable code for the log.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolError {
    pub name: String,
    pub code: String,
    pub message: String,
    /// Log-only events recorded with the failed result (as `ToolOutput::events`).
    pub events: Vec<EventBody>,
}

impl ToolError {
    pub fn new(code: &str, message: impl Into<String>) -> Self {
        Self::named("ToolError", code, message)
    }

    /// An error with its own name (`AbortError`, `PermissionError`, ...). The message is cut at
    /// `MAX_ERROR_BYTES` with a note: an error may quote what the model sent (an id, a tool name),
    /// which is only as short as the model made it.
    pub fn named(name: &str, code: &str, message: impl Into<String>) -> Self {
        let message = message.into();
        let message = if message.len() > MAX_ERROR_BYTES { capture::cut(&message, MAX_ERROR_BYTES) } else { message };
        ToolError { name: name.into(), code: code.into(), message, events: Vec::new() }
    }

    /// An error whose message its maker bounded (a command's output before its timeout, already
    /// cut to its head and tail with a note): not cut again at `MAX_ERROR_BYTES`, which would drop
    /// the tail, where a hung command shows where it hung.
    pub(crate) fn bounded(code: &str, message: String) -> Self {
        ToolError { name: "ToolError".into(), code: code.into(), message, events: Vec::new() }
    }

    /// Adds a log-only event recorded with the failed result.
    pub fn with_event(mut self, body: impl Into<EventBody>) -> Self {
        self.events.push(body.into());
        self
    }
}

/// A capability the model can call. Besides running, a tool says what a call touches (`access`,
/// which the permission gate decides on), how the call is titled and what the system prompt
/// advises about it: nothing elsewhere knows a tool by its name.
pub trait Tool: Send + Sync {
    fn name(&self) -> &str;
    fn description(&self) -> String;
    /// JSON Schema of the arguments object.
    fn parameters(&self) -> Value;
    /// What a call with these arguments touches (`Null` when they are not JSON). No default:
    /// every tool says, and anything not declared a read in the workspace is asked about.
    fn access(&self, arguments: &Value) -> Access;
    /// What a remembered "always" answer about this call is kept under, or `None` when none is
    /// (the call is asked about each time): by default the tool's name. A tool whose name may
    /// come to stand for another tool (an MCP server's, when another server takes its name) says
    /// where it comes from.
    fn remembered_as(&self, _arguments: &Value) -> Option<String> {
        Some(self.name().to_string())
    }
    /// What a call does, in a few words: its one title, shown by the editor on the call, in its
    /// permission dialog and as a parent's progress.
    fn title(&self, _arguments: &Value) -> String {
        self.name().to_string()
    }
    /// Advice for the system prompt's "Using the tools" list (after `<name>: `).
    fn guidance(&self) -> Option<&'static str> {
        None
    }
    /// The error a call with these arguments fails with before it touches anything, if it does:
    /// the gate returns it rather than ask the user about a call that cannot run. By default
    /// nothing is refused here, so such a call is asked about like any other.
    fn check(&self, _arguments: &Value) -> Result<(), ToolError> {
        Ok(())
    }
    /// True when calls may run concurrently with other parallel-safe calls of the same step.
    fn parallel_safe(&self) -> bool {
        false
    }
    /// How long a cancelled call may take to end with its own result before it is abandoned.
    fn cancel_grace(&self) -> std::time::Duration {
        CANCEL_GRACE
    }
    /// True when the tool needs the caller's completed history (`Caller::history`).
    fn needs_history(&self) -> bool {
        false
    }
    /// Takes back what the tool keeps of a session in memory, when the session is loaded: it is
    /// given each call of it the log records as successful, in order (`cwd`: the session's).
    /// By default the tool keeps nothing.
    fn restore(&self, _session: &str, _cwd: &std::path::Path, _arguments: &Value) {}
    fn execute(&self, arguments: Value, ctx: ToolContext) -> BoxFuture<'static, Result<ToolOutput, ToolError>>;
}

/// Tools that come and go while a session lives (an MCP server's): each step takes them as they
/// are when it starts (`ToolRegistry::snapshot`).
pub trait ToolSource: Send + Sync {
    /// The tools offered now. May wait (bounded) until they are known; stops waiting when
    /// `cancel` fires.
    fn tools(&self, cancel: CancellationToken) -> BoxFuture<'static, Vec<Arc<dyn Tool>>>;
}

/// Which names a source's tools may have in one agent (a child's tool filter).
pub(crate) type Keep = Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// The tools of one agent, by name (sorted, so the model sees a stable list), remembering the
/// order they were registered in (the order of their advice in the system prompt), and the
/// sources whose tools join them at each step.
#[derive(Clone, Default)]
pub struct ToolRegistry {
    tools: BTreeMap<String, Arc<dyn Tool>>,
    order: Vec<String>,
    sources: Vec<(Arc<dyn ToolSource>, Option<Keep>)>,
}

impl ToolRegistry {
    pub fn new() -> Self {
        Self::default()
    }

    /// Gives each tool back what it keeps of `session` when it is loaded from its log or seeded
    /// with another's events (`Tool::restore`): every call of it the events record as successful,
    /// in the order of their results, with the directory they ran in (`cwd`).
    pub fn restore(&self, session: &str, cwd: &std::path::Path, events: &[Event]) {
        let mut calls = std::collections::HashMap::new();
        for event in events {
            if let Some(call) = event.get::<crate::session::event::ToolCall>() {
                if self.tools.contains_key(&call.name) {
                    calls.insert(call.call_id, (call.name, call.arguments));
                }
                continue;
            }
            let Some(outcome) = crate::session::event::ToolOutcome::of(event) else { continue };
            let Some((name, arguments)) = calls.remove(&outcome.call_id) else { continue };
            if outcome.failed {
                continue;
            }
            if let (Some(tool), Ok(arguments)) = (self.get(&name), serde_json::from_str::<Value>(&arguments)) {
                tool.restore(session, cwd, &arguments);
            }
        }
    }

    /// Adds `tool`; one of the same name is replaced (and keeps its place in the order).
    pub fn register(&mut self, tool: Arc<dyn Tool>) {
        let name = tool.name().to_string();
        if self.tools.insert(name.clone(), tool).is_none() {
            self.order.push(name);
        }
    }

    /// Adds a source whose tools join at each step; `keep` limits them by name.
    pub fn add_source(&mut self, source: Arc<dyn ToolSource>, keep: Option<Keep>) {
        self.sources.push((source, keep));
    }

    /// The tools for one step: these, plus each source's current tools that its filter keeps
    /// and whose names are free (a name already taken keeps its first tool).
    pub async fn snapshot(&self, cancel: &CancellationToken) -> ToolRegistry {
        let mut step = ToolRegistry { tools: self.tools.clone(), order: self.order.clone(), sources: Vec::new() };
        for (source, keep) in &self.sources {
            for tool in source.tools(cancel.clone()).await {
                let name = tool.name().to_string();
                if keep.as_ref().is_some_and(|keep| !keep(&name)) {
                    continue;
                }
                if step.tools.contains_key(&name) {
                    tracing::warn!(tool = %name, "a tool of that name exists already; the new one is left out");
                    continue;
                }
                step.order.push(name.clone());
                step.tools.insert(name, tool);
            }
        }
        step
    }

    pub fn get(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.tools.get(name)
    }

    pub fn schemas(&self) -> Vec<ToolSchema> {
        self.tools
            .values()
            .map(|t| ToolSchema {
                name: t.name().to_string(),
                description: t.description(),
                parameters: t.parameters(),
            })
            .collect()
    }

    /// A copy holding only the tools `keep` accepts, without sources (add them again with their
    /// own filter).
    pub fn filtered(&self, keep: impl Fn(&str) -> bool) -> ToolRegistry {
        let tools = self.tools.iter().filter(|(name, _)| keep(name)).map(|(n, t)| (n.clone(), t.clone())).collect();
        let order = self.order.iter().filter(|name| keep(name)).cloned().collect();
        ToolRegistry { tools, order, sources: Vec::new() }
    }

    /// How a call of `name` is shown: its title and what it touches. A name this registry does
    /// not hold (a call recorded by a tool since removed, a child's own tool, a session's MCP
    /// tool) is titled by its name (an MCP tool's names its server and tool) and touches
    /// something kin cannot see into.
    /// The title is cut at `MAX_CALL_TITLE_CHARS`, `…` marking the cut (a command or a name the
    /// model wrote may be any length).
    pub fn shown(&self, name: &str, arguments: &Value) -> (String, Access) {
        let (title, access) = match self.get(name) {
            Some(tool) => (tool.title(arguments), tool.access(arguments)),
            None => (crate::mcp::call_title(name, arguments).unwrap_or_else(|| name.to_string()), Access::External),
        };
        (crate::session::cut_chars(&shown_on_one_line(&title), MAX_CALL_TITLE_CHARS), access)
    }

    /// Each tool's prompt advice as `(name, advice)`, in registration order.
    pub fn guidance(&self) -> Vec<(String, &'static str)> {
        self.order.iter().filter_map(|name| Some((name.clone(), self.tools.get(name)?.guidance()?))).collect()
    }

    /// The names of the tools held now (a source's tools are known only in a step's snapshot).
    pub fn names(&self) -> Vec<String> {
        self.tools.keys().cloned().collect()
    }

    /// True when `name` is known and parallel-safe.
    pub fn is_parallel_safe(&self, name: &str) -> bool {
        self.get(name).is_some_and(|t| t.parallel_safe())
    }

    /// Runs one call; every failure becomes a `ToolError` (unknown tool, bad JSON, the tool's own).
    pub async fn call(&self, name: &str, raw_arguments: &str, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let Some(tool) = self.get(name).cloned() else {
            return Err(unknown_tool(name));
        };
        let arguments = parse_arguments(name, raw_arguments)?;
        let cancel = ctx.cancel.clone();
        let grace = tool.cancel_grace();
        let run = tool.execute(arguments, ctx);
        tokio::pin!(run);
        tokio::select! {
            result = &mut run => result,
            () = cancel.cancelled() => {
                // Let the tool wind down (it sees the same token) and report what really
                // happened; a tool that does not finish within the grace is abandoned.
                match tokio::time::timeout(grace, &mut run).await {
                    Ok(result) => result,
                    Err(_) => Err(args::aborted()),
                }
            }
        }
    }
}

/// A character that hides or reorders the text around it when shown (bidi overrides and
/// isolates, zero-width characters): a command shown for approval writes it as its escape, so
/// `echo a\u{202e}rm -rf\u{202c} b` is not displayed as something else.
pub(crate) fn reorders_or_hides(c: char) -> bool {
    matches!(c, '\u{061c}' | '\u{180e}' | '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2060}'..='\u{2064}' | '\u{2066}'..='\u{2069}' | '\u{feff}')
}

/// `text` (lines of it: a command) with each character that would not show as itself written as
/// its escape: [`reorders_or_hides`] ones, and control characters but the line break and the tab
/// (a carriage return or an escape sequence could overwrite what was shown before it).
pub(crate) fn shown_plainly(text: &str) -> std::borrow::Cow<'_, str> {
    escaped_where(text, |c| (c.is_control() && c != '\n' && c != '\t') || reorders_or_hides(c))
}

/// `text` as one line shown as it is: every control character (line breaks too) and every
/// [`reorders_or_hides`] one written as its escape (a title, a path in a dialog).
pub(crate) fn shown_on_one_line(text: &str) -> std::borrow::Cow<'_, str> {
    escaped_where(text, |c| c.is_control() || reorders_or_hides(c))
}

/// `text` with each character `escape` picks written as its escape (`\u{1b}`); borrowed when
/// there is none.
pub(crate) fn escaped_where(text: &str, escape: impl Fn(char) -> bool) -> std::borrow::Cow<'_, str> {
    if !text.contains(&escape) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if escape(c) {
            out.extend(c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// The error of a call naming a tool the agent does not have.
pub(crate) fn unknown_tool(name: &str) -> ToolError {
    let why = if crate::mcp::is_mcp_tool(name) {
        " (its MCP server is not running now, or no longer offers it: use the tools offered in this step)"
    } else {
        ""
    };
    ToolError::new("UNKNOWN_TOOL", format!("unknown tool \"{name}\"{why}"))
}

/// A call's arguments as JSON (`{}` when blank); not JSON is the call's error.
pub(crate) fn parse_arguments(name: &str, raw: &str) -> Result<Value, ToolError> {
    if raw.trim().is_empty() {
        return Ok(json!({}));
    }
    serde_json::from_str(raw)
        .map_err(|e| ToolError::new("INVALID_ARGUMENTS", format!("arguments for {name} are not valid JSON: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tool that only says what it is.
    struct Named(&'static str, Option<&'static str>);

    impl Tool for Named {
        fn name(&self) -> &str {
            self.0
        }
        fn description(&self) -> String {
            String::new()
        }
        fn parameters(&self) -> Value {
            json!({"type": "object"})
        }
        fn access(&self, _arguments: &Value) -> Access {
            Access::External
        }
        fn guidance(&self) -> Option<&'static str> {
            self.1
        }
        fn execute(&self, _arguments: Value, _ctx: ToolContext) -> BoxFuture<'static, Result<ToolOutput, ToolError>> {
            Box::pin(async { Ok(ToolOutput::text("")) })
        }
    }

    /// A tool that, once cancelled, takes `wind_down` to end with its own result, and gives
    /// itself `grace` for it.
    struct Slow {
        wind_down: std::time::Duration,
        grace: std::time::Duration,
    }

    impl Tool for Slow {
        fn name(&self) -> &str {
            "slow"
        }
        fn description(&self) -> String {
            String::new()
        }
        fn parameters(&self) -> Value {
            json!({"type": "object"})
        }
        fn access(&self, _arguments: &Value) -> Access {
            Access::External
        }
        fn cancel_grace(&self) -> std::time::Duration {
            self.grace
        }
        fn execute(&self, _arguments: Value, ctx: ToolContext) -> BoxFuture<'static, Result<ToolOutput, ToolError>> {
            let wind_down = self.wind_down;
            Box::pin(async move {
                ctx.cancel.cancelled().await;
                tokio::time::sleep(wind_down).await;
                Ok(ToolOutput::text("wound down"))
            })
        }
    }

    /// A cancelled call ends with its own result when it winds down within its tool's grace (an
    /// external agent's run, whose result is recorded), and is abandoned past it.
    #[tokio::test(start_paused = true)]
    async fn a_cancelled_call_gets_its_tools_grace_to_end() {
        let secs = std::time::Duration::from_secs;
        for (grace, expected) in [(CANCEL_GRACE, Err("ABORTED")), (secs(9), Ok("wound down"))] {
            let mut registry = ToolRegistry::new();
            registry.register(Arc::new(Slow { wind_down: secs(3), grace }));
            let cancel = CancellationToken::new();
            cancel.cancel();
            let result = registry.call("slow", "{}", ToolContext::detached(None, cancel)).await;
            let got =
                result.as_ref().map(|o| o.content[0]["text"].as_str().unwrap_or_default()).map_err(|e| e.code.as_str());
            assert_eq!(got, expected, "grace {grace:?}");
        }
    }

    #[test]
    fn advice_keeps_the_registration_order_and_the_schemas_stay_sorted() {
        let mut registry = ToolRegistry::new();
        registry.register(Arc::new(Named("zeta", Some("last name, first advice"))));
        registry.register(Arc::new(Named("alpha", None)));
        registry.register(Arc::new(Named("mid", Some("second"))));
        registry.register(Arc::new(Named("zeta", Some("replaced in place"))));
        let names: Vec<String> = registry.schemas().into_iter().map(|s| s.name).collect();
        assert_eq!(names, ["alpha", "mid", "zeta"]);
        assert_eq!(registry.guidance(), [("zeta".to_string(), "replaced in place"), ("mid".to_string(), "second")]);
        let filtered = registry.filtered(|name| name != "zeta");
        assert_eq!(filtered.guidance(), [("mid".to_string(), "second")]);
    }

    /// What the model sent comes back in an error or a title only so long: a 3 MB tool name
    /// gives an error of at most `MAX_ERROR_BYTES` saying how much was cut, and a title of
    /// `MAX_CALL_TITLE_CHARS` ending in `…`.
    #[test]
    fn an_error_or_title_quoting_what_the_model_sent_is_cut_and_says_so() {
        let name = "z".repeat(3 << 20);
        let error = unknown_tool(&name);
        assert!(error.message.len() <= MAX_ERROR_BYTES + 64, "{}", error.message.len());
        assert!(error.message.starts_with("unknown tool \"zzz"), "{}", &error.message[..40]);
        let note =
            format!("[... {} more bytes not shown ...]", "unknown tool \"\"".len() + name.len() - MAX_ERROR_BYTES);
        assert!(error.message.ends_with(&note), "{}", &error.message[error.message.len() - 60..]);
        let (title, _) = ToolRegistry::new().shown(&name, &json!({}));
        assert_eq!(title.chars().count(), MAX_CALL_TITLE_CHARS);
        assert!(title.ends_with('…'));
        let short = ToolRegistry::new().shown("a", &json!({})).0;
        assert_eq!(short, "a", "a short title is whole");
        let exact = "é".repeat(MAX_CALL_TITLE_CHARS);
        assert_eq!(crate::session::cut_chars(&exact, MAX_CALL_TITLE_CHARS), exact, "exactly the limit is not cut");
    }

    /// A title is shown as one line of what it says: a file named to read backwards
    /// (`notes\u{202e}txt.sh` shows as "noteshs.txt") or holding a line break or an escape
    /// sequence is written with their escapes, whichever tool made the title.
    #[test]
    fn titles_show_hiding_and_control_characters_as_escapes() {
        let mut registry = ToolRegistry::new();
        crate::tools::builtin::register_coding_tools(&mut registry, crate::tools::fs::FileState::default());
        let (title, _) = registry.shown("write", &json!({"file_path": "notes\u{202e}txt.sh", "content": ""}));
        assert_eq!(title, "Write notes\\u{202e}txt.sh");
        let (title, _) = registry.shown("read", &json!({"file_path": "a\nb\u{1b}[2K.txt"}));
        assert!(!title.contains(|c: char| c.is_control()) && title.contains("\\u{a}b\\u{1b}[2K"), "{title}");
    }

    #[test]
    fn progress_is_capped_per_call_in_number_and_size_and_the_last_report_says_so() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let progress = Progress::new("c", tx);
        progress.report("short");
        assert_eq!(rx.try_recv().unwrap(), ("c".to_string(), "short".to_string()));
        // A clone is the same call: it shares the count.
        let clone = progress.clone();
        // A character straddling the cut is left out whole.
        let long = format!("{}é{}", "a".repeat(MAX_PROGRESS_REPORT_BYTES - 1), "b".repeat(1 << 20));
        for _ in 0..1000 {
            clone.report(long.as_str());
            progress.report(long.as_str());
        }
        assert!(!progress.has_room() && !clone.has_room());
        let reports: Vec<String> = std::iter::from_fn(|| rx.try_recv().ok()).map(|(_, text)| text).collect();
        assert_eq!(reports.len(), MAX_PROGRESS_REPORTS - 1, "the first report counts too");
        let kept = "a".repeat(MAX_PROGRESS_REPORT_BYTES - 1);
        let cut = format!("{kept}\n[... {} more bytes not shown ...]", (1 << 20) + 2);
        assert_eq!(reports[0], cut);
        assert!(reports.iter().all(|r| r.len() <= MAX_PROGRESS_REPORT_BYTES + 200), "every report is cut");
        assert_eq!(reports.last().unwrap(), &format!("{cut}\n{PROGRESS_STOPS}"));
        progress.report("more");
        assert!(rx.try_recv().is_err(), "no report past the cap");
    }

    #[test]
    fn a_tool_may_end_its_last_progress_report_in_its_own_words() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let progress = Progress::new("c", tx);
        for n in 0..MAX_PROGRESS_REPORTS {
            progress.report_ending(n.to_string(), "[the result shows the rest]");
        }
        let reports: Vec<String> = std::iter::from_fn(|| rx.try_recv().ok()).map(|(_, text)| text).collect();
        assert_eq!(reports.len(), MAX_PROGRESS_REPORTS);
        assert_eq!(reports[MAX_PROGRESS_REPORTS - 2], (MAX_PROGRESS_REPORTS - 2).to_string());
        let last = format!("{}\n[the result shows the rest]", MAX_PROGRESS_REPORTS - 1);
        assert_eq!(reports[MAX_PROGRESS_REPORTS - 1], last);
    }

    #[test]
    fn a_name_the_registry_does_not_hold_is_shown_by_name_and_touches_the_unknown() {
        let registry = ToolRegistry::new();
        assert_eq!(registry.shown("report", &json!({"message": "m"})), ("report".to_string(), Access::External));
        assert_eq!(parse_arguments("t", " ").unwrap(), json!({}));
        assert_eq!(parse_arguments("t", "{").unwrap_err().code, "INVALID_ARGUMENTS");
    }
}
