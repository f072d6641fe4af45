//! The command sandbox with real kernel enforcement (Landlock, seccomp, mount namespaces) and the
//! supervisor that keeps every process of a command inside the call: the bash tool confined at
//! each level, a loopback listener reached only with the network, and `setsid` or double-forked
//! processes killed on cancel, timeout and exit. Tests that need Landlock fail under `CI=true` on
//! a kernel without it (and say they skip elsewhere).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use kin::testkit::sandbox::{SandboxPolicy, SandboxSettings, SessionSandbox, landlock_for_tests};
use kin::testkit::tools::bash::BashTool;
use kin::testkit::tools::{Access, Tool, ToolContext, ToolError, ToolOutput};
use serde_json::json;
use tokio_util::sync::CancellationToken;

#[allow(dead_code)]
mod common;

/// A workspace `ws/` (a git checkout with hooks) beside `outside/`, under one temp dir.
struct Layout {
    _dir: tempfile::TempDir,
    ws: PathBuf,
    outside: PathBuf,
}

fn layout() -> Layout {
    let dir = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(dir.path()).unwrap();
    let ws = root.join("ws");
    let outside = root.join("outside");
    std::fs::create_dir_all(ws.join(".git/hooks")).unwrap();
    std::fs::write(ws.join(".git/config"), "[core]\n").unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    Layout { _dir: dir, ws, outside }
}

fn tool(policy: &str) -> BashTool {
    let settings = SandboxSettings { policy: SandboxPolicy::parse(policy).unwrap(), ..Default::default() };
    BashTool::with_sandbox(Arc::new(SessionSandbox::restored(Arc::new(settings), None)), None)
}

/// A context for `args` as the permission gate admits the call: an unconfined command (`Execute`:
/// the sandbox is off, or `sandbox: "off"`) may run outside the sandbox, a sandboxed one may not.
fn admitted(tool: &BashTool, args: &serde_json::Value, cwd: &Path, cancel: CancellationToken) -> ToolContext {
    let mut ctx = ToolContext::detached(Some(cwd.to_path_buf()), cancel);
    ctx.allow_unsandboxed = matches!(tool.access(args), Access::Execute { .. });
    ctx
}

async fn run(tool: &BashTool, cwd: &Path, command: &str) -> Result<ToolOutput, ToolError> {
    let args = json!({"command": command, "description": "test"});
    tool.execute(args.clone(), admitted(tool, &args, cwd, CancellationToken::new())).await
}

fn text(output: &ToolOutput) -> &str {
    output.content[0]["text"].as_str().unwrap()
}

#[tokio::test]
async fn workspace_write_writes_inside_reads_anywhere_and_names_blocked_writes() {
    if !landlock_for_tests() {
        return;
    }
    let l = layout();
    let home = std::env::var("HOME").unwrap();
    let in_home = PathBuf::from(&home).join(format!("kin-sandbox-test-{}", std::process::id()));
    let outside = l.outside.join("outside");
    let command = format!(
        "echo x > ./inside; echo x > {o}; echo x > $HOME/{h}; cat /etc/hostname; echo tmp > $TMPDIR/t && cat $TMPDIR/t",
        o = outside.display(),
        h = in_home.file_name().unwrap().to_str().unwrap(),
    );
    let output = run(&tool("workspace-write"), &l.ws, &command).await.unwrap();
    let created_in_home = in_home.exists();
    let _ = std::fs::remove_file(&in_home);
    let out = text(&output);
    assert!(l.ws.join("inside").exists(), "{out}");
    assert!(!outside.exists(), "{out}");
    assert!(!created_in_home, "a write to $HOME got through: {out}");
    let hostname = std::fs::read_to_string("/etc/hostname").unwrap();
    assert!(out.contains(hostname.trim()), "{out}");
    assert!(out.contains("\ntmp\n"), "the private temp dir is writable: {out}");
    assert!(out.contains(&format!("blocked by the sandbox: {}", outside.display())), "{out}");
    assert!(out.contains(&format!("blocked by the sandbox: {}", in_home.display())), "{out}");
    assert_eq!(output.meta, Some(json!({"sandbox": "sandboxed: workspace-write"})));
}

