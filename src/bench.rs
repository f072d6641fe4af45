//! `kin bench`: figures, never assertions. Cold start (process start → `initialize` response, and
//! RSS after it), per-turn overhead with an in-process scripted model, append throughput with
//! the real fsync policy, `load` time of large sessions, subagent listing (the catalog) under
//! a large corpus, and compaction over a long session.

use std::io::Write;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde_json::json;

mod host;

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
            // The host's own figures (`host_…`) say how fast the machine was, never a regression.
            let worse = !key.starts_with("host_") && if key.ends_with("_per_s") { ratio < 0.8 } else { ratio > 1.25 };
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
    /// RSS of a `kin acp` process: idle, over HTTP turns, over a turn of 1M one-character chunks.
    Memory,
    /// Concurrent children, one turn each, and RSS per idle child.
    FanOut,
    /// Per-turn overhead: scripted model in process, and the real HTTP client on loopback.
    Turn,
    /// Streaming chunk throughput to the editor and the log.
    Stream,
    /// Append throughput with the real fsync policy.
    Append,
    /// `load` time of large sessions, in process and over `session/load`.
    Load,
    /// Subagent listing under a large corpus.
    Catalog,
    /// `session/load` of a parent with many children, the agent tree shown.
    Tree,
    /// A 2,000-turn session whose usage grows past the window: compaction cost and log growth.
    Compaction,
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
    let cpu_at_start = host::CpuTimes::now();
    let workload = host::workload();
    report.metric(
        "host_workload_ms",
        millis(workload),
        format!("host: a fixed workload ({}) took {}", host::WORKLOAD, ms(workload)),
    )?;
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
    if options.runs(Section::Memory) {
        memory(tmp.path(), quick, &mut report).await?;
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
        let mut acp_times = Vec::new();
        for &n in sizes {
            let (load, bytes, rss, root, id) = load_time(tmp.path(), n)?;
            report.metric(
                &format!("load_{n}_ms"),
                millis(load),
                format!(
                    "load of a {n}-event session ({:.1} MB), in process: {}; process RSS after it {rss} KiB",
                    bytes as f64 / 1e6,
                    ms(load)
                ),
            )?;
            let (acp, peak) = acp_load(&root, &id).await?;
            acp_times.push((n as f64, acp.as_secs_f64()));
            report.metric(
                &format!("acp_load_{n}_ms"),
                millis(acp),
                format!("session/load of the same session over ACP (replayed to the client): {}", ms(acp)),
            )?;
            report.metric(
                &format!("acp_load_{n}_peak_rss_kib"),
                peak as f64,
                format!(
                    "peak RSS of the kin process over that session/load: {peak} KiB ({:.2}x the file)",
                    peak as f64 * 1024.0 / bytes as f64
                ),
            )?;
            std::fs::remove_dir_all(&root)?;
        }
        let exponent = growth_exponent(&acp_times);
        report.metric(
            "acp_load_growth_exponent",
            exponent,
            format!("session/load time grows as N^{exponent:.2} with the number of events"),
        )?;
    }
    if options.runs(Section::Catalog) {
        catalog(tmp.path(), quick, &mut report).await?;
        session_list(&tmp.path().join("catalog"), &mut report).await?;
    }
    if options.runs(Section::Tree) {
        tree_reload(tmp.path(), &mut report).await?;
    }
    if options.runs(Section::Compaction) {
        compaction(tmp.path(), if quick { 500 } else { 2_000 }, &mut report).await?;
    }
    if let Some(steal) = cpu_at_start.zip(host::CpuTimes::now()).and_then(|(start, end)| start.steal_until(end)) {
        writeln!(
            report.out,
            "host: the hypervisor took {steal:.1}% of this machine's CPU time over the run (steal, /proc/stat)"
        )?;
    }
    if let Some(path) = &options.save {
        let doc = json!({"machine": machine(), "command": "kin bench", "figures": report.metrics});
        std::fs::write(path, serde_json::to_string_pretty(&doc)? + "\n")?;
        writeln!(report.out, "figures written to {}", path.display())?;
    }
    Ok(())
}

/// `sync(2)`: every filesystem's dirty data written out, so what the bench wrote is not
/// flushed during a later measurement.
fn sync_disks() {
    // SAFETY: sync takes no arguments and cannot fail.
    unsafe { libc::sync() }
}

/// User and system CPU time of this process so far, all threads.
fn process_cpu() -> Duration {
    // SAFETY: an all-zero `rusage` is a valid value for getrusage to fill.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a writable rusage buffer.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return Duration::ZERO;
    }
    let time = |t: libc::timeval| {
        Duration::new(u64::try_from(t.tv_sec).unwrap_or(0), u32::try_from(t.tv_usec).unwrap_or(0) * 1000)
    };
    time(usage.ru_utime) + time(usage.ru_stime)
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

/// A Chat Completions SSE stream of `chunks` text deltas of `text` each, then the finish. Each
/// delta is the smallest chunk the API sends (no `index`, no `finish_reason`: 47 bytes for one
/// character), so the million one-character chunks of `memory` stay under kin's 64 MiB cap on
/// one response (`model::http::DEFAULT_MAX_RESPONSE_BYTES`; a test keeps them there). With those
/// fields, 79 bytes a chunk, a million would be over it; no model answers in a million chunks.
fn sse_body(chunks: usize, text: &str) -> Vec<u8> {
    let delta = serde_json::to_string(text).unwrap_or_default();
    let mut body = String::with_capacity(chunks * (50 + delta.len()));
    for _ in 0..chunks {
        body.push_str("data: {\"choices\":[{\"delta\":{\"content\":");
        body.push_str(&delta);
        body.push_str("}}]}\n\n");
    }
    body.push_str("data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n");
    body.push_str("data: [DONE]\n\n");
    body.into_bytes()
}

