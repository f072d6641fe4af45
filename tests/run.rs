//! `kin run` over real pipes against a loopback DeepSeek-compatible server: text, stdin, json and
//! stream-json output, the exit code of each outcome, SIGINT mid-turn, `--resume` / `--continue`,
//! and permission refusals in `read-only` and `ask`.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use serde_json::{Value, json};
use wiremock::matchers::{body_string_contains, method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

const KIN: &str = env!("CARGO_BIN_EXE_kin");

fn chat_sse(events: &[Value]) -> String {
    let mut body: String = events.iter().map(|e| format!("data: {e}\n\n")).collect();
    body.push_str("data: [DONE]\n\n");
    body
}

fn chunk(delta: Value, finish: Option<&str>) -> Value {
    json!({"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
}

fn answer(text: &str, finish: &str) -> ResponseTemplate {
    let usage = json!({"id": "c", "object": "chat.completion.chunk", "choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 3}});
    let body =
        chat_sse(&[chunk(json!({"role": "assistant", "content": text}), None), chunk(json!({}), Some(finish)), usage]);
    ResponseTemplate::new(200).set_body_raw(body, "text/event-stream")
}

fn tool_call(name: &str, arguments: Value) -> ResponseTemplate {
    let body = chat_sse(&[
        chunk(
            json!({"role": "assistant", "content": null, "tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": name, "arguments": arguments.to_string()}}]}),
            None,
        ),
        chunk(json!({}), Some("tool_calls")),
    ]);
    ResponseTemplate::new(200).set_body_raw(body, "text/event-stream")
}

/// A temporary home for one test: a workspace, a sessions dir and a config.
struct Home {
    tmp: tempfile::TempDir,
}

impl Home {
    fn new() -> Self {
        let home = Home { tmp: tempfile::tempdir().unwrap() };
        std::fs::create_dir_all(home.cwd()).unwrap();
        std::fs::write(home.config(), "[model_settings]\nretry_base_delay_ms = 10\nmax_attempts = 1\n").unwrap();
        home
    }

    fn cwd(&self) -> PathBuf {
        self.tmp.path().join("work")
    }

    fn sessions(&self) -> PathBuf {
        self.tmp.path().join("sessions")
    }

    fn config(&self) -> PathBuf {
        self.tmp.path().join("config.toml")
    }

    fn kin(&self, server: &MockServer, args: &[&str]) -> Command {
        let mut command = Command::new(KIN);
        command
            .arg("run")
            .args(args)
            .arg("--config")
            .arg(self.config())
            .arg("--sessions")
            .arg(self.sessions())
            .current_dir(self.cwd())
            .env("DEEPSEEK_BASE_URL", server.uri())
            .env("DEEPSEEK_API_KEY", "sk-run-test")
            .env_remove("KIN_MODEL")
            .env_remove("KIN_PERMISSION_MODE")
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        command
    }

    fn run(&self, server: &MockServer, args: &[&str]) -> Output {
        self.kin(server, args).output().unwrap()
    }

    /// Every session log under the sessions dir: (session id, its events' types).
    fn logs(&self) -> Vec<(String, Vec<Value>)> {
        let mut out = Vec::new();
        for project in std::fs::read_dir(self.sessions()).into_iter().flatten().flatten() {
            for session in std::fs::read_dir(project.path()).unwrap().flatten() {
                let text = std::fs::read_to_string(session.path().join("session.jsonl")).unwrap();
                let mut lines = text.lines().map(|l| serde_json::from_str::<Value>(l).unwrap());
                let header = lines.next().unwrap();
                out.push((header["id"].as_str().unwrap().to_string(), lines.collect()));
            }
        }
        out
    }
}

fn stdout(out: &Output) -> String {
    String::from_utf8(out.stdout.clone()).unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8(out.stderr.clone()).unwrap()
}

fn turn_ends(events: &[Value]) -> Vec<Value> {
    events.iter().filter(|e| e["type"] == "turn/end").map(|e| e["data"]["reason"]["kind"].clone()).collect()
}

async fn server_answering(text: &str) -> MockServer {
    let server = MockServer::start().await;
    Mock::given(method("POST")).and(path("/chat/completions")).respond_with(answer(text, "stop")).mount(&server).await;
    server
}

#[tokio::test]
async fn text_output_streams_the_reply_and_exits_zero() {
    let server = server_answering("Hello from kin.").await;
    let home = Home::new();
    let out = home.run(&server, &["say hello"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out), "Hello from kin.\n");
    let logs = home.logs();
    assert_eq!(logs.len(), 1);
    let (id, events) = &logs[0];
    assert!(stderr(&out).contains(&format!("kin: session {id}")), "{}", stderr(&out));
    assert_eq!(turn_ends(events), [json!("completed")]);
    let prompt = events.iter().find(|e| e["type"] == "user/message").unwrap();
    assert_eq!(prompt["data"]["content"][0]["text"], "say hello");
}

/// A reader that closes stdout early (`kin run ... | head`) ends nothing: the turn completes and
/// kin exits 0 without a word. A stdout that cannot be written (`> /dev/full`) fails the run,
/// saying so and where the reply is kept. Every output alike, and no panic.
#[tokio::test]
async fn a_closed_stdout_is_quiet_and_a_failing_one_is_an_error() {
    let server = server_answering("Hello from kin.").await;
    let home = Home::new();
    for output in ["text", "json", "stream-json"] {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = home.kin(&server, &["--output", output, "say hello"]).stdout(writer).output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{output}: {}", stderr(&out));
        assert!(!stderr(&out).contains("panicked") && !stderr(&out).contains("stdout"), "{output}: {}", stderr(&out));
        let full = std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap();
        let out = home.kin(&server, &["--output", output, "say hello"]).stdout(full).output().unwrap();
        assert_eq!(out.status.code(), Some(1), "{output}: {}", stderr(&out));
        let said = stderr(&out);
        assert!(said.contains("kin: cannot write the reply to stdout: No space left on device"), "{output}: {said}");
        assert!(said.contains("kin sessions show ") && !said.contains("panicked"), "{output}: {said}");
    }
    let logs = home.logs();
    assert_eq!(logs.len(), 6);
    for (_, events) in &logs {
        assert_eq!(turn_ends(events), [json!("completed")], "each turn completed and is on disk");
    }
}

#[tokio::test]
async fn the_prompt_comes_from_stdin_when_absent_or_dash() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/chat/completions"))
        .and(body_string_contains("piped question"))
        .respond_with(answer("piped answer", "stop"))
        .expect(2)
        .mount(&server)
        .await;
    let home = Home::new();
    for args in [&[][..], &["-"][..]] {
        let mut child = home.kin(&server, args).stdin(Stdio::piped()).spawn().unwrap();
        child.stdin.take().unwrap().write_all(b"piped question\n").unwrap();
        let out = child.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        assert_eq!(stdout(&out), "piped answer\n");
    }
}

#[tokio::test]
async fn an_endless_prompt_on_stdin_is_refused_at_the_limit() {
    let server = server_answering("unused").await;
    let home = Home::new();
    let zero = std::fs::File::open("/dev/zero").unwrap();
    let out = home.kin(&server, &["-"]).stdin(zero).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("the prompt on stdin is larger than 16777216 bytes"), "{}", stderr(&out));
    assert!(home.logs().is_empty(), "no session is started");
}

