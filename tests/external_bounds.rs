//! An external ACP child cannot make kin hold what it sends without bound (issue 16): its answer
//! text is kept to its head and tail with a note (in the run's output, the parent's tool result
//! and the `subagent/remote-run` record), a frame over the size cap ends the run instead of
//! being read whole, its stderr is kept to its last bytes even without newlines, and a FIFO it
//! asks kin to read or write is refused at once. Sizes are asserted, and the peak RSS of this
//! test process (kin runs in it) read from `/proc/self/status`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use kin::testkit::agent::TurnEnd;
use kin::testkit::model::script::ReplayEntry;
use kin::testkit::model::{ModelRoute, text_response, tool_call_response};
use kin::testkit::session::{Event, SessionHeader};
use kin::testkit::subagent::external::{AcpProvider, ExternalAgentConfig, MAX_OUTPUT_BYTES};
use kin::testkit::subagent::{ErrorCode, StartRequest, StopReason, SubagentResult};
use kin::testkit::tools::Caller;
use serde_json::json;

#[allow(dead_code)]
mod common;
use common::{Quiet, runtime, start_request};

/// The handshake every scripted child makes (session `s1`), then the prompt read into `$prompt`;
/// `reply LINE RESULT` answers a request, `chunks N TEXT` streams N text updates of TEXT,
/// `tool_calls N SIZE` starts N tool calls titled with SIZE bytes of `T`.
const PREAMBLE: &str = r#"
reply() { id=$(printf '%s' "$1" | sed 's/.*"id":\([0-9]*\).*/\1/'); printf '{"jsonrpc":"2.0","id":%s,"result":%s}\n' "$id" "$2"; }
chunks() { awk -v n="$1" -v t="$2" 'BEGIN { for (i = 0; i < n; i++) printf "{\"jsonrpc\":\"2.0\",\"method\":\"session/update\",\"params\":{\"sessionId\":\"s1\",\"update\":{\"sessionUpdate\":\"agent_message_chunk\",\"content\":{\"type\":\"text\",\"text\":\"%s\"}}}}\n", t }'; }
tool_calls() { awk -v n="$1" -v size="$2" 'BEGIN { t = "T"; while (length(t) < size) t = t t; t = substr(t, 1, size); for (i = 0; i < n; i++) printf "{\"jsonrpc\":\"2.0\",\"method\":\"session/update\",\"params\":{\"sessionId\":\"s1\",\"update\":{\"sessionUpdate\":\"tool_call\",\"toolCallId\":\"t%d\",\"title\":\"%s\",\"kind\":\"other\",\"status\":\"pending\"}}}\n", i, t }'; }
read init; reply "$init" '{"protocolVersion":1}'
read new; reply "$new" '{"sessionId":"s1"}'
read prompt
"#;

/// The parent's workspace (the child's cwd).
fn workspace(root: &Path) -> PathBuf {
    let cwd = root.join("cwd");
    std::fs::create_dir_all(&cwd).unwrap();
    cwd.canonicalize().unwrap()
}

/// `sh -c SCRIPT` as the agent `KEY`.
fn agent(key: &str, script: &str) -> ExternalAgentConfig {
    let mut agent = ExternalAgentConfig::new(key, "sh");
    agent.args = vec!["-c".into(), script.into()];
    agent.startup_timeout = Duration::from_secs(10);
    agent.cancel_grace = Duration::from_millis(500);
    agent
}

fn request(cwd: &Path) -> StartRequest {
    let header = SessionHeader::new("parent-1", 1, Some(cwd.display().to_string()));
    let parent = Arc::new(Caller { header, depth: 0, route: ModelRoute::parse("p/m").unwrap(), history: None });
    StartRequest { label: Some("bounded".into()), max_depth: None, ..start_request(&parent, "Go.") }
}

/// Runs `agent` once through the service; its result, or the start's error.
async fn run(dir: &Path, agent: ExternalAgentConfig) -> Result<SubagentResult, kin::testkit::subagent::SubagentError> {
    let (rt, _) = runtime(dir, vec![], "");
    let name = agent.name.clone();
    rt.subagents().register_provider(Arc::new(AcpProvider::new(agent, kin::testkit::acp::external_agents()))).unwrap();
    let run = match rt.subagents().start(&name, request(&workspace(dir))).await {
        Ok(run) => run,
        Err(e) => {
            rt.shutdown().await;
            return Err(e);
        }
    };
    let result = tokio::time::timeout(Duration::from_secs(60), run.result).await.expect("the run ends").unwrap();
    (run.dispose)().await.unwrap();
    rt.shutdown().await;
    result
}

/// One test at a time: the memory figures are the process's.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The peak resident set of this process since the last reset, in MiB.
fn peak_rss_mib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmHWM in /proc/self/status");
    kib / 1024
}

/// Resets the peak resident set to the current one (`clear_refs` 5).
fn reset_peak_rss() {
    std::fs::write("/proc/self/clear_refs", "5").expect("the peak RSS can be reset");
}