/// A minimal loopback HTTP/1.1 server answering every POST with one short Chat Completions SSE
/// stream (keep-alive), for the HTTP client's turn overhead. Returns its base URL.
async fn mock_chat_server() -> Result<String> {
    mock_chat_server_with(vec![sse_body(1, "ok")]).await
}

/// `mock_chat_server`, answering its n-th request (over all connections) with `bodies[n]` (an
/// SSE stream), and every request past the last with the last.
async fn mock_chat_server_with(bodies: Vec<Vec<u8>>) -> Result<String> {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader as TokioBufReader};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    let bodies: Arc<Vec<Vec<u8>>> = Arc::new(bodies);
    let served = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            // The head and the body are two writes: with Nagle on, the body waits for the
            // client's delayed ACK of the head (40 ms on Linux), which would be timed as kin's.
            let _ = stream.set_nodelay(true);
            let (bodies, served) = (bodies.clone(), served.clone());
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
                    let n = served.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let body = &bodies[n.min(bodies.len() - 1)];
                    let head = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\n\r\n",
                        body.len()
                    );
                    let stream = reader.get_mut();
                    if stream.write_all(head.as_bytes()).await.is_err() || stream.write_all(body).await.is_err() {
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
/// The project directories the unrelated sessions are spread over.
const CATALOG_PROJECTS: usize = 20;

/// `list_children` latency for D = 100, 1,000, 5,000 direct children with logs of 10 KB (and
/// 1,000 children with 1 MB logs in the full run) under 10,000 unrelated sessions, each query
/// keeping the catalog index as the runtime's does, once the corpus has settled (its directories'
/// listings can be memoized: `dir_memo`). Without index: the first listing of a fresh
/// query with no index file (it reads every child log whole, and writes the index; the corpus
/// synced to disk first). Cold: the median of the first listings of five kin processes just
/// started (`first_listing`), with the CPU time of that listing (the OS page cache is warm: the
/// files were just written, and synced first), and beside it the stat pass alone in this process
/// (`store_scan::stat_pass`: the floor the host sets on a cold listing). Warm: the median of the
/// next five listings in one more fresh query, and how many times it statted each log per listing.
/// For 1,000 children with 10 KB logs, also the first `list_agents` call of a `kin acp` just
/// started, the way an editor user reaches the parent (`first_list_agents_call`).
async fn catalog(tmp: &Path, quick: bool, report: &mut Report<'_>) -> Result<()> {
    use crate::session::query::{SessionQuery, StoreSource};
    use crate::subagent::catalog::list_children;
    let root = tmp.join("catalog");
    for i in 0..CATALOG_UNRELATED {
        let header = SessionHeader::new(
            uuid::Uuid::new_v4().to_string(),
            i as u64,
            Some(format!("/bench/p{}", i % CATALOG_PROJECTS)),
        );
        write_log(&root, &header, 3, 0)?;
    }
    let mut runs: Vec<(usize, usize)> = vec![(100, 10_000), (1000, 10_000)];
    if !quick {
        runs.extend([(5000, 10_000), (1000, 1_000_000)]);
    }
    let (mut rebuild_times, mut cold_times, mut warm_times) = (Vec::new(), Vec::new(), Vec::new());
    for (d, bytes) in runs {
        let size = if bytes >= 1_000_000 { "1mb" } else { "10kb" };
        let cwd = format!("/bench/catalog-{d}-{bytes}");
        let parent = write_family(&root, &cwd, d, bytes)?;
        // A store as a kin started later finds it: its project directories last changed more
        // than `dir_memo::SETTLE` ago, so a scan memoizes their listings (one changed in the
        // last two seconds is listed by every scan, at about 1 µs per entry).
        std::thread::sleep(crate::session::dir_memo::SETTLE + Duration::from_millis(100));
        let cancel = tokio_util::sync::CancellationToken::new();
        let fresh = || SessionQuery::new(StoreSource::persisted_only(SessionStore::new(root.clone())).with_index());
        let list = |query: &SessionQuery| -> Result<Duration> {
            let started = Instant::now();
            let listed = list_children(Some(query), &parent.id, &cancel)?;
            let elapsed = started.elapsed();
            anyhow::ensure!(listed.len() == d, "listed {} of {d} children", listed.len());
            Ok(elapsed)
        };
        let index = crate::session::catalog_index::path(&root).context("the bench corpus has no index path")?;
        match std::fs::remove_file(index) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
            _ => {}
        }
        // What the bench just wrote (the corpus, then the index) goes to disk before each
        // timed listing: the kernel's writeback of it would otherwise run on the same two cores
        // during them, a cost of this bench's setup, not of a listing.
        sync_disks();
        let rebuild = list(&fresh())?;
        sync_disks();
        // The first listing of a kin process just started, in five processes (the median, with
        // its CPU time): the runtime keeps one query, so a new process is the only cold listing.
        let mut colds: Vec<(Duration, Duration, u64)> =
            (0..5).map(|_| first_listing_in_new_process(&root, &parent.id, d)).collect::<Result<_>>()?;
        colds.sort();
        let (cold, cold_cpu, cold_dirs) = colds[colds.len() / 2];
        // The stat pass alone, as the cold listings left the kernel's caches: the part of a cold
        // listing no index saves (seed 000's rule: every log is checked), a floor set by the host.
        let mut passes: Vec<(Duration, Duration)> =
            (0..5).map(|_| timed_stat_pass(&root, CATALOG_UNRELATED + d + 1)).collect::<Result<_>>()?;
        passes.sort();
        let (pass, pass_cpu) = passes[passes.len() / 2];
        let query = fresh();
        list(&query)?;
        let warm: Vec<Duration> = (0..5).map(|_| list(&query)).collect::<Result<_>>()?;
        let warm = median(&warm);
        let before = query.source().io();
        list(&query)?;
        let after = query.source().io();
        let stats_per_log = (after.stats - before.stats) as f64 / (CATALOG_UNRELATED + d + 1) as f64;
        let dirs_listed = after.dir_listings - before.dir_listings;
        if bytes == 10_000 {
            rebuild_times.push((d as f64, rebuild.as_secs_f64()));
            cold_times.push((d as f64, cold.as_secs_f64()));
            warm_times.push((d as f64, warm.as_secs_f64()));
        }
        let text = |what: &str, took: Duration| {
            format!(
                "list {d} children ({size} logs) under {CATALOG_UNRELATED} unrelated sessions, {what}: {}",
                ms(took)
            )
        };
        report.metric(
            &format!("list_{d}_children_{size}_unindexed_ms"),
            millis(rebuild),
            text("without index (first listing ever: reads every child log; the index is written after it)", rebuild),
        )?;
        report.metric(
            &format!("list_{d}_children_{size}_cold_ms"),
            millis(cold),
            text("cold (first listing of a kin process just started, from the index; median of 5)", cold),
        )?;
        report.metric(
            &format!("list_{d}_children_{size}_cold_cpu_ms"),
            millis(cold_cpu),
            format!("  the cold listing's CPU time, all threads of its process: {}", ms(cold_cpu)),
        )?;
        report.metric(
            &format!("list_{d}_children_{size}_cold_dirs_listed"),
            cold_dirs as f64,
            format!("  it listed {cold_dirs} of the {} project directories", CATALOG_PROJECTS + 1),
        )?;
        report.metric(
            &format!("list_{d}_children_{size}_stat_pass_ms"),
            millis(pass),
            format!(
                "  the stat pass alone (each project directory listed, one fstatat per log; no index), in this process: {} (median of 5)",
                ms(pass)
            ),
        )?;
        report.metric(
            &format!("list_{d}_children_{size}_stat_pass_cpu_ms"),
            millis(pass_cpu),
            format!("  the stat pass's CPU time: {}", ms(pass_cpu)),
        )?;
        report.metric(&format!("list_{d}_children_{size}_warm_ms"), millis(warm), text("warm (median of 5)", warm))?;
        report.metric(
            &format!("list_{d}_children_{size}_warm_stats_per_log"),
            stats_per_log,
            format!("  a warm listing stats each log {stats_per_log:.2} times"),
        )?;
        report.metric(
            &format!("list_{d}_children_{size}_warm_dirs_listed"),
            dirs_listed as f64,
            format!(
                "  and lists {dirs_listed} of the {} project directories (the others' listings are memoized)",
                CATALOG_PROJECTS + 1
            ),
        )?;
        if (d, bytes) == (1000, 10_000) {
            sync_disks();
            let mut calls = Vec::new();
            for _ in 0..5 {
                calls.push(first_list_agents_call(&root, &parent).await?);
            }
            let first = median(&calls);
            report.metric(
                &format!("list_agents_{d}_children_{size}_first_call_ms"),
                millis(first),
                text(
                    "the first list_agents call of a kin acp just started, the parent loaded, as its client saw the call (median of 5)",
                    first,
                ),
            )?;
        }
        std::fs::remove_dir_all(root.join(crate::session::layout::project_key(&cwd)))?;
    }
    for (what, times) in [("unindexed", &rebuild_times), ("cold", &cold_times), ("warm", &warm_times)] {
        let exponent = growth_exponent(times);
        report.metric(
            &format!("list_{what}_growth_exponent"),
            exponent,
            format!("{what} listing time grows as N^{exponent:.2} with the number of children (10 KB logs)"),
        )?;
    }
    Ok(())
}