#[tokio::test]
async fn bad_usage_exits_two() {
    let server = server_answering("unused").await;
    let home = Home::new();
    // stdin is /dev/null: no prompt anywhere.
    let empty = home.run(&server, &[]);
    assert_eq!(empty.status.code(), Some(2));
    assert!(stderr(&empty).contains("no prompt"), "{}", stderr(&empty));
    let both = home.run(&server, &["x", "--resume", "abc", "--continue"]);
    assert_eq!(both.status.code(), Some(2));
    let output = home.run(&server, &["x", "--output", "yaml"]);
    assert_eq!(output.status.code(), Some(2));
    // A --cwd that is not a directory is bad usage.
    let nowhere = home.run(&server, &["x", "--cwd", "/nonexistent-cwd"]);
    assert_eq!(nowhere.status.code(), Some(2));
    assert_eq!(stderr(&nowhere), "kin run: --cwd /nonexistent-cwd is not an existing directory\n");
    // A replay directory without a log is refused, naming the file once.
    let missing = home.run(&server, &["x", "--replay", "/nonexistent-replay"]);
    assert_eq!(missing.status.code(), Some(1));
    let said = stderr(&missing);
    assert_eq!(said.matches("/nonexistent-replay/session.jsonl").count(), 1, "{said}");
    // A provider kin does not know is bad usage, refused at start, naming the route once.
    let unknown = home.run(&server, &["x", "--model", "nosuch/model"]);
    assert_eq!(unknown.status.code(), Some(2));
    let said = stderr(&unknown);
    assert!(said.contains("unknown model provider \"nosuch\"") && said.matches("nosuch/model").count() == 1, "{said}");
    assert!(home.logs().is_empty(), "bad usage starts no session");
}

