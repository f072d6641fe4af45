//! One resolved configuration: flags > environment > config file > defaults. The config file is
//! TOML (`$XDG_CONFIG_HOME/kin/config.toml`, or `--config PATH`); an unknown key or a bad value is
//! a startup error naming the file, the key and the expected form.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use serde::Deserialize;

use crate::keys::{Backend, KeyStore};
use crate::mcp::{Defaults as McpDefaults, Origin, ServerSpec, Settings, Transport, Trust};
use crate::model::ModelRoute;
use crate::model::capacity::{ModelEntry, ModelTable, Price};
use crate::model::router::{ModelSettings, NamedProvider, ProviderKind};
use crate::permission::PermissionMode;
use crate::sandbox::{SandboxFallback, SandboxPolicy, SandboxSettings};
use crate::subagent::agents::{AgentDef, AgentSettings, Fields, Origin as AgentOrigin};
use crate::subagent::continuation::{ContinuationSettings, ReportDelivery};
use crate::subagent::external::{AcpPermission, ExternalAgentConfig};

/// The default model route.
pub(crate) const DEFAULT_MODEL: &str = "deepseek/deepseek-v4-flash";

/// Settings given on the command line (None = not given).
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub config: Option<PathBuf>,
    pub sessions: Option<PathBuf>,
    pub model: Option<String>,
    pub log_file: Option<PathBuf>,
    pub replay: Option<PathBuf>,
    pub permission_mode: Option<PermissionMode>,
    /// `kin run --max-steps`.
    pub max_steps: Option<u32>,
    pub max_frame_bytes: Option<usize>,
    pub sandbox: Option<SandboxPolicy>,
}

/// Everything kin runs with.
#[derive(Debug, Clone)]
pub struct Config {
    pub sessions_dir: PathBuf,
    pub model: ModelRoute,
    pub log_file: Option<PathBuf>,
    /// Keyless mode: serve model calls from this recorded scenario directory.
    pub replay: Option<PathBuf>,
    pub max_steps: u32,
    pub max_parallel_tools: usize,
    /// Where the settings came from, for `--help`-style diagnostics.
    pub config_file: Option<PathBuf>,
    pub subagents: SubagentSettings,
    /// The permission mode new and loaded sessions start in.
    pub permission_mode: PermissionMode,
    /// A `# Persona` section added to every top-level session's system prompt.
    pub persona: Option<String>,
    /// `title_model`: the route that writes a session's title after its first turn (none: the
    /// first prompt's fallback title stays).
    pub title_model: Option<ModelRoute>,
    /// A file whose text replaces the built system prompt (relative paths: against the config
    /// file's directory).
    pub system_prompt_file: Option<PathBuf>,
    /// `[model_settings]` and `[providers.*]`: how the HTTP clients call models.
    pub models: ModelSettings,
    /// The context windows and prices of routes (the config's entries over the built-in table).
    pub model_table: ModelTable,
    /// `[compaction]` (its table is `model_table`).
    pub compaction: crate::agent::compact::Policy,
    /// The routes an editor may switch a session to (the default route first).
    pub model_choices: Vec<ModelRoute>,
    /// `[acp_agents.NAME]`: external ACP agents offered as subagent providers `acp:NAME`.
    pub acp_agents: Vec<ExternalAgentConfig>,
    /// The longest JSON-RPC frame `kin acp` reads from its client, in bytes.
    pub max_frame_bytes: usize,
    /// `[mcp_servers.NAME]`: MCP servers every top-level session gets (an editor's server of
    /// the same name replaces one for that session).
    pub mcp_servers: Vec<ServerSpec>,
    /// `[mcp]`: the timeouts of servers that set none.
    pub mcp: McpDefaults,
    /// Where `kin login` stores keys and kin looks for them after the environment.
    pub keys: KeyStore,
    /// Named child agents: the user's agent directories, `[agents.NAME]`, `[model_aliases]`.
    pub agents: AgentSettings,
    /// The user's slash-command dirs (`~/.config/kin/commands`, `~/.claude/commands`; see
    /// `user_dirs`), read after the workspace's (`slash::dirs`).
    pub command_dirs: Vec<PathBuf>,
    /// `sandbox*` keys: what commands may touch (the policy new sessions start with).
    pub sandbox: SandboxSettings,
}

/// `[subagents]`: how the delegation tools start children.
#[derive(Debug, Clone, PartialEq)]
pub struct SubagentSettings {
    /// Deepest delegation allowed (a top-level agent is depth 0).
    pub max_depth: u64,
    /// A system-prompt section for every child.
    pub persona: Option<String>,
    /// The children's model route (default: the parent's).
    pub model: Option<ModelRoute>,
    pub allow_tools: Option<Vec<String>>,
    pub deny_tools: Option<Vec<String>>,
    /// An object-rooted JSON Schema every delegated child must satisfy via `structured_output`.
    pub output_schema: Option<serde_json::Value>,
    /// Offer `run_in_background` (continuable children) on the delegation tools.
    pub background: bool,
    pub continuation: ContinuationSettings,
}

impl Default for SubagentSettings {
    fn default() -> Self {
        SubagentSettings {
            max_depth: 3,
            persona: None,
            model: None,
            allow_tools: None,
            deny_tools: None,
            output_schema: None,
            background: true,
            continuation: ContinuationSettings::default(),
        }
    }
}

/// The config file's shape.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    sessions_dir: Option<PathBuf>,
    model: Option<String>,
    log_file: Option<PathBuf>,
    permission_mode: Option<String>,
    sandbox: Option<String>,
    sandbox_network: Option<bool>,
    sandbox_writable_roots: Option<Vec<PathBuf>>,
    sandbox_fallback: Option<String>,
    persona: Option<String>,
    system_prompt_file: Option<PathBuf>,
    max_frame_bytes: Option<usize>,
    key_store: Option<String>,
    title_model: Option<String>,
    #[serde(default)]
    agent: AgentSection,
    #[serde(default)]
    subagents: SubagentSection,
    #[serde(default, rename = "model_settings")]
    model_settings: ModelSection,
    #[serde(default)]
    providers: std::collections::BTreeMap<String, ProviderSection>,
    #[serde(default)]
    acp_agents: std::collections::BTreeMap<String, AcpAgentSection>,
    #[serde(default)]
    mcp: McpSection,
    #[serde(default)]
    mcp_servers: std::collections::BTreeMap<String, McpServerSection>,
    #[serde(default)]
    agents: std::collections::BTreeMap<String, AgentTable>,
    #[serde(default)]
    model_aliases: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    compaction: CompactionSection,
}

/// `[agents.NAME]`: a named child agent the delegation tools offer.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AgentTable {
    description: String,
    prompt: Option<String>,
    tools: Option<Vec<String>>,
    #[serde(default)]
    disallowed_tools: Vec<String>,
    model: Option<String>,
    max_turns: Option<u64>,
    background: Option<bool>,
    permission_mode: Option<String>,
}

/// `[compaction]`: when and how a session's history is compacted.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct CompactionSection {
    threshold_ratio: Option<f64>,
    retain_ratio: Option<f64>,
    max_tokens: Option<u32>,
    auto: Option<bool>,
    max_overflow_retries: Option<u32>,
    /// The route that writes summaries (`P/M`); default: the session's own.
    model: Option<String>,
}

/// `[mcp]`: defaults for every MCP server.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct McpSection {
    startup_timeout_secs: Option<f64>,
    tool_timeout_secs: Option<f64>,
}

/// `[mcp_servers.NAME]`: an MCP server (`command` for stdio, or `url` for streamable HTTP).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct McpServerSection {
    command: Option<String>,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: std::collections::BTreeMap<String, String>,
    url: Option<String>,
    #[serde(default)]
    headers: std::collections::BTreeMap<String, String>,
    startup_timeout_secs: Option<f64>,
    tool_timeout_secs: Option<f64>,
    enabled_tools: Option<Vec<String>>,
    #[serde(default)]
    disabled_tools: Vec<String>,
    trust: Option<String>,
}

/// `[acp_agents.NAME]`: an external ACP agent started as a child (`acp:NAME`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AcpAgentSection {
    command: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: std::collections::BTreeMap<String, String>,
    cwd: Option<PathBuf>,
    permission: Option<String>,
    tool_name: Option<String>,
    description: Option<String>,
    startup_timeout_secs: Option<f64>,
    turn_timeout_secs: Option<f64>,
    cancel_grace_secs: Option<f64>,
    kill_grace_secs: Option<f64>,
    sandbox: Option<String>,
    sandbox_network: Option<bool>,
    sandbox_writable_roots: Option<Vec<PathBuf>>,
}

