//! Keyless replay of recorded scenarios (dsh `llm-replay`). Each recorded session log
//! (`session.jsonl`, then `session.N.jsonl` by header `createdAt`) yields one script: its
//! `assistant/chunk` events grouped by (turn, step), one model call per group (a group ends at its
//! `finish`, so a step that retried a call holds a group per attempt). Live sessions bind
//! to scripts in first-call order. `replay.override.json` replaces the parent's script (a bare
//! entry array) or patches it (`{patches:[{at, entry}]}`). Session ids are minted from the recorded
//! headers in order, so recorded tool arguments naming a session id stay valid.

use std::collections::{HashMap, VecDeque};
use std::path::Path;
use std::sync::Mutex;

use anyhow::{Context, Result};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::script::{ReplayEntry, blocks_text, play, prompt_of};
use super::{ChunkStream, Model, ModelRequest, StreamChunk};
use crate::session::event::{AssistantChunk, UserMessage};
use crate::session::layout::validate_session_id;
use crate::session::scan::scan_file;
use crate::session::{Event, Kind};

/// One recorded session's calls.
#[derive(Debug)]
struct Script {
    name: String,
    /// The recorded session's id.
    id: String,
    /// The first user prompt of the recorded session (after any lineage seed).
    prompt: Option<String>,
    bound: bool,
    /// Each call with the recorded (turn, step) it served, when known.
    entries: VecDeque<(Option<(u64, u64)>, ReplayEntry)>,
    recorded: usize,
}

#[derive(Debug, Default)]
struct State {
    scripts: Vec<Script>,
    bindings: HashMap<String, usize>,
    /// Session ids to mint, in recorded header order.
    ids: VecDeque<String>,
    /// How many ids were minted (deterministic ids continue from here).
    minted: u64,
}

/// A deterministic id for the `n`th session of a replay whose recorded header has no UUID.
fn sequential_id(n: u64) -> String {
    format!("00000000-0000-4000-8000-{n:012}")
}

/// Serves recorded model calls.
#[derive(Debug)]
pub(crate) struct ReplayModel {
    state: Mutex<State>,
}

impl ReplayModel {
    /// Reads the scripts of a scenario directory.
    pub(crate) fn from_dir(dir: &Path) -> Result<Self> {
        let parent = dir.join("session.jsonl");
        let mut logs = vec![(parent.clone(), scan_file(&parent).context("reading a replay log")?)];
        let mut children = Vec::new();
        for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
            let path = entry?.path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            let is_child = name
                .strip_prefix("session.")
                .and_then(|rest| rest.strip_suffix(".jsonl"))
                .is_some_and(|n| n.parse::<u32>().is_ok());
            if is_child {
                let scanned = scan_file(&path).context("reading a replay log")?;
                children.push((path, scanned));
            }
        }
        children.sort_by(|a, b| (a.1.header.created_at, &a.0).cmp(&(b.1.header.created_at, &b.0)));
        logs.extend(children);
        let mut state = State::default();
        for (n, (path, scanned)) in logs.into_iter().enumerate() {
            let id = &scanned.header.id;
            let usable = validate_session_id(id).is_ok() && is_uuid(id);
            let minted = if usable { id.clone() } else { sequential_id(n as u64 + 1) };
            state.ids.push_back(minted.clone());
            let seed_length = scanned.header.seed_length.unwrap_or(0);
            let prompt = scanned
                .events
                .iter()
                .filter(|e| e.seq >= seed_length)
                .filter_map(Event::get::<UserMessage>)
                .find(UserMessage::is_from_user)
                .map(|m| blocks_text(&m.content));
            let entries = derive_entries(scanned.events.iter().filter(|e| e.kind == Kind::AssistantChunk));
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("?").to_string();
            state.scripts.push(Script { id: minted, name, prompt, bound: false, recorded: entries.len(), entries });
        }
        let override_path = dir.join("replay.override.json");
        if override_path.exists() {
            let text = std::fs::read_to_string(&override_path)?;
            let value: Value =
                serde_json::from_str(&text).with_context(|| format!("parsing {}", override_path.display()))?;
            apply_override(&mut state.scripts, &value)
                .with_context(|| format!("applying {}", override_path.display()))?;
        }
        Ok(ReplayModel { state: Mutex::new(state) })
    }
}

/// True for the 8-4-4-4-12 hex shape.
pub(crate) fn is_uuid(s: &str) -> bool {
    uuid::Uuid::try_parse(s).is_ok() && s.len() == 36
}

fn derive_entries<'a>(chunks: impl Iterator<Item = &'a Event>) -> VecDeque<(Option<(u64, u64)>, ReplayEntry)> {
    let mut groups: Vec<((u64, u64), Vec<StreamChunk>)> = Vec::new();
    for event in chunks {
        let Some(AssistantChunk { turn, step, chunk }) = event.get() else {
            tracing::warn!("skipping an unreadable recorded chunk (seq {}): {}", event.seq, event.data);
            continue;
        };
        let key = (turn, step);
        // A group ends at its `finish`: a step that retried an empty completion holds a
        // call per attempt.
        let open = |group: &[StreamChunk]| !matches!(group.last(), Some(StreamChunk::Finish { .. }));
        match groups.last_mut() {
            Some((k, group)) if *k == key && open(group) => group.push(chunk),
            _ => groups.push((key, vec![chunk])),
        }
    }
    groups.into_iter().map(|(key, chunks)| (Some(key), ReplayEntry::Chunks(chunks))).collect()
}

