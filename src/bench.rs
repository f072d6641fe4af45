//! `kin bench`: figures, never assertions. Cold start (process start → `initialize` response, and
//! RSS after it), per-turn overhead with an in-process scripted model, append throughput with
//! the real fsync policy, `load` time of large sessions, and subagent listing (the catalog) under
//! a large corpus.

use std::io::Write;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde_json::json;

use crate::acp::peer::{ChooseOption, Driver, numbering};
use crate::agent::{AgentDeps, TurnEnd, spawn_agent};
use crate::model::script::ScriptedModel;
use crate::model::{Model, ModelRoute, StreamChunk, text_response};
use crate::session::event::{self, TurnEndReason};
use crate::session::{Event, EventBody, Kind, Record, SessionHeader, SessionStore};
use crate::tools::ToolRegistry;

/// Collects figures, prints them, and compares them with a baseline file when there is one.
struct Report<'a> {
    out: &'a mut dyn Write,
    metrics: serde_json::Map<String, serde_json::Value>,
    baseline: Option<serde_json::Map<String, serde_json::Value>>,
}

impl Report<'_> {
    /// Prints `text`, then the figure's ratio to the baseline (lower is better for every figure
    /// kin records, except the rates, whose keys end in `_per_s`).
    fn metric(&mut self, key: &str, value: f64, text: String) -> Result<()> {
        let ratio = self.baseline.as_ref().and_then(|b| b.get(key)).and_then(serde_json::Value::as_f64).map(|base| {
            let ratio = if base > 0.0 { value / base } else { 1.0 };
            let worse = if key.ends_with("_per_s") { ratio < 0.8 } else { ratio > 1.25 };
            format!(" [{ratio:.2}x baseline{}]", if worse { ", REGRESSION?" } else { "" })
        });
        writeln!(self.out, "{text}{}", ratio.unwrap_or_default())?;
        self.metrics.insert(key.into(), json!((value * 1000.0).round() / 1000.0));
        Ok(())
    }
}

/// A part of the suite (`kin bench --only SECTION`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Section {
    /// Process start to the `initialize` response, and RSS after it.
    Startup,
    /// Concurrent children, one turn each, and RSS per idle child.
    FanOut,
    /// Per-turn overhead: scripted model in process, and the real HTTP client on loopback.
    Turn,
    /// Streaming chunk throughput to the editor and the log.
    Stream,
    /// Append throughput with the real fsync policy.
    Append,
    /// `load` time of large sessions.
    Load,
    /// Subagent listing under a large corpus.
    Catalog,
}

/// What `kin bench` runs.
#[derive(Debug, Clone)]
pub struct Options {
    /// The reduced set.
    pub quick: bool,
    /// Figures to compare with (a JSON object of figures; ratios are printed when it exists).
    pub baseline: std::path::PathBuf,
    /// Where to write this run's figures.
    pub save: Option<std::path::PathBuf>,
    /// The sections to run; empty runs them all.
    pub only: Vec<Section>,
}

impl Options {
    fn runs(&self, section: Section) -> bool {
        self.only.is_empty() || self.only.contains(&section)
    }
}