/// `[model_settings]`: how model calls are made.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ModelSection {
    max_tokens: Option<u32>,
    reasoning_effort: Option<String>,
    max_attempts: Option<u32>,
    retry_base_delay_ms: Option<u64>,
    retry_max_delay_ms: Option<u64>,
    /// The longest `Retry-After` honoured; a longer one is capped to this.
    max_retry_after_secs: Option<f64>,
    idle_timeout_secs: Option<u64>,
    /// Routes offered to the editor's model selector.
    choices: Option<Vec<String>>,
    /// The window and prices of any route nothing more specific describes.
    context_window: Option<u64>,
    input_price_per_mtok: Option<f64>,
    output_price_per_mtok: Option<f64>,
    /// `[model_settings.models."P/M"]`: one route's window and prices.
    #[serde(default)]
    models: std::collections::BTreeMap<String, ModelEntrySection>,
}

/// A model's context window and prices (every key optional).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ModelEntrySection {
    context_window: Option<u64>,
    input_price_per_mtok: Option<f64>,
    output_price_per_mtok: Option<f64>,
}

/// `[providers.NAME]`: a named OpenAI-compatible (or Anthropic) endpoint, used as `NAME/model`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ProviderSection {
    base_url: String,
    api_key_env: Option<String>,
    #[serde(default)]
    headers: std::collections::BTreeMap<String, String>,
    kind: Option<String>,
    /// The window and prices of every model of this provider without its own entry.
    context_window: Option<u64>,
    input_price_per_mtok: Option<f64>,
    output_price_per_mtok: Option<f64>,
    /// `[providers.NAME.models.MODEL]`: one model's window and prices.
    #[serde(default)]
    models: std::collections::BTreeMap<String, ModelEntrySection>,
    /// The models behind it take images (default: true for `anthropic`, false for `openai`).
    images: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct SubagentSection {
    max_depth: Option<u64>,
    persona: Option<String>,
    model: Option<String>,
    allow_tools: Option<Vec<String>>,
    deny_tools: Option<Vec<String>>,
    output_schema: Option<String>,
    background: Option<bool>,
    settlement_notice: Option<bool>,
    report_delivery: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct AgentSection {
    max_steps: Option<u32>,
    max_parallel_tools: Option<usize>,
}

/// Reads environment variables through a function, so tests never touch the process environment.
pub(crate) type Env<'a> = &'a dyn Fn(&str) -> Option<String>;

/// The real process environment (empty values count as unset).
pub fn process_env(key: &str) -> Option<String> {
    std::env::var(key).ok().filter(|v| !v.is_empty())
}

impl Config {
    /// Resolves flags > environment > config file > defaults.
    pub fn resolve(flags: &Overrides, env: Env<'_>) -> Result<Config> {
        let explicit = flags.config.clone().or_else(|| env("KIN_CONFIG").map(PathBuf::from));
        let config_dir = env("XDG_CONFIG_HOME")
            .map(PathBuf::from)
            .or_else(|| env("HOME").map(|h| Path::new(&h).join(".config")))
            .map(|base| base.join("kin"));
        let default_path = config_dir.as_ref().map(|dir| dir.join("config.toml"));
        let (file, config_file) = match (&explicit, &default_path) {
            (Some(path), _) => (read_file(path)?, Some(path.clone())),
            (None, Some(path)) if path.exists() => (read_file(path)?, Some(path.clone())),
            _ => (FileConfig::default(), None),
        };
        let where_ = || config_file.as_ref().map_or("defaults".to_string(), |p| p.display().to_string());
        let sessions_dir = flags
            .sessions
            .clone()
            .or_else(|| env("KIN_SESSIONS_DIR").map(PathBuf::from))
            .or(file.sessions_dir)
            .or_else(|| env("XDG_STATE_HOME").map(|s| Path::new(&s).join("kin/sessions")))
            .or_else(|| env("HOME").map(|h| Path::new(&h).join(".local/state/kin/sessions")))
            .context("cannot choose a sessions directory: pass --sessions DIR or set KIN_SESSIONS_DIR")?;
        // Absolute from here on (a relative one is taken from the working directory): the catalog
        // index sits beside it, and the sandbox protects it by path.
        let sessions_dir = std::path::absolute(&sessions_dir)
            .with_context(|| format!("the sessions directory {}", sessions_dir.display()))?;
        let (model_text, model_origin) = match (&flags.model, env("KIN_MODEL"), &file.model) {
            (Some(m), _, _) => (m.clone(), "--model".to_string()),
            (None, Some(m), _) => (m, "KIN_MODEL".to_string()),
            (None, None, Some(m)) => (m.clone(), format!("{}: key `model`", where_())),
            (None, None, None) => (DEFAULT_MODEL.to_string(), "default".to_string()),
        };
        let model = ModelRoute::parse(&model_text).map_err(|e| anyhow::anyhow!("{model_origin}: {e}"))?;
        let max_steps = flags.max_steps.or(file.agent.max_steps).unwrap_or(50);
        if max_steps == 0 {
            anyhow::bail!("{}: key `agent.max_steps` must be a positive integer", where_());
        }
        let max_parallel_tools = file.agent.max_parallel_tools.unwrap_or(10);
        if max_parallel_tools == 0 {
            anyhow::bail!("{}: key `agent.max_parallel_tools` must be a positive integer", where_());
        }
        let subagents = resolve_subagents(file.subagents, &where_())?;
        // Each source is checked even when a stronger one wins (`kin run` always passes its own
        // mode): a bad value stops kin wherever it is.
        let env_mode = env("KIN_PERMISSION_MODE")
            .map(|id| PermissionMode::parse_arg(&id).map_err(|e| anyhow::anyhow!("KIN_PERMISSION_MODE: {e}")))
            .transpose()?;
        let file_mode = file
            .permission_mode
            .as_deref()
            .map(|id| {
                PermissionMode::parse_arg(id).map_err(|e| anyhow::anyhow!("{}: key `permission_mode`: {e}", where_()))
            })
            .transpose()?;
        let permission_mode = flags.permission_mode.or(env_mode).or(file_mode).unwrap_or_default();
        let system_prompt_file =
            file.system_prompt_file.map(|path| match config_file.as_deref().and_then(Path::parent) {
                Some(dir) if path.is_relative() => dir.join(path),
                _ => path,
            });
        let mut model_choices = vec![model.clone()];
        let listed =
            file.model_settings.choices.clone().unwrap_or_else(|| {
                ["deepseek/deepseek-v4-flash", "deepseek/deepseek-v4-pro"].map(String::from).to_vec()
            });
        for text in listed {
            let route = ModelRoute::parse(&text)
                .map_err(|e| anyhow::anyhow!("{}: key `model_settings.choices`: {e}", where_()))?;
            if !model_choices.contains(&route) {
                model_choices.push(route);
            }
        }
        let file_frames = file
            .max_frame_bytes
            .map(|bytes| frame_limit(bytes, &format!("{}: key `max_frame_bytes`", where_())))
            .transpose()?;
        let flag_frames = flags.max_frame_bytes.map(|bytes| frame_limit(bytes, "--max-frame-bytes")).transpose()?;
        let max_frame_bytes = flag_frames.or(file_frames).unwrap_or(crate::acp::DEFAULT_MAX_FRAME_BYTES);
        let title_model = file
            .title_model
            .map(|m| ModelRoute::parse(&m).map_err(|e| anyhow::anyhow!("{}: key `title_model`: {e}", where_())))
            .transpose()?;
        let (models, model_table) = resolve_models(file.model_settings, file.providers, &where_())?;
        let replay = flags.replay.clone().or_else(|| env("KIN_REPLAY_DIR").map(PathBuf::from));
        // A replay answers from its recording whatever the route; any other run needs a provider
        // it can reach, refused here as bad usage (exit 2) rather than when the runtime is built.
        if replay.is_none() {
            crate::model::router::check_provider(&model.provider, &models)
                .map_err(|e| anyhow::anyhow!("{model_origin}: model route {model}: {e}"))?;
        }
        let env_sandbox = env("KIN_SANDBOX")
            .map(|id| SandboxPolicy::parse_arg(&id).map_err(|e| anyhow::anyhow!("KIN_SANDBOX: {e}")))
            .transpose()?;
        let file_sandbox =
            sandbox_policy(file.sandbox.as_deref(), file.sandbox_network, &|k| format!("{}: key `{k}`", where_()))?;
        let policy = flags.sandbox.or(env_sandbox).unwrap_or(file_sandbox);
        let fallback = match file.sandbox_fallback.as_deref() {
            None => SandboxFallback::default(),
            Some(id) => SandboxFallback::parse(id).ok_or_else(|| {
                anyhow::anyhow!("{}: key `sandbox_fallback` must be \"refuse\" or \"warn\", not {id:?}", where_())
            })?,
        };
        // kin's own directories: the config file's (else the default one) and the sessions'.
        let own_dir =
            config_file.as_deref().and_then(Path::parent).map(Path::to_path_buf).or_else(|| config_dir.clone());
        let sandbox = SandboxSettings {
            policy,
            writable_roots: absolute_roots(
                file.sandbox_writable_roots,
                &format!("{}: key `sandbox_writable_roots`", where_()),
            )?,
            fallback,
            // The catalog index sits beside the sessions directory.
            protected: own_dir
                .into_iter()
                .chain([sessions_dir.clone()])
                .chain(crate::session::catalog_index::path(&sessions_dir))
                .collect(),
        };
        let acp_agents = resolve_acp_agents(file.acp_agents, &where_(), &sandbox)?;
        let mcp = resolve_mcp_defaults(&file.mcp, &where_())?;
        let mcp_servers = resolve_mcp_servers(file.mcp_servers, &where_())?;
        let backend = match (env("KIN_KEY_STORE"), &file.key_store) {
            (Some(text), _) => Backend::parse(&text).map_err(|e| anyhow::anyhow!("KIN_KEY_STORE: {e}"))?,
            (None, Some(text)) => {
                Backend::parse(text).map_err(|e| anyhow::anyhow!("{}: key `key_store`: {e}", where_()))?
            }
            (None, None) => Backend::Auto,
        };
        let command_dirs = user_dirs(env, "commands");
        let keys = KeyStore { backend, file: config_dir.map(|dir| dir.join(crate::keys::FILE_NAME)) };
        let mut agents = resolve_agents(file.agents, file.model_aliases, &where_())?;
        agents.user_dirs = user_dirs(env, "agents");
        Ok(Config {
            agents,
            command_dirs,
            max_frame_bytes,
            mcp,
            mcp_servers,
            keys,
            sandbox,
            model_choices,
            acp_agents,
            models,
            compaction: resolve_compaction(file.compaction, &model_table, &where_())?,
            model_table,
            subagents,
            sessions_dir,
            model,
            log_file: flags.log_file.clone().or_else(|| env("KIN_LOG_FILE").map(PathBuf::from)).or(file.log_file),
            replay,
            max_steps,
            max_parallel_tools,
            config_file,
            permission_mode,
            persona: file.persona,
            title_model,
            system_prompt_file,
        })
    }
}

/// One entry of the model table: a positive window, non-negative prices given together.
fn model_entry(
    context_window: Option<u64>,
    input: Option<f64>,
    output: Option<f64>,
    key: &dyn Fn(&str) -> String,
) -> Result<ModelEntry> {
    if context_window == Some(0) {
        anyhow::bail!("{} must be a positive number of tokens", key("context_window"));
    }
    let price = |value: f64, name: &str| -> Result<f64> {
        if !(value.is_finite() && value >= 0.0) {
            anyhow::bail!("{} must be a non-negative number of dollars per million tokens, not {value}", key(name));
        }
        Ok(value)
    };
    let price = match (input, output) {
        (None, None) => None,
        (Some(input), Some(output)) => Some(Price {
            input_per_mtok: price(input, "input_price_per_mtok")?,
            output_per_mtok: price(output, "output_price_per_mtok")?,
        }),
        (Some(_), None) => {
            anyhow::bail!("{} is given without {}", key("input_price_per_mtok"), key("output_price_per_mtok"))
        }
        (None, Some(_)) => {
            anyhow::bail!("{} is given without {}", key("output_price_per_mtok"), key("input_price_per_mtok"))
        }
    };
    Ok(ModelEntry { context_window, price })
}

fn resolve_models(
    mut section: ModelSection,
    providers: std::collections::BTreeMap<String, ProviderSection>,
    origin: &str,
) -> Result<(ModelSettings, ModelTable)> {
    let mut table = ModelTable::default();
    let key = |k: &str| format!("{origin}: key `model_settings.{k}`");
    table.fallback =
        model_entry(section.context_window, section.input_price_per_mtok, section.output_price_per_mtok, &key)?;
    for (route, entry) in std::mem::take(&mut section.models) {
        ModelRoute::parse(&route)
            .map_err(|e| anyhow::anyhow!("{origin}: table `model_settings.models.{route:?}`: {e}"))?;
        let key = |k: &str| format!("{origin}: key `model_settings.models.{route:?}.{k}`");
        let entry = model_entry(entry.context_window, entry.input_price_per_mtok, entry.output_price_per_mtok, &key)?;
        table.routes.push((route, entry));
    }
    let mut settings = ModelSettings::default();
    settings.max_tokens = section.max_tokens.or(settings.max_tokens);
    settings.reasoning_effort = section.reasoning_effort;
    if let Some(n) = section.max_attempts {
        if n == 0 {
            anyhow::bail!("{origin}: key `model_settings.max_attempts` must be at least 1");
        }
        settings.retry.max_attempts = n;
    }
    settings.retry.base_delay_ms = section.retry_base_delay_ms.unwrap_or(settings.retry.base_delay_ms);
    settings.retry.max_delay_ms = section.retry_max_delay_ms.unwrap_or(settings.retry.max_delay_ms);
    if let Some(secs) = section.max_retry_after_secs {
        let cap = seconds(secs, false, &format!("{origin}: key `model_settings.max_retry_after_secs`"))?;
        settings.retry.max_retry_after_ms = u64::try_from(cap.as_millis()).unwrap_or(u64::MAX);
    }
    settings.idle_timeout_secs = section.idle_timeout_secs.unwrap_or(settings.idle_timeout_secs);
    for (name, p) in providers {
        let kind = match p.kind.as_deref() {
            None | Some("openai") => ProviderKind::OpenAi,
            Some("anthropic") => ProviderKind::Anthropic,
            Some(other) => {
                anyhow::bail!(
                    "{origin}: key `providers.{name}.kind` must be \"openai\" or \"anthropic\", not {other:?}"
                )
            }
        };
        if !(p.base_url.starts_with("http://") || p.base_url.starts_with("https://")) {
            anyhow::bail!("{origin}: key `providers.{name}.base_url` must be an http(s) URL, not {:?}", p.base_url);
        }
        let key = |k: &str| format!("{origin}: key `providers.{name}.{k}`");
        let entry = model_entry(p.context_window, p.input_price_per_mtok, p.output_price_per_mtok, &key)?;
        table.providers.push((name.clone(), entry));
        for (model, entry) in p.models {
            let key = |k: &str| format!("{origin}: key `providers.{name}.models.{model:?}.{k}`");
            let entry =
                model_entry(entry.context_window, entry.input_price_per_mtok, entry.output_price_per_mtok, &key)?;
            // `[model_settings.models."P/M"]` comes first and wins.
            table.routes.push((format!("{name}/{model}"), entry));
        }
        table.named.push(name.clone());
        settings.providers.push(NamedProvider {
            name,
            base_url: p.base_url,
            api_key_env: p.api_key_env,
            headers: p.headers.into_iter().collect(),
            images: p.images.unwrap_or(kind == ProviderKind::Anthropic),
            kind,
        });
    }
    Ok((settings, table))
}

fn resolve_compaction(
    section: CompactionSection,
    table: &ModelTable,
    origin: &str,
) -> Result<crate::agent::compact::Policy> {
    let mut policy = crate::agent::compact::Policy { models: std::sync::Arc::new(table.clone()), ..Default::default() };
    let key = |k: &str| format!("{origin}: key `compaction.{k}`");
    for (value, name) in [(section.threshold_ratio, "threshold_ratio"), (section.retain_ratio, "retain_ratio")] {
        if let Some(v) = value
            && !(v > 0.0 && v <= 1.0)
        {
            anyhow::bail!("{} must be a fraction of the context window in (0, 1], not {v}", key(name));
        }
    }
    policy.threshold_ratio = section.threshold_ratio.unwrap_or(policy.threshold_ratio);
    policy.retain_ratio = section.retain_ratio.unwrap_or(policy.retain_ratio);
    if policy.retain_ratio >= policy.threshold_ratio {
        anyhow::bail!(
            "{} ({}) must be below `compaction.threshold_ratio` ({}): the kept tail must fit under the threshold",
            key("retain_ratio"),
            policy.retain_ratio,
            policy.threshold_ratio
        );
    }
    if section.max_tokens == Some(0) {
        anyhow::bail!("{} must be a positive number of tokens", key("max_tokens"));
    }
    policy.max_tokens = section.max_tokens.unwrap_or(policy.max_tokens);
    policy.auto = section.auto.unwrap_or(policy.auto);
    policy.max_overflow_retries = section.max_overflow_retries.unwrap_or(policy.max_overflow_retries);
    if let Some(route) = section.model {
        policy.summary_route = Some(ModelRoute::parse(&route).map_err(|e| anyhow::anyhow!("{}: {e}", key("model")))?);
    }
    Ok(policy)
}

fn resolve_subagents(section: SubagentSection, origin: &str) -> Result<SubagentSettings> {
    let defaults = SubagentSettings::default();
    let model = section
        .model
        .map(|m| ModelRoute::parse(&m).map_err(|e| anyhow::anyhow!("{origin}: key `subagents.model`: {e}")))
        .transpose()?;
    let output_schema = match section.output_schema {
        None => None,
        Some(text) => {
            let schema: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
                anyhow::anyhow!("{origin}: key `subagents.output_schema` must be a JSON Schema object in a string: {e}")
            })?;
            if schema.get("type").and_then(serde_json::Value::as_str) != Some("object") {
                anyhow::bail!("{origin}: key `subagents.output_schema` must be object-rooted (\"type\": \"object\")");
            }
            Some(schema)
        }
    };
    let report_delivery = match section.report_delivery.as_deref() {
        None | Some("quiet") => ReportDelivery::Quiet,
        Some("wakeup") => ReportDelivery::Wakeup,
        Some(other) => {
            anyhow::bail!("{origin}: key `subagents.report_delivery` must be \"quiet\" or \"wakeup\", not {other:?}")
        }
    };
    let continuation = ContinuationSettings {
        settlement_notice: section.settlement_notice.unwrap_or(defaults.continuation.settlement_notice),
        report_delivery,
    };
    Ok(SubagentSettings {
        background: section.background.unwrap_or(defaults.background),
        continuation,
        max_depth: section.max_depth.unwrap_or(defaults.max_depth),
        persona: section.persona,
        model,
        allow_tools: section.allow_tools,
        deny_tools: section.deny_tools,
        output_schema,
    })
}

