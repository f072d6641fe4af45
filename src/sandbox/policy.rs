//! The sandbox setting: a level (`off`, `read-only`, `workspace-write`) and whether the network
//! is reachable, with the strictness order that "never looser than the start" is decided by, and
//! the settings from the config file (extra writable roots, the fallback, kin's own directories).

use std::fmt;
use std::path::PathBuf;

/// How far commands are confined.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SandboxLevel {
    /// Commands may read what the user can and write nowhere but a private temp dir.
    ReadOnly,
    /// Commands may also write the session's workspace and the declared extra roots.
    WorkspaceWrite,
    /// No confinement.
    Off,
}

impl SandboxLevel {
    pub const ALL: [SandboxLevel; 3] = [SandboxLevel::Off, SandboxLevel::ReadOnly, SandboxLevel::WorkspaceWrite];

    pub fn id(self) -> &'static str {
        match self {
            SandboxLevel::Off => "off",
            SandboxLevel::ReadOnly => "read-only",
            SandboxLevel::WorkspaceWrite => "workspace-write",
        }
    }

    pub fn parse(id: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|level| level.id() == id)
    }
}

/// A level and the network switch: what one command may do. `off` always has the network.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SandboxPolicy {
    pub level: SandboxLevel,
    network: bool,
}

impl Default for SandboxPolicy {
    fn default() -> Self {
        SandboxPolicy::OFF
    }
}

impl SandboxPolicy {
    pub const OFF: SandboxPolicy = SandboxPolicy { level: SandboxLevel::Off, network: true };

    /// Every policy, in the order the editor's selector lists them.
    pub const ALL: [SandboxPolicy; 5] = [
        SandboxPolicy::OFF,
        SandboxPolicy { level: SandboxLevel::ReadOnly, network: false },
        SandboxPolicy { level: SandboxLevel::ReadOnly, network: true },
        SandboxPolicy { level: SandboxLevel::WorkspaceWrite, network: false },
        SandboxPolicy { level: SandboxLevel::WorkspaceWrite, network: true },
    ];

    /// `level` with `network` (ignored for `off`, which has it).
    pub fn new(level: SandboxLevel, network: bool) -> Self {
        SandboxPolicy { level, network: network || level == SandboxLevel::Off }
    }

    pub fn network(self) -> bool {
        self.network
    }

    /// True unless the level is `off`.
    pub fn is_sandboxed(self) -> bool {
        self.level != SandboxLevel::Off
    }

    /// The stable id: the level, with `+network` for a sandboxed level that keeps the network
    /// (`workspace-write+network`).
    pub fn id(self) -> String {
        match (self.level, self.network) {
            (SandboxLevel::Off, _) | (_, false) => self.level.id().to_string(),
            (level, true) => format!("{}+network", level.id()),
        }
    }

    /// The policy with this id (`off`, `read-only`, `workspace-write`, each sandboxed level
    /// optionally with `+network`).
    pub fn parse(id: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|policy| policy.id() == id)
    }

    /// `parse` with an error naming the bad id and the valid ones.
    pub fn parse_arg(id: &str) -> Result<Self, String> {
        Self::parse(id).ok_or_else(|| format!("unknown sandbox \"{id}\"; valid values are {}", Self::valid_ids()))
    }

    pub fn valid_ids() -> String {
        Self::ALL.map(SandboxPolicy::id).join(", ")
    }

    /// A short human name for the editor's selector.
    pub fn name(self) -> String {
        let level = match self.level {
            SandboxLevel::Off => return "Off".to_string(),
            SandboxLevel::ReadOnly => "Read only",
            SandboxLevel::WorkspaceWrite => "Workspace write",
        };
        if self.network { format!("{level}, network") } else { format!("{level}, no network") }
    }

    /// True when this policy allows nothing `other` does not (each dimension at most as loose).
    pub fn within(self, other: SandboxPolicy) -> bool {
        self.level <= other.level && (!self.network || other.network)
    }

    /// The loosest policy within both (the stricter of each dimension).
    pub fn meet(self, other: SandboxPolicy) -> SandboxPolicy {
        SandboxPolicy::new(self.level.min(other.level), self.network && other.network)
    }
}

impl fmt::Display for SandboxPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.id())
    }
}

/// What to do when the kernel enforces less than the policy asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SandboxFallback {
    /// Do not count commands as sandboxed: they run unconfined, after the permission questions
    /// of the mode, and kin says why.
    #[default]
    Refuse,
    /// Run commands with what the kernel does enforce, count them as sandboxed, and say what is
    /// missing.
    Warn,
}

impl SandboxFallback {
    pub fn parse(id: &str) -> Option<Self> {
        match id {
            "refuse" => Some(SandboxFallback::Refuse),
            "warn" => Some(SandboxFallback::Warn),
            _ => None,
        }
    }
}

/// The sandbox part of the configuration.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SandboxSettings {
    /// The policy kin starts sessions with; restored sessions are never looser.
    pub policy: SandboxPolicy,
    /// Absolute directories `workspace-write` commands may write besides the workspace.
    pub writable_roots: Vec<PathBuf>,
    pub fallback: SandboxFallback,
    /// kin's own directories (config, sessions): kept read-only when they lie inside a writable
    /// root.
    pub protected: Vec<PathBuf>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_bad_ids_are_named() {
        for policy in SandboxPolicy::ALL {
            assert_eq!(SandboxPolicy::parse(&policy.id()), Some(policy));
        }
        assert_eq!(
            SandboxPolicy::valid_ids(),
            "off, read-only, read-only+network, workspace-write, workspace-write+network"
        );
        let err = SandboxPolicy::parse_arg("jail").unwrap_err();
        assert!(err.contains("\"jail\"") && err.contains("workspace-write"), "{err}");
        assert_eq!(SandboxPolicy::new(SandboxLevel::Off, false), SandboxPolicy::OFF);
        assert!(SandboxPolicy::OFF.network());
    }

    #[test]
    fn strictness_is_per_dimension() {
        let [off, ro, ro_net, ww, ww_net] = SandboxPolicy::ALL;
        assert!(ro.within(ww) && ro.within(off) && ww.within(off) && ro.within(ro_net));
        assert!(!ww.within(ro) && !off.within(ww) && !ro_net.within(ww) && !ww_net.within(ww));
        // A restored read-only+network under a start of workspace-write keeps read-only, loses
        // the network.
        assert_eq!(ro_net.meet(ww), ro);
        assert_eq!(off.meet(ww_net), ww_net);
        assert_eq!(ww_net.meet(ro_net), ro_net);
        for a in SandboxPolicy::ALL {
            for b in SandboxPolicy::ALL {
                assert!(a.meet(b).within(a) && a.meet(b).within(b), "{a} {b}");
            }
        }
    }
}
