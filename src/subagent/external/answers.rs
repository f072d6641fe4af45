//! How kin answers an external agent during one run, under the configured policy: its permission
//! requests (by policy, which allows only reads and searches of paths inside the working
//! directory, or forwarded to the parent's editor; the answer goes back as the agent's option of
//! the same kind or a narrower one, never a wider one), its `fs/read_text_file` and
//! `fs/write_text_file` requests (served inside the run's working directory only, regular files
//! only through `tools::regular`, never blocking on a FIFO), and what it streams: its answer text,
//! kept bounded (head and tail, like `bash`), and its tool calls, reported as progress on the
//! delegating call (within the call's cap on progress, `tools::Progress`). A write is served only
//! while the session's permission mode allows it: an edit the editor allowed earlier never
//! overrides read-only.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};

use futures::FutureExt;
use futures::future::BoxFuture;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::AcpPermission;
use super::port::{OfferKind, PermissionAsk, PermissionChoice, PermissionOffer, Refusal, RefusalKind, RemoteAnswers};
use crate::permission::{CallShown, PermissionAnswer, PermissionPrompt, PermissionRequest};
use crate::tools::capture::{Capture, Limits};
use crate::tools::regular::{open_regular, write_regular};
use crate::tools::{Access, Progress};

/// The agent's answer text keeps what any child's does (`subagent::OUTPUT_LIMITS`).
pub(crate) const OUTPUT_LIMITS: Limits = crate::subagent::OUTPUT_LIMITS;
/// The largest file served to the agent (`fs/read_text_file`), about the size of a frame it may send.
pub(crate) const MAX_SERVED_FILE: u64 = 16 << 20;

/// Where `forward` asks: the parent's editor, on the parent's session and the delegating tool
/// call; the run's cancellation withdraws an open question.
pub(crate) struct Forward {
    pub(crate) editor: std::sync::Arc<dyn PermissionPrompt>,
    pub(crate) session_id: String,
    pub(crate) call_id: String,
    /// How the editor shows the delegating call, shown again once a question was answered.
    pub(crate) call: CallShown,
    pub(crate) cancel: CancellationToken,
}

impl Forward {
    /// Asks the editor `request`; `None` when the run was cancelled first.
    async fn ask(&self, request: PermissionRequest) -> Option<PermissionAnswer> {
        tokio::select! {
            answer = self.editor.ask(request) => Some(answer),
            () = self.cancel.cancelled() => None,
        }
    }
}

struct State {
    output: Capture,
    /// Writes the editor allowed through `forward` and the agent has not made yet.
    write_grants: u32,
    /// The editor allowed the agent's edits always.
    writes_always: bool,
}

/// What the agent asks about.
struct Asked<'a> {
    /// Its call's ACP kind.
    kind: &'a str,
    title: &'a str,
    raw_input: Value,
    access: Access,
    /// Every path it names lies in the working directory (and it names some).
    in_workspace: bool,
}

/// The answers of one run.
pub(crate) struct Answers {
    provider: String,
    policy: AcpPermission,
    /// Set for `forward` when there is an editor to ask.
    forward: Option<Forward>,
    /// The delegating call's progress: each tool call the agent starts is reported there.
    progress: Option<Progress>,
    /// The real working directory: file requests must stay inside it.
    root: PathBuf,
    state: Mutex<State>,
}