/// The user's directories named `leaf` (`agents`, `commands`): kin's (`$XDG_CONFIG_HOME/kin/<leaf>`,
/// else `~/.config/kin/<leaf>`) and Claude Code's (`$CLAUDE_CONFIG_DIR/<leaf>`, else `~/.claude/<leaf>`).
fn user_dirs(env: Env<'_>, leaf: &str) -> Vec<PathBuf> {
    let home = env("HOME").map(PathBuf::from);
    let kin = env("XDG_CONFIG_HOME").map(PathBuf::from).or_else(|| home.as_ref().map(|h| h.join(".config")));
    let claude = env("CLAUDE_CONFIG_DIR").map(PathBuf::from).or_else(|| home.as_ref().map(|h| h.join(".claude")));
    kin.map(|k| k.join("kin").join(leaf)).into_iter().chain(claude.map(|c| c.join(leaf))).collect()
}

/// `[agents.NAME]` and `[model_aliases]`.
fn resolve_agents(
    tables: std::collections::BTreeMap<String, AgentTable>,
    aliases: std::collections::BTreeMap<String, String>,
    origin: &str,
) -> Result<AgentSettings> {
    let mut settings = AgentSettings::default();
    for (alias, route) in aliases {
        let route =
            ModelRoute::parse(&route).map_err(|e| anyhow::anyhow!("{origin}: key `model_aliases.{alias}`: {e}"))?;
        settings.aliases.insert(alias, route);
    }
    for (name, table) in tables {
        let fields = Fields {
            name: name.clone(),
            description: Some(table.description),
            persona: table.prompt,
            tools: table.tools,
            disallowed: table.disallowed_tools,
            model: table.model,
            max_turns: table.max_turns,
            background: table.background,
            permission_mode: table.permission_mode,
        };
        let def: AgentDef = fields
            .build(AgentOrigin::Config, &settings.aliases)
            .map_err(|e| anyhow::anyhow!("{origin}: table `agents.{name}`: key `{}`: {}", e.field, e.message))?;
        settings.tables.push(def);
    }
    Ok(settings)
}

