//! The one seam between the runtime and a scenario's replay. A `Fixture` pins what a replayed
//! run must reproduce (new session ids, the system prompt), hears what the replay must follow (a
//! session loaded, a child settled), stands in for the MCP servers and checks at exit that the
//! recording was used up. `Replay` is the fixture of `--replay DIR`; a runtime without one (a real
//! run, the tests' scripted runs) has none of these behaviours, and `trait Model` carries none.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Result;

use crate::mcp::Recording;
use crate::model::replay::ReplayModel;
use crate::session::Event;

/// The empty file written into a child's cwd whenever a subagent ends, in replay: scenarios fence
/// on it to know a child has ended (dsh's settlement marker).
pub(crate) const SETTLED_MARKER: &str = ".dsh-snapshot-subagent-settled";

/// What a replayed run asks of the recording it replays.
pub(crate) trait Fixture: Send + Sync {
    /// The id of the next new session, when the recording pins them (`None`: a fresh UUID).
    fn next_session_id(&self) -> Option<String>;

    /// The system prompt a new top-level session in `cwd` starts with, when the recording pins
    /// one. Without one the built prompt is used and not recorded (its date would make the
    /// transcripts differ).
    fn pinned_prompt(&self, cwd: &Path) -> Option<String>;

    /// Hears that a stored session was loaded with these events (the model calls its log
    /// already holds count as made).
    fn session_loaded(&self, session_id: &str, events: &[Event]);

    /// Hears that a child whose working directory is `cwd` has ended.
    fn child_settled(&self, cwd: &Path);

    /// The recorded MCP results that stand in for the servers.
    fn mcp_recording(&self) -> Option<Arc<Recording>>;

    /// Checks at exit that everything recorded was used (every recorded model call was made);
    /// an error makes `kin acp` exit 3.
    fn check(&self) -> Result<(), String>;
}

/// The fixture of a scenario directory: its replay model (shared with the runtime as its
/// `Model`), its pinned prompt and its recorded MCP results.
pub(crate) struct Replay {
    model: Arc<ReplayModel>,
    dir: PathBuf,
    mcp: Arc<Recording>,
}

impl Replay {
    /// Reads the scenario directory `dir`.
    pub(crate) fn from_dir(dir: &Path) -> Result<Self> {
        let model = Arc::new(ReplayModel::from_dir(dir)?);
        Ok(Replay { model, dir: dir.to_path_buf(), mcp: Arc::new(Recording::from_dir(dir)) })
    }

    /// The model serving the recorded calls.
    pub(crate) fn model(&self) -> Arc<ReplayModel> {
        self.model.clone()
    }
}

impl Fixture for Replay {
    fn next_session_id(&self) -> Option<String> {
        self.model.next_session_id()
    }

    fn pinned_prompt(&self, cwd: &Path) -> Option<String> {
        crate::prompt::pinned(&self.dir).map(|text| text.replace("{{cwd}}", &cwd.display().to_string()))
    }

    fn session_loaded(&self, session_id: &str, events: &[Event]) {
        self.model.session_loaded(session_id, events);
    }

    fn child_settled(&self, cwd: &Path) {
        let marker = cwd.join(SETTLED_MARKER);
        if let Err(e) = std::fs::write(&marker, b"") {
            tracing::warn!(path = %marker.display(), "cannot write the settlement marker: {e}");
        }
    }

    fn mcp_recording(&self) -> Option<Arc<Recording>> {
        Some(self.mcp.clone())
    }

    fn check(&self) -> Result<(), String> {
        self.model.check_consumed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replay_pins_the_recorded_prompt_and_writes_the_settlement_marker() {
        let dir = tempfile::tempdir().unwrap();
        let header =
            r#"{"type":"session","version":0,"id":"00000000-0000-4000-8000-000000000001","createdAt":1,"cwd":"/w"}"#;
        let prompt = r#"{"type":"system/prompt","seq":0,"time":1,"data":{"text":"Pinned in {{cwd}}."}}"#;
        std::fs::write(dir.path().join("session.jsonl"), format!("{header}\n{prompt}\n")).unwrap();
        let replay = Replay::from_dir(dir.path()).unwrap();
        assert_eq!(replay.pinned_prompt(Path::new("/ws")).as_deref(), Some("Pinned in /ws."));
        assert_eq!(replay.next_session_id().as_deref(), Some("00000000-0000-4000-8000-000000000001"));
        assert_eq!(replay.check(), Ok(()), "a log without model calls leaves nothing unmade");
        let cwd = tempfile::tempdir().unwrap();
        replay.child_settled(cwd.path());
        assert!(cwd.path().join(SETTLED_MARKER).exists());
    }
}
