//! A third-party client: the official TypeScript SDK (`@agentclientprotocol/sdk`, its
//! `/unstable` entrypoint) drives `kin acp` and must parse every `session/update` kin sends:
//! through the `subagent-spawn` scenario with `clientCapabilities.subagents` (the
//! `subagent_update`s included), and as an editor against a loopback model the script serves
//! (`tests/ts-client/client.mjs`, mode `editor`): a write asked about while its call is `pending`,
//! with an absolute location, and a `bash` command whose live output arrives as progress, or,
//! for a client with terminals (which the script implements by spawning the process), whose call
//! embeds the terminal. The SDK is installed from `tests/ts-client/package.json` into a scratch
//! directory, never into the repository. The tests skip when Node.js is absent, and when npm
//! cannot install the SDK (the registry unreachable) except under `CI=true`, where that fails.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

const KIN: &str = env!("CARGO_BIN_EXE_kin");

const SKIP: &str = "skipping: node/npm not found; the TypeScript SDK client test needs Node.js";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Whether `program --version` runs.
fn available(program: &str) -> bool {
    Command::new(program)
        .arg("--version")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

/// Runs `command` to completion with captured output, failing the test after `timeout`.
fn run(mut command: Command, timeout: Duration, what: &str) -> Output {
    command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = command.spawn().unwrap_or_else(|e| panic!("could not start {what}: {e}"));
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let stdout_reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = stdout.read_to_end(&mut buf);
        buf
    });
    let stderr_reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = stderr.read_to_end(&mut buf);
        buf
    });
    let deadline = Instant::now() + timeout;
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            // The readers are not joined: a grandchild may still hold the pipes open.
            panic!("{what} did not finish within {} s", timeout.as_secs());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // The child has exited; `wait` returns the status `try_wait` saw.
    let status = child.wait().unwrap();
    Output { status, stdout: stdout_reader.join().unwrap(), stderr: stderr_reader.join().unwrap() }
}

/// Installs the pinned SDK from `tests/ts-client/package.json` into `dir`, next to a copy of
/// the client script (ESM ignores NODE_PATH, so the script must sit above `node_modules`).
fn install_client(dir: &Path) -> Option<PathBuf> {
    let source = repo().join("tests").join("ts-client");
    std::fs::copy(source.join("package.json"), dir.join("package.json")).unwrap();
    let script = dir.join("client.mjs");
    std::fs::copy(source.join("client.mjs"), &script).unwrap();
    let mut npm = Command::new("npm");
    // `--loglevel=error` rather than `--silent`, which would hide why an install failed.
    npm.args(["install", "--no-audit", "--no-fund", "--loglevel=error", "--fetch-timeout=60000", "--fetch-retries=2"])
        .current_dir(dir);
    let output = run(npm, Duration::from_secs(360), "npm install of the TypeScript SDK");
    if !output.status.success() {
        let why = format!(
            "npm install of @agentclientprotocol/sdk failed ({}); is the npm registry reachable? \
             CI needs registry access for this test.\nstdout:\n{}\nstderr:\n{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr),
        );
        assert_ne!(std::env::var("CI").as_deref(), Ok("true"), "{why}");
        eprintln!("SKIPPING the TypeScript SDK client test (it would fail under CI=true): {why}");
        return None;
    }
    assert!(
        dir.join("node_modules").join("@agentclientprotocol").join("sdk").join("package.json").is_file(),
        "npm install succeeded but left no @agentclientprotocol/sdk in {}",
        dir.display()
    );
    Some(script)
}

/// A scratch dir with the SDK installed: the dir, the script, and fresh `sessions` and `cwd`
/// dirs; `None` (after saying why) when the test must skip.
fn prepare() -> Option<(tempfile::TempDir, PathBuf, PathBuf, PathBuf)> {
    if !available("node") || !available("npm") {
        eprintln!("{SKIP}");
        return None;
    }
    let root = tempfile::tempdir().unwrap();
    let (npm_dir, sessions, cwd) = (root.path().join("npm"), root.path().join("sessions"), root.path().join("cwd"));
    for dir in [&npm_dir, &sessions, &cwd] {
        std::fs::create_dir_all(dir).unwrap();
    }
    let script = install_client(&npm_dir)?;
    Some((root, script, sessions, cwd))
}

/// Runs the client script with `args` after the kin binary; its summary line, checked `ok`.
fn client(script: &Path, mode: &str, args: &[&Path], terminal: Option<&str>) -> Value {
    let mut node = Command::new("node");
    node.arg(script).arg(mode).arg(KIN).args(args).args(terminal).current_dir(script.parent().unwrap());
    let output = run(node, Duration::from_secs(120), "the TypeScript SDK client");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the TypeScript SDK client failed ({})\nstdout:\n{stdout}\nstderr:\n{stderr}",
        output.status
    );
    let line = stdout
        .lines()
        .rev()
        .find(|line| !line.trim().is_empty())
        .unwrap_or_else(|| panic!("the TypeScript SDK client printed no summary\nstderr:\n{stderr}"));
    let summary: Value = serde_json::from_str(line)
        .unwrap_or_else(|e| panic!("the summary line is not JSON ({e}): {line}\nstderr:\n{stderr}"));
    assert_eq!(summary["ok"], Value::Bool(true), "{summary}");
    summary
}

#[test]
fn typescript_sdk_parses_every_update() {
    let Some((_root, script, sessions, cwd)) = prepare() else { return };
    let scenario = repo().join("scenarios").join("subagent-spawn");
    let summary = client(&script, "replay", &[&scenario, &sessions, &cwd], None);
    assert_eq!(summary["stopReason"], "end_turn", "{summary}");
    let count = |kind: &str| summary["kinds"][kind].as_u64().unwrap_or(0);
    assert!(count("subagent_update") >= 1, "no subagent_update reached the SDK client: {summary}");
    assert!(count("tool_call") >= 1, "no tool_call reached the SDK client: {summary}");
    assert!(count("agent_message_chunk") >= 1, "no agent_message_chunk reached the SDK client: {summary}");
    // The editor features' updates pass the SDK's schema too.
    assert_eq!(count("available_commands_update"), 1, "the slash commands, once after session/new: {summary}");
    // One title per session: the parent's first prompt and the child's task.
    assert_eq!(count("session_info_update"), 2, "a title for the parent and one for the child: {summary}");
    assert!(summary["sessions"].as_u64().unwrap_or(0) >= 2, "the child's own updates are missing: {summary}");
}

/// The script itself fails unless each run saw what it checks (see its `editorProblems`): the
/// `pending` status and absolute location of an asked write, and live output (`local`) or the
/// embedded terminal with create, wait, output and release (`terminal`).
#[test]
fn typescript_sdk_parses_pending_calls_locations_live_output_and_terminals() {
    let Some((root, script, _, _)) = prepare() else { return };
    for terminal in ["local", "terminal"] {
        let (sessions, cwd) =
            (root.path().join(format!("sessions-{terminal}")), root.path().join(format!("cwd-{terminal}")));
        for dir in [&sessions, &cwd] {
            std::fs::create_dir_all(dir).unwrap();
        }
        let summary = client(&script, "editor", &[&sessions, &cwd], Some(terminal));
        assert_eq!(summary["stopReason"], "end_turn", "{summary}");
        assert_eq!(summary["permissionRequests"], 2, "{summary}");
        let expected: &[&str] = match terminal {
            "terminal" => &["create", "wait_for_exit", "output", "release"],
            _ => &[],
        };
        assert_eq!(summary["terminalCalls"], serde_json::json!(expected), "{summary}");
    }
}