/// Applies `replay.override.json`: a bare entry array replaces the parent's script;
/// `{patches: [{at, entry, script?}]}` replaces single calls (`script` N patches `session.N.jsonl`,
/// a kin extension; the default 0 is the parent).
fn apply_override(scripts: &mut [Script], value: &Value) -> Result<()> {
    match value {
        Value::Array(entries) => {
            let parsed: Result<VecDeque<_>, _> =
                entries.iter().map(|e| ReplayEntry::parse(e).map(|e| (None, e))).collect();
            let parent = scripts.first_mut().context("no parent script")?;
            parent.entries = parsed.map_err(anyhow::Error::msg)?;
            parent.recorded = parent.entries.len();
        }
        Value::Object(map) => {
            let patches =
                map.get("patches").and_then(Value::as_array).context("override object needs a \"patches\" array")?;
            for patch in patches {
                let at = patch["at"].as_u64().context("patch needs a numeric \"at\"")? as usize;
                let n = patch.get("script").and_then(Value::as_u64).unwrap_or(0) as usize;
                let entry = ReplayEntry::parse(&patch["entry"]).map_err(anyhow::Error::msg)?;
                let script =
                    scripts.get_mut(n).with_context(|| format!("patch names script {n}, which does not exist"))?;
                let slot =
                    script.entries.get_mut(at).with_context(|| format!("patch at {at} is past the script's end"))?;
                slot.1 = entry;
            }
        }
        _ => anyhow::bail!("override must be an entry array or {{\"patches\": [...]}}"),
    }
    Ok(())
}

impl Model for ReplayModel {
    fn stream(&self, request: ModelRequest, cancel: CancellationToken) -> ChunkStream {
        let entry = {
            let Ok(mut state) = self.state.lock() else {
                return play(exhausted("replay state poisoned"), None, cancel);
            };
            let index = match state.bindings.get(&request.session_id) {
                Some(&i) => Some(i),
                None => {
                    // Bind to the unbound script recorded with the same prompt, else to the
                    // first unbound one (dsh's first-call order).
                    let prompt = prompt_of(&request.messages);
                    let unbound = || state.scripts.iter().enumerate().filter(|(_, s)| !s.bound);
                    let chosen = unbound()
                        .find(|(_, s)| s.prompt.is_some() && s.prompt == prompt)
                        .or_else(|| unbound().next())
                        .map(|(i, _)| i);
                    if let Some(i) = chosen {
                        state.scripts[i].bound = true;
                        state.bindings.insert(request.session_id.clone(), i);
                    }
                    chosen
                }
            };
            match index {
                None => exhausted(&format!("no recorded session left to replay for session {}", request.session_id)),
                Some(i) => {
                    let script = &mut state.scripts[i];
                    // A session loaded after a restart skips the calls its log already holds.
                    while script
                        .entries
                        .front()
                        .is_some_and(|(key, _)| key.is_some_and(|k| k < (request.turn, request.step)))
                    {
                        script.entries.pop_front();
                    }
                    script.entries.pop_front().map(|(_, entry)| entry).unwrap_or_else(|| {
                        exhausted(&format!(
                            "{} has no recorded model call left ({} recorded)",
                            script.name, script.recorded
                        ))
                    })
                }
            }
        };
        play(entry, request.cwd, cancel)
    }
}

impl ReplayModel {
    /// Checks that every recorded call was made (the fixture's end check).
    pub(crate) fn check_consumed(&self) -> Result<(), String> {
        let state = self.state.lock().map_err(|_| "replay state poisoned".to_string())?;
        let unused: Vec<String> = state
            .scripts
            .iter()
            .filter(|s| !s.entries.is_empty())
            .map(|s| format!("{}: {} of {} recorded model calls were not made", s.name, s.entries.len(), s.recorded))
            .collect();
        if unused.is_empty() { Ok(()) } else { Err(unused.join("; ")) }
    }

    /// A stored session was loaded with these events: the calls its log already holds count as
    /// made.
    pub(crate) fn session_loaded(&self, session_id: &str, events: &[crate::session::Event]) {
        let Ok(mut state) = self.state.lock() else { return };
        let index = match state.bindings.get(session_id) {
            Some(&i) => Some(i),
            None => state.scripts.iter().position(|s| !s.bound && s.id == session_id),
        };
        let Some(i) = index else { return };
        state.bindings.insert(session_id.to_string(), i);
        state.scripts[i].bound = true;
        let done: std::collections::HashSet<(u64, u64)> =
            events.iter().filter_map(Event::get::<AssistantChunk>).map(|c| (c.turn, c.step)).collect();
        state.scripts[i].entries.retain(|(key, _)| key.is_none_or(|k| !done.contains(&k)));
    }

    /// The id of the next new session: the recorded headers' in order, then sequential ones.
    pub(crate) fn next_session_id(&self) -> Option<String> {
        let mut state = self.state.lock().ok()?;
        state.minted += 1;
        let minted = state.minted;
        Some(state.ids.pop_front().unwrap_or_else(|| sequential_id(minted)))
    }
}

fn exhausted(message: &str) -> ReplayEntry {
    ReplayEntry::Throw { chunks: Vec::new(), message: message.into(), code: "REPLAY_EXHAUSTED".into() }
}
