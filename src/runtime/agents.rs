//! The one registry of the live agents of a process: every live agent by session id behind one
//! mutex, each with its parent link and its closed `Role` (a top-level session with what its
//! tree shares, or a child with its narrowed permissions and its way of asking); and the tree
//! queries over those links (parent, ancestors, the top-level session at or above an agent,
//! descendants), written once here, each bounded by the registry's size so that a cycle of
//! links cannot hang them.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::agent::AgentHandle;
use crate::mcp::McpSession;
use crate::permission::{PermissionPrompt, Permissions};
use crate::sandbox::SessionSandbox;
use crate::subagent::agents::Agents;

/// What the registry needs to know of an agent to answer tree queries.
pub(super) trait Node: Clone {
    /// True for a top-level session (the root of its tree).
    fn is_top_level(&self) -> bool;
}

/// A live agent: its handle (which also answers whether a turn or a prompt is in flight and
/// the route of its next turn) and its role.
#[derive(Clone)]
pub(super) struct Agent {
    pub(super) handle: AgentHandle,
    pub(super) role: Role,
}

/// What kind of agent it is, and what only that kind has.
#[derive(Clone)]
pub(super) enum Role {
    TopLevel(Arc<TopLevel>),
    Child(Child),
}

/// What a top-level session holds for its whole tree.
pub(super) struct TopLevel {
    /// Its gate (its children's are narrowed from it).
    pub(super) permissions: Arc<Permissions>,
    /// The session's MCP servers (its children use them too).
    pub(super) mcp: Arc<McpSession>,
    /// The named agents its delegation tools offer (its children's too), read when it started.
    pub(super) named: Arc<Agents>,
    /// The session's working directory (its workspace slash commands; what its sandbox lets write).
    pub(super) cwd: Option<PathBuf>,
    /// The sandbox its commands (and its children's) run in.
    pub(super) sandbox: Arc<SessionSandbox>,
}

/// What a live child agent (a subagent) holds of its own.
#[derive(Clone)]
pub(super) struct Child {
    /// Its top-level session's, narrowed by its agent and every cap above it.
    pub(super) permissions: Arc<Permissions>,
    /// How the child asks the user (its own children ask through it).
    pub(super) prompt: Option<Arc<dyn PermissionPrompt>>,
}

impl Node for Agent {
    fn is_top_level(&self) -> bool {
        match self.role {
            Role::TopLevel(_) => true,
            Role::Child(_) => false,
        }
    }
}

impl Agent {
    /// The agent's gate: a top-level session's own, a child's narrowed one.
    pub(super) fn permissions(&self) -> &Arc<Permissions> {
        match &self.role {
            Role::TopLevel(top) => &top.permissions,
            Role::Child(child) => &child.permissions,
        }
    }

    /// What a top-level session holds, `None` for a child.
    pub(super) fn top_level(&self) -> Option<&Arc<TopLevel>> {
        match &self.role {
            Role::TopLevel(top) => Some(top),
            Role::Child(_) => None,
        }
    }

    /// What a child holds, `None` for a top-level session.
    pub(super) fn child(&self) -> Option<&Child> {
        match &self.role {
            Role::TopLevel(_) => None,
            Role::Child(child) => Some(child),
        }
    }
}

/// One registered agent and the session it was started below.
struct Entry<A> {
    agent: A,
    parent: Option<String>,
}

/// A live agent below another one.
pub(super) struct Descendant<A> {
    pub(super) id: String,
    pub(super) agent: A,
    /// This one and the agents between it and the one asked about, from this one up.
    pub(super) via: Vec<String>,
}

/// The live agents by session id.
pub(super) struct Registry<A = Agent> {
    by_id: Mutex<HashMap<String, Entry<A>>>,
}

impl<A> Default for Registry<A> {
    fn default() -> Self {
        Registry { by_id: Mutex::new(HashMap::new()) }
    }
}

impl<A: Node> Registry<A> {
    fn map(&self) -> MutexGuard<'_, HashMap<String, Entry<A>>> {
        self.by_id.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Registers (or replaces) the agent of session `id`, started below `parent`.
    pub(super) fn insert(&self, id: String, agent: A, parent: Option<String>) {
        self.map().insert(id, Entry { agent, parent });
    }

    /// Unregisters session `id`, returning its agent.
    pub(super) fn remove(&self, id: &str) -> Option<A> {
        self.map().remove(id).map(|entry| entry.agent)
    }

