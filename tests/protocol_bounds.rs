//! kin's own protocol channel under load, in the real binary over pipes: a frame longer than the
//! maximum frame size is answered with a JSON-RPC error (with its id when the start of the frame
//! holds it) and kin keeps serving, without ever holding the frame (its peak RSS stays bounded);
//! a request sent wrong (params not an object, no `"jsonrpc": "2.0"`, a notification sent as a
//! request, an id too long to echo) is told what is wrong under its id (or a null one);
//! concurrent `session/load` and `session/resume` of one session from one client all succeed.

use std::io::Write;
use std::time::Duration;

use serde_json::{Value, json};

#[allow(dead_code)]
mod common;
use common::Peer;

const TIMEOUT: Duration = Duration::from_secs(60);

fn initialized(command: &mut std::process::Command) -> Peer {
    let mut kin = Peer::spawn(command).ids_after(1000);
    let init = kin.call("initialize", json!({"protocolVersion": 1, "clientCapabilities": {}}), TIMEOUT);
    assert!(init["result"].is_object(), "{init}");
    kin
}

/// Writes `head`, `size` bytes of `x`, then `tail` and a newline to kin's stdin, in pieces.
fn write_huge(kin: &mut Peer, head: &str, size: usize, tail: &str) {
    let stdin = kin.child.stdin.as_mut().unwrap();
    stdin.write_all(head.as_bytes()).unwrap();
    let block = vec![b'x'; 1 << 20];
    let mut left = size;
    while left > 0 {
        let n = left.min(block.len());
        stdin.write_all(&block[..n]).unwrap();
        left -= n;
    }
    stdin.write_all(tail.as_bytes()).unwrap();
    stdin.write_all(b"\n").unwrap();
    stdin.flush().unwrap();
}

/// The next response with id `id` (notifications and other responses are passed over).
fn answer(kin: &Peer, id: Value) -> Value {
    loop {
        let frame = kin.frame(TIMEOUT);
        if frame["id"] == id && frame.get("method").is_none() {
            return frame;
        }
    }
}

fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).expect("VmHWM in /proc/PID/status");
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

