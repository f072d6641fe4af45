//! What a configuration runs on: the HTTP models and their key check, or the replay's model and
//! fixture when a scenario directory is given (`--replay DIR`). The runtime's replay behaviours are the fixture's hooks
//! (`scenario::fixture`): the settlement marker is written through it, and its end check is what
//! makes `kin acp` exit 3.

use std::path::Path;
use std::sync::Arc;

use anyhow::Result;

use super::Runtime;
use super::build::Backend;
use crate::config::Config;
use crate::model::Model;
use crate::scenario::fixture::Replay;
use crate::subagent::Lifecycle;
use crate::tools::ToolRegistry;

/// Picks the backend for a configuration: the recorded calls and their fixture when a scenario
/// directory is given, else the HTTP clients of its routes with their key check.
fn backend_for(config: &Config) -> Result<Backend> {
    if let Some(dir) = &config.replay {
        let replay = Replay::from_dir(dir)?;
        let model: Arc<dyn Model> = replay.model();
        return Ok(Backend { model, keys: None, fixture: Some(Arc::new(replay)) });
    }
    let store = config.keys.clone();
    let stored: crate::model::routed::KeyLookup =
        Arc::new(move |variable: &str| crate::keys::lookup(&|_| None, &store, variable));
    let routed = crate::model::routed::Routed::new(&config.model, config.models.clone(), stored)
        .map_err(|e| anyhow::anyhow!("model {e}"))?;
    let routed = Arc::new(routed);
    Ok(Backend { model: routed.clone(), keys: Some(routed), fixture: None })
}

impl Runtime {
    /// The runtime a configuration asks for (what `kin acp` and `kin run` serve): its model, and
    /// with `--replay DIR` the scenario's recorded calls and their fixture, over `tools`.
    pub fn for_config(config: Config, tools: ToolRegistry) -> Result<Arc<Self>> {
        let backend = backend_for(&config)?;
        Self::with_backend(config, backend, tools)
    }

    /// With a fixture, tells it of every child that ends (in replay it writes the settlement
    /// marker scenarios fence on).
    pub(super) fn report_settlements(&self) {
        let Some(fixture) = self.fixture.clone() else { return };
        self.subagents.observe(move |event| {
            if let Lifecycle::End { cwd: Some(cwd), .. } = event {
                fixture.child_settled(Path::new(cwd));
            }
        });
    }

    /// Hears that a stored session was loaded with these events (the fixture's hook).
    pub(super) fn session_loaded(&self, session_id: &str, events: &[crate::session::Event]) {
        if let Some(fixture) = &self.fixture {
            fixture.session_loaded(session_id, events);
        }
    }

    /// The fixture's end check (a replay: every recorded model call was made); none without one.
    pub fn check_fixture(&self) -> Result<(), String> {
        self.fixture.as_ref().map_or(Ok(()), |fixture| fixture.check())
    }
}