/// The policy of a `sandbox` id (default `off`) with `sandbox_network` (which must not
/// contradict a `+network` id); `key` names a key for errors.
fn sandbox_policy(id: Option<&str>, network: Option<bool>, key: &dyn Fn(&str) -> String) -> Result<SandboxPolicy> {
    let policy = match id {
        None => SandboxPolicy::OFF,
        Some(id) => SandboxPolicy::parse_arg(id).map_err(|e| anyhow::anyhow!("{}: {e}", key("sandbox")))?,
    };
    match network {
        None => Ok(policy),
        Some(false) if policy.network() && policy.is_sandboxed() => {
            anyhow::bail!("{} = false contradicts sandbox = {:?}", key("sandbox_network"), policy.id())
        }
        Some(network) => Ok(SandboxPolicy::new(policy.level, network || policy.network())),
    }
}

/// Extra writable roots: absolute paths.
fn absolute_roots(roots: Option<Vec<PathBuf>>, key: &str) -> Result<Vec<PathBuf>> {
    let roots = roots.unwrap_or_default();
    if let Some(bad) = roots.iter().find(|r| !r.is_absolute()) {
        anyhow::bail!("{key} must list absolute paths, not {:?}", bad.display().to_string());
    }
    Ok(roots)
}

fn resolve_acp_agents(
    sections: std::collections::BTreeMap<String, AcpAgentSection>,
    origin: &str,
    sandbox: &SandboxSettings,
) -> Result<Vec<ExternalAgentConfig>> {
    let mut agents: Vec<ExternalAgentConfig> = Vec::new();
    for (name, section) in sections {
        let key = |k: &str| format!("{origin}: key `acp_agents.{name}.{k}`");
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')) {
            anyhow::bail!("{origin}: table `acp_agents.{name}`: the name must be letters, digits, `_`, `-` or `.`");
        }
        if section.command.trim().is_empty() {
            anyhow::bail!("{} must name the program to run", key("command"));
        }
        let mut agent = ExternalAgentConfig::new(&name, section.command);
        agent.args = section.args;
        agent.env = section.env.into_iter().collect();
        if let Some(cwd) = section.cwd {
            if !cwd.is_absolute() {
                anyhow::bail!("{} must be an absolute path, not {:?}", key("cwd"), cwd.display().to_string());
            }
            agent.cwd = Some(cwd);
        }
        if let Some(permission) = section.permission {
            agent.permission = AcpPermission::parse(&permission).ok_or_else(|| {
                anyhow::anyhow!(
                    "{} must be \"reject\", \"allow-reads\" or \"forward\", not {permission:?}",
                    key("permission")
                )
            })?;
        }
        if let Some(tool_name) = section.tool_name {
            agent.tool_name = tool_name;
        }
        let valid = |t: &str| {
            (1..=64).contains(&t.len()) && t.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-'))
        };
        if !valid(&agent.tool_name) {
            anyhow::bail!(
                "{} must be 1 to 64 letters, digits, `_` or `-`, not {:?}",
                key("tool_name"),
                agent.tool_name
            );
        }
        if agents.iter().any(|a| a.tool_name == agent.tool_name) {
            anyhow::bail!("{}: {:?} is already the tool of another ACP agent", key("tool_name"), agent.tool_name);
        }
        agent.description = section.description;
        if let Some(v) = section.startup_timeout_secs {
            agent.startup_timeout = seconds(v, true, &key("startup_timeout_secs"))?;
        }
        if let Some(v) = section.turn_timeout_secs {
            agent.turn_timeout = Some(seconds(v, true, &key("turn_timeout_secs"))?);
        }
        if let Some(v) = section.cancel_grace_secs {
            agent.cancel_grace = seconds(v, false, &key("cancel_grace_secs"))?;
        }
        if let Some(v) = section.kill_grace_secs {
            agent.kill_grace = seconds(v, false, &key("kill_grace_secs"))?;
        }
        if section.sandbox.is_some() || section.sandbox_network.is_some() || section.sandbox_writable_roots.is_some() {
            let policy = sandbox_policy(section.sandbox.as_deref(), section.sandbox_network, &key)?;
            let roots = absolute_roots(section.sandbox_writable_roots, &key("sandbox_writable_roots"))?;
            // The agent's own roots beside the global ones; the fallback and kin's protected
            // directories are the global ones.
            let writable_roots = sandbox.writable_roots.iter().cloned().chain(roots).collect();
            agent.sandbox =
                policy.is_sandboxed().then(|| SandboxSettings { policy, writable_roots, ..sandbox.clone() });
        }
        agents.push(agent);
    }
    Ok(agents)
}