    /// Unregisters session `id` if `take` says so, under the one lock: `Ok(Some)` with the agent
    /// taken, `Ok(None)` when it is not live, `Err` with the agent when `take` kept it.
    pub(super) fn remove_if(&self, id: &str, take: impl FnOnce(&A) -> bool) -> Result<Option<A>, A> {
        let mut map = self.map();
        match map.get(id) {
            None => Ok(None),
            Some(entry) if take(&entry.agent) => Ok(map.remove(id).map(|entry| entry.agent)),
            Some(entry) => Err(entry.agent.clone()),
        }
    }

    /// The live agent of session `id`, whatever its role.
    pub(super) fn get(&self, id: &str) -> Option<A> {
        self.map().get(id).map(|entry| entry.agent.clone())
    }

    /// Every live agent, in no particular order.
    pub(super) fn all(&self) -> Vec<(String, A)> {
        self.map().iter().map(|(id, entry)| (id.clone(), entry.agent.clone())).collect()
    }

    /// Unregisters every agent `pick` chooses, returning them.
    pub(super) fn drain(&self, pick: impl Fn(&A) -> bool) -> Vec<(String, A)> {
        let mut map = self.map();
        let ids: Vec<String> = map.iter().filter(|(_, entry)| pick(&entry.agent)).map(|(id, _)| id.clone()).collect();
        ids.into_iter().filter_map(|id| map.remove(&id).map(|entry| (id, entry.agent))).collect()
    }

    /// The session a live agent was started below.
    pub(super) fn parent_of(&self, id: &str) -> Option<String> {
        self.map().get(id).and_then(|entry| entry.parent.clone())
    }

    /// The sessions above a live agent, nearest first, as far as the links reach through live
    /// agents (the last one may not be live itself); each at most once.
    pub(super) fn ancestors(&self, id: &str) -> Vec<String> {
        Self::up(&self.map(), id)
    }

    fn up(map: &HashMap<String, Entry<A>>, id: &str) -> Vec<String> {
        let mut above: Vec<String> = Vec::new();
        let mut cursor = map.get(id).and_then(|entry| entry.parent.as_deref());
        while let Some(parent) = cursor {
            if parent == id || above.iter().any(|seen| seen == parent) || above.len() > map.len() {
                break;
            }
            above.push(parent.to_string());
            cursor = map.get(parent).and_then(|entry| entry.parent.as_deref());
        }
        above
    }

    /// The live top-level agent at or above `id`, walking up through live agents.
    pub(super) fn root_of(&self, id: &str) -> Option<A> {
        let map = self.map();
        let at = map.get(id)?;
        if at.agent.is_top_level() {
            return Some(at.agent.clone());
        }
        for ancestor in Self::up(&map, id) {
            let entry = map.get(&ancestor)?;
            if entry.agent.is_top_level() {
                return Some(entry.agent.clone());
            }
        }
        None
    }

    /// The live agents below `id` (children, grandchildren, …), not `id` itself.
    pub(super) fn descendants(&self, id: &str) -> Vec<Descendant<A>> {
        let map = self.map();
        map.iter()
            .filter(|(cid, _)| cid.as_str() != id)
            .filter_map(|(cid, entry)| {
                let above = Self::up(&map, cid);
                let at = above.iter().position(|a| a == id)?;
                let via = std::iter::once(cid.clone()).chain(above[..at].iter().cloned()).collect();
                Some(Descendant { id: cid.clone(), agent: entry.agent.clone(), via })
            })
            .collect()
    }
}

impl Registry<Agent> {
    /// The live top-level session `id`: its handle and what it holds.
    pub(super) fn top_level(&self, id: &str) -> Option<(AgentHandle, Arc<TopLevel>)> {
        let agent = self.get(id)?;
        let top = agent.top_level()?.clone();
        Some((agent.handle, top))
    }

    /// True when `id` is a live top-level session.
    pub(super) fn is_top_level(&self, id: &str) -> bool {
        self.map().get(id).is_some_and(|entry| entry.agent.is_top_level())
    }

    /// The live child `id`: its handle and what it holds.
    pub(super) fn child(&self, id: &str) -> Option<(AgentHandle, Child)> {
        let agent = self.get(id)?;
        let child = agent.child()?.clone();
        Some((agent.handle, child))
    }

    /// True when `id` is a live child.
    pub(super) fn is_child(&self, id: &str) -> bool {
        self.map().get(id).is_some_and(|entry| !entry.agent.is_top_level())
    }

    /// The live top-level session at or above `id`: what it holds.
    pub(super) fn root_top_level(&self, id: &str) -> Option<Arc<TopLevel>> {
        self.root_of(id)?.top_level().cloned()
    }