/// What one of the flooding cases may add to the process's peak RSS (each test resets the peak
/// and runs alone). Each sends kin 50 MB or more; read whole, that costs more than this.
const PEAK_GROWTH_MIB: u64 = 64;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_megabytes_of_text_keep_their_head_and_tail() {
    let _alone = ONE_AT_A_TIME.lock().await;
    // 50 MB of answer text in 50 000 updates.
    let dir = tempfile::tempdir().unwrap();
    let script = format!(
        "{PREAMBLE}chunks 1 HEAD-; chunks 50000 {}; chunks 1 -TAIL\nreply \"$prompt\" '{{\"stopReason\":\"end_turn\"}}'\n",
        "x".repeat(1000)
    );
    reset_peak_rss();
    let base = peak_rss_mib();
    let result = run(dir.path(), agent("chatty", &script)).await.unwrap();
    let grew = peak_rss_mib().saturating_sub(base);
    eprintln!("50 MB of text: peak RSS +{grew} MiB");
    assert_eq!(result.stop_reason, StopReason::Completed);
    let output = &result.output;
    assert!(output.len() <= MAX_OUTPUT_BYTES + 100, "{} bytes of output", output.len());
    assert!(output.starts_with("HEAD-xxx") && output.ends_with("xxx-TAIL"), "head and tail are kept");
    // 50 000 010 bytes, of which the first and last 40 000 are kept.
    assert!(output.contains("\n[... 49920010 bytes omitted ...]\n"), "the note says what was cut");
    assert!(grew < PEAK_GROWTH_MIB, "50 MB of text grew the peak RSS by {grew} MiB");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_over_the_cap_ends_the_run_unread() {
    let _alone = ONE_AT_A_TIME.lock().await;
    // One valid 200 MB frame: the run fails once the line passes the cap.
    let dir = tempfile::tempdir().unwrap();
    let script = format!(
        "{PREAMBLE}printf '{{\"jsonrpc\":\"2.0\",\"method\":\"session/update\",\"params\":{{\"sessionId\":\"s1\",\"update\":{{\"sessionUpdate\":\"agent_message_chunk\",\"content\":{{\"type\":\"text\",\"text\":\"'\nhead -c 200000000 /dev/zero | tr '\\0' a\nprintf '\"}}}}}}}}\\n'\nreply \"$prompt\" '{{\"stopReason\":\"end_turn\"}}'\n"
    );
    reset_peak_rss();
    let base = peak_rss_mib();
    let result = run(dir.path(), agent("huge", &script)).await.unwrap();
    let grew = peak_rss_mib().saturating_sub(base);
    eprintln!("a 200 MB frame: peak RSS +{grew} MiB");
    assert_eq!(result.stop_reason, StopReason::Error);
    let error = result.remote.unwrap().error.unwrap();
    assert!(
        error.starts_with("the child agent wrote a line longer than 16777216 bytes, the most kin reads as one frame"),
        "{error}"
    );
    assert!(result.output.is_empty(), "nothing of the frame is kept: {} bytes", result.output.len());
    assert!(grew < PEAK_GROWTH_MIB, "a 200 MB frame grew the peak RSS by {grew} MiB");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stderr_without_newlines_is_kept_to_its_last_bytes() {
    let _alone = ONE_AT_A_TIME.lock().await;
    // 50 MB of stderr without a newline, then an exit during the handshake.
    let dir = tempfile::tempdir().unwrap();
    let script = "head -c 50000000 /dev/zero | tr '\\0' e >&2; printf 'last words' >&2; exit 3";
    reset_peak_rss();
    let base = peak_rss_mib();
    let err = run(dir.path(), agent("noisy", script)).await.unwrap_err();
    let grew = peak_rss_mib().saturating_sub(base);
    eprintln!("50 MB of stderr: peak RSS +{grew} MiB");
    assert_eq!(err.code, ErrorCode::StartFailed);
    assert!(err.message.len() < 5000, "{} bytes of error message", err.message.len());
    assert!(
        err.message.starts_with(
            "subagent provider \"acp:noisy\": the child agent exited (exit code 3) during the handshake; its stderr \
             (50000010 bytes, the first "
        ),
        "{}",
        &err.message[..200.min(err.message.len())]
    );
    assert!(err.message.ends_with("eeeelast words"), "its last bytes are quoted");
    assert!(grew < PEAK_GROWTH_MIB, "50 MB of stderr grew the peak RSS by {grew} MiB");
}

/// Runs one parent turn that delegates once to `delegate_KEY` (`sh -c SCRIPT`), in `bypass` (a
/// delegation to an external agent asks otherwise), and returns the parent's log.
async fn delegate_once(key: &str, script: &str) -> Vec<Event> {
    let dir = tempfile::tempdir().unwrap();
    let entries = vec![
        ReplayEntry::Chunks(tool_call_response(
            "c1",
            &format!("delegate_{key}"),
            r#"{"description":"the task","prompt":"Do it."}"#,
        )),
        ReplayEntry::Chunks(text_response(&["parent done"])),
    ];
    let script = serde_json::to_string(script).unwrap();
    let config = format!(
        "permission_mode = \"bypass\"\n[acp_agents.{key}]\ncommand = \"sh\"\nargs = [\"-c\", {script}]\npermission = \"allow-reads\"\n"
    );
    let (rt, _) = runtime(dir.path(), entries, &config);
    let id = rt.new_session(&workspace(dir.path()), Arc::new(Quiet)).unwrap();
    let turn = rt.prompt(&id, vec![json!({"type": "text", "text": "go"})]).unwrap();
    assert_eq!(tokio::time::timeout(Duration::from_secs(30), turn).await.unwrap().unwrap(), TurnEnd::Completed);
    let log = rt.store().inspect(&id).unwrap().events;
    rt.shutdown().await;
    log
}

#[tokio::test]
async fn the_parent_records_and_passes_on_a_bounded_result() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let script = format!(
        "{PREAMBLE}chunks 1 HEAD-; chunks 20000 {}; chunks 1 -TAIL\nreply \"$prompt\" '{{\"stopReason\":\"end_turn\"}}'\n",
        "y".repeat(1000)
    );
    let log = delegate_once("big", &script).await;
    let remote = log.iter().find(|e| e.kind == "subagent/remote-run").expect("the run is recorded");
    let recorded = remote.data["output"].as_str().unwrap();
    assert!(recorded.len() <= MAX_OUTPUT_BYTES + 100, "{} bytes recorded", recorded.len());
    let result = log.iter().find(|e| e.kind == "tool/result").unwrap();
    let text = result.data["message"]["content"][0]["content"][0]["text"].as_str().unwrap();
    assert!(text.len() <= MAX_OUTPUT_BYTES + 100, "a tool result of {} bytes", text.len());
    assert!(
        text.starts_with("HEAD-") && text.ends_with("-TAIL") && text.contains(" bytes omitted ...]"),
        "{}",
        &text[..80]
    );
}

#[tokio::test]
async fn a_flood_of_tool_calls_is_reported_within_the_call_cap_on_progress() {
    let _alone = ONE_AT_A_TIME.lock().await;
    // 1000 tool calls titled with 20 kB each: 20 MB of progress if every one were reported whole.
    let end = "reply \"$prompt\" '{\"stopReason\":\"end_turn\"}'";
    let script = format!("{PREAMBLE}tool_calls 1000 20000\nchunks 1 done\n{end}\n");
    let log = delegate_once("busy", &script).await;
    let reports: Vec<&str> =
        log.iter().filter(|e| e.kind == "tool/progress").map(|e| e.data["text"].as_str().unwrap()).collect();
    // A call's progress is capped (`tools::MAX_PROGRESS_REPORTS`, `MAX_PROGRESS_REPORT_BYTES`):
    // 120 reports of at most 8192 bytes and their notes.
    assert_eq!(reports.len(), 120, "the reports of the call");
    let (prefix, cap) = ("acp:busy: ", 8192);
    let kept = "T".repeat(cap - prefix.len());
    let first = format!("{prefix}{kept}\n[... {} more bytes not shown ...]", 20_000 + prefix.len() - cap);
    assert_eq!(reports[0], first, "a long title is cut, saying so");
    assert!(reports.iter().all(|r| r.len() <= cap + 200), "every report is cut");
    let stops = "[progress stops here; the call's result follows when it ends]";
    assert!(reports.last().unwrap().ends_with(stops), "the last report says so");
    let result = log.iter().find(|e| e.kind == "tool/result").unwrap();
    let text = result.data["message"]["content"][0]["content"][0]["text"].as_str().unwrap();
    assert!(text.ends_with("done"), "the run itself completes: {text}");
}

#[tokio::test]
async fn a_fifo_the_child_asks_for_is_refused_at_once() {
    let _alone = ONE_AT_A_TIME.lock().await;
    // The child makes a FIFO in its workspace, asks kin to read it, and answers with what kin
    // said. Nobody ever opens the FIFO's other end.
    let script = format!(
        r#"{PREAMBLE}mkfifo "$(pwd -P)/pipe"
printf '{{"jsonrpc":"2.0","id":"r","method":"fs/read_text_file","params":{{"sessionId":"s1","path":"%s/pipe"}}}}\n' "$(pwd -P)"
read answer
say=$(printf '%s' "$answer" | sed 's/\\/\\\\/g; s/"/\\"/g')
printf '{{"jsonrpc":"2.0","method":"session/update","params":{{"sessionId":"s1","update":{{"sessionUpdate":"agent_message_chunk","content":{{"type":"text","text":"%s"}}}}}}}}\n' "$say"
reply "$prompt" '{{"stopReason":"end_turn"}}'
"#
    );
    let log = tokio::time::timeout(Duration::from_secs(30), delegate_once("fifo", &script)).await.expect("no hang");
    let remote = log.iter().find(|e| e.kind == "subagent/remote-run").expect("the run is recorded");
    let output = remote.data["output"].as_str().unwrap();
    assert!(output.contains(r#""id":"r","error":{"code":-32603"#), "{output}");
    assert!(output.contains("/pipe is a FIFO (named pipe), not a regular file"), "{output}");
}