/// All of `.git` stays read-only: its hooks and config, what else git follows (`commondir` moves
/// both elsewhere), and `.git` itself, which a command could otherwise rename and replace with a
/// writable copy (`mv .git .g && cp -a .g .git`, then a hook).
#[tokio::test]
async fn workspace_write_keeps_all_of_git_read_only() {
    if !landlock_for_tests() {
        return;
    }
    let l = layout();
    let command = "echo evil > .git/hooks/pre-commit; echo x >> .git/config; echo ../evil > .git/commondir; \
                   mv .git .git_orig; rm -rf .git; ls -d .git && echo ok > inside && cat inside";
    let output = run(&tool("workspace-write"), &l.ws, command).await.unwrap();
    let out = text(&output);
    assert!(!l.ws.join(".git/hooks/pre-commit").exists(), "{out}");
    assert_eq!(std::fs::read_to_string(l.ws.join(".git/config")).unwrap(), "[core]\n", "{out}");
    assert!(!l.ws.join(".git/commondir").exists(), "{out}");
    assert!(!l.ws.join(".git_orig").exists() && l.ws.join(".git/hooks").is_dir(), "not moved nor removed: {out}");
    assert!(out.contains(".git\nok\n"), "the rest of the workspace is writable: {out}");
    for blocked in [".git/hooks/pre-commit", ".git/commondir"] {
        assert!(out.contains(&format!("blocked by the sandbox: {}", l.ws.join(blocked).display())), "{out}");
    }
}

#[tokio::test]
async fn read_only_writes_nowhere_but_the_private_temp_dir() {
    if !landlock_for_tests() {
        return;
    }
    let l = layout();
    let command = format!(
        "echo x > ./inside; echo x > {}/o; echo kept > $TMPDIR/t && cat $TMPDIR/t; echo $TMPDIR",
        l.outside.display()
    );
    let output = run(&tool("read-only"), &l.ws, &command).await.unwrap();
    let out = text(&output);
    assert!(!l.ws.join("inside").exists() && !l.outside.join("o").exists(), "{out}");
    assert!(out.contains("kept\n"), "{out}");
    let temp = out.lines().find(|line| line.contains("kin-sandbox-")).expect("TMPDIR is the private temp dir");
    assert!(!Path::new(temp).exists(), "the private temp dir is removed after the call");
    assert!(out.contains(&format!("blocked by the sandbox: {}", l.ws.join("inside").display())), "{out}");
}

/// A loopback listener; the command tries a TCP connect to it (bash's /dev/tcp) and, where curl
/// exists, an HTTP request.
async fn connect(policy: &str) -> (String, bool) {
    let l = layout();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    listener.set_nonblocking(true).unwrap();
    let command = format!("exec 3<>/dev/tcp/127.0.0.1/{port} && echo CONNECTED");
    let output = run(&tool(policy), &l.ws, &command).await.unwrap();
    let accepted = listener.accept().is_ok();
    (text(&output).to_string(), accepted)
}

#[tokio::test]
async fn the_network_is_cut_without_network_and_reachable_with_it() {
    if !landlock_for_tests() {
        return;
    }
    let (out, accepted) = connect("workspace-write").await;
    assert!(!out.contains("CONNECTED") && !accepted, "{out}");
    assert!(out.contains("Permission denied"), "{out}");
    // Named as the network refused, not as a write to a file under /dev.
    assert!(out.contains("blocked by the sandbox: a network connection (tcp 127.0.0.1 port "), "{out}");
    assert!(out.contains("must write there or reach the network"), "{out}");
    assert!(!out.contains("blocked by the sandbox: /dev/"), "{out}");
    let (out, accepted) = connect("workspace-write+network").await;
    assert!(out.contains("CONNECTED") && accepted, "{out}");
    let (out, _) = connect("read-only").await;
    assert!(!out.contains("CONNECTED"), "{out}");
    // UDP is cut too (seccomp refuses the socket, not only Landlock's TCP rules).
    let l = layout();
    let output = run(&tool("workspace-write"), &l.ws, "echo hi > /dev/udp/127.0.0.1/9 && echo SENT").await.unwrap();
    assert!(!text(&output).contains("SENT"), "{}", text(&output));
}