/// The first `list_agents` call of a `kin acp` just started, as an editor user makes one over a
/// parent with stored children: the parent loaded (`session/load`; its restore lists the stored
/// sessions, as after every load), then a prompt whose model (a loopback server) calls
/// `list_agents` at once. The time from the tool call shown to it completed, as the client saw
/// them: what the user waits for.
async fn first_list_agents_call(root: &Path, parent: &SessionHeader) -> Result<Duration> {
    let call = concat!(
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_1\",",
        "\"type\":\"function\",\"function\":{\"name\":\"list_agents\",\"arguments\":\"{}\"}}]}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\n",
        "data: [DONE]\n\n"
    );
    let server = mock_chat_server_with(vec![call.as_bytes().to_vec(), sse_body(1, "ok")]).await?;
    let kin = KinProcess::start(root, Some(&server)).await?;
    kin.call("session/load", json!({"sessionId": parent.id, "cwd": parent.cwd, "mcpServers": []})).await?;
    kin.tool_call.arm();
    kin.prompt(&parent.id, "which agents are there?").await?;
    let took = kin
        .tool_call
        .took()
        .context("the client did not see the list_agents call complete with the children listed")?;
    kin.close().await?;
    Ok(took)
}

/// `session/list` over the catalog corpus (its unrelated sessions are top-level sessions with a
/// title each) in a fresh `kin acp`: the first call after the start (no title in the catalog
/// index yet), the next one, and the first call of another `kin acp` started after it (the
/// titles from the index). Then, in that kin, a call after a long session of 16 MB was added
/// (a title, then a turn's streamed text: its title read whole), and one after that session
/// grew by a title (read from where the last read stopped).
async fn session_list(sessions: &Path, report: &mut Report<'_>) -> Result<()> {
    let kin = KinProcess::start(sessions, None).await?;
    for call in ["first", "again"] {
        session_list_call(&kin, call, &format!("{call} call"), CATALOG_UNRELATED, report).await?;
    }
    kin.close().await?;
    sync_disks();
    let kin = KinProcess::start(sessions, None).await?;
    session_list_call(&kin, "restarted", "first call of a kin started after that", CATALOG_UNRELATED, report).await?;
    let header = SessionHeader::new(uuid::Uuid::new_v4().to_string(), 0, Some("/bench/long".into()));
    let events = write_log(sessions, &header, 1, 16_000_000)?;
    let path = crate::session::layout::log_path(sessions, header.cwd.as_deref(), &header.id);
    let bytes = std::fs::metadata(&path)?.len();
    let mb = bytes as f64 / 1e6;
    sync_disks();
    let what = format!("next call, with a new {mb:.0} MB session");
    session_list_call(&kin, "long_new", &what, CATALOG_UNRELATED + 1, report).await?;
    let title = EventBody::Unknown { kind: "session/title".into(), data: json!({"title": "grown"}) };
    let line = Record::Event(Event::new(events, 0, title, None)).to_line() + "\n";
    std::fs::OpenOptions::new().append(true).open(&path)?.write_all(line.as_bytes())?;
    sync_disks();
    let what = format!("next call, after that {mb:.0} MB session grew by a title");
    let listed = session_list_call(&kin, "long_grown", &what, CATALOG_UNRELATED + 1, report).await?;
    let shown = listed.iter().find(|s| s["sessionId"] == header.id.as_str()).map(|s| s["title"].clone());
    anyhow::ensure!(shown == Some(json!("grown")), "the grown session's title: {shown:?}");
    kin.close().await?;
    std::fs::remove_dir_all(path.parent().context("a log's session directory")?)?;
    Ok(())
}