impl Answers {
    pub(crate) fn new(
        provider: &str,
        policy: AcpPermission,
        forward: Option<Forward>,
        progress: Option<Progress>,
        root: PathBuf,
    ) -> Self {
        let state = State { output: Capture::new(OUTPUT_LIMITS), write_grants: 0, writes_always: false };
        Answers { provider: provider.to_string(), policy, forward, progress, root, state: Mutex::new(state) }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether kin serves writes (only `forward` with an editor asks about them).
    pub(crate) fn serves_writes(&self) -> bool {
        self.forward.is_some()
    }

    /// The agent's answer text so far, head and tail when it is longer than `OUTPUT_LIMITS`.
    pub(crate) fn output(&self) -> String {
        self.lock().output.render()
    }

    /// `forward`: asks the editor about the agent's tool call and passes the answer on as the
    /// agent's option of the same kind, or a narrower one (`passed_on`). An allowed edit the agent
    /// is told it may make lets it write once (always, for "allow always"); a run cancelled while
    /// the question is open answers `cancelled`.
    async fn forward_permission(&self, forward: &Forward, ask: PermissionAsk) -> PermissionChoice {
        let title = ask.title.as_deref().filter(|t| !t.trim().is_empty()).unwrap_or("a tool call");
        // The paths the question is really about, when the title may not say them: every one
        // not in the working directory (the agent's title is its own word).
        let root = [self.root.clone()];
        let elsewhere: Vec<String> = ask
            .paths
            .iter()
            .filter(|p| !crate::tools::paths::inside_workspace(&root, p))
            .map(|p| p.display().to_string())
            .chain(ask.opaque.iter().cloned())
            .collect();
        let title = match elsewhere.as_slice() {
            [] => title.to_string(),
            named => format!(
                "{title} (it names {}: not known to be in the working directory)",
                crate::session::cut_chars(&named.join(", "), 500)
            ),
        };
        let title = title.as_str();
        let in_workspace = names_only_workspace_paths(&self.root, &ask);
        let asked =
            Asked { kind: ask.kind, title, raw_input: ask.raw_input.clone(), access: ask.access.clone(), in_workspace };
        let Some(answer) = forward.ask(self.request(forward, asked)).await else {
            return PermissionChoice::Cancelled;
        };
        let offer = offered(&ask, passed_on(answer));
        // An allow the agent was not told of (it offers no option for it) grants no write.
        if ask.kind == "edit" && offer.is_some_and(|o| lets_go_ahead(o.kind)) {
            let mut state = self.lock();
            match answer {
                PermissionAnswer::AllowOnce => state.write_grants += 1,
                PermissionAnswer::AllowAlways => state.writes_always = true,
                PermissionAnswer::RejectOnce | PermissionAnswer::RejectAlways | PermissionAnswer::Dismissed => {}
            }
        }
        chosen(offer)
    }

    /// The question about `asked` on the delegating call, titled with the provider's name.
    fn request(&self, forward: &Forward, asked: Asked<'_>) -> PermissionRequest {
        PermissionRequest {
            session_id: forward.session_id.clone(),
            call_id: forward.call_id.clone(),
            tool: asked.kind.to_string(),
            title: format!("{}: {}", self.provider, asked.title),
            raw_input: asked.raw_input,
            access: asked.access,
            cwd: self.root.clone(),
            in_workspace: asked.in_workspace,
            keeps_always: true,
            on_behalf_of: Some(forward.call.clone()),
            unannounced: false,
        }
    }

    fn refused(&self, what: &str, why: &str) -> Refusal {
        let message = format!(
            "{what} is refused: subagent provider \"{}\" has permission \"{}\"{why}",
            self.provider,
            self.policy.id()
        );
        Refusal::new(RefusalKind::Internal, message)
    }

    /// `fs/write_text_file` inside the working directory, under `forward` only, once
    /// `admit_write` lets it through.
    async fn write(&self, path: PathBuf, content: String) -> Result<(), Refusal> {
        let Some(forward) = &self.forward else {
            return Err(self.refused("writing files", ", which allows no writes"));
        };
        let target = confined_new(&self.root, &path).await?;
        let shown = path.display().to_string();
        self.admit_write(forward, &shown, &target).await?;
        let written = tokio::task::spawn_blocking(move || write_regular(&target, content.as_bytes())).await;
        match written {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::InvalidInput => {
                Err(Refusal::new(RefusalKind::Internal, e.to_string()))
            }
            Ok(Err(e)) => Err(Refusal::new(RefusalKind::Internal, format!("cannot write {shown}: {e}"))),
            Err(e) => Err(Refusal::new(RefusalKind::Internal, format!("cannot write {shown}: {e}"))),
        }
    }

    /// Whether the agent may write `target` (`shown` as it named it). The session's permission
    /// mode answers first, as it is now: a read-only session refuses the write whatever the
    /// editor allowed before. Where the mode would ask, an edit the editor allowed just before
    /// (or always) lets the write through; else the editor is asked about this write.
    async fn admit_write(&self, forward: &Forward, shown: &str, target: &Path) -> Result<(), Refusal> {
        let granted = self.take_grant();
        let title = format!("Write {shown}");
        let access = Access::Edit { paths: vec![target.to_path_buf()] };
        let asked =
            Asked { kind: "edit", title: &title, raw_input: json!({"path": shown}), access, in_workspace: true };
        let request = self.request(forward, asked);
        let refusal = |who: &str| Refusal::new(RefusalKind::Internal, format!("{who} writing {shown}"));
        if let Some(answer) = forward.editor.decided_by_mode(&request) {
            return if allows(answer) { Ok(()) } else { Err(refusal("the session's permission mode refuses")) };
        }
        if granted {
            return Ok(());
        }
        let answer = forward.ask(request).await.unwrap_or(PermissionAnswer::Dismissed);
        if answer == PermissionAnswer::AllowAlways {
            self.lock().writes_always = true;
        }
        if allows(answer) { Ok(()) } else { Err(refusal("the user rejected")) }
    }

    /// Uses up what the editor allowed for one write: true when it allowed the agent's edits
    /// always, or an edit not written yet.
    fn take_grant(&self) -> bool {
        let mut state = self.lock();
        let granted = state.writes_always || state.write_grants > 0;
        state.write_grants = state.write_grants.saturating_sub(1);
        granted
    }

    /// `fs/read_text_file` inside the working directory: a regular file of at most
    /// `MAX_SERVED_FILE` bytes, whole or the window of `limit` lines from 1-based `line`.
    async fn read(&self, path: PathBuf, line: Option<u32>, limit: Option<u32>) -> Result<String, Refusal> {
        if !self.policy.allows_reads() {
            return Err(self.refused("reading files", ""));
        }
        let real = confined(&self.root, &path).await?;
        let shown = path.display().to_string();
        let text = tokio::task::spawn_blocking(move || read_regular_text(&real, &shown))
            .await
            .map_err(|e| Refusal::new(RefusalKind::Internal, format!("the read failed: {e}")))??;
        Ok(match (line, limit) {
            (None, None) => text,
            _ => {
                let skip = usize::try_from(line.unwrap_or(1).saturating_sub(1)).unwrap_or(usize::MAX);
                let take = limit.map_or(usize::MAX, |l| usize::try_from(l).unwrap_or(usize::MAX));
                text.split_inclusive('\n').skip(skip).take(take).collect()
            }
        })
    }
}

impl RemoteAnswers for Answers {
    fn permission(&self, ask: PermissionAsk) -> BoxFuture<'_, PermissionChoice> {
        async move {
            match &self.forward {
                Some(forward) => self.forward_permission(forward, ask).await,
                None => permission_answer(self.policy, &self.root, &ask),
            }
        }
        .boxed()
    }