#[tokio::test]
async fn json_output_is_one_object_with_text_stop_reason_session_and_usage() {
    let server = server_answering("All done.").await;
    let home = Home::new();
    let out = home.run(&server, &["--output", "json", "finish it"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert_eq!(text.lines().count(), 1, "{text}");
    let result: Value = serde_json::from_str(&text).unwrap();
    let id = &home.logs()[0].0;
    assert_eq!(result["type"], "result");
    assert_eq!(result["text"], "All done.");
    assert_eq!(result["stopReason"], "end_turn");
    assert_eq!(result["error"], Value::Null);
    assert_eq!(result["sessionId"], id.as_str());
    assert_eq!(result["usage"], json!({"inputTokens": 12, "outputTokens": 3, "modelCalls": 1}), "{result}");
    assert_eq!(result["runningChildren"], json!([]));
}

#[tokio::test]
async fn stream_json_prints_every_update_then_the_result() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/chat/completions"))
        .respond_with(tool_call("read", json!({"file_path": "note.txt"})))
        .up_to_n_times(1)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path("/chat/completions"))
        .respond_with(answer("It says hi.", "stop"))
        .mount(&server)
        .await;
    let home = Home::new();
    std::fs::write(home.cwd().join("note.txt"), "hi\n").unwrap();
    let out = home.run(&server, &["--output", "stream-json", "read the note"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let lines: Vec<Value> =
        stdout(&out).lines().map(|l| serde_json::from_str(l).expect("every line is JSON")).collect();
    let kinds: Vec<String> = lines
        .iter()
        .map(|l| match l["type"].as_str().unwrap() {
            "session_update" => l["update"]["sessionUpdate"].as_str().unwrap().to_string(),
            other => other.to_string(),
        })
        .collect();
    let tool_call = kinds.iter().position(|k| k == "tool_call").expect("a tool_call update");
    let text = kinds.iter().position(|k| k == "agent_message_chunk").expect("a message chunk");
    assert!(tool_call < text, "{kinds:?}");
    assert!(kinds.contains(&"tool_call_update".to_string()), "{kinds:?}");
    assert_eq!(kinds.last().map(String::as_str), Some("result"));
    let call = &lines[tool_call];
    assert_eq!(call["update"]["kind"], "read");
    assert_eq!(call["sessionId"], lines.last().unwrap()["sessionId"]);
    assert_eq!(lines.last().unwrap()["text"], "It says hi.");
}

#[tokio::test]
async fn a_failed_turn_exits_one_and_max_tokens_exits_four() {
    let failing = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/chat/completions"))
        .respond_with(ResponseTemplate::new(401))
        .mount(&failing)
        .await;
    let home = Home::new();
    let out = home.run(&failing, &["hello"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let said = stderr(&out);
    assert!(said.contains("rejected"), "the turn's error is printed: {said}");
    // Once, in the turn's words: no JSON-RPC code name, no warning of the same failure beside it.
    assert_eq!(said.matches("rejected").count(), 1, "{said}");
    assert!(said.contains("kin: turn failed: ") && !said.contains("Internal error"), "{said}");
    // With a log file, what ended the run is in it too.
    let log = home.cwd().join("kin.log");
    let out = home.run(&failing, &["--log-file", log.to_str().unwrap(), "hello"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(
        logged.contains("ERROR") && logged.contains("kin run: turn failed: ") && logged.contains("rejected"),
        "{logged}"
    );
    let out = home.run(&failing, &["--log-file", log.to_str().unwrap(), "--resume", "nope", "hello"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(std::fs::read_to_string(&log).unwrap().contains("unknown session: nope"));

    let cut = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/chat/completions"))
        .respond_with(answer("partial", "length"))
        .mount(&cut)
        .await;
    let out = home.run(&cut, &["--output", "json", "write a long essay"]);
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    let result: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(result["stopReason"], "max_tokens");
}

#[tokio::test]
async fn the_step_limit_is_a_stop_with_exit_four() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/chat/completions"))
        .respond_with(tool_call("read", json!({"file_path": "note.txt"})))
        .mount(&server)
        .await;
    let home = Home::new();
    std::fs::write(home.cwd().join("note.txt"), "hi\n").unwrap();
    let out = home.run(&server, &["--max-steps", "1", "--output", "json", "read it forever"]);
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    let result: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(result["stopReason"], "max_turn_requests");
    let text = home.run(&server, &["--max-steps", "1", "read it forever"]);
    assert_eq!(text.status.code(), Some(4));
    assert!(stderr(&text).contains("--max-steps"), "the stop says how to allow more: {}", stderr(&text));
}

#[tokio::test]
async fn resume_and_continue_add_a_turn_to_the_right_session() {
    let server = server_answering("ok").await;
    let home = Home::new();
    let first = home.run(&server, &["--output", "json", "one"]);
    let first_id = serde_json::from_str::<Value>(&stdout(&first)).unwrap()["sessionId"].as_str().unwrap().to_string();
    // A newer session in another directory must not be what --continue picks here.
    let elsewhere = home.tmp.path().join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    let other = home.run(&server, &["--output", "json", "--cwd", elsewhere.to_str().unwrap(), "two"]);
    let other_id = serde_json::from_str::<Value>(&stdout(&other)).unwrap()["sessionId"].as_str().unwrap().to_string();
    assert_ne!(first_id, other_id);

    let continued = home.run(&server, &["--output", "json", "--continue", "three"]);
    assert_eq!(continued.status.code(), Some(0), "{}", stderr(&continued));
    assert_eq!(serde_json::from_str::<Value>(&stdout(&continued)).unwrap()["sessionId"], first_id.as_str());
    let resumed = home.run(&server, &["--output", "json", "--resume", &other_id, "four"]);
    assert_eq!(resumed.status.code(), Some(0), "{}", stderr(&resumed));

    let logs = home.logs();
    let turns = |id: &str| turn_ends(&logs.iter().find(|(i, _)| i == id).unwrap().1).len();
    assert_eq!((turns(&first_id), turns(&other_id)), (2, 2));
    let missing = home.run(&server, &["--resume", "no-such-session", "five"]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(stderr(&missing).contains("no-such-session"), "{}", stderr(&missing));
    assert!(
        stderr(&missing).starts_with("kin: unknown session: no-such-session"),
        "no JSON-RPC code names: {}",
        stderr(&missing)
    );
    // Said once, by kin run: the ACP crate's warning of the error it answered is not shown.
    assert_eq!(stderr(&missing).lines().count(), 1, "{}", stderr(&missing));
}

/// A model that calls `tool` with `arguments`, then answers `then` once the call's result is in
/// its request.
async fn server_calling(tool: &str, arguments: Value, then: &str) -> MockServer {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/chat/completions"))
        .and(body_string_contains("\"role\":\"tool\""))
        .respond_with(answer(then, "stop"))
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path("/chat/completions"))
        .respond_with(tool_call(tool, arguments))
        .mount(&server)
        .await;
    server
}

#[tokio::test]
async fn read_only_refuses_a_write_and_ask_refuses_with_a_message() {
    let write = json!({"file_path": "out.txt", "content": "x"});
    let server = server_calling("write", write, "I could not write it.").await;
    let home = Home::new();
    let read_only = home.run(&server, &["write out.txt"]);
    assert_eq!(read_only.status.code(), Some(0), "{}", stderr(&read_only));
    let said = stderr(&read_only);
    assert!(said.contains("failed:") && said.contains("out.txt"), "{said}");
    assert!(!home.cwd().join("out.txt").exists(), "read-only never writes");

    let ask = home.run(&server, &["--permission-mode", "ask", "write out.txt"]);
    assert_eq!(ask.status.code(), Some(0), "{}", stderr(&ask));
    assert!(stderr(&ask).contains("kin run cannot ask for permission"), "{}", stderr(&ask));
    assert!(!home.cwd().join("out.txt").exists(), "a refused question never writes");

    let bypass = home.run(&server, &["--permission-mode", "bypass", "write out.txt"]);
    assert_eq!(bypass.status.code(), Some(0), "{}", stderr(&bypass));
    assert_eq!(std::fs::read_to_string(home.cwd().join("out.txt")).unwrap(), "x");
}

/// A command kin run cannot ask about under accept-edits, with a sandbox asked for that the
/// kernel cannot enforce (simulated): the refusal says what would let it run, and kin says once
/// that the sandbox is not in force (before, neither: the hint named the mode already given).
#[tokio::test]
async fn a_refused_command_says_what_would_let_it_run_and_that_the_sandbox_is_not_in_force() {
    let bash = json!({"command": "touch made.txt", "description": "make a file"});
    let server = server_calling("bash", bash, "It was refused.").await;
    let home = Home::new();
    let args = ["--permission-mode", "accept-edits", "--sandbox", "workspace-write", "make a file"];
    let out = home.kin(&server, &args).env("KIN_SANDBOX_TEST_ABI", "0").output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let said = stderr(&out);
    assert!(
        said.contains("run with --permission-mode bypass, or give commands a sandbox the kernel enforces"),
        "{said}"
    );
    assert_eq!(said.matches("this kernel has no Landlock: commands are not sandboxed").count(), 1, "{said}");
    assert!(!home.cwd().join("made.txt").exists(), "a refused command never runs");
}

/// `kin run ARGS` sent `signal` once its turn is in its model call (which would take a minute).
async fn signalled(signal: libc::c_int, args: &[&str]) -> (Output, Home) {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/chat/completions"))
        .respond_with(answer("too late", "stop").set_delay(Duration::from_secs(60)))
        .mount(&server)
        .await;
    let home = Home::new();
    let child = home.kin(&server, args).spawn().unwrap();
    // Fenced on the model request having arrived: the turn is running.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while server.received_requests().await.unwrap_or_default().is_empty() {
        assert!(std::time::Instant::now() < deadline, "the model was never called");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as i32, signal) };
    (child.wait_with_output().unwrap(), home)
}

#[tokio::test]
async fn sigint_cancels_the_turn_and_the_log_says_so() {
    let (out, home) = signalled(libc::SIGINT, &["wait for it"]).await;
    assert_eq!(out.status.code(), Some(130), "{}", stderr(&out));
    assert!(stderr(&out).contains("cancelling the turn"), "{}", stderr(&out));
    let logs = home.logs();
    assert_eq!(turn_ends(&logs[0].1), [json!("aborted")]);
}

/// SIGTERM (a CI job's cancel, `timeout`) ends the run as SIGINT does, with its own code: the
/// turn is cancelled, the result still printed (before, kin died of it with no result).
#[tokio::test]
async fn sigterm_cancels_the_turn_and_the_result_is_still_printed() {
    let (out, home) = signalled(libc::SIGTERM, &["--output", "json", "wait for it"]).await;
    assert_eq!(out.status.code(), Some(143), "{}", stderr(&out));
    assert!(stderr(&out).contains("terminated (SIGTERM): cancelling the turn"), "{}", stderr(&out));
    let result: Value = serde_json::from_str(stdout(&out).trim()).unwrap_or_else(|e| panic!("{e}: {}", stdout(&out)));
    assert_eq!(result["stopReason"], "cancelled", "{result}");
    let logs = home.logs();
    assert_eq!(result["sessionId"], logs[0].0, "{result}");
    assert_eq!(turn_ends(&logs[0].1), [json!("aborted")]);
}

#[test]
fn replay_makes_a_run_keyless() {
    let home = Home::new();
    let scenario = concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios/streaming-text");
    let out = Command::new(KIN)
        .args(["run", "--replay", scenario, "--config"])
        .arg(home.config())
        .arg("--sessions")
        .arg(home.sessions())
        .arg("Count to five slowly, thinking first.")
        .current_dir(home.cwd())
        .env_remove("DEEPSEEK_API_KEY")
        .env_remove("KIN_MODEL")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out), "one, two, three, four, five.\n");
}

/// A relative `--sessions DIR` is taken from the working directory: the run's session is there,
/// `kin sessions list` finds it, and the catalog index is written beside it (a relative path used
/// to put the index in a directory named "" and warn on every command).
#[test]
fn a_relative_sessions_directory_is_taken_from_the_working_directory() {
    let home = Home::new();
    let scenario = concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios/streaming-text");
    let kin = |args: &[&str]| {
        Command::new(KIN)
            .args(args)
            .arg("--config")
            .arg(home.config())
            .args(["--sessions", "state/sessions"])
            .current_dir(home.cwd())
            .env_remove("DEEPSEEK_API_KEY")
            .env_remove("KIN_MODEL")
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let out = kin(&["run", "--replay", scenario, "Count to five slowly, thinking first."]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(!stderr(&out).contains("WARN"), "{}", stderr(&out));
    let listed = kin(&["sessions", "list"]);
    assert_eq!(listed.status.code(), Some(0), "{}", stderr(&listed));
    assert_eq!(stderr(&listed), "", "nothing to warn about");
    assert!(stdout(&listed).contains("Count to five"), "{}", stdout(&listed));
    assert!(home.cwd().join("state/sessions.catalog-index.jsonl").is_file(), "the index beside the directory");
}
