//! The command sandbox (issue 22): what `bash` commands (and, when configured, external ACP
//! agents) may touch, enforced by the kernel in the child before `exec`, and the supervisor that
//! keeps every process a command starts inside the call's lifetime.
//!
//! - `policy`: the setting (`off`, `read-only`, `workspace-write`, each with or without the
//!   network), its strictness order and the config-file settings.
//! - `kernel`: what the running kernel offers (Landlock ABI, seccomp, mount namespaces), probed
//!   once.
//! - `confine`: one command's Landlock ruleset, seccomp filter and read-only bind mounts, built
//!   before the fork and entered after it.
//! - `supervise`: the per-command supervisor (a child subreaper) that reports the exit and kills
//!   every remaining descendant when the call ends, is cancelled, times out or kin dies.
//! - `blocked`: which refused writes in a command's stderr the sandbox caused.
//!
//! [`plan`] is the small interface the tools call: for a policy and a workspace it gives either a
//! [`Confined`] command (the confinement, its private temp dir, what the kernel does not enforce)
//! or the reason the command runs unconfined. Where the kernel enforces less than asked, the
//! command is not counted as sandboxed (it runs after the mode's permission questions) unless
//! `sandbox_fallback = "warn"`; kin says so once per process in its log, and on every such call.

mod blocked;
mod confine;
pub(crate) mod kernel;
mod policy;
pub(crate) mod supervise;

use std::collections::HashSet;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use crate::session::event::SandboxChoice;

pub(crate) use blocked::{Blocked, blocked};
pub(crate) use confine::{Confinement, Layout};
pub(crate) use kernel::Support;
pub(crate) use policy::SandboxFallback;
pub(crate) use policy::SandboxLevel;
pub use policy::SandboxPolicy;
pub use policy::SandboxSettings;

/// A session's sandbox: the settings kin started with and the policy in force now. Children
/// share their top-level session's.
#[derive(Debug)]
pub struct SessionSandbox {
    settings: Arc<SandboxSettings>,
    policy: Mutex<SandboxPolicy>,
}

impl SessionSandbox {
    /// A session restored with `recorded` (its last `session/sandbox`, if any): it keeps it
    /// unless kin was started stricter, in which case each dimension is clamped to the start.
    pub fn restored(settings: Arc<SandboxSettings>, recorded: Option<SandboxPolicy>) -> Self {
        let start = settings.policy;
        let policy = recorded.map_or(start, |r| r.meet(start));
        SessionSandbox { settings, policy: Mutex::new(policy) }
    }

    pub fn policy(&self) -> SandboxPolicy {
        *self.policy.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn set(&self, policy: SandboxPolicy) {
        *self.policy.lock().unwrap_or_else(PoisonError::into_inner) = policy;
    }

    pub fn settings(&self) -> &SandboxSettings {
        &self.settings
    }

    /// True when a command in `workspace` would run confined by the kernel now.
    /// A sandbox asked for that the kernel cannot enforce is said once in the log here, where
    /// the permission gate first asks (a refused command never reaches `plan`, which says it too).
    pub fn in_force(&self, workspace: Option<&Path>) -> bool {
        let policy = self.policy();
        if !policy.is_sandboxed() {
            return false;
        }
        match assess(policy, &self.settings, workspace) {
            Ok(Verdict::Enforce { .. }) => true,
            Ok(Verdict::Unconfined(notice)) => {
                say_once(&notice);
                false
            }
            Err(_) => false,
        }
    }

    /// What the model is told about the sandbox in the bash tool's description, for a session
    /// in `workspace`.
    pub fn describe(&self, workspace: Option<&Path>) -> String {
        let policy = self.policy();
        if policy.is_sandboxed() && !self.in_force(workspace) {
            return format!(
                "A sandbox ({policy}) is configured, but this kernel cannot enforce it: commands run unconfined, \
                 after the usual permission questions."
            );
        }
        let reach = match policy.level {
            SandboxLevel::Off => return String::new(),
            SandboxLevel::ReadOnly => "may read files but write only in $TMPDIR (a private temp dir)",
            SandboxLevel::WorkspaceWrite => {
                "may read files but write only in the session workspace, the configured writable roots and \
                 $TMPDIR (a private temp dir); .git stays read-only (git commands that write to it, such as \
                 commit, need `sandbox: \"off\"`)"
            }
        };
        let network = if policy.network() { "" } else { " and cannot reach the network" };
        format!(
            "Commands run in a kernel sandbox ({policy}): they {reach}{network}. A command that must run \
             outside it passes `sandbox: \"off\"` and the user is asked first."
        )
    }

    /// The record of a session's choice: the `session/sandbox` event.
    pub fn event_body(policy: SandboxPolicy) -> SandboxChoice {
        SandboxChoice { level: policy.level.id().to_string(), network: policy.network() }
    }

    /// The policy a `session/sandbox` event records.
    pub fn from_event(choice: &SandboxChoice) -> Option<SandboxPolicy> {
        Some(SandboxPolicy::new(SandboxLevel::parse(&choice.level)?, choice.network))
    }
}

/// A command that runs confined.
pub(crate) struct Confined {
    pub policy: SandboxPolicy,
    pub confinement: Arc<Confinement>,
    pub layout: Layout,
    /// The private temp dir (removed when this is dropped).
    pub temp: tempfile::TempDir,
    /// What the kernel does not enforce (only with `sandbox_fallback = "warn"`).
    pub gaps: Vec<String>,
}

impl Confined {
    /// The environment the command gets on top of kin's: `$TMPDIR` and friends point to the
    /// private temp dir.
    pub(crate) fn env(&self) -> Vec<(OsString, OsString)> {
        let temp = self.temp.path().as_os_str().to_os_string();
        ["TMPDIR", "TMP", "TEMP"].map(|k| (OsString::from(k), temp.clone())).to_vec()
    }