#[tokio::test]
async fn off_runs_unconfined_and_says_nothing() {
    let l = layout();
    let output = run(&tool("off"), &l.ws, &format!("echo x > {}/o && echo wrote", l.outside.display())).await.unwrap();
    assert_eq!(text(&output), "wrote\n");
    assert_eq!(output.meta, None);
    assert!(l.outside.join("o").exists());
}

// ---------------------------------------------------------------------------------------------
// no escapes from the process tree

/// Starts a `setsid` grandchild (`a.pid`) and a double-forked `setsid` daemon (`b.pid`), both
/// detached from the group and from the output pipes, then runs `rest`.
fn escapees(rest: &str) -> String {
    format!(
        "setsid sh -c 'echo $$ > a.pid; exec sleep 60' >/dev/null 2>&1 </dev/null & \
         ( setsid sh -c 'sh -c \"echo \\$\\$ > b.pid; exec sleep 60\" >/dev/null 2>&1 </dev/null &' & ) ; \
         while [ ! -s a.pid ] || [ ! -s b.pid ]; do sleep 0.02; done; echo STARTED; {rest}"
    )
}

/// The pids the escapees wrote in `ws`, once both are there.
async fn escapee_pids(ws: &Path) -> Vec<String> {
    let read = |name: &str| std::fs::read_to_string(ws.join(name)).ok().filter(|p| p.ends_with('\n'));
    common::until("the escapees to write their pids", || read("a.pid").is_some() && read("b.pid").is_some()).await;
    let pids: Vec<String> = ["a.pid", "b.pid"].iter().map(|n| read(n).unwrap().trim().to_string()).collect();
    // A pid is written by its shell just before that shell execs the marker `sleep`, so the
    // cmdline is awaited, not read once.
    let is_sleep = |pid: &String| {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        String::from_utf8_lossy(&cmdline).starts_with("sleep\0")
    };
    common::until("the escapees to exec the marker sleep", || pids.iter().all(is_sleep)).await;
    pids
}

/// Every pid is gone: not running, not an unreaped zombie.
async fn all_gone(what: &str, pids: &[String]) {
    common::until(what, || pids.iter().all(|pid| !Path::new("/proc").join(pid).exists())).await;
}

#[tokio::test]
async fn setsid_and_double_forked_processes_die_when_the_command_exits() {
    for policy in ["off", "workspace-write"] {
        let l = layout();
        let output = run(&tool(policy), &l.ws, &escapees("true")).await.unwrap();
        assert!(text(&output).contains("STARTED"), "{}", text(&output));
        let pids = [
            std::fs::read_to_string(l.ws.join("a.pid")).unwrap(),
            std::fs::read_to_string(l.ws.join("b.pid")).unwrap(),
        ];
        let pids: Vec<String> = pids.iter().map(|p| p.trim().to_string()).collect();
        all_gone(&format!("the escapees of a {policy} command to die"), &pids).await;
    }
}

#[tokio::test]
async fn setsid_and_double_forked_processes_die_on_timeout() {
    let l = layout();
    let args = json!({"command": escapees("sleep 60"), "description": "t", "timeoutMs": 1500});
    let ctx = admitted(&tool("off"), &args, &l.ws, CancellationToken::new());
    let call = tokio::spawn(tool("off").execute(args, ctx));
    let pids = escapee_pids(&l.ws).await;
    let err = call.await.unwrap().unwrap_err();
    assert_eq!(err.code, "TIMEOUT");
    assert!(err.message.contains("STARTED"), "{}", err.message);
    all_gone("the escapees to die after the timeout", &pids).await;
}

