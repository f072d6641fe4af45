//! `kin bench`: figures, never assertions. Cold start (process start → `initialize` response, and
//! RSS after it), per-turn overhead with an in-process scripted model, append throughput with
//! the real fsync policy, `load` time of large sessions, and subagent listing (the catalog) under
//! a large corpus.

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
    catalog(tmp.path(), quick, out)?;
    Ok(())
}

/// Unrelated sessions around the listed parent.
const CATALOG_UNRELATED: usize = 10_000;

/// `list_children` latency for D = 10, 100, 1000 direct children with logs of 10 KB (and 1 MB in
/// the full run) under 10,000 unrelated sessions. Cold: a fresh query (empty derived cache; the
/// OS page cache is warm, the files were just written). Warm: median of the next five listings.
fn catalog(tmp: &Path, quick: bool, out: &mut dyn Write) -> Result<()> {
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
            writeln!(
                out,
                "list {d} children ({size} logs) under {CATALOG_UNRELATED} unrelated sessions: cold {}, warm median {}",
                ms(cold),
                ms(median(&warm))
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
    let mut line =
        |text: &mut String, kind: &str, data: serde_json::Value, extra: Option<(&str, serde_json::Value)>| {
            let mut event = json!({"type": kind, "seq": seq, "time": 0, "data": data});
            if let Some((key, value)) = extra {
                event[key] = value;
            }
            text.push_str(&event.to_string());
            text.push('\n');
            seq += 1;
        };
    for _ in 0..events {
        line(&mut text, "session/title", json!({"title": "bench"}), None);
    }
    if child_bytes > 0 {
        let descriptor = json!({"version": 2, "mode": "continuable", "provider": "spawn", "label": "bench child", "agentProvider": "bench", "agentModel": "m"});
        line(&mut text, "subagent/descriptor", descriptor, None);
        line(&mut text, "session/end-seed", json!({}), None);
        line(
            &mut text,
            "turn/start",
            json!({"turn": 1, "trigger": {"kind": "message", "source": {"kind": "user"}}}),
            None,
        );
        let prompt = json!({"role": "user", "content": [{"type": "text", "text": "work"}], "source": {"kind": "user"}, "id": "u"});
        line(&mut text, "user/message", prompt, Some(("surfaceOp", json!("append"))));
        while text.len() < child_bytes {
            let chunk = json!({"turn": 1, "step": 1, "chunk": {"type": "text-delta", "index": 0, "text": "some streamed text of a busy child, long enough to fill its log"}});
            line(&mut text, "assistant/chunk", chunk, None);
        }
        let message = json!({"turn": 1, "step": 1, "message": {"role": "assistant", "content": [{"type": "text", "text": "done"}]}});
        line(&mut text, "assistant/message", message, Some(("surfaceOp", json!("append"))));
        line(&mut text, "turn/end", json!({"turn": 1, "reason": {"kind": "completed"}}), None);
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