    fn read_text_file(
        &self,
        path: PathBuf,
        line: Option<u32>,
        limit: Option<u32>,
    ) -> BoxFuture<'_, Result<String, Refusal>> {
        self.read(path, line, limit).boxed()
    }

    fn write_text_file(&self, path: PathBuf, content: String) -> BoxFuture<'_, Result<(), Refusal>> {
        self.write(path, content).boxed()
    }

    fn text(&self, text: &str) {
        self.lock().output.push(text.as_bytes());
    }

    fn tool_call(&self, title: &str) {
        // Past the call's cap nothing is reported: a long title is not even copied.
        if let Some(progress) = &self.progress
            && progress.has_room()
            && !title.trim().is_empty()
        {
            progress.report(format!("{}: {title}", self.provider));
        }
    }
}

/// The answer to a permission request without an editor, passed on as `passed_on` says: "allow
/// once" for a read or a search when the policy allows reads and every path the call names lies
/// in the working directory `root`, else "reject once". A call naming no path is rejected: its
/// kind and paths are the agent's word, and what it would read is not known.
fn permission_answer(policy: AcpPermission, root: &Path, ask: &PermissionAsk) -> PermissionChoice {
    let allow = policy.allows_reads() && matches!(ask.kind, "read" | "search") && names_only_workspace_paths(root, ask);
    let answer = if allow { PermissionAnswer::AllowOnce } else { PermissionAnswer::RejectOnce };
    chosen(offered(ask, passed_on(answer)))
}

/// The kinds of the agent's options that pass `answer` on, in order of preference: its own kind,
/// else one that narrows it ("allow always" as `allow_once`; a rejection as the other rejection),
/// never one that widens it. "Allow once" is never passed on as `allow_always`: the agent would
/// stop asking, and later answers and mode changes would never reach it. Without an
/// `allow_once` it is `reject_once`, not `reject_always`, which the agent would keep for good
/// though the user allowed the call. Nothing fitting offered: `cancelled` (`chosen`).
fn passed_on(answer: PermissionAnswer) -> &'static [OfferKind] {
    match answer {
        PermissionAnswer::AllowOnce => &[OfferKind::AllowOnce, OfferKind::RejectOnce],
        PermissionAnswer::AllowAlways => &[OfferKind::AllowAlways, OfferKind::AllowOnce],
        PermissionAnswer::RejectOnce | PermissionAnswer::Dismissed => &[OfferKind::RejectOnce, OfferKind::RejectAlways],
        PermissionAnswer::RejectAlways => &[OfferKind::RejectAlways, OfferKind::RejectOnce],
    }
}

/// Whether the agent's option of `kind` lets it go ahead.
fn lets_go_ahead(kind: OfferKind) -> bool {
    match kind {
        OfferKind::AllowOnce | OfferKind::AllowAlways => true,
        OfferKind::RejectOnce | OfferKind::RejectAlways => false,
    }
}

/// Whether `answer` lets the agent go ahead.
fn allows(answer: PermissionAnswer) -> bool {
    match answer {
        PermissionAnswer::AllowOnce | PermissionAnswer::AllowAlways => true,
        PermissionAnswer::RejectOnce | PermissionAnswer::RejectAlways | PermissionAnswer::Dismissed => false,
    }
}

/// The first offered option whose kind is in `preferred` (in that order).
fn offered<'a>(ask: &'a PermissionAsk, preferred: &[OfferKind]) -> Option<&'a PermissionOffer> {
    preferred.iter().find_map(|want| ask.options.iter().find(|o| o.kind == *want))
}

/// The answer selecting `offer`, else `cancelled`.
fn chosen(offer: Option<&PermissionOffer>) -> PermissionChoice {
    offer.map_or(PermissionChoice::Cancelled, |o| PermissionChoice::Selected(o.id.clone()))
}

/// Whether the call names paths and all of them lie in the working directory (none of them in a
/// form kin cannot resolve).
fn names_only_workspace_paths(root: &Path, ask: &PermissionAsk) -> bool {
    ask.opaque.is_empty()
        && !ask.paths.is_empty()
        && ask.paths.iter().all(|p| crate::tools::paths::inside_workspace(&[root.to_path_buf()], p))
}

