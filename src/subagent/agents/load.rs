//! The agents a session may start: the built-ins, then the user's agent files, then the config
//! file's `[agents.NAME]` tables, then the workspace's agent files, each level replacing a name
//! the one before defined. Two files of one level that define the same name are an error naming
//! both, and neither is used; a file that cannot be used is skipped with one warning naming its
//! line. Loading never fails.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::def::AgentDef;
use super::{builtin, file};
use crate::model::ModelRoute;

/// Agent files read from one directory at most (the rest are skipped with a warning).
pub(crate) const MAX_FILES_PER_DIR: usize = 64;
/// Directory entries looked at in one agent directory at most.
const MAX_ENTRIES_PER_DIR: usize = 4096;

/// Where agents come from besides the workspace.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AgentSettings {
    /// The user's agent directories (`<config dir>/kin/agents`, `~/.claude/agents`).
    pub user_dirs: Vec<PathBuf>,
    /// `[agents.NAME]` tables.
    pub tables: Vec<AgentDef>,
    /// `[model_aliases]`: model names that are not routes (`sonnet`), to routes.
    pub aliases: BTreeMap<String, ModelRoute>,
}

/// The agent directories of a workspace.
pub(crate) fn workspace_dirs(cwd: &Path) -> Vec<PathBuf> {
    vec![cwd.join(".kin").join("agents"), cwd.join(".claude").join("agents")]
}

/// The named agents of one session, by name.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Agents {
    agents: BTreeMap<String, AgentDef>,
}

impl Agents {
    /// Only the built-ins.
    pub fn builtin() -> Agents {
        let mut catalog = Agents::default();
        for def in builtin::all() {
            catalog.agents.insert(def.name.clone(), def);
        }
        catalog
    }

    /// Every level for a session in `workspace`.
    pub fn load(settings: &AgentSettings, workspace: Option<&Path>) -> Agents {
        let mut catalog = Agents::builtin();
        catalog.overlay(read_level(&settings.user_dirs, &settings.aliases, "the user's agent directories"));
        catalog.overlay(settings.tables.clone());
        if let Some(cwd) = workspace {
            catalog.overlay(read_level(&workspace_dirs(cwd), &settings.aliases, "the workspace"));
        }
        catalog
    }

    fn overlay(&mut self, defs: Vec<AgentDef>) {
        for def in defs {
            if let Some(notice) = def.model_notice() {
                tracing::warn!("{notice}");
            }
            if let Some(old) = self.agents.get(&def.name) {
                tracing::debug!(agent = %def.name, from = %def.origin, replaces = %old.origin, "an agent definition replaces another");
            }
            self.agents.insert(def.name.clone(), def);
        }
    }

    pub fn get(&self, name: &str) -> Option<&AgentDef> {
        self.agents.get(name)
    }

    /// Every agent, by name.
    pub fn iter(&self) -> impl Iterator<Item = &AgentDef> {
        self.agents.values()
    }

    pub fn names(&self) -> Vec<String> {
        self.agents.keys().cloned().collect()
    }
}

/// The definitions of one level's directories; a name defined twice is left out.
fn read_level(dirs: &[PathBuf], aliases: &BTreeMap<String, ModelRoute>, level: &str) -> Vec<AgentDef> {
    let mut defs: Vec<AgentDef> = Vec::new();
    for dir in dirs {
        for path in agent_files(dir) {
            match file::read(&path, aliases) {
                Ok(def) => defs.push(def),
                Err(e) => {
                    tracing::warn!("agent file {}:{}: {}; the file is skipped", path.display(), e.line, e.message)
                }
            }
        }
    }
    let mut kept = Vec::new();
    let mut clashed: Vec<String> = Vec::new();
    for (index, def) in defs.iter().enumerate() {
        if clashed.contains(&def.name) {
            continue;
        }
        match defs[index + 1..].iter().find(|other| other.name == def.name) {
            Some(other) => {
                tracing::error!(
                    "agent files {} and {} both define the agent {:?} in {level}; neither is used",
                    def.origin,
                    other.origin,
                    def.name
                );
                clashed.push(def.name.clone());
            }
            None => kept.push(def.clone()),
        }
    }
    kept
}

