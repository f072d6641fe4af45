//! `kin bench`: figures, never assertions. Cold start (process start → `initialize` response, and
//! RSS after it), per-turn overhead with an in-process scripted model, append throughput with
//! the real fsync policy, and `load` time of large sessions.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde_json::json;

use crate::agent::{AgentDeps, TurnEnd, spawn_agent};
use crate::model::script::ScriptedModel;
use crate::model::{Model, ModelRoute, text_response};
use crate::session::{SessionHeader, SessionStore};
use crate::tools::ToolRegistry;

/// Runs the suite and writes a report to `out`.
pub async fn run(quick: bool, out: &mut dyn Write) -> Result<()> {
    let tmp = tempfile::tempdir()?;
    writeln!(out, "kin bench{} — {}", if quick { " --quick" } else { "" }, machine())?;
    let starts = if quick { 10 } else { 30 };
    let (times, rss) = cold_start(tmp.path(), starts)?;
    writeln!(
        out,
        "cold start to initialize response: median {} p99 {} over {starts} starts; RSS after initialize {rss} KiB",
        ms(median(&times)),
        ms(p99(&times))
    )?;
    let turns = if quick { 200 } else { 1000 };
    let overhead = turn_overhead(tmp.path(), turns).await?;
    writeln!(
        out,
        "turn overhead (scripted model, in process): median {} p99 {} over {turns} turns",
        ms(median(&overhead)),
        ms(p99(&overhead))
    )?;
    let (events, elapsed) = append_throughput(tmp.path(), if quick { 20_000 } else { 100_000 })?;
    writeln!(
        out,
        "append: {events} events in {} = {:.0} events/s (fsync every 100 events)",
        ms(elapsed),
        events as f64 / elapsed.as_secs_f64()
    )?;
    let sizes: &[usize] = if quick { &[10_000, 100_000] } else { &[10_000, 100_000, 1_000_000] };
    for &n in sizes {
        let (load, bytes) = load_time(tmp.path(), n)?;
        writeln!(out, "load of a {n}-event session ({:.1} MB): {}", bytes as f64 / 1e6, ms(load))?;
    }
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

fn cold_start(tmp: &Path, n: usize) -> Result<(Vec<Duration>, u64)> {
    let exe = std::env::current_exe()?;
    let mut times = Vec::new();
    let mut rss = 0;
    for _ in 0..n {
        let started = Instant::now();
        let mut child = Command::new(&exe)
            .args(["acp", "--config", "/dev/null", "--sessions"])
            .arg(tmp.join("cold"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?;
        let mut stdin = child.stdin.take().context("stdin")?;
        writeln!(
            stdin,
            "{}",
            json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":{}}})
        )?;
        let mut line = String::new();
        BufReader::new(child.stdout.take().context("stdout")?).read_line(&mut line)?;
        times.push(started.elapsed());
        rss = rss_kib(child.id()).unwrap_or(0);
        drop(stdin);
        child.wait()?;
    }
    Ok((times, rss))
}

fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find(|l| l.starts_with("VmRSS:"))?.split_whitespace().nth(1)?.parse().ok()
}

async fn turn_overhead(tmp: &Path, turns: usize) -> Result<Vec<Duration>> {
    let store = SessionStore::new(tmp.join("turns"));
    let session = store.create(SessionHeader::new(uuid::Uuid::new_v4().to_string(), 0, Some("/bench".into())))?;
    let model = Arc::new(ScriptedModel::from_responses((0..turns).map(|_| text_response(&["ok"]))));
    let deps = AgentDeps {
        model: model as Arc<dyn Model>,
        tools: ToolRegistry::new(),
        route: ModelRoute::parse("bench/scripted").map_err(anyhow::Error::msg)?,
        system: String::new(),
        max_steps: 5,
        max_parallel_tools: 1,
        depth: 0,
        permissions: None,
        prompt: None,
        file_access: None,
    };
    let agent = spawn_agent(session, deps);
    let mut times = Vec::with_capacity(turns);
    for _ in 0..turns {
        let started = Instant::now();
        let end = agent.followup(vec![json!({"type":"text","text":"hi"})], json!({"kind":"user"}))?.await?;
        times.push(started.elapsed());
        anyhow::ensure!(end == TurnEnd::Completed, "bench turn ended {end:?}");
    }
    agent.shutdown().await;
    Ok(times)
}

fn append_throughput(tmp: &Path, n: usize) -> Result<(usize, Duration)> {
    let store = SessionStore::new(tmp.join("append"));
    let mut session = store.create(SessionHeader::new(uuid::Uuid::new_v4().to_string(), 0, Some("/bench".into())))?;
    let started = Instant::now();
    for i in 0..n {
        session.append(
            "assistant/chunk",
            json!({"turn": 1, "step": 1, "chunk": {"type": "text-delta", "index": 0, "text": "token "}}),
        );
        if i % 100 == 99 {
            session.flush()?;
        }
    }
    session.flush()?;
    Ok((n, started.elapsed()))
}

fn load_time(tmp: &Path, n: usize) -> Result<(Duration, u64)> {
    let store = SessionStore::new(tmp.join(format!("load-{n}")));
    let id = uuid::Uuid::new_v4().to_string();
    let mut session = store.create(SessionHeader::new(id.clone(), 0, Some("/bench".into())))?;
    let mut turn = 0;
    for i in 0..n {
        if i % 10 == 0 {
            turn += 1;
            session.append(
                "turn/start",
                json!({"turn": turn, "trigger": {"kind": "message", "source": {"kind": "user"}}}),
            );
        } else if i % 10 == 9 {
            session.append("turn/end", json!({"turn": turn, "reason": {"kind": "completed"}}));
        } else {
            session.append("assistant/chunk", json!({"turn": turn, "step": 1, "chunk": {"type": "text-delta", "index": 0, "text": "some streamed text"}}));
        }
    }
    session.flush()?;
    drop(session);
    let bytes = store.locate(&id)?.map_or(0, |p| std::fs::metadata(p).map_or(0, |m| m.len()));
    let started = Instant::now();
    let loaded = store.load(&id).map_err(|e| anyhow::anyhow!("{e}"))?;
    let elapsed = started.elapsed();
    anyhow::ensure!(loaded.events().len() >= n, "loaded {} of {n} events", loaded.events().len());
    Ok((elapsed, bytes))
}