    /// The permissions of a live agent (a child's are its top-level session's, narrowed).
    pub(super) fn permissions_of(&self, id: &str) -> Option<Arc<Permissions>> {
        self.map().get(id).map(|entry| entry.agent.permissions().clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in agent: its name and whether it is top-level.
    #[derive(Clone, Debug, PartialEq)]
    struct Fake(&'static str, bool);

    impl Node for Fake {
        fn is_top_level(&self) -> bool {
            self.1
        }
    }

    /// root ─ a ─ b ─ c, root ─ d; e is a child whose parent is not live.
    fn tree() -> Registry<Fake> {
        let registry = Registry::default();
        registry.insert("root".into(), Fake("root", true), None);
        for (id, parent) in [("a", "root"), ("b", "a"), ("c", "b"), ("d", "root"), ("e", "gone")] {
            registry.insert(id.into(), Fake(id, false), Some(parent.into()));
        }
        registry
    }

    fn sorted(mut below: Vec<Descendant<Fake>>) -> Vec<(String, Vec<String>)> {
        below.sort_by(|x, y| x.id.cmp(&y.id));
        below.into_iter().map(|d| (d.id, d.via)).collect()
    }

    fn ids(list: &[&str]) -> Vec<String> {
        list.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn parents_and_ancestors_follow_the_links_through_live_agents() {
        let registry = tree();
        assert_eq!(registry.parent_of("c").as_deref(), Some("b"));
        assert_eq!(registry.parent_of("root"), None);
        assert_eq!(registry.parent_of("nobody"), None);
        assert_eq!(registry.ancestors("c"), ids(&["b", "a", "root"]));
        assert_eq!(registry.ancestors("e"), ids(&["gone"]), "the last link may name a session not live");
        assert!(registry.ancestors("root").is_empty());
    }

    #[test]
    fn the_root_is_the_live_top_level_agent_at_or_above() {
        let registry = tree();
        assert_eq!(registry.root_of("c"), Some(Fake("root", true)));
        assert_eq!(registry.root_of("root"), Some(Fake("root", true)));
        assert_eq!(registry.root_of("e"), None, "its parent is not live");
        assert_eq!(registry.root_of("nobody"), None);
    }

    #[test]
    fn descendants_are_every_live_agent_below_with_the_path_to_it() {
        let registry = tree();
        assert_eq!(
            sorted(registry.descendants("root")),
            [
                ("a".to_string(), ids(&["a"])),
                ("b".to_string(), ids(&["b", "a"])),
                ("c".to_string(), ids(&["c", "b", "a"])),
                ("d".to_string(), ids(&["d"])),
            ]
        );
        assert_eq!(sorted(registry.descendants("b")), [("c".to_string(), ids(&["c"]))]);
        assert!(registry.descendants("c").is_empty());
        assert_eq!(sorted(registry.descendants("gone")), [("e".to_string(), ids(&["e"]))]);
    }

    #[test]
    fn a_cycle_of_links_ends_every_walk() {
        let registry = Registry::default();
        registry.insert("x".into(), Fake("x", false), Some("y".into()));
        registry.insert("y".into(), Fake("y", false), Some("z".into()));
        registry.insert("z".into(), Fake("z", false), Some("x".into()));
        registry.insert("self".into(), Fake("self", false), Some("self".into()));
        assert_eq!(registry.ancestors("x"), ids(&["y", "z"]));
        assert!(registry.ancestors("self").is_empty());
        assert_eq!(registry.root_of("x"), None);
        assert_eq!(
            sorted(registry.descendants("x")),
            [("y".to_string(), ids(&["y", "z"])), ("z".to_string(), ids(&["z"]))]
        );
        assert!(registry.descendants("self").is_empty());
    }

    #[test]
    fn removing_and_draining_unregister() {
        let registry = tree();
        assert_eq!(registry.remove("d"), Some(Fake("d", false)));
        assert_eq!(registry.remove_if("a", Fake::is_top_level), Err(Fake("a", false)));
        assert_eq!(registry.remove_if("nobody", Fake::is_top_level), Ok(None));
        assert_eq!(registry.remove_if("root", Fake::is_top_level), Ok(Some(Fake("root", true))));
        registry.insert("root".into(), Fake("root", true), None);
        assert_eq!(registry.get("d"), None);
        let mut drained = registry.drain(|agent| !agent.is_top_level());
        drained.sort_by(|x, y| x.0.cmp(&y.0));
        assert_eq!(drained.iter().map(|(id, _)| id.as_str()).collect::<Vec<_>>(), ["a", "b", "c", "e"]);
        assert_eq!(registry.all(), [("root".to_string(), Fake("root", true))]);
    }
}