#[test]
fn an_oversize_frame_is_refused_with_its_id_and_kin_keeps_serving() {
    let tmp = tempfile::tempdir().unwrap();
    let mut command = common::acp(&tmp.path().join("sessions"), None);
    command.args(["--max-frame-bytes", "1048576"]);
    let mut kin = initialized(&mut command);
    // The id before the huge params: answered with it.
    let head = r#"{"jsonrpc":"2.0","id":7,"method":"session/prompt","params":{"sessionId":"s","prompt":[{"type":"text","text":""#;
    write_huge(&mut kin, head, 3 << 20, r#""}]}}"#);
    let refused = answer(&kin, json!(7));
    assert_eq!(refused["error"]["code"], -32600, "{refused}");
    let message = refused["error"]["message"].as_str().unwrap();
    assert!(message.contains("more than kin's maximum frame size of 1048576 bytes"), "{message}");
    assert!(message.contains("--max-frame-bytes"), "{message}");
    assert_eq!(refused["error"]["data"]["maxFrameBytes"], 1_048_576);
    assert!(refused["error"]["data"]["frameBytes"].as_u64().unwrap() > 3 << 20);
    // The id after them: answered with null.
    let head = r#"{"jsonrpc":"2.0","method":"session/prompt","params":{"prompt":""#;
    write_huge(&mut kin, head, 2 << 20, r#""},"id":8}"#);
    let refused = answer(&kin, Value::Null);
    assert_eq!(refused["error"]["code"], -32600, "{refused}");
    // A frame that is not UTF-8 is a parse error with its id.
    let stdin = kin.child.stdin.as_mut().unwrap();
    stdin
        .write_all(b"{\"jsonrpc\":\"2.0\",\"id\":9,\"method\":\"session/list\",\"params\":{\"cwd\":\"\xff\"}}\n")
        .unwrap();
    stdin.flush().unwrap();
    let refused = answer(&kin, json!(9));
    assert_eq!(refused["error"]["code"], -32700, "{refused}");
    // Still serving.
    let listed = kin.call("session/list", json!({}), TIMEOUT);
    assert!(listed["result"]["sessions"].is_array(), "{listed}");
    kin.close_stdin();
    assert!(kin.child.wait().unwrap().success());
}

/// A request kin cannot serve as sent is answered with its id and what is wrong with it (the
/// SDK alone would answer with a null id the client cannot match, or "Method not found" for a
/// notification sent as a request); an id too long to echo is refused without being echoed.
#[test]
fn a_request_sent_wrong_is_told_what_is_wrong_under_its_id() {
    let tmp = tempfile::tempdir().unwrap();
    let mut kin = initialized(&mut common::acp(&tmp.path().join("sessions"), None));
    let mut send = |frame: Value| {
        let stdin = kin.child.stdin.as_mut().unwrap();
        writeln!(stdin, "{frame}").unwrap();
        stdin.flush().unwrap();
    };
    send(json!({"jsonrpc": "2.0", "id": 21, "method": "session/list", "params": "all"}));
    send(json!({"id": "a", "method": "session/list", "params": {}}));
    send(json!({"jsonrpc": "2.0", "id": 22, "method": "session/cancel", "params": {"sessionId": "s"}}));
    send(json!({"jsonrpc": "2.0", "id": "i".repeat(2000), "method": "session/list", "params": {}}));
    let expect = |id: Value, code: i64, message: &str| {
        let refused = answer(&kin, id);
        assert_eq!(
            (refused["error"]["code"].as_i64(), refused["error"]["message"].as_str()),
            (Some(code), Some(message))
        );
    };
    expect(json!(21), -32602, "Invalid params: params must be an object");
    expect(json!("a"), -32600, r#"Invalid request: it lacks "jsonrpc": "2.0""#);
    expect(json!(22), -32600, "Invalid request: session/cancel is a notification: send it without an id");
    let long = "Invalid request: its id is longer than 1024 bytes; use a number or a short string";
    expect(Value::Null, -32600, long);
    // An id longer than the start kin reads of a frame: refused the same way, not echoed.
    write_huge(&mut kin, r#"{"jsonrpc":"2.0","id":""#, 100_000, r#"","method":"session/list","params":{}}"#);
    let refused = answer(&kin, Value::Null);
    assert_eq!(refused["error"]["message"], long);
    assert!(refused.to_string().len() < 1024);
    let listed = kin.call("session/list", json!({}), TIMEOUT);
    assert!(listed["result"]["sessions"].is_array(), "still serving: {listed}");
    kin.close_stdin();
    assert!(kin.child.wait().unwrap().success());
}

/// The SDK answers a malformed request by quoting it: kin cuts that quote, so a 4 MiB prompt
/// with one bad block is not echoed back whole.
#[test]
fn a_malformed_request_is_not_echoed_back_whole() {
    let tmp = tempfile::tempdir().unwrap();
    let mut kin = initialized(&mut common::acp(&tmp.path().join("sessions"), None));
    let head = r#"{"jsonrpc":"2.0","id":11,"method":"session/prompt","params":{"sessionId":"s","prompt":[{"type":"nonsense","text":""#;
    write_huge(&mut kin, head, 4 << 20, r#""}]}}"#);
    let line = loop {
        let line = kin.line(TIMEOUT).expect("an answer");
        let frame: Value = serde_json::from_str(&line).unwrap();
        if frame["id"] == 11 {
            break line;
        }
    };
    let refused: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(refused["error"]["code"], -32602, "{refused}");
    assert!(line.len() <= 64 * 1024, "{} bytes", line.len());
    let listed = kin.call("session/list", json!({}), TIMEOUT);
    assert!(listed["result"]["sessions"].is_array(), "still serving: {listed}");
    kin.close_stdin();
    assert!(kin.child.wait().unwrap().success());
}

#[test]
fn a_huge_frame_never_costs_its_size_in_memory() {
    const SIZE: usize = 300 << 20;
    let tmp = tempfile::tempdir().unwrap();
    // The default limit (64 MiB).
    let mut kin = initialized(&mut common::acp(&tmp.path().join("sessions"), None));
    let head = r#"{"jsonrpc":"2.0","id":5,"method":"session/prompt","params":{"sessionId":"s","prompt":[{"type":"text","text":""#;
    write_huge(&mut kin, head, SIZE, r#""}]}}"#);
    let refused = answer(&kin, json!(5));
    assert_eq!(refused["error"]["code"], -32600, "{refused}");
    assert_eq!(refused["error"]["data"]["maxFrameBytes"], 64 << 20);
    let listed = kin.call("session/list", json!({}), TIMEOUT);
    assert!(listed["result"]["sessions"].is_array(), "{listed}");
    let peak = peak_rss(kin.child.id());
    assert!(peak < 160 << 20, "kin peaked at {} MB reading a {} MB frame", peak >> 20, SIZE >> 20);
    kin.close_stdin();
    assert!(kin.child.wait().unwrap().success());
}

#[test]
fn concurrent_loads_and_resumes_of_one_session_all_succeed() {
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path().join("cwd");
    std::fs::create_dir_all(&cwd).unwrap();
    let sessions = tmp.path().join("sessions");
    // A stored session, written by an earlier kin.
    let mut first = initialized(&mut common::acp(&sessions, None));
    let created = first.call("session/new", json!({"cwd": cwd, "mcpServers": []}), TIMEOUT);
    let id = created["result"]["sessionId"].as_str().unwrap().to_string();
    first.close_stdin();
    assert!(first.child.wait().unwrap().success());
    // Eight loads and resumes at once, then eight more while the session is live.
    let mut kin = initialized(&mut common::acp(&sessions, None));
    for round in 0..2 {
        let calls: Vec<u64> = (0..8)
            .map(|i| {
                let method = if i % 2 == 0 { "session/load" } else { "session/resume" };
                kin.request(method, json!({"sessionId": id, "cwd": cwd, "mcpServers": []}))
            })
            .collect();
        // Answered in any order (the loads wait for each other, a resume of a live session
        // does not).
        let answers = kin.responses(&calls, TIMEOUT);
        for call in calls {
            let answered = &answers[&call];
            assert!(answered["result"].is_object(), "round {round}, request {call}: {answered}");
        }
    }
    kin.close_stdin();
    assert!(kin.child.wait().unwrap().success());
}

/// A turn of 200,000 one-character deltas over the real HTTP client: kin's peak memory stays
/// near its idle size. Before, each delta stayed in memory as an event for the life of the
/// session and the SDK's queue of updates to the editor grew with the stream (about 180 MB
/// peak in a debug build); now deltas after a call's first stay on disk and a model call waits
/// while more than a thousand updates are on their way to the client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finely_streamed_answer_costs_its_text_not_its_chunk_count() {
    use wiremock::matchers::{method, path};
    use wiremock::{Mock, MockServer, ResponseTemplate};
    const CHUNKS: usize = 200_000;
    let server = MockServer::start().await;
    let mut events = vec![common::chunk(json!({"role": "assistant", "content": ""}), None)];
    events.extend((0..CHUNKS).map(|_| common::chunk(json!({"content": "x"}), None)));
    events.push(common::chunk(json!({}), Some("stop")));
    let body = common::chat_sse(&events);
    Mock::given(method("POST"))
        .and(path("/chat/completions"))
        .respond_with(ResponseTemplate::new(200).set_body_raw(body, "text/event-stream"))
        .mount(&server)
        .await;
    let dir = tempfile::tempdir().unwrap();
    let sessions = dir.path().join("sessions");
    let mut command = common::acp(&sessions, None);
    command.env("DEEPSEEK_BASE_URL", server.uri()).env("DEEPSEEK_API_KEY", "sk-bounds");
    let mut kin = initialized(&mut command);
    let idle = peak_rss(kin.child.id());
    let created = kin.call("session/new", json!({"cwd": dir.path(), "mcpServers": []}), TIMEOUT);
    let session = created["result"]["sessionId"].as_str().unwrap().to_string();
    let id = kin.request("session/prompt", json!({"sessionId": session, "prompt": [{"type": "text", "text": "go"}]}));
    let mut streamed = 0usize;
    let done = kin.response(id, TIMEOUT, |frame| {
        if frame["params"]["update"]["sessionUpdate"] == "agent_message_chunk" {
            streamed += frame["params"]["update"]["content"]["text"].as_str().map_or(0, str::len);
        }
    });
    assert_eq!(done["result"]["stopReason"], "end_turn", "{done}");
    assert_eq!(streamed, CHUNKS, "every delta reached the client");
    let peak = peak_rss(kin.child.id());
    assert!(peak < idle + 48 * 1024 * 1024, "peak RSS {peak} bytes, idle {idle}: the stream was held in memory");
    kin.close_stdin();
    assert!(kin.child.wait().unwrap().success());
}