/// Runs the suite and writes a report to `out`.
pub async fn run(options: &Options, out: &mut dyn Write) -> Result<()> {
    let quick = options.quick;
    let tmp = tempfile::tempdir()?;
    let baseline_figures = std::fs::read_to_string(&options.baseline)
        .ok()
        .and_then(|text| serde_json::from_str::<serde_json::Value>(&text).ok())
        .and_then(|v| v.get("figures").and_then(|f| f.as_object().cloned()));
    writeln!(out, "kin bench{} — {}", if quick { " --quick" } else { "" }, machine())?;
    if baseline_figures.is_none() {
        writeln!(out, "(no baseline at {}; ratios are not shown)", options.baseline.display())?;
    }
    let mut report = Report { out, metrics: serde_json::Map::new(), baseline: baseline_figures };
    if options.runs(Section::Startup) {
        let starts = if quick { 10 } else { 30 };
        let (times, rss) = cold_start(tmp.path(), starts).await?;
        report.metric(
            "cold_start_median_ms",
            millis(median(&times)),
            format!(
                "cold start to initialize response: median {} p99 {} over {starts} starts",
                ms(median(&times)),
                ms(p99(&times))
            ),
        )?;
        report.metric("rss_after_initialize_kib", rss as f64, format!("RSS after initialize: {rss} KiB"))?;
    }
    // Fan-out first, while the heap is small, so RSS per idle child is measurable.
    if options.runs(Section::FanOut) {
        let fan: &[usize] = if quick { &[10, 100] } else { &[10, 100, 500] };
        for &n in fan {
            let (wall, per_child, peak) = fan_out(tmp.path(), n).await?;
            report.metric(
                &format!("fan_out_{n}_ms"),
                millis(wall),
                format!(
                    "fan-out: {n} concurrent children, one turn each: {} wall; RSS per idle child {per_child:.0} KiB; peak RSS {peak} KiB",
                    ms(wall)
                ),
            )?;
        }
    }
    if options.runs(Section::Turn) {
        let server = mock_chat_server().await?;
        let runs: [(&str, &str, Option<&str>, usize); 2] = [
            ("turn", "scripted model, in process, includes the turn-end fsync", None, if quick { 200 } else { 1000 }),
            ("http_turn", "real HTTP client, loopback mock", Some(server.as_str()), if quick { 100 } else { 1000 }),
        ];
        for (key, what, http, turns) in runs {
            let (first, overhead) = turn_overhead(tmp.path(), turns, http).await?;
            let (first_med, first_p99) = (median(&first), p99(&first));
            report.metric(
                &format!("{key}_first_chunk_median_ms"),
                millis(first_med),
                format!("prompt to first chunk ({what}): median {} p99 {}", ms(first_med), ms(first_p99)),
            )?;
            let (med, p) = (median(&overhead), p99(&overhead));
            report.metric(
                &format!("{key}_overhead_median_ms"),
                millis(med),
                format!("turn overhead ({what}): median {} p99 {} over {turns} turns", ms(med), ms(p)),
            )?;
        }
    }
    if options.runs(Section::Stream) {
        let (chunks, elapsed, log_bytes) = streaming(tmp.path(), if quick { 20_000 } else { 100_000 }).await?;
        report.metric(
            "stream_chunks_per_s",
            chunks as f64 / elapsed.as_secs_f64(),
            format!(
                "streaming: {chunks} chunks in {} = {:.0} chunks/s forwarded, {:.1} MB/s written to the log",
                ms(elapsed),
                chunks as f64 / elapsed.as_secs_f64(),
                log_bytes as f64 / 1e6 / elapsed.as_secs_f64()
            ),
        )?;
    }
    if options.runs(Section::Append) {
        let (events, elapsed) = append_throughput(tmp.path(), if quick { 20_000 } else { 100_000 })?;
        report.metric(
            "append_events_per_s",
            events as f64 / elapsed.as_secs_f64(),
            format!(
                "append: {events} events in {} = {:.0} events/s (fsync every 100 events)",
                ms(elapsed),
                events as f64 / elapsed.as_secs_f64()
            ),
        )?;
    }
    if options.runs(Section::Load) {
        let sizes: &[usize] = if quick { &[10_000, 100_000] } else { &[10_000, 100_000, 1_000_000] };
        for &n in sizes {
            let (load, bytes, rss) = load_time(tmp.path(), n)?;
            report.metric(
                &format!("load_{n}_ms"),
                millis(load),
                format!(
                    "load of a {n}-event session ({:.1} MB): {}; process RSS after it {rss} KiB",
                    bytes as f64 / 1e6,
                    ms(load)
                ),
            )?;
        }
    }
    if options.runs(Section::Catalog) {
        catalog(tmp.path(), quick, &mut report)?;
    }
    if let Some(path) = &options.save {
        let doc = json!({"machine": machine(), "command": "kin bench", "figures": report.metrics});
        std::fs::write(path, serde_json::to_string_pretty(&doc)? + "\n")?;
        writeln!(report.out, "figures written to {}", path.display())?;
    }
    Ok(())
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// VmRSS and VmHWM (peak) of this process, in KiB.
fn own_rss() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// A minimal loopback HTTP/1.1 server answering every POST with one short Chat Completions SSE
/// stream (keep-alive), for the HTTP client's turn overhead. Returns its base URL.
async fn mock_chat_server() -> Result<String> {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader as TokioBufReader};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    let body = concat!(
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"ok\"},\"finish_reason\":null}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
        "data: [DONE]\n\n"
    );
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut reader = TokioBufReader::new(stream);
                loop {
                    let mut length = 0usize;
                    let mut line = String::new();
                    loop {
                        line.clear();
                        if reader.read_line(&mut line).await.unwrap_or(0) == 0 {
                            return;
                        }
                        if line == "\r\n" {
                            break;
                        }
                        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                            length = v.trim().parse().unwrap_or(0);
                        }
                    }
                    let mut request_body = vec![0; length];
                    if reader.read_exact(&mut request_body).await.is_err() {
                        return;
                    }
                    let response = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    if reader.get_mut().write_all(response.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    Ok(base)
}

/// Unrelated sessions around the listed parent.
const CATALOG_UNRELATED: usize = 10_000;

/// `list_children` latency for D = 10, 100, 1000 direct children with logs of 10 KB (and 1 MB in
/// the full run) under 10,000 unrelated sessions. Cold: a fresh query (empty derived cache; the
/// OS page cache is warm, the files were just written). Warm: median of the next five listings.
fn catalog(tmp: &Path, quick: bool, report: &mut Report<'_>) -> Result<()> {
    use crate::session::query::{QueryService, SessionQuery, StoreSource};
    use crate::subagent::catalog::list_children;
    let root = tmp.join("catalog");
    for i in 0..CATALOG_UNRELATED {
        let header =
            SessionHeader::new(uuid::Uuid::new_v4().to_string(), i as u64, Some(format!("/bench/p{}", i % 20)));
        write_log(&root, &header, 3, 0)?;
    }
    let sizes: &[(usize, &str)] = if quick { &[(10_000, "10 KB")] } else { &[(10_000, "10 KB"), (1_000_000, "1 MB")] };
    for &(bytes, size) in sizes {
        for d in [10usize, 100, 1000] {
            let cwd = format!("/bench/catalog-{d}-{bytes}");
            let parent = SessionHeader::new(uuid::Uuid::new_v4().to_string(), 0, Some(cwd.clone()));
            write_log(&root, &parent, 3, 0)?;
            for i in 0..d {
                let mut child = SessionHeader::new(uuid::Uuid::new_v4().to_string(), i as u64, Some(cwd.clone()));
                child.parent_session = Some(parent.id.clone());
                child.origin = Some("subagent".into());
                child.delegation_depth = 1;
                write_log(&root, &child, 0, bytes)?;
            }
            let query = SessionQuery::new(StoreSource::persisted_only(SessionStore::new(root.clone())));
            let service: &dyn QueryService = &query;
            let cancel = tokio_util::sync::CancellationToken::new();
            let started = Instant::now();
            let listed = list_children(Some(service), &parent.id, &cancel)?;
            let cold = started.elapsed();
            anyhow::ensure!(listed.len() == d, "listed {} of {d} children", listed.len());
            let mut warm = Vec::new();
            for _ in 0..5 {
                let started = Instant::now();
                list_children(Some(service), &parent.id, &cancel)?;
                warm.push(started.elapsed());
            }
            let key = format!("list_{d}_children_{}_warm_ms", size.replace(' ', "").to_lowercase());
            report.metric(
                &key,
                millis(median(&warm)),
                format!(
                    "list {d} children ({size} logs) under {CATALOG_UNRELATED} unrelated sessions: cold {}, warm median {}",
                    ms(cold),
                    ms(median(&warm))
                ),
            )?;
            std::fs::remove_dir_all(root.join(crate::session::layout::project_key(&cwd)))?;
        }
    }
    Ok(())
}

/// Writes a log directly (no fsync: a benchmark corpus): the header, `events` log-only events,
/// and, when `child_bytes` > 0, a settled continuable child's conversation padded to about that
/// many bytes.
fn write_log(root: &Path, header: &SessionHeader, events: usize, child_bytes: usize) -> Result<()> {
    let mut text = serde_json::to_string(header)?;
    text.push('\n');
    let mut seq = 0u64;
    let mut line = |text: &mut String, body: EventBody| {
        text.push_str(&Record::Event(Event::new(seq, 0, body, None)).to_line());
        text.push('\n');
        seq += 1;
    };
    for _ in 0..events {
        line(&mut text, EventBody::Unknown { kind: "session/title".into(), data: json!({"title": "bench"}) });
    }
    if child_bytes > 0 {
        let descriptor = crate::subagent::Descriptor::Continuable {
            provider: "spawn".into(),
            label: "bench child".into(),
            agent_provider: Some("bench".into()),
            agent_model: Some("m".into()),
            persona: None,
            tool_filter: None,
        };
        line(&mut text, descriptor.event());
        line(&mut text, event::EndSeed {}.into());
        line(&mut text, event::TurnStart { turn: 1, trigger: event::Trigger::message(json!({"kind": "user"})) }.into());
        let prompt = event::UserMessage::new(vec![json!({"type": "text", "text": "work"})], json!({"kind": "user"}));
        line(&mut text, prompt.into());
        while text.len() < child_bytes {
            line(&mut text, text_chunk(1, "some streamed text of a busy child, long enough to fill its log").into());
        }
        let message = event::ModelMessage::new(vec![json!({"type": "text", "text": "done"})], "bench", "m");
        line(&mut text, event::AssistantMessage { turn: 1, step: 1, message, usage: None }.into());
        line(&mut text, event::TurnEnd { turn: 1, reason: TurnEndReason::Completed }.into());
    }
    let path = crate::session::layout::log_path(root, header.cwd.as_deref(), &header.id);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(path, text)?;
    Ok(())
}

fn machine() -> String {
    let cores = std::thread::available_parallelism().map_or(0, std::num::NonZero::get);
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    format!("{cores} cores, {cpu}")
}

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1000.0)
}

