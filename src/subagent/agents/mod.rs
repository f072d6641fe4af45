//! Named child agents (issue 24): reviewers, explorers and testers defined in files
//! (`.kin/agents/*.md`, `.claude/agents/*.md`, in the workspace and the user's config), in
//! `[agents.NAME]` config tables, or built in (`general`, `explore`, `review`). The delegation
//! tools offer them by name; a child started as one runs with its persona, tool filter, model,
//! turn limit and permission cap (`launch`), which its descriptor records for cold resume.
//!
//! `front` splits a file's YAML front matter, `file` reads a file into a definition, `def` is the
//! definition and the checks files and tables share, `builtin` the three shipped agents, `load`
//! the levels and their precedence.

mod builtin;
mod def;
mod file;
mod front;
mod load;

pub(crate) use def::AgentDef;
pub(crate) use def::Fields;
pub(crate) use def::ModelChoice;
pub(crate) use def::Origin;
pub(crate) use load::AgentSettings;
pub(crate) use load::Agents;

use crate::model::ModelRoute;
use crate::subagent::NamedAgent;
use crate::subagent::descriptor::ToolFilter;

/// The default child's composition (`[subagents]`): what `general` runs with, and what every
/// other agent's tools stay within.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Defaults {
    pub persona: Option<String>,
    pub tool_filter: Option<ToolFilter>,
    /// `None`: the parent's route.
    pub route: Option<ModelRoute>,
}

/// What a child started as a named agent runs with.
#[derive(Debug, Clone, PartialEq)]
pub struct Launch {
    pub agent: NamedAgent,
    pub persona: Option<String>,
    pub tool_filter: Option<ToolFilter>,
    /// `None`: the parent's route.
    pub route: Option<ModelRoute>,
}

impl AgentDef {
    /// What a child started as this agent runs with, on top of the default child's `defaults`:
    /// `general` is the default child; any other agent has its own persona and model (unset:
    /// the default child's model), and its tools stay within the default child's filter.
    pub fn launch(&self, defaults: &Defaults) -> Launch {
        let (persona, tool_filter, route) = if self.is_default {
            (defaults.persona.clone(), defaults.tool_filter.clone(), defaults.route.clone())
        } else {
            let filter = match (self.own_filter(), &defaults.tool_filter) {
                (Some(own), Some(outer)) => Some(own.within(outer)),
                (own, outer) => own.or_else(|| outer.clone()),
            };
            let route = match &self.model {
                ModelChoice::Default => defaults.route.clone(),
                ModelChoice::Route(route) => Some(route.clone()),
                ModelChoice::Inherit | ModelChoice::Unknown(_) => None,
            };
            (self.persona.clone(), filter, route)
        };
        let agent =
            NamedAgent { name: self.name.clone(), permission_cap: self.permission_mode, max_turns: self.max_turns };
        Launch { agent, persona, tool_filter, route }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::permission::PermissionMode;
    use crate::subagent::AgentRecord;

    fn defaults() -> Defaults {
        Defaults {
            persona: Some("default persona".into()),
            tool_filter: Some(ToolFilter { allow: None, deny: Some(vec!["bash".into()]) }),
            route: Some(ModelRoute::parse("cfg/child").unwrap()),
        }
    }

    #[test]
    fn general_is_the_default_child() {
        let agents = Agents::builtin();
        let launch = agents.get("general").unwrap().launch(&defaults());
        assert_eq!(launch.persona.as_deref(), Some("default persona"));
        assert_eq!(launch.tool_filter, defaults().tool_filter);
        assert_eq!(launch.route, defaults().route);
        assert_eq!((launch.agent.permission_cap, launch.agent.max_turns), (None, None));
        assert_eq!(launch.agent.record(), AgentRecord::named("general"));
    }

    #[test]
    fn explore_and_review_are_read_only_and_stay_within_the_default_filter() {
        let agents = Agents::builtin();
        for name in ["explore", "review"] {
            let launch = agents.get(name).unwrap().launch(&defaults());
            let filter = launch.tool_filter.clone().unwrap();
            assert_eq!(filter.allow, Some(vec!["read".to_string(), "glob".to_string(), "grep".to_string()]));
            assert_eq!(filter.deny, Some(vec!["bash".to_string()]), "the default child's denies still apply");
            assert_eq!(launch.agent.permission_cap, Some(PermissionMode::ReadOnly));
            assert!(launch.persona.as_deref().unwrap().contains("cannot change files"));
            assert_eq!(launch.route, defaults().route, "no model of their own: the default child's");
            assert_eq!(launch.agent.record().permission_mode.as_deref(), Some("read-only"));
        }
        assert!(agents.get("review").unwrap().launch(&Defaults::default()).persona.unwrap().contains("findings"));
    }

    #[test]
    fn a_model_choice_picks_the_route() {
        let mut def = Agents::builtin().get("explore").unwrap().clone();
        for (choice, route) in [
            (ModelChoice::Inherit, None),
            (ModelChoice::Unknown("haiku".into()), None),
            (ModelChoice::Route(ModelRoute::parse("a/b").unwrap()), Some(ModelRoute::parse("a/b").unwrap())),
            (ModelChoice::Default, defaults().route),
        ] {
            def.model = choice;
            assert_eq!(def.launch(&defaults()).route, route);
        }
    }
}