/// One timed `session/list` of every stored session, checked to list `expected`: the figure
/// `call`, described as `what`. The sessions listed.
async fn session_list_call(
    kin: &KinProcess,
    call: &str,
    what: &str,
    expected: usize,
    report: &mut Report<'_>,
) -> Result<Vec<serde_json::Value>> {
    let started = Instant::now();
    let listed = kin.call("session/list", json!({})).await?;
    let took = started.elapsed();
    let listed = listed["sessions"].as_array().cloned().unwrap_or_default();
    anyhow::ensure!(listed.len() == expected, "session/list listed {} of {expected}", listed.len());
    report.metric(
        &format!("session_list_{CATALOG_UNRELATED}_{call}_ms"),
        millis(took),
        format!("session/list of {CATALOG_UNRELATED} stored sessions with titles, {what}: {}", ms(took)),
    )?;
    Ok(listed)
}

/// The first listing of `parent`'s children in `sessions` by this kin process, just started, as
/// its runtime makes one (a query keeping the index; the listing on a blocking thread): one line
/// of JSON with its wall and CPU time and how many it listed (`kin bench --first-listing`, which
/// the catalog section runs). As `list_agents` does, the listing shares the query, which outlives
/// it: the runtime keeps its query for its life, so freeing it is no part of a listing's time.
pub async fn first_listing(sessions: &Path, parent: &str, out: &mut dyn Write) -> Result<()> {
    use crate::session::query::{SessionQuery, StoreSource};
    let store = StoreSource::persisted_only(SessionStore::new(sessions.to_path_buf())).with_index();
    let query = std::sync::Arc::new(SessionQuery::new(store));
    let (shared, parent) = (query.clone(), parent.to_string());
    let (started, cpu) = (Instant::now(), process_cpu());
    let listed = tokio::task::spawn_blocking(move || {
        let cancel = tokio_util::sync::CancellationToken::new();
        crate::subagent::catalog::list_children(Some(&*shared), &parent, &cancel).map(|listed| listed.len())
    })
    .await??;
    let (wall, cpu) = (started.elapsed(), process_cpu().saturating_sub(cpu));
    let dirs = query.source().io().dir_listings;
    drop(query);
    writeln!(out, "{}", json!({"wallMs": millis(wall), "cpuMs": millis(cpu), "listed": listed, "dirsListed": dirs}))?;
    Ok(())
}

/// One stat pass over `sessions` (`store_scan::stat_pass`, on its threads) in this process: its
/// wall and CPU time, checked to find `logs` logs.
fn timed_stat_pass(sessions: &Path, logs: usize) -> Result<(Duration, Duration)> {
    let (started, cpu) = (Instant::now(), process_cpu());
    let found = crate::session::store_scan::stat_pass(sessions)?;
    let timed = (started.elapsed(), process_cpu().saturating_sub(cpu));
    anyhow::ensure!(found == logs, "the stat pass found {found} of {logs} logs");
    Ok(timed)
}

/// `first_listing` in a new kin process: its wall and CPU time and the project directories it
/// listed, checked to list `children`.
fn first_listing_in_new_process(sessions: &Path, parent: &str, children: usize) -> Result<(Duration, Duration, u64)> {
    let output = std::process::Command::new(std::env::current_exe()?)
        .args(["bench", "--first-listing"])
        .arg(sessions)
        .arg(parent)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()?;
    anyhow::ensure!(output.status.success(), "kin bench --first-listing failed: {}", output.status);
    let figures: serde_json::Value = serde_json::from_slice(&output.stdout).context("kin bench --first-listing")?;
    let field = |name: &str| figures.get(name).and_then(serde_json::Value::as_f64).context("kin bench --first-listing");
    anyhow::ensure!(
        field("listed")? == children as f64,
        "a new process listed {} of {children} children",
        field("listed")?
    );
    Ok((
        Duration::from_secs_f64(field("wallMs")? / 1e3),
        Duration::from_secs_f64(field("cpuMs")? / 1e3),
        field("dirsListed")? as u64,
    ))
}