    /// The note the editor sees on the call.
    pub(crate) fn note(&self) -> String {
        let mut note = format!("sandboxed: {}", self.policy);
        if !self.gaps.is_empty() {
            note.push_str(&format!(" (the kernel does not enforce: {})", self.gaps.join("; ")));
        }
        note
    }
}

/// How one command runs.
pub(crate) enum Plan {
    /// Without confinement; `notice` says why when a sandbox was asked for.
    Unconfined {
        notice: Option<String>,
    },
    Confined(Confined),
}

/// The plan for one command under `policy` in `workspace` (the session directory). An `Err` is
/// a sandbox that should apply but cannot be set up (the command must not run).
pub(crate) fn plan(
    policy: SandboxPolicy,
    settings: &SandboxSettings,
    workspace: Option<&Path>,
) -> Result<Plan, String> {
    if !policy.is_sandboxed() {
        return Ok(Plan::Unconfined { notice: None });
    }
    let verdict = assess(policy, settings, workspace)?;
    let (gaps, support) = match verdict {
        Verdict::Unconfined(notice) => {
            say_once(&notice);
            return Ok(Plan::Unconfined { notice: Some(notice) });
        }
        Verdict::Enforce { gaps, support } => (gaps, support),
    };
    if !gaps.is_empty() {
        say_once(&format!("the sandbox ({policy}) runs without: {}", gaps.join("; ")));
    }
    let temp = tempfile::Builder::new()
        .prefix("kin-sandbox-")
        .tempdir()
        .map_err(|e| format!("cannot create the sandbox's private temp dir: {e}"))?;
    let mut layout = layout(policy, settings, workspace);
    layout.writable.push(real(temp.path()));
    let confinement = Confinement::build(policy, &layout, support)?;
    Ok(Plan::Confined(Confined { policy, confinement: Arc::new(confinement), layout, temp, gaps }))
}

/// Confines the process `command` starts (an external ACP agent) under `settings.policy`, with
/// `workspace` writable for `workspace-write`. The returned [`Confined`] keeps the private temp
/// dir: hold it while the process runs. A policy the kernel cannot enforce (no Landlock, or less
/// than asked without `sandbox_fallback = "warn"`) is an `Err`: the process must not start.
pub(crate) fn confine_command(
    command: &mut tokio::process::Command,
    settings: &SandboxSettings,
    workspace: &Path,
) -> Result<Option<Confined>, String> {
    match plan(settings.policy, settings, Some(workspace))? {
        Plan::Unconfined { notice: None } => Ok(None),
        Plan::Unconfined { notice: Some(notice) } => Err(format!("refusing to start it unconfined: {notice}")),
        Plan::Confined(confined) => {
            command.envs(confined.env());
            let confinement = confined.confinement.clone();
            // SAFETY: `enter` makes only system calls on data prepared before the fork.
            unsafe {
                command.pre_exec(move || confinement.enter());
            }
            Ok(Some(confined))
        }
    }
}

/// What the kernel makes of a sandboxed policy.
enum Verdict {
    /// Run confined; `gaps` is what is not enforced (empty unless the fallback is `warn`).
    Enforce { gaps: Vec<String>, support: Support },
    /// Do not count the command as sandboxed, for this reason.
    Unconfined(String),
}

fn assess(policy: SandboxPolicy, settings: &SandboxSettings, workspace: Option<&Path>) -> Result<Verdict, String> {
    let support = kernel::support();
    if support.landlock_abi == 0 {
        return Ok(Verdict::Unconfined(format!(
            "sandbox {policy} requested, but this kernel has no Landlock: commands are not sandboxed and fall \
             back to the permission questions of the mode"
        )));
    }
    let gaps = gaps(policy, &layout(policy, settings, workspace), support);
    if gaps.is_empty() || settings.fallback == SandboxFallback::Warn {
        return Ok(Verdict::Enforce { gaps, support });
    }
    Ok(Verdict::Unconfined(format!(
        "sandbox {policy} requested, but this kernel does not enforce {}: commands are not sandboxed and fall \
         back to the permission questions of the mode (set sandbox_fallback = \"warn\" to run them with what \
         the kernel enforces)",
        gaps.join("; ")
    )))
}

/// What `support` leaves unenforced of `policy` over `layout`.
fn gaps(policy: SandboxPolicy, layout: &Layout, support: Support) -> Vec<String> {
    let abi = support.landlock_abi;
    let mut gaps = Vec::new();
    if abi < 3 {
        gaps.push(format!("truncating files outside the writable roots (needs Landlock ABI 3, the kernel has {abi})"));
    }
    if abi < 5 {
        gaps.push(format!("ioctl on device files (needs Landlock ABI 5, the kernel has {abi})"));
    }
    if !policy.network() && !support.seccomp {
        gaps.push(if abi >= 4 {
            "cutting the network for sockets other than TCP (needs seccomp)".to_string()
        } else {
            format!("cutting the network (needs seccomp or Landlock ABI 4, the kernel has {abi})")
        });
    }
    if !layout.read_only.is_empty() && !support.mount_ns {
        let paths: Vec<String> = layout.read_only.iter().map(|p| p.display().to_string()).collect();
        gaps.push(format!("keeping {} read-only (needs a private mount namespace)", paths.join(", ")));
    }
    gaps
}

/// The writable roots and the read-only paths inside them (the private temp dir not included).
fn layout(policy: SandboxPolicy, settings: &SandboxSettings, workspace: Option<&Path>) -> Layout {
    let mut writable: Vec<PathBuf> = Vec::new();
    if policy.level == SandboxLevel::WorkspaceWrite {
        let roots = workspace.into_iter().map(Path::to_path_buf).chain(settings.writable_roots.iter().cloned());
        for root in roots.filter(|r| r.is_dir()) {
            let root = real(&root);
            if !writable.contains(&root) {
                writable.push(root);
            }
        }
    }
    let mut read_only: Vec<PathBuf> = Vec::new();
    // All of a writable root's `.git` (a directory, or a worktree's `.git` file): git runs what
    // its hooks, config, `commondir` and submodules' git dirs say, and a `.git` that could be
    // renamed or replaced would take any of them along. A mount point cannot be renamed.
    for root in &writable {
        let git = root.join(".git");
        if git.symlink_metadata().is_ok_and(|m| m.is_dir() || m.is_file()) {
            read_only.push(real(&git));
        }
    }
    for dir in settings.protected.iter().filter(|d| d.exists()).map(|d| real(d)) {
        let inside = writable.iter().any(|w| dir.starts_with(w));
        let declared = writable.iter().any(|w| w.starts_with(&dir));
        if inside && !declared {
            read_only.push(dir);
        }
    }
    read_only.sort();
    read_only.dedup();
    // A path under another read-only one is covered by it.
    let covered: Vec<PathBuf> =
        read_only.iter().filter(|p| read_only.iter().any(|q| q != *p && p.starts_with(q))).cloned().collect();
    read_only.retain(|p| !covered.contains(p));
    Layout { writable, read_only }
}

fn real(path: &Path) -> PathBuf {
    std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf())
}