#[tokio::test]
async fn setsid_and_double_forked_processes_die_on_cancel() {
    let l = layout();
    let cancel = CancellationToken::new();
    let ctx = ToolContext::detached(Some(l.ws.clone()), cancel.clone());
    let args = json!({"command": escapees("sleep 60"), "description": "t"});
    let call = tokio::spawn(tool("workspace-write").execute(args, ctx));
    let pids = escapee_pids(&l.ws).await;
    cancel.cancel();
    let err = call.await.unwrap().unwrap_err();
    assert_eq!(err.code, "ABORTED");
    all_gone("the escapees to die after the cancel", &pids).await;
}

#[tokio::test]
async fn a_dropped_call_kills_its_processes_too() {
    let l = layout();
    let args = json!({"command": escapees("sleep 60"), "description": "t"});
    let ctx = admitted(&tool("off"), &args, &l.ws, CancellationToken::new());
    let call = tokio::spawn(tool("off").execute(args, ctx));
    let pids = escapee_pids(&l.ws).await;
    call.abort();
    let _ = call.await;
    all_gone("the escapees to die after the call was dropped", &pids).await;
}

// ---------------------------------------------------------------------------------------------
// escalations (the gate's side is in tests/permissions.rs)

/// Fail closed: a call the gate admitted as a sandboxed command (no question asked) does not run
/// unconfined when the session's sandbox is switched off before it starts; called again, it is an
/// unconfined command, which the gate asks about.
#[tokio::test]
async fn a_call_admitted_as_sandboxed_does_not_run_unconfined_after_the_sandbox_is_switched_off() {
    let l = layout();
    let settings = SandboxSettings { policy: SandboxPolicy::parse("workspace-write").unwrap(), ..Default::default() };
    let sandbox = Arc::new(SessionSandbox::restored(Arc::new(settings), None));
    let bash = BashTool::with_sandbox(sandbox.clone(), None);
    let target = l.outside.join("escaped");
    let args = json!({"command": format!("echo x > {}", target.display()), "description": "d"});
    let ctx = admitted(&bash, &args, &l.ws, CancellationToken::new());
    assert!(!ctx.allow_unsandboxed, "admitted as a sandboxed command");
    sandbox.set(SandboxPolicy::parse("off").unwrap());
    let err = bash.execute(args.clone(), ctx).await.unwrap_err();
    assert_eq!(err.code, "SANDBOX_UNAVAILABLE", "{}", err.message);
    assert!(err.message.contains("switched off after this command was allowed"), "{}", err.message);
    assert!(!target.exists(), "the command did not run");
    // Called again, the gate sees an unconfined command (and asks); allowed, it runs.
    assert!(matches!(bash.access(&args), Access::Execute { .. }));
    bash.execute(args.clone(), admitted(&bash, &args, &l.ws, CancellationToken::new())).await.unwrap();
    assert!(target.exists());
}

#[tokio::test]
async fn an_escalation_without_the_gate_is_refused_and_the_schema_offers_it_only_under_a_sandbox() {
    let l = layout();
    let ctx = ToolContext::detached(Some(l.ws.clone()), CancellationToken::new());
    let target = l.outside.join("escaped");
    let args = json!({"command": format!("echo x > {}", target.display()), "description": "d", "sandbox": "off"});
    let err = tool("workspace-write").execute(args, ctx).await.unwrap_err();
    assert_eq!(err.code, "SANDBOX_ESCALATION_REFUSED");
    assert!(!target.exists());
    assert!(tool("workspace-write").parameters()["properties"]["sandbox"].is_object());
    assert!(tool("off").parameters()["properties"].get("sandbox").is_none());
    assert!(BashTool::default().parameters()["properties"].get("sandbox").is_none());
    assert!(tool("read-only").description().contains("sandbox: \"off\""));
    assert_eq!(tool("off").description(), BashTool::default().description());
}