/// The text of the regular file at `real` (`shown` names it in errors), refusing anything else
/// (a FIFO, a socket, a device) without blocking, and files over `MAX_SERVED_FILE`.
fn read_regular_text(real: &Path, shown: &str) -> Result<String, Refusal> {
    let internal = |message: String| Refusal::new(RefusalKind::Internal, message);
    let mut file = open_regular(real).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => Refusal::new(RefusalKind::NotFound, format!("Resource not found: {shown}")),
        // The refusal names the path and what it is.
        std::io::ErrorKind::InvalidInput => internal(e.to_string()),
        _ => internal(format!("cannot read {shown}: {e}")),
    })?;
    let size = file.metadata().map_err(|e| internal(format!("cannot read {shown}: {e}")))?.len();
    if size > MAX_SERVED_FILE {
        return Err(internal(format!(
            "cannot read {shown}: it is {size} bytes; kin serves files of at most {MAX_SERVED_FILE} bytes to an \
             external agent"
        )));
    }
    let mut bytes = Vec::new();
    // A file that grew after the check is still read only up to the cap.
    file.by_ref()
        .take(MAX_SERVED_FILE)
        .read_to_end(&mut bytes)
        .map_err(|e| internal(format!("cannot read {shown}: {e}")))?;
    String::from_utf8(bytes).map_err(|_| internal(format!("cannot read {shown}: it is not UTF-8 text")))
}