/// The `*.md` files of `dir`, by file name, at most `MAX_FILES_PER_DIR`. A missing directory has
/// none; one that cannot be read is warned about.
fn agent_files(dir: &Path) -> Vec<PathBuf> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Vec::new(),
        Err(e) => {
            tracing::warn!(dir = %dir.display(), "cannot read the agent directory: {e}");
            return Vec::new();
        }
    };
    let mut files: Vec<PathBuf> = entries
        .take(MAX_ENTRIES_PER_DIR)
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    files.sort();
    if files.len() > MAX_FILES_PER_DIR {
        tracing::warn!(
            dir = %dir.display(),
            "the agent directory holds {} agent files; only the first {MAX_FILES_PER_DIR} (by name) are read",
            files.len()
        );
        files.truncate(MAX_FILES_PER_DIR);
    }
    files
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::subagent::agents::{Fields, ModelChoice, Origin};

    /// What `f` logs (every level).
    pub(crate) fn logged<T>(f: impl FnOnce() -> T) -> (T, String) {
        #[derive(Clone, Default)]
        struct Buffer(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Buffer {
            fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(bytes);
                Ok(bytes.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        let value = tracing::subscriber::with_default(subscriber, f);
        let text = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
        (value, text)
    }

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        std::fs::create_dir_all(dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    fn agent(name: &str, description: &str) -> String {
        format!("---\nname: {name}\ndescription: {description}\n---\nPersona of {name}.\n")
    }

    fn table(name: &str, description: &str) -> AgentDef {
        let fields = Fields { name: name.into(), description: Some(description.into()), ..Fields::default() };
        fields.build(Origin::Config, &BTreeMap::new()).unwrap()
    }

    #[test]
    fn every_level_adds_agents_and_the_workspace_wins() {
        let dir = tempfile::tempdir().unwrap();
        let (user_kin, user_claude) = (dir.path().join("config/kin/agents"), dir.path().join("home/.claude/agents"));
        let cwd = dir.path().join("cwd");
        write(&user_kin, "mine.md", &agent("mine", "user kin"));
        write(&user_claude, "theirs.md", &agent("theirs", "user claude"));
        write(&user_claude, "shared.md", &agent("shared", "from the user"));
        write(&user_claude, "notes.txt", "not an agent");
        write(&cwd.join(".kin/agents"), "local.md", &agent("local", "workspace kin"));
        write(&cwd.join(".claude/agents"), "shared.md", &agent("shared", "from the workspace"));
        write(&cwd.join(".claude/agents"), "review.md", &agent("review", "the workspace's reviewer"));
        let settings = AgentSettings {
            user_dirs: vec![user_kin, user_claude],
            tables: vec![table("tabled", "from config"), table("theirs", "config beats the user")],
            aliases: BTreeMap::new(),
        };
        let agents = Agents::load(&settings, Some(&cwd));
        let described: Vec<(String, String)> = agents.iter().map(|d| (d.name.clone(), d.description.clone())).collect();
        let expected = [
            ("explore", builtin::all()[1].description.as_str()),
            ("general", builtin::all()[0].description.as_str()),
            ("local", "workspace kin"),
            ("mine", "user kin"),
            ("review", "the workspace's reviewer"),
            ("shared", "from the workspace"),
            ("tabled", "from config"),
            ("theirs", "config beats the user"),
        ]
        .map(|(n, d)| (n.to_string(), d.to_string()));
        assert_eq!(described, expected);
        assert_eq!(agents.get("local").unwrap().origin, Origin::File(cwd.join(".kin/agents/local.md")));
        assert_eq!(agents.get("local").unwrap().persona.as_deref(), Some("Persona of local."));
        assert_eq!(Agents::load(&AgentSettings::default(), None), Agents::builtin());
    }

    #[test]
    fn a_clash_inside_one_level_names_both_files_and_uses_neither() {
        let dir = tempfile::tempdir().unwrap();
        let cwd = dir.path().join("cwd");
        let a = write(&cwd.join(".kin/agents"), "a.md", &agent("twin", "one"));
        let b = write(&cwd.join(".claude/agents"), "b.md", &agent("twin", "two"));
        let user = dir.path().join("user");
        write(&user, "twin.md", &agent("twin", "the user's"));
        let settings = AgentSettings { user_dirs: vec![user], ..AgentSettings::default() };
        let (agents, log) = logged(|| Agents::load(&settings, Some(&cwd)));
        assert!(
            log.contains(&format!(
                "agent files {} and {} both define the agent \"twin\" in the workspace; neither is used",
                a.display(),
                b.display()
            )),
            "{log}"
        );
        assert_eq!(agents.get("twin").unwrap().description, "the user's", "the level below still applies");
    }

    #[test]
    fn a_malformed_file_is_skipped_with_one_warning_naming_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let cwd = dir.path().join("cwd");
        let bad = write(&cwd.join(".kin/agents"), "bad.md", "---\ndescription: d\nmaxTurns: lots\n---\n");
        write(&cwd.join(".kin/agents"), "odd.md", "---\ndescription: keeps\ncolor: red\nskills: [x]\n---\n");
        let (agents, log) = logged(|| Agents::load(&AgentSettings::default(), Some(&cwd)));
        let line =
            format!("agent file {}:3: `maxTurns` must be a positive whole number; the file is skipped", bad.display());
        assert_eq!(log.matches(&line).count(), 1, "{log}");
        assert!(agents.get("bad").is_none());
        assert_eq!(agents.get("odd").unwrap().description, "keeps", "unknown keys are ignored");
        assert!(log.contains("DEBUG") && log.contains("key=color") && log.contains("key=skills"), "{log}");
        assert_eq!(log.matches(" WARN ").count(), 1, "only the bad file warns: {log}");
    }

    #[test]
    fn an_unknown_model_alias_warns_and_runs_on_the_parent() {
        let dir = tempfile::tempdir().unwrap();
        let cwd = dir.path().join("cwd");
        write(&cwd.join(".kin/agents"), "fast.md", "---\ndescription: d\nmodel: haiku\n---\n");
        let (agents, log) = logged(|| Agents::load(&AgentSettings::default(), Some(&cwd)));
        assert!(log.contains("asks for model \"haiku\", which is neither a kin route"), "{log}");
        assert_eq!(agents.get("fast").unwrap().model, ModelChoice::Unknown("haiku".into()));
    }

    #[test]
    fn a_directory_reads_its_first_files_by_name() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..MAX_FILES_PER_DIR + 2 {
            write(dir.path(), &format!("a{i:03}.md"), &agent(&format!("a{i:03}"), "d"));
        }
        let settings = AgentSettings { user_dirs: vec![dir.path().to_path_buf()], ..AgentSettings::default() };
        let (agents, log) = logged(|| Agents::load(&settings, None));
        assert_eq!(agents.iter().count(), MAX_FILES_PER_DIR + builtin::all().len());
        assert!(agents.get("a065").is_none() && agents.get("a063").is_some());
        assert!(log.contains("only the first 64 (by name) are read"), "{log}");
    }
}