/// For tests that need Landlock: true when the kernel has it; without it, a failure under
/// `CI=true` and a loud note (and `false`, to skip) elsewhere.
#[doc(hidden)]
pub fn landlock_for_tests() -> bool {
    let abi = kernel::support().landlock_abi;
    if abi > 0 {
        return true;
    }
    assert_ne!(std::env::var("CI").as_deref(), Ok("true"), "this kernel has no Landlock: the sandbox tests cannot run");
    eprintln!("SKIPPING a sandbox test: this kernel has no Landlock (it would fail under CI=true)");
    false
}

/// Logs `notice` the first time this process sees it.
fn say_once(notice: &str) {
    static SAID: Mutex<Option<HashSet<String>>> = Mutex::new(None);
    let mut said = SAID.lock().unwrap_or_else(PoisonError::into_inner);
    if said.get_or_insert_with(HashSet::new).insert(notice.to_string()) {
        tracing::warn!("{notice}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(policy: SandboxPolicy) -> SandboxSettings {
        SandboxSettings { policy, ..Default::default() }
    }

    #[test]
    fn a_restored_session_is_never_looser_than_the_start() {
        let ww = SandboxPolicy::parse("workspace-write").unwrap();
        let ro_net = SandboxPolicy::parse("read-only+network").unwrap();
        let start = Arc::new(settings(ww));
        assert_eq!(SessionSandbox::restored(start.clone(), None).policy(), ww);
        assert_eq!(SessionSandbox::restored(start.clone(), Some(SandboxPolicy::OFF)).policy(), ww);
        assert_eq!(SessionSandbox::restored(start, Some(ro_net)).policy().id(), "read-only");
        let loose = Arc::new(settings(SandboxPolicy::OFF));
        assert_eq!(SessionSandbox::restored(loose, Some(ro_net)).policy(), ro_net);
        let body = SessionSandbox::event_body(ro_net);
        assert_eq!(body, SandboxChoice { level: "read-only".into(), network: true });
        assert_eq!(SessionSandbox::from_event(&body), Some(ro_net));
        assert_eq!(SessionSandbox::from_event(&SandboxChoice { level: "jail".into(), network: true }), None);
    }

    #[test]
    fn git_and_kin_dirs_inside_the_workspace_stay_read_only() {
        let dir = tempfile::tempdir().unwrap();
        let ws = real(dir.path()).join("ws");
        std::fs::create_dir_all(ws.join(".git/hooks")).unwrap();
        std::fs::write(ws.join(".git/config"), "").unwrap();
        std::fs::create_dir_all(ws.join("state/sessions")).unwrap();
        let outside = real(dir.path()).join("elsewhere");
        std::fs::create_dir_all(&outside).unwrap();
        let mut s = settings(SandboxPolicy::parse("workspace-write").unwrap());
        s.protected = vec![ws.join("state/sessions"), outside.clone()];
        let layout = layout(s.policy, &s, Some(&ws));
        assert_eq!(layout.writable, std::slice::from_ref(&ws));
        assert_eq!(layout.read_only, [ws.join(".git"), ws.join("state/sessions")]);
        // A declared writable root inside a protected dir means the user wants it writable.
        s.writable_roots = vec![ws.join("state/sessions")];
        assert!(!layout_of(&s, &ws).read_only.contains(&ws.join("state/sessions")));
        // Read-only: nothing is writable, so nothing needs a mount.
        let ro = settings(SandboxPolicy::parse("read-only").unwrap());
        let layout = layout_of(&ro, &ws);
        assert!(layout.writable.is_empty() && layout.read_only.is_empty(), "{layout:?}");
        // A worktree's `.git` file is kept as well; a workspace without one has nothing to keep.
        std::fs::remove_dir_all(ws.join(".git")).unwrap();
        std::fs::write(ws.join(".git"), "gitdir: /elsewhere/.git/worktrees/ws\n").unwrap();
        assert_eq!(layout_of(&settings(s.policy), &ws).read_only, [ws.join(".git")]);
        std::fs::remove_file(ws.join(".git")).unwrap();
        assert!(layout_of(&settings(s.policy), &ws).read_only.is_empty());
    }

    fn layout_of(s: &SandboxSettings, ws: &Path) -> Layout {
        layout(s.policy, s, Some(ws))
    }

    #[test]
    fn gaps_name_what_an_older_kernel_does_not_enforce() {
        let ww = SandboxPolicy::parse("workspace-write").unwrap();
        let full = Support { landlock_abi: 7, seccomp: true, mount_ns: true };
        let hooks = Layout { writable: vec!["/w".into()], read_only: vec!["/w/.git/hooks".into()] };
        assert!(gaps(ww, &hooks, full).is_empty());
        let old = Support { landlock_abi: 3, seccomp: false, mount_ns: false };
        let found = gaps(ww, &hooks, old);
        assert_eq!(found.len(), 3, "{found:?}");
        assert!(found[0].contains("ioctl") && found[1].contains("cutting the network"), "{found:?}");
        assert!(found[2].contains("/w/.git/hooks"), "{found:?}");
        let ancient = Support { landlock_abi: 1, seccomp: true, mount_ns: true };
        assert!(gaps(ww, &Layout::default(), ancient)[0].contains("truncating"));
        let v4 = Support { landlock_abi: 4, seccomp: false, mount_ns: true };
        assert!(gaps(ww, &Layout::default(), v4)[1].contains("sockets other than TCP"));
        let net = SandboxPolicy::parse("workspace-write+network").unwrap();
        assert!(gaps(net, &Layout::default(), Support { seccomp: false, ..full }).is_empty());
    }
}