/// A maximum frame size: at least `MIN_MAX_FRAME_BYTES`, so that the handshake fits, and at
/// most `MAX_MAX_FRAME_BYTES`, so that a prompt's line in the log stays one kin reads back.
fn frame_limit(bytes: usize, origin: &str) -> Result<usize> {
    let (min, max) = (crate::acp::MIN_MAX_FRAME_BYTES, crate::acp::MAX_MAX_FRAME_BYTES);
    if bytes < min {
        anyhow::bail!("{origin} must be at least {min} bytes (64 KiB), not {bytes}");
    }
    if bytes > max {
        anyhow::bail!("{origin} must be at most {max} bytes (128 MiB), not {bytes}");
    }
    Ok(bytes)
}

fn resolve_mcp_defaults(section: &McpSection, origin: &str) -> Result<McpDefaults> {
    let mut defaults = McpDefaults::default();
    if let Some(v) = section.startup_timeout_secs {
        defaults.startup_timeout = seconds(v, true, &format!("{origin}: key `mcp.startup_timeout_secs`"))?;
    }
    if let Some(v) = section.tool_timeout_secs {
        defaults.tool_timeout = seconds(v, true, &format!("{origin}: key `mcp.tool_timeout_secs`"))?;
    }
    Ok(defaults)
}

fn resolve_mcp_servers(
    sections: std::collections::BTreeMap<String, McpServerSection>,
    origin: &str,
) -> Result<Vec<ServerSpec>> {
    let mut servers = Vec::new();
    for (name, section) in sections {
        let key = |k: &str| format!("{origin}: key `mcp_servers.{name}.{k}`");
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-')) {
            anyhow::bail!("{origin}: table `mcp_servers.{name}`: the name must be letters, digits, `_` or `-`");
        }
        let pairs = |map: std::collections::BTreeMap<String, String>| map.into_iter().collect::<Vec<_>>();
        let transport = match (section.command, section.url) {
            (Some(command), None) => {
                if command.trim().is_empty() {
                    anyhow::bail!("{} must name the program to run", key("command"));
                }
                if !section.headers.is_empty() {
                    anyhow::bail!("{} applies to `url` servers only", key("headers"));
                }
                Transport::Stdio { command, args: section.args, env: pairs(section.env) }
            }
            (None, Some(url)) => {
                if !(url.starts_with("http://") || url.starts_with("https://")) {
                    anyhow::bail!("{} must be an http(s) URL", key("url"));
                }
                if !section.args.is_empty() || !section.env.is_empty() {
                    anyhow::bail!(
                        "{origin}: table `mcp_servers.{name}`: `args` and `env` apply to `command` servers only"
                    );
                }
                Transport::Http { url, headers: pairs(section.headers) }
            }
            (Some(_), Some(_)) => {
                anyhow::bail!(
                    "{origin}: table `mcp_servers.{name}`: give either `command` (stdio) or `url` (HTTP), not both"
                )
            }
            (None, None) => {
                anyhow::bail!("{origin}: table `mcp_servers.{name}` needs `command` (stdio) or `url` (HTTP)")
            }
        };
        let trust = match section.trust.as_deref() {
            None => Trust::None,
            Some(text) => Trust::parse(text).ok_or_else(|| {
                anyhow::anyhow!("{} must be \"none\" or \"read-only-hints\", not {text:?}", key("trust"))
            })?,
        };
        let settings = Settings {
            startup_timeout: section
                .startup_timeout_secs
                .map(|v| seconds(v, true, &key("startup_timeout_secs")))
                .transpose()?,
            tool_timeout: section.tool_timeout_secs.map(|v| seconds(v, true, &key("tool_timeout_secs"))).transpose()?,
            enabled_tools: section.enabled_tools,
            disabled_tools: section.disabled_tools,
            trust,
        };
        servers.push(ServerSpec { name, transport, settings, origin: Origin::Config });
    }
    Ok(servers)
}

/// A number of seconds from the config file (positive, or non-negative when `positive` is false).
fn seconds(value: f64, positive: bool, key: &str) -> Result<Duration> {
    let in_range = value.is_finite() && value <= 1e9 && if positive { value > 0.0 } else { value >= 0.0 };
    if !in_range {
        let kind = if positive { "positive" } else { "non-negative" };
        anyhow::bail!("{key} must be a {kind} number of seconds, not {value}");
    }
    Ok(Duration::from_secs_f64(value))
}

/// The largest config file read, in bytes.
const MAX_CONFIG_BYTES: u64 = 1024 * 1024;

