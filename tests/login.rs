//! `kin login` / `kin logout` and the ACP auth flow, over real pipes and real HTTP: a key piped on
//! stdin is checked against a loopback mock provider (its `*_BASE_URL` or `[providers.NAME]`
//! base URL) and stored in the file store (`KIN_KEY_STORE=file`, under `XDG_CONFIG_HOME`, so no
//! test touches an OS keyring); `session/new` without a key answers `-32000` naming the provider
//! and variable; with the stored key the first turn reaches the mock with it; a rejected key is
//! not stored; logout removes it; no key ever shows in stderr, a message or a session log.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use serde_json::{Value, json};
use wiremock::matchers::{header, method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

#[allow(dead_code)]
mod common;
use common::{KIN, Peer};

const GOOD: &str = "sk-login-good-0123";
const BAD: &str = "sk-login-bad-4567";

/// A scratch home: config dir (the credentials file lives under it), sessions and a cwd.
struct Home {
    tmp: tempfile::TempDir,
}

impl Home {
    fn new(config: &str) -> Home {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(tmp.path().join("cwd")).unwrap();
        std::fs::write(tmp.path().join("config.toml"), config).unwrap();
        Home { tmp }
    }

    fn path(&self) -> &Path {
        self.tmp.path()
    }

    fn credentials(&self) -> PathBuf {
        self.path().join("xdg/kin/credentials.json")
    }

    /// `kin ARGS` with this home's config, the file key store and the mock as DeepSeek.
    fn kin(&self, server: &MockServer, args: &[&str]) -> Command {
        let mut command = Command::new(KIN);
        command
            .args(args)
            .arg("--config")
            .arg(self.path().join("config.toml"))
            .arg("--sessions")
            .arg(self.path().join("sessions"))
            .current_dir(self.path().join("cwd"))
            .env("XDG_CONFIG_HOME", self.path().join("xdg"))
            .env("KIN_KEY_STORE", "file")
            .env("DEEPSEEK_BASE_URL", server.uri())
            .env_remove("DEEPSEEK_API_KEY")
            .env_remove("KIN_MODEL")
            .env_remove("KIN_CONFIG");
        command
    }

    /// Runs `kin login ARGS` (or `kin acp login`) with `input` piped on stdin.
    fn login(&self, server: &MockServer, args: &[&str], input: &str) -> Output {
        let mut child =
            self.kin(server, args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
        child.wait_with_output().unwrap()
    }
}

fn text(output: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

fn chat_answer() -> ResponseTemplate {
    let chunk = |delta: Value, finish: Option<&str>| json!({"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
    let body = format!(
        "data: {}\n\ndata: {}\n\ndata: [DONE]\n\n",
        chunk(json!({"role": "assistant", "content": "logged in"}), None),
        chunk(json!({}), Some("stop"))
    );
    ResponseTemplate::new(200).set_body_raw(body, "text/event-stream")
}

/// A DeepSeek-like mock: `GET /models` accepts only `GOOD` (401 with the key echoed back, as
/// some providers do, otherwise) and chat completions answer `logged in`.
async fn provider() -> MockServer {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/models"))
        .and(header("authorization", format!("Bearer {GOOD}").as_str()))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"object": "list", "data": []})))
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/models"))
        .respond_with(
            ResponseTemplate::new(401).set_body_json(json!({"error": {"message": format!("invalid key {BAD}")}})),
        )
        .mount(&server)
        .await;
    Mock::given(method("POST")).and(path("/chat/completions")).respond_with(chat_answer()).mount(&server).await;
    server
}

fn call(kin: &mut Peer, method: &str, params: Value) -> Value {
    kin.call(method, params, Duration::from_secs(30))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_piped_key_is_checked_stored_and_used_and_logout_removes_it() {
    let server = provider().await;
    let home = Home::new("");
    let cwd = home.path().join("cwd");
    let mut kin = Peer::spawn(home.kin(&server, &["acp"]).stderr(Stdio::piped()));
    let init =
        call(&mut kin, "initialize", json!({"protocolVersion": 1, "clientCapabilities": {"auth": {"terminal": true}}}));
    let methods = &init["result"]["authMethods"];
    assert_eq!(methods[0]["type"], "terminal", "{init}");
    assert_eq!(methods[0]["args"], json!(["login"]), "the editor runs its agent command plus `login`");

    let refused = call(&mut kin, "session/new", json!({"cwd": cwd, "mcpServers": []}));
    assert_eq!(refused["error"]["code"], -32000, "{refused}");
    let message = refused["error"]["message"].as_str().unwrap();
    assert!(message.contains("deepseek") && message.contains("DEEPSEEK_API_KEY"), "{message}");
    assert_eq!(refused["error"]["data"], json!({"provider": "deepseek", "variable": "DEEPSEEK_API_KEY"}));

    // A rejected key is not stored, and the message says why without showing it.
    let rejected = home.login(&server, &["login"], &format!("deepseek\n{BAD}\n"));
    assert!(!rejected.status.success());
    let said = text(&rejected);
    assert!(said.contains("not stored") && said.contains("HTTP 401"), "{said}");
    assert!(!said.contains(BAD), "the key is never shown: {said}");
    assert!(!home.credentials().exists());

    // What the editor runs for the terminal method: `kin acp login`; the menu takes a number.
    let accepted = home.login(&server, &["acp", "login"], &format!("1\n{GOOD}\n"));
    let said = text(&accepted);
    assert!(accepted.status.success(), "{said}");
    assert!(said.contains("deepseek (DEEPSEEK_API_KEY)") && said.contains("openai") && said.contains("anthropic"));
    assert!(!said.contains(GOOD), "{said}");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(home.credentials()).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);

    // The same kin, retried by the editor: the session opens and its turn carries the key.
    let created = call(&mut kin, "session/new", json!({"cwd": cwd, "mcpServers": []}));
    let id = created["result"]["sessionId"].as_str().unwrap_or_else(|| panic!("{created}")).to_string();
    let turn = call(&mut kin, "session/prompt", json!({"sessionId": id, "prompt": [{"type": "text", "text": "hi"}]}));
    assert_eq!(turn["result"]["stopReason"], "end_turn", "{turn}");
    let requests = server.received_requests().await.unwrap();
    let chat = requests.iter().find(|r| r.url.path() == "/chat/completions").expect("the turn reached the mock");
    assert_eq!(chat.headers.get("authorization").unwrap(), format!("Bearer {GOOD}").as_str());
    let (status, stderr) = kin.exit_with_stderr();
    assert!(status.success());
    assert!(!stderr.contains(GOOD) && !stderr.contains(BAD), "no key in the logs");
    let log = std::fs::read_to_string(
        kin::testkit::session::SessionStore::new(home.path().join("sessions")).locate(&id).unwrap().unwrap(),
    )
    .unwrap();
    assert!(!log.contains(GOOD), "no key in the session log");

    // Logout removes it: a new kin asks for the login again.
    let out = home.kin(&server, &["logout", "deepseek"]).output().unwrap();
    assert!(out.status.success() && text(&out).contains("Removed the stored key for deepseek"), "{}", text(&out));
    assert!(!home.credentials().exists());
    let out = home.kin(&server, &["logout", "deepseek"]).output().unwrap();
    assert!(out.status.success() && text(&out).contains("No stored key for deepseek"), "{}", text(&out));
    let mut kin = Peer::spawn(home.kin(&server, &["acp"]).stderr(Stdio::null()));
    call(&mut kin, "initialize", json!({"protocolVersion": 1, "clientCapabilities": {}}));
    let refused = call(&mut kin, "session/new", json!({"cwd": cwd, "mcpServers": []}));
    assert_eq!(refused["error"]["code"], -32000, "{refused}");
    kin.close_stdin();
    assert!(kin.child.wait().unwrap().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_provider_is_offered_and_checked_at_its_base_url() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/api/v1/models"))
        .and(header("x-api-key", GOOD))
        .and(header("x-team", "blue"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"data": []})))
        .mount(&server)
        .await;
    let config = format!(
        "[providers.team]\nbase_url = \"{}/api\"\napi_key_env = \"TEAM_KEY\"\nkind = \"anthropic\"\nheaders = {{ x-team = \"blue\" }}\n\n[providers.local]\nbase_url = \"http://127.0.0.1:9/v1\"\n",
        server.uri()
    );
    let home = Home::new(&config);
    let out = home.login(&server, &["login"], &format!("team\n{GOOD}\n"));
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    assert!(said.contains("team (TEAM_KEY)"), "named providers with a key are offered: {said}");
    assert!(!said.contains("local"), "a provider without api_key_env takes no key: {said}");
    let stored: Value = serde_json::from_str(&std::fs::read_to_string(home.credentials()).unwrap()).unwrap();
    assert_eq!(stored, json!({"TEAM_KEY": GOOD}));
    let out = home.login(&server, &["login", "local"], "");
    assert!(!out.status.success() && text(&out).contains("api_key_env"), "{}", text(&out));
    let out = home.login(&server, &["login", "nope"], "");
    assert!(!out.status.success() && text(&out).contains("choose one of: deepseek, openai, anthropic, team"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_that_cannot_be_checked_is_stored_only_when_asked() {
    // No `/models` on this server: 404.
    let server = MockServer::start().await;
    let home = Home::new("");
    let out = home.login(&server, &["login", "deepseek"], &format!("{GOOD}\n"));
    let said = text(&out);
    assert!(!out.status.success() && said.contains("HTTP 404") && said.contains("--no-check"), "{said}");
    assert!(!home.credentials().exists());
    let out = home.login(&server, &["login", "deepseek", "--no-check"], &format!("{GOOD}\n"));
    assert!(out.status.success(), "{}", text(&out));
    assert!(std::fs::read_to_string(home.credentials()).unwrap().contains(GOOD));
    let out = home.login(&server, &["login", "deepseek", "--no-check"], "two words\n");
    assert!(!out.status.success() && text(&out).contains("spaces"), "{}", text(&out));
    assert!(!text(&out).contains("two words"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyless_replay_never_asks() {
    let server = MockServer::start().await;
    let home = Home::new("");
    let replay = concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios/streaming-text");
    let mut kin = Peer::spawn(home.kin(&server, &["acp", "--replay", replay]).stderr(Stdio::null()));
    call(&mut kin, "initialize", json!({"protocolVersion": 1, "clientCapabilities": {}}));
    let created = call(&mut kin, "session/new", json!({"cwd": home.path().join("cwd"), "mcpServers": []}));
    assert!(created["result"]["sessionId"].is_string(), "{created}");
    kin.close_stdin();
    let _ = kin.child.wait();
}
