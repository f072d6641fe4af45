//! The replay switch: the model a configuration picks (replay when a scenario directory is
//! given), dsh's settlement marker and the replay model's end check.

use std::path::Path;
use std::sync::Arc;

use anyhow::Result;

use super::Runtime;
use crate::config::Config;
use crate::model::Model;
use crate::model::replay::ReplayModel;
use crate::subagent::Lifecycle;

/// The empty file written into a child's cwd whenever a subagent ends, in replay mode.
pub(crate) const SETTLED_MARKER: &str = ".dsh-snapshot-subagent-settled";

/// Picks the model for a configuration: replay when a scenario directory is given.
pub fn model_for(config: &Config) -> Result<Arc<dyn Model>> {
    if let Some(dir) = &config.replay {
        return Ok(Arc::new(ReplayModel::from_dir(dir)?));
    }
    let store = config.keys.clone();
    let stored: crate::model::routed::KeyLookup =
        Arc::new(move |variable: &str| crate::keys::lookup(&|_| None, &store, variable));
    let routed = crate::model::routed::Routed::new(&config.model, config.models.clone(), stored)
        .map_err(|e| anyhow::anyhow!("model route {}: {e}", config.model))?;
    Ok(Arc::new(routed))
}

impl Runtime {
    /// In replay, writes dsh's settlement marker into a child's cwd when it ends: scenarios
    /// fence on it to know a child has ended.
    pub(super) fn mark_settlements(&self) {
        if self.config.replay.is_none() {
            return;
        }
        self.subagents.observe(|event| {
            if let Lifecycle::End { cwd: Some(cwd), .. } = event {
                let marker = Path::new(cwd).join(SETTLED_MARKER);
                if let Err(e) = std::fs::write(&marker, b"") {
                    tracing::warn!(path = %marker.display(), "cannot write the settlement marker: {e}");
                }
            }
        });
    }

    /// Checks that the model served everything it expected (replay).
    pub fn check_model_consumed(&self) -> Result<(), String> {
        self.model.check_consumed()
    }
}