/// The config file at `path`: any file, not only a regular one (`--config <(…)` is a pipe), but
/// never more of it than `MAX_CONFIG_BYTES`.
fn read_file(path: &Path) -> Result<FileConfig> {
    let text = std::fs::File::open(path)
        .and_then(|file| crate::tools::regular::text_within(file, MAX_CONFIG_BYTES, &path.display().to_string()))
        .with_context(|| format!("reading config file {}", path.display()))?;
    toml::from_str(&text).map_err(|e| anyhow::anyhow!("config file {}: {}", path.display(), e.to_string().trim_end()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn flags_beat_env_beat_file_beat_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        std::fs::write(&file, "model = \"openai/file-m\"\nsessions_dir = \"/from/file\"\n[agent]\nmax_steps = 7\n")
            .unwrap();
        let flags = Overrides { config: Some(file.clone()), ..Default::default() };
        let env = env_of(&[("KIN_MODEL", "anthropic/env-m")]);
        let c = Config::resolve(&flags, &env).unwrap();
        assert_eq!(c.model.to_string(), "anthropic/env-m");
        assert_eq!(c.sessions_dir, PathBuf::from("/from/file"));
        assert_eq!(c.max_steps, 7);
        let flags = Overrides {
            config: Some(file),
            model: Some("deepseek/flag-m".into()),
            sessions: Some("/flag".into()),
            ..Default::default()
        };
        let c = Config::resolve(&flags, &env).unwrap();
        assert_eq!(c.model.to_string(), "deepseek/flag-m");
        assert_eq!(c.sessions_dir, PathBuf::from("/flag"));
    }

    #[test]
    fn a_model_of_an_unknown_provider_is_refused_naming_where_it_came_from() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        std::fs::write(&file, "model = \"local/m\"\n[providers.local]\nbase_url = \"http://127.0.0.1:1/v1\"\n")
            .unwrap();
        let flags = Overrides { config: Some(file.clone()), sessions: Some("/s".into()), ..Default::default() };
        let c = Config::resolve(&flags, &env_of(&[])).unwrap();
        assert_eq!(c.model.to_string(), "local/m", "a declared provider is known");
        let error = Config::resolve(&flags, &env_of(&[("KIN_MODEL", "nosuch/m")])).unwrap_err().to_string();
        assert!(error.starts_with("KIN_MODEL: model route nosuch/m: unknown model provider \"nosuch\""), "{error}");
        assert!(error.contains("known providers: deepseek, openai, anthropic, local"), "{error}");
        let flagged = Overrides { model: Some("nosuch/m".into()), ..flags.clone() };
        let error = Config::resolve(&flagged, &env_of(&[])).unwrap_err().to_string();
        assert!(error.starts_with("--model: model route nosuch/m"), "{error}");
        // A replay answers from its recording: its route needs no provider.
        let replay = Overrides { replay: Some(dir.path().into()), ..flagged };
        assert_eq!(Config::resolve(&replay, &env_of(&[])).unwrap().model.to_string(), "nosuch/m");
    }

    #[test]
    fn a_relative_sessions_dir_is_made_absolute_from_the_working_directory() {
        let flags = Overrides { sessions: Some("rel/sessions".into()), ..Default::default() };
        let c = Config::resolve(&flags, &env_of(&[])).unwrap();
        assert_eq!(c.sessions_dir, std::env::current_dir().unwrap().join("rel/sessions"));
    }

    #[test]
    fn default_sessions_dir_follows_xdg_then_home() {
        let c = Config::resolve(&Overrides::default(), &env_of(&[("XDG_STATE_HOME", "/st"), ("HOME", "/h")])).unwrap();
        assert_eq!(c.sessions_dir, PathBuf::from("/st/kin/sessions"));
        let c = Config::resolve(&Overrides::default(), &env_of(&[("HOME", "/h")])).unwrap();
        assert_eq!(c.sessions_dir, PathBuf::from("/h/.local/state/kin/sessions"));
        assert_eq!(c.model.to_string(), DEFAULT_MODEL);
    }

    #[test]
    fn unknown_key_names_file_and_key() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        std::fs::write(&file, "modle = \"x/y\"\n").unwrap();
        let flags = Overrides { config: Some(file.clone()), ..Default::default() };
        let err = Config::resolve(&flags, &env_of(&[("HOME", "/h")])).unwrap_err().to_string();
        assert!(err.contains(&file.display().to_string()), "{err}");
        assert!(err.contains("modle"), "{err}");
    }

    #[test]
    fn an_oversized_config_file_is_refused_naming_it_and_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let large = dir.path().join("large.toml");
        std::fs::write(&large, format!("# {}\n", "x".repeat(MAX_CONFIG_BYTES as usize))).unwrap();
        // An endless file is read only up to the limit.
        for file in [large, PathBuf::from("/dev/zero")] {
            let flags = Overrides { config: Some(file.clone()), ..Default::default() };
            let err = format!("{:#}", Config::resolve(&flags, &env_of(&[("HOME", "/h")])).unwrap_err());
            let shown = file.display();
            assert!(
                err.contains(&format!("reading config file {shown}: {shown} is larger than 1048576 bytes")),
                "{err}"
            );
        }
    }

    #[test]
    fn the_key_store_is_chosen_by_env_then_file_and_lives_in_the_config_dir() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        std::fs::write(&file, "key_store = \"keyring\"\n").unwrap();
        let flags = Overrides { config: Some(file.clone()), ..Default::default() };
        let c = Config::resolve(&flags, &env_of(&[("HOME", "/h")])).unwrap();
        assert_eq!(c.keys.backend, Backend::Keyring);
        assert_eq!(c.keys.file, Some(PathBuf::from("/h/.config/kin/credentials.json")));
        let env = env_of(&[("HOME", "/h"), ("XDG_CONFIG_HOME", "/x"), ("KIN_KEY_STORE", "file")]);
        let c = Config::resolve(&flags, &env).unwrap();
        assert_eq!((c.keys.backend, c.keys.file), (Backend::File, Some(PathBuf::from("/x/kin/credentials.json"))));
        let defaults = Config::resolve(&Overrides::default(), &env_of(&[("HOME", "/h")])).unwrap();
        assert_eq!(defaults.keys.backend, Backend::Auto);
        let err = Config::resolve(&flags, &env_of(&[("KIN_KEY_STORE", "vault"), ("HOME", "/h")])).unwrap_err();
        assert!(err.to_string().contains("KIN_KEY_STORE") && err.to_string().contains("\"vault\""), "{err}");
        std::fs::write(&file, "key_store = \"vault\"\n").unwrap();
        let err = Config::resolve(&flags, &env_of(&[("HOME", "/h")])).unwrap_err().to_string();
        assert!(err.contains("key_store"), "{err}");
    }

    #[test]
    fn permission_mode_and_prompt_keys() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        std::fs::write(
            &file,
            "permission_mode = \"read-only\"\npersona = \"Be terse.\"\nsystem_prompt_file = \"prompt.md\"\n",
        )
        .unwrap();
        let flags = Overrides { config: Some(file.clone()), ..Default::default() };
        let home = env_of(&[("HOME", "/h")]);
        let c = Config::resolve(&flags, &home).unwrap();
        assert_eq!(c.permission_mode, PermissionMode::ReadOnly);
        assert_eq!(c.persona.as_deref(), Some("Be terse."));
        assert_eq!(c.system_prompt_file, Some(dir.path().join("prompt.md")));
        let env = env_of(&[("HOME", "/h"), ("KIN_PERMISSION_MODE", "bypass")]);
        assert_eq!(Config::resolve(&flags, &env).unwrap().permission_mode, PermissionMode::Bypass);
        let flagged = Overrides { permission_mode: Some(PermissionMode::AcceptEdits), ..flags.clone() };
        assert_eq!(Config::resolve(&flagged, &env).unwrap().permission_mode, PermissionMode::AcceptEdits);
        let defaults = Config::resolve(&Overrides::default(), &home).unwrap();
        assert_eq!(defaults.permission_mode, PermissionMode::Ask);
        std::fs::write(&file, "permission_mode = \"yolo\"\n").unwrap();
        let err = Config::resolve(&flags, &home).unwrap_err().to_string();
        assert!(err.contains("permission_mode") && err.contains("\"yolo\""), "{err}");
        assert!(err.contains("accept-edits"), "{err}");
        // A bad value stops kin even where a stronger source wins (`kin run` passes its own mode).
        let err = Config::resolve(&flagged, &home).unwrap_err().to_string();
        assert!(err.contains("key `permission_mode`") && err.contains("\"yolo\""), "{err}");
        std::fs::write(&file, "max_frame_bytes = 10\n").unwrap();
        let strong =
            Overrides { sandbox: Some(SandboxPolicy::default()), max_frame_bytes: Some(1 << 20), ..flagged.clone() };
        let err = Config::resolve(&strong, &home).unwrap_err().to_string();
        assert!(err.contains("key `max_frame_bytes`"), "{err}");
        std::fs::write(&file, "sandbox = \"tight\"\n").unwrap();
        let err = Config::resolve(&strong, &home).unwrap_err().to_string();
        assert!(err.contains("key `sandbox`") && err.contains("tight"), "{err}");
        std::fs::write(&file, "").unwrap();
        let env = env_of(&[("HOME", "/h"), ("KIN_PERMISSION_MODE", "yolo"), ("KIN_SANDBOX", "read-only")]);
        let err = Config::resolve(&strong, &env).unwrap_err().to_string();
        assert!(err.contains("KIN_PERMISSION_MODE"), "{err}");
        let env = env_of(&[("HOME", "/h"), ("KIN_SANDBOX", "x")]);
        let err = Config::resolve(&strong, &env).unwrap_err().to_string();
        assert!(err.contains("KIN_SANDBOX"), "{err}");
    }

    #[test]
    fn acp_agents_are_read_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        std::fs::write(
            &file,
            "[acp_agents.kin]\ncommand = \"kin\"\nargs = [\"acp\"]\nenv = { KIN_MODEL = \"x/y\" }\n\
             permission = \"allow-reads\"\nstartup_timeout_secs = 5\ncancel_grace_secs = 0.5\n\
             [acp_agents.remote]\ncommand = \"ssh\"\nargs = [\"host\", \"kin\", \"acp\"]\ncwd = \"/srv/work\"\n\
             tool_name = \"delegate_remote_kin\"\nturn_timeout_secs = 600\n",
        )
        .unwrap();
        let flags = Overrides { config: Some(file.clone()), ..Default::default() };
        let home = env_of(&[("HOME", "/h")]);
        let c = Config::resolve(&flags, &home).unwrap();
        let [kin, remote] = &c.acp_agents[..] else { panic!("{:?}", c.acp_agents) };
        assert_eq!((kin.name.as_str(), kin.tool_name.as_str()), ("acp:kin", "delegate_kin"));
        assert_eq!((kin.command.as_str(), kin.args.clone()), ("kin", vec!["acp".to_string()]));
        assert_eq!(kin.env, [("KIN_MODEL".to_string(), "x/y".to_string())]);
        assert_eq!(kin.permission, AcpPermission::AllowReads);
        assert_eq!((kin.startup_timeout, kin.cancel_grace), (Duration::from_secs(5), Duration::from_millis(500)));
        assert_eq!((kin.turn_timeout, kin.kill_grace), (None, Duration::from_secs(3)));
        assert_eq!((remote.name.as_str(), remote.tool_name.as_str()), ("acp:remote", "delegate_remote_kin"));
        assert_eq!((remote.permission, remote.cwd.clone()), (AcpPermission::Reject, Some(PathBuf::from("/srv/work"))));
        assert_eq!(remote.turn_timeout, Some(Duration::from_secs(600)));
        for (text, key) in [
            ("[acp_agents.a]\ncommand = \"x\"\npermission = \"ask\"\n", "acp_agents.a.permission"),
            ("[acp_agents.a]\ncommand = \"x\"\nstartup_timeout_secs = 0\n", "acp_agents.a.startup_timeout_secs"),
            ("[acp_agents.a]\ncommand = \"x\"\ncwd = \"rel\"\n", "acp_agents.a.cwd"),
            ("[acp_agents.a]\ncommand = \"x\"\ntool_name = \"has space\"\n", "acp_agents.a.tool_name"),
            ("[acp_agents.a]\ncommand = \"\"\n", "acp_agents.a.command"),
            ("[acp_agents.a]\ncommand = \"x\"\ncomand = \"y\"\n", "comand"),
        ] {
            std::fs::write(&file, text).unwrap();
            let err = Config::resolve(&flags, &home).unwrap_err().to_string();
            assert!(err.contains(key), "{text}: {err}");
        }
    }

    #[test]
    fn retry_after_cap_is_read_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        let flags = Overrides { config: Some(file.clone()), ..Default::default() };
        let home = env_of(&[("HOME", "/h")]);
        let c = Config::resolve(&Overrides::default(), &home).unwrap();
        assert_eq!(c.models.retry.max_retry_after_ms, 60_000);
        std::fs::write(&file, "[model_settings]\nmax_retry_after_secs = 2.5\n").unwrap();
        assert_eq!(Config::resolve(&flags, &home).unwrap().models.retry.max_retry_after_ms, 2_500);
        std::fs::write(&file, "[model_settings]\nmax_retry_after_secs = -1\n").unwrap();
        let err = Config::resolve(&flags, &home).unwrap_err().to_string();
        assert!(err.contains("model_settings.max_retry_after_secs") && err.contains("non-negative"), "{err}");
    }

    #[test]
    fn context_windows_and_prices_come_from_the_file_over_the_built_in_table() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        let flags = Overrides { config: Some(file.clone()), ..Default::default() };
        let home = env_of(&[("HOME", "/h")]);
        let route = |text: &str| ModelRoute::parse(text).unwrap();
        let defaults = Config::resolve(&Overrides::default(), &home).unwrap();
        assert_eq!(defaults.model_table.info(&route("deepseek/deepseek-v4-flash")).context_window, Some(1_000_000));
        std::fs::write(
            &file,
            "[model_settings]\ncontext_window = 32000\n\
             [model_settings.models.\"deepseek/deepseek-v4-flash\"]\ncontext_window = 2000\n\
             input_price_per_mtok = 0.28\noutput_price_per_mtok = 0.42\n\
             [providers.local]\nbase_url = \"http://127.0.0.1:1/v1\"\ncontext_window = 8192\n\
             [providers.local.models.\"qwen3:8b\"]\ncontext_window = 40960\n",
        )
        .unwrap();
        let table = Config::resolve(&flags, &home).unwrap().model_table;
        let flash = table.info(&route("deepseek/deepseek-v4-flash"));
        assert_eq!(flash.context_window, Some(2000));
        assert_eq!(flash.price, Some(Price { input_per_mtok: 0.28, output_per_mtok: 0.42 }));
        assert_eq!(table.info(&route("local/qwen3:8b")).context_window, Some(40960));
        assert_eq!(table.info(&route("local/other")).context_window, Some(8192));
        assert_eq!(table.info(&route("openai/gpt-5.1")).context_window, Some(400_000));
        assert_eq!(table.info(&route("elsewhere/m")).context_window, Some(32000));
        for (text, key) in [
            ("[model_settings]\ncontext_window = 0\n", "model_settings.context_window"),
            ("[model_settings]\ninput_price_per_mtok = 1\n", "model_settings.input_price_per_mtok"),
            ("[model_settings]\ninput_price_per_mtok = -1\noutput_price_per_mtok = 1\n", "input_price_per_mtok"),
            ("[model_settings.models.nope]\ncontext_window = 1\n", "model_settings.models.\"nope\""),
            ("[model_settings.models.\"a/b\"]\ncontext_windw = 1\n", "context_windw"),
        ] {
            std::fs::write(&file, text).unwrap();
            let err = Config::resolve(&flags, &home).unwrap_err().to_string();
            assert!(err.contains(key), "{text}: {err}");
        }
    }

    #[test]
    fn compaction_settings_come_from_the_file_and_bad_ones_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        let flags = Overrides { config: Some(file.clone()), ..Default::default() };
        let home = env_of(&[("HOME", "/h")]);
        let defaults = Config::resolve(&Overrides::default(), &home).unwrap().compaction;
        assert_eq!((defaults.threshold_ratio, defaults.retain_ratio, defaults.max_tokens), (0.8, 0.16, 8192));
        assert!(defaults.auto && defaults.summary_route.is_none());
        std::fs::write(
            &file,
            "[compaction]\nthreshold_ratio = 0.5\nretain_ratio = 0.2\nmax_tokens = 100\nauto = false\n\
             model = \"p/m\"\n[model_settings.models.\"p/m\"]\ncontext_window = 2000\n",
        )
        .unwrap();
        let policy = Config::resolve(&flags, &home).unwrap().compaction;
        assert_eq!(
            (policy.threshold_ratio, policy.retain_ratio, policy.max_tokens, policy.auto),
            (0.5, 0.2, 100, false)
        );
        assert_eq!(policy.summary_route, Some(ModelRoute::parse("p/m").unwrap()));
        assert_eq!(policy.models.info(&ModelRoute::parse("p/m").unwrap()).context_window, Some(2000));
        for (text, key) in [
            ("[compaction]\nthreshold_ratio = 1.5\n", "compaction.threshold_ratio"),
            ("[compaction]\nretain_ratio = 0.9\n", "must be below"),
            ("[compaction]\nmax_tokens = 0\n", "compaction.max_tokens"),
            ("[compaction]\nmodel = \"nope\"\n", "compaction.model"),
            ("[compaction]\nthreshold = 0.5\n", "threshold"),
        ] {
            std::fs::write(&file, text).unwrap();
            let err = format!("{:#}", Config::resolve(&flags, &home).unwrap_err());
            assert!(err.contains(key), "{text}: {err}");
            assert_eq!(err.matches(&file.display().to_string()).count(), 1, "the file is named once: {err}");
        }
    }

    #[test]
    fn the_frame_limit_comes_from_the_flag_or_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        let home = env_of(&[("HOME", "/h")]);
        assert_eq!(Config::resolve(&Overrides::default(), &home).unwrap().max_frame_bytes, 64 << 20);
        std::fs::write(&file, "max_frame_bytes = 1048576\n").unwrap();
        let flags = Overrides { config: Some(file.clone()), ..Default::default() };
        assert_eq!(Config::resolve(&flags, &home).unwrap().max_frame_bytes, 1 << 20);
        let flagged = Overrides { max_frame_bytes: Some(2 << 20), ..flags.clone() };
        assert_eq!(Config::resolve(&flagged, &home).unwrap().max_frame_bytes, 2 << 20);
        let tiny = Overrides { max_frame_bytes: Some(100), ..flags.clone() };
        let err = Config::resolve(&tiny, &home).unwrap_err().to_string();
        assert!(err.contains("--max-frame-bytes must be at least 65536"), "{err}");
        std::fs::write(&file, "max_frame_bytes = 10\n").unwrap();
        let err = Config::resolve(&flags, &home).unwrap_err().to_string();
        assert!(err.contains("key `max_frame_bytes` must be at least"), "{err}");
        std::fs::write(&file, "max_frame_bytes = 1048576\n").unwrap();
        let huge = Overrides { max_frame_bytes: Some(1 << 30), ..flags.clone() };
        let err = Config::resolve(&huge, &home).unwrap_err().to_string();
        assert!(err.contains("--max-frame-bytes must be at most 134217728 bytes (128 MiB)"), "{err}");
    }

    #[test]
    fn mcp_servers_are_read_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        std::fs::write(
            &file,
            "[mcp]\nstartup_timeout_secs = 5\n\
             [mcp_servers.fs]\ncommand = \"npx\"\nargs = [\"-y\", \"server-fs\"]\nenv = { ROOT = \"/w\" }\n\
             tool_timeout_secs = 9\nenabled_tools = [\"read\"]\ndisabled_tools = [\"write\"]\ntrust = \"read-only-hints\"\n\
             [mcp_servers.api]\nurl = \"https://example.test/mcp\"\nheaders = { Authorization = \"Bearer t\" }\n",
        )
        .unwrap();
        let flags = Overrides { config: Some(file.clone()), ..Default::default() };
        let home = env_of(&[("HOME", "/h")]);
        let c = Config::resolve(&flags, &home).unwrap();
        assert_eq!(c.mcp.startup_timeout, Duration::from_secs(5));
        assert_eq!(c.mcp.tool_timeout, McpDefaults::default().tool_timeout);
        let [api, fs] = &c.mcp_servers[..] else { panic!("{:?}", c.mcp_servers) };
        assert_eq!(
            api.transport,
            Transport::Http {
                url: "https://example.test/mcp".into(),
                headers: vec![("Authorization".into(), "Bearer t".into())]
            }
        );
        assert_eq!(api.settings, Settings::default());
        assert_eq!(
            fs.transport,
            Transport::Stdio {
                command: "npx".into(),
                args: vec!["-y".into(), "server-fs".into()],
                env: vec![("ROOT".into(), "/w".into())]
            }
        );
        assert_eq!(fs.settings.tool_timeout, Some(Duration::from_secs(9)));
        assert_eq!(fs.settings.enabled_tools, Some(vec!["read".to_string()]));
        assert_eq!(fs.settings.disabled_tools, ["write"]);
        assert_eq!((fs.settings.trust, fs.origin), (Trust::ReadOnlyHints, Origin::Config));
        for (text, key) in [
            ("[mcp_servers.a]\n", "mcp_servers.a"),
            ("[mcp_servers.a]\ncommand = \"x\"\nurl = \"http://h\"\n", "mcp_servers.a"),
            ("[mcp_servers.a]\nurl = \"ftp://h\"\n", "mcp_servers.a.url"),
            ("[mcp_servers.a]\ncommand = \"x\"\ntrust = \"all\"\n", "mcp_servers.a.trust"),
            ("[mcp_servers.a]\ncommand = \"x\"\nstartup_timeout_secs = 0\n", "mcp_servers.a.startup_timeout_secs"),
            ("[mcp_servers.a]\ncommand = \"x\"\nheaders = { A = \"b\" }\n", "mcp_servers.a.headers"),
            ("[mcp_servers.\"a b\"]\ncommand = \"x\"\n", "mcp_servers.a b"),
            ("[mcp_servers.a]\ncommand = \"x\"\ncomand = \"y\"\n", "comand"),
            ("[mcp]\ntool_timeout_secs = -1\n", "mcp.tool_timeout_secs"),
        ] {
            std::fs::write(&file, text).unwrap();
            let err = Config::resolve(&flags, &home).unwrap_err().to_string();
            assert!(err.contains(key), "{text}: {err}");
        }
    }

    #[test]
    fn agent_tables_aliases_and_the_users_agent_directories() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        std::fs::write(
            &file,
            "[model_aliases]\nsonnet = \"anthropic/claude-sonnet\"\n\
             [agents.tester]\ndescription = \"Runs the tests.\"\nprompt = \"You test.\"\ntools = [\"read\", \"Bash\"]\n\
             disallowed_tools = [\"write\"]\nmodel = \"sonnet\"\nmax_turns = 4\nbackground = true\npermission_mode = \"accept-edits\"\n",
        )
        .unwrap();
        let flags = Overrides { config: Some(file.clone()), ..Default::default() };
        let c = Config::resolve(&flags, &env_of(&[("HOME", "/h")])).unwrap();
        let sonnet = ModelRoute::parse("anthropic/claude-sonnet").unwrap();
        assert_eq!(c.agents.aliases.get("sonnet"), Some(&sonnet));
        let [tester] = &c.agents.tables[..] else { panic!("{:?}", c.agents.tables) };
        assert_eq!((tester.name.as_str(), tester.description.as_str()), ("tester", "Runs the tests."));
        assert_eq!(tester.tools, Some(vec!["read".to_string(), "bash".to_string()]));
        assert_eq!(tester.model, crate::subagent::agents::ModelChoice::Route(sonnet));
        assert_eq!((tester.max_turns, tester.background), (Some(4), Some(true)));
        assert_eq!(tester.permission_mode, Some(PermissionMode::AcceptEdits));
        assert_eq!(c.agents.user_dirs, [PathBuf::from("/h/.config/kin/agents"), PathBuf::from("/h/.claude/agents")]);
        let env = env_of(&[("XDG_CONFIG_HOME", "/x"), ("CLAUDE_CONFIG_DIR", "/c"), ("KIN_SESSIONS_DIR", "/s")]);
        let c = Config::resolve(&flags, &env).unwrap();
        assert_eq!(c.agents.user_dirs, [PathBuf::from("/x/kin/agents"), PathBuf::from("/c/agents")]);
        assert_eq!(c.command_dirs, [PathBuf::from("/x/kin/commands"), PathBuf::from("/c/commands")]);
        for (text, key) in [
            ("[agents.a]\nprompt = \"p\"\n", "description"),
            ("[agents.a]\ndescription = \"d\"\ncolor = \"red\"\n", "color"),
            ("[agents.\"a b\"]\ndescription = \"d\"\n", "table `agents.a b`: key `name`"),
            ("[agents.a]\ndescription = \"d\"\npermission_mode = \"yolo\"\n", "agents.a`: key `permission_mode`"),
            ("[agents.a]\ndescription = \"d\"\nmax_turns = 0\n", "agents.a`: key `max_turns`"),
            ("[model_aliases]\nsonnet = \"claude\"\n", "model_aliases.sonnet"),
        ] {
            std::fs::write(&file, text).unwrap();
            let err = Config::resolve(&flags, &env_of(&[("HOME", "/h")])).unwrap_err().to_string();
            assert!(err.contains(key), "{text}: {err}");
        }
    }

    #[test]
    fn sandbox_keys_flag_and_env() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        std::fs::write(
            &file,
            "sandbox = \"workspace-write\"\nsandbox_network = true\nsandbox_writable_roots = [\"/srv/cache\"]\n\
             sandbox_fallback = \"warn\"\nsessions_dir = \"/st\"\n\
             [acp_agents.kin]\ncommand = \"kin\"\nsandbox = \"read-only\"\nsandbox_writable_roots = [\"/k\"]\n",
        )
        .unwrap();
        let flags = Overrides { config: Some(file.clone()), ..Default::default() };
        let home = env_of(&[("HOME", "/h")]);
        let c = Config::resolve(&flags, &home).unwrap();
        assert_eq!(c.sandbox.policy.id(), "workspace-write+network");
        assert_eq!(c.sandbox.writable_roots, [PathBuf::from("/srv/cache")]);
        assert_eq!(c.sandbox.fallback, SandboxFallback::Warn);
        assert_eq!(
            c.sandbox.protected,
            [dir.path().to_path_buf(), PathBuf::from("/st"), PathBuf::from("/st.catalog-index.jsonl")]
        );
        let agent = c.acp_agents[0].sandbox.clone().unwrap();
        assert_eq!(agent.policy.id(), "read-only");
        assert_eq!(agent.writable_roots, [PathBuf::from("/srv/cache"), PathBuf::from("/k")]);
        let env = env_of(&[("HOME", "/h"), ("KIN_SANDBOX", "read-only")]);
        assert_eq!(Config::resolve(&flags, &env).unwrap().sandbox.policy.id(), "read-only");
        let flagged = Overrides { sandbox: Some(SandboxPolicy::OFF), ..flags.clone() };
        assert_eq!(Config::resolve(&flagged, &env).unwrap().sandbox.policy, SandboxPolicy::OFF);
        let defaults = Config::resolve(&Overrides::default(), &home).unwrap();
        assert_eq!(defaults.sandbox.policy, SandboxPolicy::OFF);
        assert_eq!(
            defaults.sandbox.protected,
            [
                PathBuf::from("/h/.config/kin"),
                PathBuf::from("/h/.local/state/kin/sessions"),
                PathBuf::from("/h/.local/state/kin/sessions.catalog-index.jsonl")
            ]
        );
        for (text, key) in [
            ("sandbox = \"jail\"\n", "`sandbox`"),
            ("sandbox = \"read-only+network\"\nsandbox_network = false\n", "`sandbox_network`"),
            ("sandbox_writable_roots = [\"rel\"]\n", "`sandbox_writable_roots`"),
            ("sandbox_fallback = \"ignore\"\n", "`sandbox_fallback`"),
            ("[acp_agents.a]\ncommand = \"x\"\nsandbox = \"on\"\n", "acp_agents.a.sandbox"),
        ] {
            std::fs::write(&file, text).unwrap();
            let err = Config::resolve(&flags, &home).unwrap_err().to_string();
            assert!(err.contains(key), "{text}: {err}");
        }
        let err = Config::resolve(&Overrides::default(), &env_of(&[("HOME", "/h"), ("KIN_SANDBOX", "x")]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("KIN_SANDBOX") && err.contains("workspace-write"), "{err}");
    }

    #[test]
    fn bad_values_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        std::fs::write(&file, "[agent]\nmax_steps = 0\n").unwrap();
        let flags = Overrides { config: Some(file), ..Default::default() };
        let err = Config::resolve(&flags, &env_of(&[("HOME", "/h")])).unwrap_err().to_string();
        assert!(err.contains("agent.max_steps"), "{err}");
        let flags = Overrides { model: Some("nomodel".into()), ..Default::default() };
        let err = Config::resolve(&flags, &env_of(&[("HOME", "/h")])).unwrap_err().to_string();
        assert!(err.contains("--model") && err.contains("provider/model"), "{err}");
    }
}