fn median(v: &[Duration]) -> Duration {
    let mut v = v.to_vec();
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

fn p99(v: &[Duration]) -> Duration {
    let mut v = v.to_vec();
    v.sort();
    v.get((v.len() * 99 / 100).min(v.len().saturating_sub(1))).copied().unwrap_or_default()
}

async fn cold_start(tmp: &Path, n: usize) -> Result<(Vec<Duration>, u64)> {
    let exe = std::env::current_exe()?;
    let mut times = Vec::new();
    let mut rss = 0;
    for _ in 0..n {
        let started = Instant::now();
        let mut child = tokio::process::Command::new(&exe)
            .args(["acp", "--config", "/dev/null", "--sessions"])
            .arg(tmp.join("cold"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()?;
        let stdin = child.stdin.take().context("stdin")?;
        let stdout = child.stdout.take().context("stdout")?;
        let no_questions: ChooseOption = Arc::new(|_| None);
        let kin = Driver::connect("bench", stdin, stdout, None, no_questions, numbering())
            .await
            .map_err(anyhow::Error::msg)?;
        let params = json!({"protocolVersion": 1, "clientCapabilities": {}});
        kin.request("initialize", params).await.map_err(anyhow::Error::msg)?;
        times.push(started.elapsed());
        rss = child.id().and_then(rss_kib).unwrap_or(0);
        kin.close().await;
        child.wait().await?;
    }
    Ok((times, rss))
}

fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find(|l| l.starts_with("VmRSS:"))?.split_whitespace().nth(1)?.parse().ok()
}

/// Times turns: prompt → first streamed text chunk, and prompt → turn end (flushed). With
/// `http`, the model is the real Chat Completions client against that base URL.
async fn turn_overhead(tmp: &Path, turns: usize, http: Option<&str>) -> Result<(Vec<Duration>, Vec<Duration>)> {
    let store = SessionStore::new(tmp.join(if http.is_some() { "turns-http" } else { "turns" }));
    let mut session = store.create(SessionHeader::new(uuid::Uuid::new_v4().to_string(), 0, Some("/bench".into())))?;
    let first_chunk = Arc::new(FirstChunk::default());
    session.add_observer(first_chunk.clone());
    let (model, route): (Arc<dyn Model>, ModelRoute) = match http {
        None => (
            Arc::new(ScriptedModel::from_responses((0..turns).map(|_| text_response(&["ok"]))).unrecorded()),
            scripted_route()?,
        ),
        Some(base) => {
            let base = base.to_string();
            let env = move |key: &str| match key {
                "DEEPSEEK_BASE_URL" => Some(base.clone()),
                "DEEPSEEK_API_KEY" => Some("bench".to_string()),
                _ => None,
            };
            let route = ModelRoute::parse("deepseek/deepseek-v4-flash").map_err(anyhow::Error::msg)?;
            let settings = crate::model::router::ModelSettings::default();
            (crate::model::router::model_for_route(&route, &settings, &env).map_err(anyhow::Error::msg)?, route)
        }
    };
    let deps = bench_deps(model, route, 0);
    let agent = spawn_agent(session, deps);
    let (mut firsts, mut times) = (Vec::with_capacity(turns), Vec::with_capacity(turns));
    for _ in 0..turns {
        first_chunk.reset();
        let started = Instant::now();
        let end = agent.followup(vec![json!({"type":"text","text":"hi"})], json!({"kind":"user"}))?.await?;
        times.push(started.elapsed());
        firsts.push(first_chunk.at().map_or(Duration::ZERO, |at| at.duration_since(started)));
        anyhow::ensure!(end == TurnEnd::Completed, "bench turn ended {end:?}");
    }
    agent.shutdown().await;
    Ok((firsts, times))
}

/// The deps of a benchmark agent: no tools, no permissions, no editor.
fn bench_deps(model: Arc<dyn Model>, route: ModelRoute, depth: u64) -> AgentDeps {
    AgentDeps {
        model,
        tools: ToolRegistry::new(),
        route,
        system: String::new(),
        max_steps: 5,
        max_parallel_tools: 1,
        depth,
        permissions: None,
        prompt: None,
        file_access: None,
        retry: Default::default(),
    }
}

fn scripted_route() -> Result<ModelRoute> {
    ModelRoute::parse("bench/scripted").map_err(anyhow::Error::msg)
}

/// An `assistant/chunk` of step 1 of `turn` carrying one text delta.
fn text_chunk(turn: u64, text: &str) -> event::AssistantChunk {
    event::AssistantChunk { turn, step: 1, chunk: StreamChunk::TextDelta { index: 0, text: text.into() } }
}

/// Records when the first text delta of a turn was appended (what an editor would see first).
#[derive(Default)]
struct FirstChunk(std::sync::Mutex<Option<Instant>>);

impl FirstChunk {
    fn reset(&self) {
        if let Ok(mut at) = self.0.lock() {
            *at = None;
        }
    }

    fn at(&self) -> Option<Instant> {
        self.0.lock().ok().and_then(|at| *at)
    }
}

impl crate::session::SessionObserver for FirstChunk {
    fn on_event(&self, _: &SessionHeader, event: &crate::session::Event) {
        if event.kind == Kind::AssistantChunk
            && matches!(event.get::<event::AssistantChunk>(), Some(c) if matches!(c.chunk, StreamChunk::TextDelta { .. }))
            && let Ok(mut at) = self.0.lock()
            && at.is_none()
        {
            *at = Some(Instant::now());
        }
    }
}

/// One turn streaming `chunks` text deltas through the agent: chunks forwarded per second and
/// log bytes written per second.
async fn streaming(tmp: &Path, chunks: usize) -> Result<(usize, Duration, u64)> {
    let store = SessionStore::new(tmp.join("stream"));
    let id = uuid::Uuid::new_v4().to_string();
    let session = store.create(SessionHeader::new(id.clone(), 0, Some("/bench".into())))?;
    let pieces: Vec<String> = (0..chunks).map(|i| format!("token{i} ")).collect();
    let refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
    let model = Arc::new(ScriptedModel::from_responses([text_response(&refs)]).unrecorded());
    let deps = bench_deps(model, scripted_route()?, 0);
    let agent = spawn_agent(session, deps);
    let started = Instant::now();
    agent.followup(vec![json!({"type":"text","text":"stream"})], json!({"kind":"user"}))?.await?;
    let elapsed = started.elapsed();
    agent.shutdown().await;
    let bytes = store.locate(&id)?.map_or(0, |p| std::fs::metadata(p).map_or(0, |m| m.len()));
    Ok((chunks, elapsed, bytes))
}

/// `n` agents (sessions with their actors, as in-process children are) each running one turn
/// at once: wall time, then RSS per idle agent and the process's peak RSS.
async fn fan_out(tmp: &Path, n: usize) -> Result<(Duration, f64, u64)> {
    let store = SessionStore::new(tmp.join(format!("fan-{n}")));
    let model: Arc<dyn Model> =
        Arc::new(ScriptedModel::from_responses((0..n).map(|_| text_response(&["done"]))).unrecorded());
    let (before, _) = own_rss();
    let started = Instant::now();
    let mut agents = Vec::with_capacity(n);
    let mut turns = Vec::with_capacity(n);
    for _ in 0..n {
        let mut header = SessionHeader::new(uuid::Uuid::new_v4().to_string(), 0, Some("/bench".into()));
        header.origin = Some("subagent".into());
        header.delegation_depth = 1;
        let session = store.create(header)?;
        let deps = bench_deps(model.clone(), scripted_route()?, 1);
        let agent = spawn_agent(session, deps);
        turns.push(agent.followup(vec![json!({"type":"text","text":"go"})], json!({"kind":"user"}))?);
        agents.push(agent);
    }
    for turn in turns {
        turn.await?;
    }
    let wall = started.elapsed();
    let (after, peak) = own_rss();
    let per_child = after.saturating_sub(before) as f64 / n as f64;
    futures::future::join_all(agents.iter().map(crate::agent::AgentHandle::shutdown)).await;
    Ok((wall, per_child, peak))
}

fn append_throughput(tmp: &Path, n: usize) -> Result<(usize, Duration)> {
    let store = SessionStore::new(tmp.join("append"));
    let mut session = store.create(SessionHeader::new(uuid::Uuid::new_v4().to_string(), 0, Some("/bench".into())))?;
    let started = Instant::now();
    for i in 0..n {
        session.push(text_chunk(1, "token "));
        if i % 100 == 99 {
            session.flush()?;
        }
    }
    session.flush()?;
    Ok((n, started.elapsed()))
}

fn load_time(tmp: &Path, n: usize) -> Result<(Duration, u64, u64)> {
    let store = SessionStore::new(tmp.join(format!("load-{n}")));
    let id = uuid::Uuid::new_v4().to_string();
    let mut session = store.create(SessionHeader::new(id.clone(), 0, Some("/bench".into())))?;
    let mut turn = 0;
    for i in 0..n {
        if i % 10 == 0 {
            turn += 1;
            session.push(event::TurnStart { turn, trigger: event::Trigger::message(json!({"kind": "user"})) });
        } else if i % 10 == 9 {
            session.push(event::TurnEnd { turn, reason: TurnEndReason::Completed });
        } else {
            session.push(text_chunk(turn, "some streamed text"));
        }
    }
    session.flush()?;
    drop(session);
    let bytes = store.locate(&id)?.map_or(0, |p| std::fs::metadata(p).map_or(0, |m| m.len()));
    let started = Instant::now();
    let loaded = store.load(&id).map_err(|e| anyhow::anyhow!("{e}"))?;
    let elapsed = started.elapsed();
    anyhow::ensure!(loaded.events().len() >= n, "loaded {} of {n} events", loaded.events().len());
    let (rss, _) = own_rss();
    drop(loaded);
    Ok((elapsed, bytes, rss))
}