/// `session/load` of a parent with D = 100, 1,000, 5,000 stored continuable children (2 KB logs)
/// in a fresh `kin acp` whose client advertises `clientCapabilities.subagents`, so the load
/// lists the agent tree and replays every child before its response.
async fn tree_reload(tmp: &Path, report: &mut Report<'_>) -> Result<()> {
    let root = tmp.join("tree");
    let mut times = Vec::new();
    for d in [100usize, 1000, 5000] {
        let cwd = format!("/bench/tree-{d}");
        let parent = write_family(&root, &cwd, d, 2_000)?;
        let kin = KinProcess::start_as(&root, None, json!({"subagents": {}})).await?;
        let started = Instant::now();
        kin.call("session/load", json!({"sessionId": parent.id, "cwd": cwd, "mcpServers": []})).await?;
        let took = started.elapsed();
        let seen = kin.announced.load(std::sync::atomic::Ordering::Relaxed);
        kin.close().await?;
        anyhow::ensure!(seen >= d, "the load announced {seen} of {d} children");
        times.push((d as f64, took.as_secs_f64()));
        report.metric(
            &format!("tree_reload_{d}_children_ms"),
            millis(took),
            format!("session/load of a parent with {d} stored children, agent tree shown: {}", ms(took)),
        )?;
        std::fs::remove_dir_all(root.join(crate::session::layout::project_key(&cwd)))?;
    }
    let exponent = growth_exponent(&times);
    report.metric(
        "tree_reload_growth_exponent",
        exponent,
        format!("agent-tree reload time grows as N^{exponent:.2} with the number of children"),
    )?;
    Ok(())
}

/// The slope of log(time) over log(N), least squares: 1.0 is linear growth.
fn growth_exponent(points: &[(f64, f64)]) -> f64 {
    let logs: Vec<(f64, f64)> =
        points.iter().filter(|(n, t)| *n > 0.0 && *t > 0.0).map(|(n, t)| (n.ln(), t.ln())).collect();
    if logs.len() < 2 {
        return 0.0;
    }
    let count = logs.len() as f64;
    let (mx, my) = (logs.iter().map(|p| p.0).sum::<f64>() / count, logs.iter().map(|p| p.1).sum::<f64>() / count);
    let sxy: f64 = logs.iter().map(|(x, y)| (x - mx) * (y - my)).sum();
    let sxx: f64 = logs.iter().map(|(x, _)| (x - mx) * (x - mx)).sum();
    if sxx == 0.0 { 0.0 } else { sxy / sxx }
}

/// A stored parent in `cwd` with `children` subagent children of about `child_bytes` each;
/// the parent's header.
fn write_family(root: &Path, cwd: &str, children: usize, child_bytes: usize) -> Result<SessionHeader> {
    let parent = SessionHeader::new(uuid::Uuid::new_v4().to_string(), 0, Some(cwd.to_string()));
    write_log(root, &parent, 3, 0)?;
    for i in 0..children {
        let mut child = SessionHeader::new(uuid::Uuid::new_v4().to_string(), i as u64, Some(cwd.to_string()));
        child.parent_session = Some(parent.id.clone());
        child.origin = Some("subagent".into());
        child.delegation_depth = 1;
        write_log(root, &child, 0, child_bytes)?;
    }
    Ok(parent)
}