/// The real path of `path` when it is absolute and, symlinks resolved, inside `root` (itself
/// resolved).
async fn confined(root: &Path, path: &Path) -> Result<PathBuf, Refusal> {
    if !path.is_absolute() {
        return Err(Refusal::new(RefusalKind::InvalidParams, format!("the path must be absolute: {}", path.display())));
    }
    match tokio::fs::canonicalize(path).await {
        Ok(real) if real.starts_with(root) => Ok(real),
        Ok(_) => Err(Refusal::new(
            RefusalKind::Internal,
            format!("{} is outside the working directory {} of this subagent run", path.display(), root.display()),
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err(Refusal::new(RefusalKind::NotFound, format!("Resource not found: {}", path.display())))
        }
        Err(e) => Err(Refusal::new(RefusalKind::Internal, format!("cannot resolve {}: {e}", path.display()))),
    }
}

/// Where a write to `path` lands: its directory resolved (symlinks included) must be inside
/// `root`, and an existing file there must not be a symlink.
async fn confined_new(root: &Path, path: &Path) -> Result<PathBuf, Refusal> {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(Refusal::new(RefusalKind::InvalidParams, format!("not a file path: {}", path.display())));
    };
    let target = confined(root, dir).await?.join(name);
    match tokio::fs::symlink_metadata(&target).await {
        Ok(meta) if meta.file_type().is_symlink() => Err(Refusal::new(
            RefusalKind::Internal,
            format!("{} is a symbolic link; kin does not write through it", path.display()),
        )),
        _ => Ok(target),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;
    use crate::permission::{PermissionMode, Permissions};
    use crate::tools::{MAX_PROGRESS_REPORT_BYTES, MAX_PROGRESS_REPORTS, PROGRESS_STOPS};

    fn ask(kind: &'static str, paths: &[&str]) -> PermissionAsk {
        let paths: Vec<PathBuf> = paths.iter().map(PathBuf::from).collect();
        PermissionAsk {
            kind,
            access: Access::Edit { paths: paths.clone() },
            title: Some(format!("{kind} something")),
            raw_input: Value::Null,
            paths,
            opaque: Vec::new(),
            options: vec![
                super::super::port::PermissionOffer { id: "a1".into(), kind: OfferKind::AllowOnce },
                super::super::port::PermissionOffer { id: "r1".into(), kind: OfferKind::RejectOnce },
            ],
        }
    }

    /// `ask` offering options of `kinds` only: `a1` allow once, `a2` allow always, `r1` reject
    /// once, `r2` reject always.
    fn offering(ask: PermissionAsk, kinds: &[OfferKind]) -> PermissionAsk {
        let id = |kind: OfferKind| match kind {
            OfferKind::AllowOnce => "a1",
            OfferKind::AllowAlways => "a2",
            OfferKind::RejectOnce => "r1",
            OfferKind::RejectAlways => "r2",
        };
        let options = kinds.iter().map(|&kind| PermissionOffer { id: id(kind).into(), kind });
        PermissionAsk { options: options.collect(), ..ask }
    }

    fn answers(policy: AcpPermission, root: &Path) -> Answers {
        Answers::new("acp:t", policy, None, None, root.to_path_buf())
    }

    #[test]
    fn permission_requests_follow_the_policy() {
        let dir = tempfile::tempdir().unwrap();
        let (root, _) = workspace(&dir);
        let inside = root.join("a.txt").display().to_string();
        let answer = |policy, ask: PermissionAsk| permission_answer(policy, &root, &ask);
        let selected = |id: &str| PermissionChoice::Selected(id.into());
        assert_eq!(answer(AcpPermission::Reject, ask("read", &[&inside])), selected("r1"));
        assert_eq!(answer(AcpPermission::AllowReads, ask("read", &[&inside])), selected("a1"));
        assert_eq!(answer(AcpPermission::Forward, ask("search", &[&inside])), selected("a1"));
        assert_eq!(answer(AcpPermission::AllowReads, ask("edit", &[&inside])), selected("r1"));
        let bare = PermissionAsk { options: Vec::new(), ..ask("other", &[]) };
        assert_eq!(answer(AcpPermission::Reject, bare), PermissionChoice::Cancelled);
        // An allowed read is never passed on as "allow always": the agent would stop asking.
        let always = offering(ask("read", &[&inside]), &[OfferKind::AllowAlways, OfferKind::RejectOnce]);
        assert_eq!(answer(AcpPermission::AllowReads, always), selected("r1"));
    }

    #[tokio::test]
    async fn allow_reads_allows_only_reads_naming_paths_inside_the_working_directory() {
        let dir = tempfile::tempdir().unwrap();
        let (root, base) = workspace(&dir);
        link_out(&root, &base);
        let reads = answers(AcpPermission::AllowReads, &root);
        let inside = root.join("a.txt").display().to_string();
        assert_eq!(reads.permission(ask("read", &[&inside])).await, PermissionChoice::Selected("a1".into()));
        assert_eq!(reads.permission(ask("search", &[&inside])).await, PermissionChoice::Selected("a1".into()));
        let up = root.join("../secret.txt").display().to_string();
        let link = root.join("link.txt").display().to_string();
        let (up, link) = (up.as_str(), link.as_str());
        for paths in [vec!["/etc/passwd"], vec![inside.as_str(), "/etc/passwd"], vec![up], vec![link], Vec::new()] {
            for kind in ["read", "search"] {
                let answer = reads.permission(ask(kind, &paths)).await;
                assert_eq!(answer, PermissionChoice::Selected("r1".into()), "{kind} {paths:?}");
            }
        }
    }

    #[test]
    fn an_answer_is_passed_on_as_an_option_of_its_kind_or_a_narrower_one() {
        use OfferKind::{AllowAlways, AllowOnce, RejectAlways, RejectOnce};
        let all = [AllowOnce, AllowAlways, RejectOnce, RejectAlways];
        let cases: [(PermissionAnswer, &[OfferKind], &str); 14] = [
            (PermissionAnswer::AllowOnce, &all, "a1"),
            // Never `allow_always`, nor `reject_always`, for a one-time allow.
            (PermissionAnswer::AllowOnce, &[AllowAlways, RejectOnce, RejectAlways], "r1"),
            (PermissionAnswer::AllowOnce, &[AllowAlways, RejectAlways], "cancelled"),
            (PermissionAnswer::AllowAlways, &all, "a2"),
            (PermissionAnswer::AllowAlways, &[AllowOnce, RejectOnce, RejectAlways], "a1"),
            (PermissionAnswer::AllowAlways, &[RejectOnce, RejectAlways], "cancelled"),
            (PermissionAnswer::RejectOnce, &all, "r1"),
            (PermissionAnswer::RejectOnce, &[AllowOnce, AllowAlways, RejectAlways], "r2"),
            (PermissionAnswer::RejectOnce, &[AllowOnce, AllowAlways], "cancelled"),
            (PermissionAnswer::Dismissed, &all, "r1"),
            (PermissionAnswer::Dismissed, &[AllowOnce, AllowAlways], "cancelled"),
            (PermissionAnswer::RejectAlways, &all, "r2"),
            (PermissionAnswer::RejectAlways, &[AllowOnce, AllowAlways, RejectOnce], "r1"),
            (PermissionAnswer::RejectAlways, &[AllowOnce, AllowAlways], "cancelled"),
        ];
        for (answer, kinds, expected) in cases {
            let asked = offering(ask("edit", &[]), kinds);
            let got = match chosen(offered(&asked, passed_on(answer))) {
                PermissionChoice::Selected(id) => id,
                PermissionChoice::Cancelled => "cancelled".into(),
            };
            assert_eq!(got, expected, "{answer:?} offered {kinds:?}");
        }
    }

    /// An editor that answers every question with `answer` and counts them.
    struct Editor(PermissionAnswer, Arc<AtomicU64>);

    impl PermissionPrompt for Editor {
        fn ask(&self, _: PermissionRequest) -> BoxFuture<'static, PermissionAnswer> {
            self.1.fetch_add(1, Ordering::Relaxed);
            let answer = self.0;
            async move { answer }.boxed()
        }
    }

    fn forwarding(root: &Path, answer: PermissionAnswer) -> (Answers, Arc<AtomicU64>) {
        let asked = Arc::new(AtomicU64::new(0));
        (forwarding_to(root, Arc::new(Editor(answer, asked.clone()))), asked)
    }

    /// The answers of a `forward` run asking `editor`.
    fn forwarding_to(root: &Path, editor: Arc<dyn PermissionPrompt>) -> Answers {
        let forward = Forward {
            editor,
            session_id: "p".into(),
            call_id: "c".into(),
            call: CallShown { title: "delegate_t: task".into(), tool: "delegate_t".into(), access: Access::Delegate },
            cancel: CancellationToken::new(),
        };
        Answers::new("acp:t", AcpPermission::Forward, Some(forward), None, root.to_path_buf())
    }

    /// An editor behind a session's permission mode, as the runtime's `forward` prompt is: the
    /// mode answers where it decides, else the user answers `answer` (counted).
    struct ModeEditor {
        permissions: Arc<Permissions>,
        answer: PermissionAnswer,
        asked: Arc<AtomicU64>,
    }

    impl PermissionPrompt for ModeEditor {
        fn ask(&self, request: PermissionRequest) -> BoxFuture<'static, PermissionAnswer> {
            let answer = self.decided_by_mode(&request).unwrap_or_else(|| {
                self.asked.fetch_add(1, Ordering::Relaxed);
                self.answer
            });
            async move { answer }.boxed()
        }

        fn decided_by_mode(&self, request: &PermissionRequest) -> Option<PermissionAnswer> {
            self.permissions.decide_forwarded(&request.access, request.in_workspace, &request.cwd)
        }
    }

    /// `dir/ws` (the working directory, resolved) and `dir` itself.
    fn workspace(dir: &tempfile::TempDir) -> (PathBuf, PathBuf) {
        let base = std::fs::canonicalize(dir.path()).unwrap();
        let root = base.join("ws");
        std::fs::create_dir(&root).unwrap();
        (root, base)
    }

    /// `base/secret.txt`, outside the workspace `root`, and `root/link.txt` pointing at it.
    fn link_out(root: &Path, base: &Path) {
        std::fs::write(base.join("secret.txt"), "s").unwrap();
        std::os::unix::fs::symlink(base.join("secret.txt"), root.join("link.txt")).unwrap();
    }

    #[test]
    fn a_call_is_in_the_workspace_only_when_every_path_it_names_is() {
        let dir = tempfile::tempdir().unwrap();
        let (root, _) = workspace(&dir);
        std::os::unix::fs::symlink("/etc", root.join("etc")).unwrap();
        let named = |paths: &[&str]| PermissionAsk {
            paths: paths.iter().map(|p| crate::tools::paths::resolve(&root, p)).collect(),
            ..ask("read", &[])
        };
        let inside = root.join("a.txt").display().to_string();
        assert!(names_only_workspace_paths(&root, &named(&[&inside])));
        assert!(names_only_workspace_paths(&root, &named(&["src/new.rs"])));
        assert!(!names_only_workspace_paths(&root, &named(&[])), "no path named");
        assert!(!names_only_workspace_paths(&root, &named(&[&inside, "/etc/passwd"])));
        assert!(!names_only_workspace_paths(&root, &named(&["../x"])));
        assert!(!names_only_workspace_paths(&root, &named(&["etc/passwd"])), "a symlink out");
        let opaque = PermissionAsk { opaque: vec!["$HOME/.ssh/id_rsa".into()], ..named(&[&inside]) };
        assert!(!names_only_workspace_paths(&root, &opaque), "a path kin cannot resolve");
    }

    #[tokio::test]
    async fn a_forwarded_question_names_the_paths_outside_the_working_directory() {
        /// Keeps each question's title and whether it stays in the working directory.
        struct Shown(Mutex<Vec<(String, bool)>>);
        impl PermissionPrompt for Shown {
            fn ask(&self, request: PermissionRequest) -> BoxFuture<'static, PermissionAnswer> {
                self.0.lock().unwrap().push((request.title, request.in_workspace));
                async { PermissionAnswer::RejectOnce }.boxed()
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let (root, _) = workspace(&dir);
        let shown = Arc::new(Shown(Mutex::new(Vec::new())));
        let run = forwarding_to(&root, shown.clone());
        let inside = root.join("a.txt").display().to_string();
        let titled = |paths: &[&str]| PermissionAsk { title: Some("Read README.md".into()), ..ask("read", paths) };
        run.permission(titled(&[&inside])).await;
        run.permission(titled(&[&inside, "/root/.ssh/id_rsa"])).await;
        run.permission(PermissionAsk { opaque: vec!["$HOME/.aws/credentials".into()], ..titled(&[&inside]) }).await;
        let shown = shown.0.lock().unwrap().clone();
        assert_eq!(shown[0], ("acp:t: Read README.md".to_string(), true));
        assert_eq!(
            shown[1],
            (
                "acp:t: Read README.md (it names /root/.ssh/id_rsa: not known to be in the working directory)".into(),
                false
            )
        );
        assert_eq!(
            shown[2],
            (
                "acp:t: Read README.md (it names $HOME/.aws/credentials: not known to be in the working directory)"
                    .into(),
                false
            )
        );
    }

    #[tokio::test]
    async fn an_allowed_edit_lets_the_agent_write_once() {
        let dir = tempfile::tempdir().unwrap();
        let (root, _) = workspace(&dir);
        let (allows, asked) = forwarding(&root, PermissionAnswer::AllowOnce);
        let inside = root.join("a.txt").display().to_string();
        assert_eq!(allows.permission(ask("edit", &[&inside])).await, PermissionChoice::Selected("a1".into()));
        assert_eq!(asked.load(Ordering::Relaxed), 1);
        allows.write_text_file(root.join("a.txt"), "x".into()).await.unwrap();
        assert_eq!(asked.load(Ordering::Relaxed), 1, "the write rode on the allowed edit");
        allows.write_text_file(root.join("a.txt"), "y".into()).await.unwrap();
        assert_eq!(asked.load(Ordering::Relaxed), 2, "the second write is asked about");
    }

    #[tokio::test]
    async fn a_one_time_allow_is_never_passed_on_as_allow_always() {
        let dir = tempfile::tempdir().unwrap();
        let (root, _) = workspace(&dir);
        let inside = root.join("a.txt").display().to_string();
        let only_always = |kind| offering(ask(kind, &[&inside]), &[OfferKind::AllowAlways, OfferKind::RejectOnce]);
        // The user allows once: the agent hears "reject once", and gets no write for the edit.
        let (user, asked) = forwarding(&root, PermissionAnswer::AllowOnce);
        assert_eq!(user.permission(only_always("edit")).await, PermissionChoice::Selected("r1".into()));
        user.write_text_file(root.join("a.txt"), "x".into()).await.unwrap();
        assert_eq!(asked.load(Ordering::Relaxed), 2, "the write is asked about");
        // The mode allows (once): the same.
        let permissions = Arc::new(Permissions::new(PermissionMode::Bypass));
        let (answer, asked) = (PermissionAnswer::RejectOnce, Arc::new(AtomicU64::new(0)));
        let run = forwarding_to(&root, Arc::new(ModeEditor { permissions, answer, asked: asked.clone() }));
        assert_eq!(run.permission(only_always("read")).await, PermissionChoice::Selected("r1".into()));
        assert_eq!(asked.load(Ordering::Relaxed), 0, "the mode answered");
    }

    #[tokio::test]
    async fn read_only_refuses_a_write_the_editor_allowed_always_before() {
        let dir = tempfile::tempdir().unwrap();
        let (root, _) = workspace(&dir);
        let (permissions, asked) = (Arc::new(Permissions::new(PermissionMode::Ask)), Arc::new(AtomicU64::new(0)));
        let (answer, mode) = (PermissionAnswer::AllowAlways, permissions.clone());
        let editor = ModeEditor { permissions: mode, answer, asked: asked.clone() };
        let run = forwarding_to(&root, Arc::new(editor));
        let notes = root.join("notes.txt");
        let shown = notes.display().to_string();
        assert_eq!(run.permission(ask("edit", &[&shown])).await, PermissionChoice::Selected("a1".into()));
        run.write_text_file(notes.clone(), "allowed".into()).await.unwrap();
        permissions.set_mode(PermissionMode::ReadOnly);
        let refused = run.write_text_file(notes.clone(), "after".into()).await.unwrap_err();
        assert_eq!(refused.message, format!("the session's permission mode refuses writing {shown}"));
        assert_eq!(std::fs::read_to_string(&notes).unwrap(), "allowed", "the file is unchanged");
        assert_eq!(asked.load(Ordering::Relaxed), 1, "only the edit was asked about");
        // Out of read-only, the "allow always" answer stands again.
        permissions.set_mode(PermissionMode::Ask);
        run.write_text_file(notes.clone(), "again".into()).await.unwrap();
        assert_eq!((std::fs::read_to_string(&notes).unwrap().as_str(), asked.load(Ordering::Relaxed)), ("again", 1));
    }

    #[tokio::test]
    async fn forwarded_writes_stay_inside_the_working_directory_and_follow_the_editor() {
        let dir = tempfile::tempdir().unwrap();
        let (root, base) = workspace(&dir);
        link_out(&root, &base);
        let (allows, asked) = forwarding(&root, PermissionAnswer::AllowOnce);
        for escape in [base.join("new.txt"), root.join("../new.txt"), root.join("link.txt")] {
            let refused = allows.write_text_file(escape, "x".into()).await.unwrap_err();
            assert!(
                refused.message.contains("outside the working directory") || refused.message.contains("symbolic link"),
                "{refused:?}"
            );
        }
        assert_eq!(std::fs::read_to_string(base.join("secret.txt")).unwrap(), "s");
        assert!(!base.join("new.txt").exists());
        let relative = allows.write_text_file("a.txt".into(), "x".into()).await.unwrap_err();
        assert_eq!(relative.kind, RefusalKind::InvalidParams);
        assert_eq!(asked.load(Ordering::Relaxed), 0, "nothing refused was asked about");
        for n in 1..=2 {
            allows.write_text_file(root.join("a.txt"), "x".into()).await.unwrap();
            assert_eq!(asked.load(Ordering::Relaxed), n);
        }
        assert_eq!(std::fs::read_to_string(root.join("a.txt")).unwrap(), "x");
        let (always, asked) = forwarding(&root, PermissionAnswer::AllowAlways);
        for _ in 0..3 {
            always.write_text_file(root.join("b.txt"), "x".into()).await.unwrap();
        }
        assert_eq!(asked.load(Ordering::Relaxed), 1, "\"allow always\" is asked once");
        let (rejects, _) = forwarding(&root, PermissionAnswer::Dismissed);
        let refused = rejects.write_text_file(root.join("c.txt"), "x".into()).await.unwrap_err();
        assert!(refused.message.contains("the user rejected writing"), "{refused:?}");
        assert!(!root.join("c.txt").exists());
    }

    #[tokio::test]
    async fn file_reads_stay_inside_the_working_directory() {
        let dir = tempfile::tempdir().unwrap();
        let (root, base) = workspace(&dir);
        std::fs::write(root.join("a.txt"), "one\ntwo\nthree\n").unwrap();
        link_out(&root, &base);
        let reads = answers(AcpPermission::AllowReads, &root);
        assert_eq!(reads.read_text_file(root.join("a.txt"), None, None).await.unwrap(), "one\ntwo\nthree\n");
        assert_eq!(reads.read_text_file(root.join("a.txt"), Some(2), Some(1)).await.unwrap(), "two\n");
        for escape in [base.join("secret.txt"), root.join("../secret.txt"), root.join("link.txt")] {
            let refused = reads.read_text_file(escape, None, None).await.unwrap_err();
            assert!(refused.message.contains("outside the working directory"), "{refused:?}");
        }
        let relative = reads.read_text_file("a.txt".into(), None, None).await.unwrap_err();
        assert_eq!(relative.kind, RefusalKind::InvalidParams);
        let missing = reads.read_text_file(root.join("nope.txt"), None, None).await.unwrap_err();
        assert_eq!(missing.kind, RefusalKind::NotFound);
        let write = reads.write_text_file(root.join("a.txt"), "x".into()).await.unwrap_err();
        assert!(write.message.contains("writing files is refused"), "{write:?}");
        let rejects = answers(AcpPermission::Reject, &root);
        let refused = rejects.read_text_file(root.join("a.txt"), None, None).await.unwrap_err();
        assert!(refused.message.contains("reading files is refused"), "{refused:?}");
    }

    #[tokio::test]
    async fn fifos_and_oversized_files_are_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let (root, _) = workspace(&dir);
        let fifo = root.join("fifo");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status().unwrap();
        assert!(made.success());
        let reads = answers(AcpPermission::AllowReads, &root);
        // No writer ever opens the FIFO: a blocking open would never return.
        let refused = reads.read_text_file(fifo.clone(), None, None).await.unwrap_err();
        let named = format!("{} is a FIFO (named pipe), not a regular file", fifo.display());
        assert!(refused.message.starts_with(&named), "{refused:?}");
        let (writes, _) = forwarding(&root, PermissionAnswer::AllowAlways);
        let refused = writes.write_text_file(fifo.clone(), "x".into()).await.unwrap_err();
        assert!(refused.message.starts_with(&named), "{refused:?}");
        let big = root.join("big.txt");
        std::fs::File::create(&big).unwrap().set_len(MAX_SERVED_FILE + 1).unwrap();
        let refused = reads.read_text_file(big, None, None).await.unwrap_err();
        assert!(refused.message.contains("kin serves files of at most 16777216 bytes"), "{refused:?}");
    }

    #[test]
    fn the_agent_tool_calls_are_reported_within_the_call_cap_on_progress() {
        let dir = tempfile::tempdir().unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let progress = Some(Progress::new("c", tx));
        let run = Answers::new("acp:t", AcpPermission::Reject, None, progress, dir.path().to_path_buf());
        let title = "t".repeat(1 << 20);
        for _ in 0..1000 {
            run.tool_call(&title);
        }
        let reports: Vec<String> = std::iter::from_fn(|| rx.try_recv().ok()).map(|(_, text)| text).collect();
        assert_eq!(reports.len(), MAX_PROGRESS_REPORTS);
        let kept = "t".repeat(MAX_PROGRESS_REPORT_BYTES - "acp:t: ".len());
        let cut = (1 << 20) + "acp:t: ".len() - MAX_PROGRESS_REPORT_BYTES;
        assert_eq!(reports[0], format!("acp:t: {kept}\n[... {cut} more bytes not shown ...]"));
        assert!(reports.iter().all(|r| r.len() <= MAX_PROGRESS_REPORT_BYTES + 200), "every title is cut");
        assert!(reports.last().unwrap().ends_with(&format!(" more bytes not shown ...]\n{PROGRESS_STOPS}")));
    }

    #[test]
    fn the_answer_text_keeps_its_head_and_tail() {
        let dir = tempfile::tempdir().unwrap();
        let run = answers(AcpPermission::Reject, dir.path());
        run.text("START ");
        for _ in 0..10_000 {
            run.text(&"x".repeat(1000));
        }
        run.text(" END");
        let output = run.output();
        assert!(output.len() <= OUTPUT_LIMITS.total() + 64, "{} bytes", output.len());
        assert!(output.starts_with("START ") && output.ends_with(" END"));
        assert!(output.contains(&format!("[... {} bytes omitted ...]", 10_000_010 - OUTPUT_LIMITS.total())));
    }
}