/// Writes a log directly (no fsync: a benchmark corpus): the header, `events` log-only events,
/// and, when `child_bytes` > 0, a settled continuable child's conversation padded to about that
/// many bytes. The number of events written (the seq of the next).
fn write_log(root: &Path, header: &SessionHeader, events: usize, child_bytes: usize) -> Result<u64> {
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
            agent: None,
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
    Ok(seq)
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
        compaction: Default::default(),
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

/// Writes an `n`-event session and loads it in process: load time, log bytes, RSS after, and
/// where the log is (its store root and id).
fn load_time(tmp: &Path, n: usize) -> Result<(Duration, u64, u64, std::path::PathBuf, String)> {
    let root = tmp.join(format!("load-{n}"));
    let store = SessionStore::new(root.clone());
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
    anyhow::ensure!(loaded.len() >= n as u64, "loaded {} of {n} events", loaded.len());
    let (rss, _) = own_rss();
    drop(loaded);
    Ok((elapsed, bytes, rss, root, id))
}

/// A `kin acp` process driven over its pipes, its model the Chat Completions client pointed at
/// `model_url` (when given).
struct KinProcess {
    child: tokio::process::Child,
    driver: Driver,
    /// Text deltas the client has seen (`agent_message_chunk` notifications).
    chunks: Arc<std::sync::atomic::AtomicUsize>,
    /// `subagent_update` notifications the client has seen.
    announced: Arc<std::sync::atomic::AtomicUsize>,
    /// When the client saw the first tool call shown (`tool_call`), and the first tool call
    /// completed listing a child (a `tool_call_update` with status `completed`), after
    /// `ToolCallSeen::arm`.
    tool_call: Arc<ToolCallSeen>,
}

/// How `list_agents` shows a stored child (`id [complete] — label`): a completed call counts
/// only when it listed one, so an empty or refused listing is not timed as a listing.
const LISTED_CHILD: &str = " [complete] ";

/// When a `KinProcess`'s client saw the first tool call start and the first tool call complete
/// with a listed child once `arm`ed (a load's replay of earlier calls is not counted).
#[derive(Default)]
struct ToolCallSeen {
    armed: std::sync::atomic::AtomicBool,
    shown: std::sync::OnceLock<Instant>,
    completed: std::sync::OnceLock<Instant>,
}

impl ToolCallSeen {
    fn arm(&self) {
        self.armed.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// How long the first tool call took as the client saw it, once it completed.
    fn took(&self) -> Option<Duration> {
        Some(self.completed.get()?.saturating_duration_since(*self.shown.get()?))
    }
}

impl KinProcess {
    async fn start(sessions: &Path, model_url: Option<&str>) -> Result<KinProcess> {
        Self::start_as(sessions, model_url, json!({})).await
    }

    /// `start`, the client advertising `capabilities` at `initialize`.
    async fn start_as(sessions: &Path, model_url: Option<&str>, capabilities: serde_json::Value) -> Result<KinProcess> {
        let exe = std::env::current_exe()?;
        let mut command = tokio::process::Command::new(&exe);
        command
            .args(["acp", "--config", "/dev/null", "--sessions"])
            .arg(sessions)
            .env_remove("RUST_LOG")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        if let Some(url) = model_url {
            command.env("DEEPSEEK_BASE_URL", url).env("DEEPSEEK_API_KEY", "bench");
        }
        let mut child = command.spawn()?;
        let stdin = child.stdin.take().context("stdin")?;
        let stdout = child.stdout.take().context("stdout")?;
        let chunks = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let announced = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let tool_call = Arc::new(ToolCallSeen::default());
        let (seen, children, tool) = (chunks.clone(), announced.clone(), tool_call.clone());
        let tap: crate::acp::wire::Tap = Arc::new(move |line: &str| {
            if line.contains("\"agent_message_chunk\"") {
                seen.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            if line.contains("\"subagent_update\"") {
                children.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            if tool.armed.load(std::sync::atomic::Ordering::Relaxed) {
                if line.contains("\"sessionUpdate\":\"tool_call\"") {
                    let _ = tool.shown.set(Instant::now());
                }
                if line.contains("\"sessionUpdate\":\"tool_call_update\"")
                    && line.contains("\"status\":\"completed\"")
                    && line.contains(LISTED_CHILD)
                {
                    let _ = tool.completed.set(Instant::now());
                }
            }
        });
        let no_questions: ChooseOption = Arc::new(|_| None);
        let driver = Driver::connect("bench", stdin, stdout, Some(tap), no_questions, numbering())
            .await
            .map_err(anyhow::Error::msg)?;
        let kin = KinProcess { child, driver, chunks, announced, tool_call };
        kin.call("initialize", json!({"protocolVersion": 1, "clientCapabilities": capabilities})).await?;
        Ok(kin)
    }

    async fn call(&self, method: &str, params: serde_json::Value) -> Result<serde_json::Value> {
        match self.driver.request(method, params).await.map_err(anyhow::Error::msg)? {
            crate::acp::peer::Answer::Result(value) => Ok(value),
            crate::acp::peer::Answer::Error { code, message } => anyhow::bail!("{method} failed ({code}): {message}"),
        }
    }

    /// `session/new` in `cwd`: the session id.
    async fn new_session(&self, cwd: &Path) -> Result<String> {
        let created = self.call("session/new", json!({"cwd": cwd, "mcpServers": []})).await?;
        created["sessionId"].as_str().map(str::to_string).context("session/new answered without a sessionId")
    }

    async fn prompt(&self, session: &str, text: &str) -> Result<()> {
        let params = json!({"sessionId": session, "prompt": [{"type": "text", "text": text}]});
        let answer = self.call("session/prompt", params).await?;
        anyhow::ensure!(answer["stopReason"] == "end_turn", "the bench turn ended {answer}");
        Ok(())
    }

    /// VmRSS and VmHWM (peak) of the process, in KiB.
    fn rss(&self) -> (u64, u64) {
        (self.status("VmRSS:"), self.status("VmHWM:"))
    }

    /// RssAnon of the process (its heap and stacks, not the pages of its binary), in KiB.
    fn anon(&self) -> u64 {
        self.status("RssAnon:")
    }

    /// A KiB field of `/proc/PID/status` (0 when it cannot be read).
    fn status(&self, name: &str) -> u64 {
        let status = self.child.id().and_then(|pid| std::fs::read_to_string(format!("/proc/{pid}/status")).ok());
        status
            .as_deref()
            .unwrap_or_default()
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    }

    /// Resets the peak (VmHWM) to the current RSS (`/proc/PID/clear_refs`, Linux 4.0+).
    fn reset_peak(&self) {
        if let Some(pid) = self.child.id() {
            let _ = std::fs::write(format!("/proc/{pid}/clear_refs"), "5");
        }
    }

    async fn close(mut self) -> Result<()> {
        self.driver.close().await;
        self.child.wait().await?;
        Ok(())
    }
}

/// The one-character chunks of the full run's streamed turn in `memory`.
const FINE_STREAM_CHUNKS: usize = 1_000_000;

/// RSS of one `kin acp` process: after `initialize` (idle), after its first HTTP turn (and the
/// peak over it), after ten more turns; then a turn of one million one-character chunks from
/// the model (1 MB of text): its peak and what stays after it, and RSS after `session/load` of
/// that session in a fresh process.
async fn memory(tmp: &Path, quick: bool, report: &mut Report<'_>) -> Result<()> {
    let sessions = tmp.join("memory");
    let cwd = tmp.join("memory-cwd");
    std::fs::create_dir_all(&cwd)?;
    let server = mock_chat_server().await?;
    let kin = KinProcess::start(&sessions, Some(&server)).await?;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (idle, _) = kin.rss();
    report.metric("rss_idle_kib", idle as f64, format!("RSS of an idle kin acp after initialize: {idle} KiB"))?;
    let session = kin.new_session(&cwd).await?;
    kin.reset_peak();
    kin.prompt(&session, "hi").await?;
    let (after_one, peak_one) = kin.rss();
    report.metric(
        "rss_after_http_turn_kib",
        after_one as f64,
        format!("RSS after one HTTP turn (loopback model): {after_one} KiB; peak over the turn {peak_one} KiB"),
    )?;
    report.metric("peak_rss_http_turn_kib", peak_one as f64, format!("peak RSS over one HTTP turn: {peak_one} KiB"))?;
    let step = after_one.saturating_sub(idle);
    report.metric(
        "rss_first_http_turn_step_kib",
        step as f64,
        format!("RSS step of the first HTTP turn (session/new and the turn, over idle): {step} KiB"),
    )?;
    for _ in 0..10 {
        kin.prompt(&session, "hi").await?;
    }
    let (after_more, _) = kin.rss();
    report.metric(
        "rss_after_11_http_turns_kib",
        after_more as f64,
        format!(
            "RSS after ten more HTTP turns: {after_more} KiB ({:+} KiB over the first turn)",
            after_more as i64 - after_one as i64
        ),
    )?;
    kin.close().await?;

    let chunks = if quick { 200_000 } else { FINE_STREAM_CHUNKS };
    let fine = streamed_turn(&sessions, &cwd, sse_body(chunks, "x")).await?;
    let key = if quick { "stream_200k_chunks" } else { "stream_1m_chunks" };
    report.metric(
        &format!("{key}_peak_rss_kib"),
        fine.peak as f64,
        format!(
            "a turn of {chunks} one-character chunks ({:.1} MB of text) over HTTP: {} ({} chunks forwarded); peak RSS {} KiB",
            chunks as f64 / 1e6,
            ms(fine.took),
            fine.forwarded,
            fine.peak
        ),
    )?;
    report.metric(
        &format!("{key}_retained_kib"),
        fine.kept as f64,
        format!(
            "RSS kept after that turn (over the session after a one-line warm-up turn): {} KiB ({:.2}x the text)",
            fine.kept,
            fine.kept as f64 * 1024.0 / chunks as f64
        ),
    )?;
    report.metric(
        &format!("{key}_retained_anon_kib"),
        fine.kept_anon as f64,
        format!(
            "  of it anonymous memory (the heap; the rest is pages of kin's binary and libraries the turn ran first): {} KiB ({:.2}x the text)",
            fine.kept_anon,
            fine.kept_anon as f64 * 1024.0 / chunks as f64
        ),
    )?;
    let kin = KinProcess::start(&sessions, None).await?;
    kin.call("session/load", json!({"sessionId": fine.session, "cwd": cwd, "mcpServers": []})).await?;
    let (loaded, _) = kin.rss();
    kin.close().await?;
    report.metric(
        &format!("{key}_rss_after_load_kib"),
        loaded as f64,
        format!("RSS of a fresh kin after session/load of that session: {loaded} KiB"),
    )?;
    // The same text in a thousandth of the chunks: what a turn keeps whatever the streaming.
    let coarse = chunks / 1000;
    let kept = streamed_turn(&sessions, &cwd, sse_body(coarse, &"x".repeat(1000))).await?.kept;
    report.metric(
        &format!("{key}_coarse_retained_kib"),
        kept as f64,
        format!(
            "RSS kept after the same text in {coarse} chunks of 1,000 characters: {kept} KiB ({} KiB more for the fine stream)",
            fine.kept as i64 - kept as i64
        ),
    )?;
    Ok(())
}

/// What one streamed turn cost a `kin acp` process.
struct StreamedTurn {
    session: String,
    took: Duration,
    forwarded: usize,
    /// Peak RSS over the turn, KiB.
    peak: u64,
    /// RSS after the turn over RSS before it, KiB.
    kept: u64,
    /// The same for anonymous memory only (what the turn left on the heap), KiB.
    kept_anon: u64,
}

/// A fresh `kin acp` whose session first has a one-line turn (so the HTTP client, its pools and
/// the session's first-turn tables exist), then a turn the model answers with `body`.
async fn streamed_turn(sessions: &Path, cwd: &Path, body: Vec<u8>) -> Result<StreamedTurn> {
    let server = mock_chat_server_with(vec![sse_body(1, "ok"), body]).await?;
    let kin = KinProcess::start(sessions, Some(&server)).await?;
    let session = kin.new_session(cwd).await?;
    kin.prompt(&session, "hi").await?;
    let (before, before_anon) = (kin.rss().0, kin.anon());
    let warm_up = kin.chunks.load(std::sync::atomic::Ordering::Relaxed);
    kin.reset_peak();
    let started = Instant::now();
    kin.prompt(&session, "stream").await?;
    let took = started.elapsed();
    let (after, peak) = kin.rss();
    let kept_anon = kin.anon().saturating_sub(before_anon);
    let forwarded = kin.chunks.load(std::sync::atomic::Ordering::Relaxed) - warm_up;
    kin.close().await?;
    Ok(StreamedTurn { session, took, forwarded, peak, kept: after.saturating_sub(before), kept_anon })
}

/// `session/load` of a stored session in a fresh `kin acp`: the time to its response (every
/// update replayed to the client before it) and the process's peak RSS over the load.
async fn acp_load(root: &Path, id: &str) -> Result<(Duration, u64)> {
    let kin = KinProcess::start(root, None).await?;
    kin.reset_peak();
    let started = Instant::now();
    kin.call("session/load", json!({"sessionId": id, "cwd": "/bench", "mcpServers": []})).await?;
    let took = started.elapsed();
    let (_, peak) = kin.rss();
    kin.close().await?;
    Ok((took, peak))
}

/// The window of the compaction bench's route.
const BENCH_WINDOW: u64 = 20_000;

/// A scripted model for the compaction bench: a step's answer reports the request's estimated
/// size as its usage (so usage grows with the history, as a real model's does); a summary
/// request gets a short summary. Keeps the largest step request it saw.
#[derive(Default)]
struct GrowingModel {
    largest: std::sync::atomic::AtomicU64,
}

impl Model for GrowingModel {
    fn stream(
        &self,
        request: crate::model::ModelRequest,
        cancel: tokio_util::sync::CancellationToken,
    ) -> crate::model::ChunkStream {
        use crate::agent::meter;
        let tokens = meter::header_tokens(&request.system, &request.tools)
            + request.messages.iter().map(crate::session::estimate::message_tokens).sum::<u64>();
        let text = match request.purpose {
            crate::model::Purpose::Compaction => {
                "The user asked a long series of numbered questions; each was answered.".to_string()
            }
            _ => {
                self.largest.fetch_max(tokens, std::sync::atomic::Ordering::Relaxed);
                format!("Answer to turn {}: {}", request.turn, "details ".repeat(20))
            }
        };
        let mut chunks = text_response(&[&text]);
        for chunk in &mut chunks {
            if let StreamChunk::Usage { usage } = chunk {
                *usage = json!({"inputTokens": tokens, "outputTokens": text.len() / 4});
            }
        }
        crate::model::script::play(crate::model::script::ReplayEntry::Chunks(chunks), None, cancel)
    }
}

/// When each `compact/start` and `compact/end` was appended.
#[derive(Default)]
struct Brackets(std::sync::Mutex<(Vec<Instant>, Vec<Instant>)>);

impl crate::session::SessionObserver for Brackets {
    fn on_event(&self, _: &SessionHeader, event: &crate::session::Event) {
        let Ok(mut marks) = self.0.lock() else { return };
        match event.kind {
            Kind::CompactStart => marks.0.push(Instant::now()),
            Kind::CompactEnd => marks.1.push(Instant::now()),
            _ => {}
        }
    }
}

/// `turns` prompts against [`GrowingModel`] on a 20,000-token window with the default policy:
/// every turn must complete and every step request stay under the window; the figures are the
/// time of a compaction (from `compact/start` to `compact/end`, the summary being the in-process
/// scripted call) and the log's growth.
async fn compaction(tmp: &Path, turns: usize, report: &mut Report<'_>) -> Result<()> {
    let store = SessionStore::new(tmp.join("compaction"));
    let id = uuid::Uuid::new_v4().to_string();
    let mut session = store.create(SessionHeader::new(id.clone(), 0, Some("/bench".into())))?;
    let brackets = Arc::new(Brackets::default());
    session.add_observer(brackets.clone());
    let model = Arc::new(GrowingModel::default());
    let route = scripted_route()?;
    let entry = crate::model::capacity::ModelEntry { context_window: Some(BENCH_WINDOW), price: None };
    let models = crate::model::capacity::ModelTable { routes: vec![(route.to_string(), entry)], ..Default::default() };
    let mut deps = bench_deps(model.clone(), route, 0);
    deps.compaction = crate::agent::compact::Policy { models: Arc::new(models), ..Default::default() };
    let agent = spawn_agent(session, deps);
    let started = Instant::now();
    for n in 0..turns {
        let text = format!("Question {n}: {}", "please consider this ".repeat(20));
        let end = agent.followup(vec![json!({"type": "text", "text": text})], json!({"kind": "user"}))?.await?;
        anyhow::ensure!(end == TurnEnd::Completed, "compaction bench: turn {} ended {end:?}", n + 1);
    }
    let wall = started.elapsed();
    agent.shutdown().await;
    let largest = model.largest.load(std::sync::atomic::Ordering::Relaxed);
    anyhow::ensure!(largest < BENCH_WINDOW, "a request of ~{largest} tokens exceeded the {BENCH_WINDOW}-token window");
    let (starts, ends) = brackets.0.lock().map_err(|_| anyhow::anyhow!("bench observer poisoned"))?.clone();
    anyhow::ensure!(
        !starts.is_empty() && starts.len() == ends.len(),
        "compaction bench: {} starts, {} ends",
        starts.len(),
        ends.len()
    );
    let times: Vec<Duration> = starts.iter().zip(&ends).map(|(s, e)| e.duration_since(*s)).collect();
    let stored = store.inspect(&id)?;
    let failed =
        stored.events.iter().filter(|e| e.get::<event::CompactEnd>().is_some_and(|end| end.error.is_some())).count();
    let bytes = std::fs::metadata(store.locate(&id)?.context("the bench session's log")?)?.len();
    let compact_bytes: usize = stored
        .events
        .iter()
        .filter(|e| {
            matches!(e.kind, Kind::CompactStart | Kind::CompactSummary | Kind::CompactEnd)
                || e.surface_op.as_ref().is_some_and(|op| op["op"] == "replace")
        })
        .map(|e| serde_json::to_string(&e.data).map_or(0, |t| t.len()))
        .sum();
    let (med, p) = (median(&times), p99(&times));
    report.metric(
        "compaction_median_ms",
        millis(med),
        format!(
            "compaction: {turns} turns in {} on a {BENCH_WINDOW}-token window, none failed; {} compactions ({failed} failed), each {} median {} p99 (compact/start to compact/end; the summary is the in-process scripted call); largest request ~{largest} tokens",
            ms(wall),
            times.len(),
            ms(med),
            ms(p)
        ),
    )?;
    report.metric(
        "compaction_log_bytes_per_turn",
        bytes as f64 / turns as f64,
        format!(
            "compaction log: {:.2} MB for {turns} turns ({:.0} bytes a turn), {:.1}% of it the compaction events and checkpoints",
            bytes as f64 / 1e6,
            bytes as f64 / turns as f64,
            compact_bytes as f64 * 100.0 / bytes as f64
        ),
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The full run's million-chunk stream is one model response: it must stay under kin's cap
    /// on one (it went over once, and only the full run, which CI does not make, failed).
    #[test]
    fn the_full_run_s_streamed_turn_fits_one_response() {
        let body = sse_body(FINE_STREAM_CHUNKS, "x");
        assert!(body.len() <= crate::model::http::DEFAULT_MAX_RESPONSE_BYTES, "{} bytes", body.len());
        assert!(body.ends_with(b"data: [DONE]\n\n"));
    }
}
