//! Picks the HTTP model client for a route's provider: the built-in `deepseek`, `openai` and
//! `anthropic` routes, or a named compatible endpoint from the config file (which wins over a
//! built-in of the same name). Keys are read through the `env` lookup the caller gives (the
//! environment, then `kin login`'s store), but a missing key only fails the first model call, so
//! `kin acp` starts without one; [`missing_key`] tells the protocol layer beforehand.

use std::sync::Arc;
use std::time::Duration;

use super::anthropic::{AnthropicConfig, AnthropicModel, DEFAULT_MAX_TOKENS};
use super::http::{RetryPolicy, Server};
use super::openai::{OpenAiConfig, OpenAiModel};
use super::{Model, ModelRoute};

/// The providers kin knows without configuration.
pub(crate) const BUILTIN_PROVIDERS: [&str; 3] = ["deepseek", "openai", "anthropic"];

/// Which wire protocol a named provider speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ProviderKind {
    /// OpenAI-compatible Chat Completions (`{base_url}/chat/completions`).
    #[default]
    OpenAi,
    /// Anthropic Messages (`{base_url}/v1/messages`).
    Anthropic,
}

/// A compatible endpoint declared in the config file, used as `name/model`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedProvider {
    pub name: String,
    pub base_url: String,
    /// The variable holding the key; None for servers that need no key (Ollama, llama.cpp).
    pub api_key_env: Option<String>,
    /// Headers sent with every request.
    pub headers: Vec<(String, String)>,
    pub kind: ProviderKind,
    /// Its models take images (config `images`).
    pub images: bool,
}

/// The model settings of the config file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelSettings {
    /// Maximum output tokens per call (Anthropic defaults to 8192; others to the server's).
    pub max_tokens: Option<u32>,
    /// `reasoning_effort` (OpenAI-compatible), the thinking switch (`off`, DeepSeek) or the
    /// thinking budget (Anthropic).
    pub reasoning_effort: Option<String>,
    pub retry: RetryPolicy,
    /// A stream silent for this long fails the attempt (retryable `TIMEOUT`).
    pub idle_timeout_secs: u64,
    pub providers: Vec<NamedProvider>,
}

impl Default for ModelSettings {
    fn default() -> Self {
        ModelSettings {
            max_tokens: None,
            reasoning_effort: None,
            retry: RetryPolicy::default(),
            idle_timeout_secs: 300,
            providers: Vec::new(),
        }
    }
}

/// Whether the models of `route` take images: DeepSeek's do not, OpenAI's and Anthropic's do,
/// and a named provider's as its config says (`images`). An unknown provider takes none.
pub(crate) fn takes_images(route: &ModelRoute, settings: &ModelSettings) -> bool {
    match settings.providers.iter().find(|p| p.name == route.provider) {
        Some(named) => named.images,
        None => matches!(route.provider.as_str(), "openai" | "anthropic"),
    }
}

/// The client for `route`; `env` gives base URLs and keys.
pub fn model_for_route(
    route: &ModelRoute,
    settings: &ModelSettings,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Arc<dyn Model>, String> {
    let (api, server) = endpoint(&route.provider, settings, env).map_err(|e| format!("route {route}: {e}"))?;
    client_for(api, server, settings, takes_images(route, settings))
}

/// Which wire API a provider's server speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WireApi {
    /// OpenAI-compatible Chat Completions; `deepseek` adds DeepSeek's extensions.
    OpenAi {
        deepseek: bool,
    },
    Anthropic,
}

/// A provider's server as configured: the API it speaks, its base URL (`$<PREFIX>_BASE_URL`
/// for the built-ins, `base_url` for `[providers.NAME]`), the key variable and the key `env`
/// gave, and extra headers. Retry and timeout settings are left at their defaults.
pub(crate) fn endpoint(
    provider: &str,
    settings: &ModelSettings,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(WireApi, Server), String> {
    if let Some(named) = settings.providers.iter().find(|p| p.name == provider) {
        let mut server = Server::new(named.base_url.clone(), named.api_key_env.as_deref());
        server.api_key = named.api_key_env.as_deref().and_then(env).filter(|v| !v.trim().is_empty());
        server.extra_headers = named.headers.clone();
        let api = match named.kind {
            ProviderKind::OpenAi => WireApi::OpenAi { deepseek: named.base_url.contains("deepseek") },
            ProviderKind::Anthropic => WireApi::Anthropic,
        };
        return Ok((api, server));
    }
    match provider {
        "deepseek" => {
            Ok((WireApi::OpenAi { deepseek: true }, Server::from_env("DEEPSEEK", "https://api.deepseek.com", env)))
        }
        "openai" => {
            Ok((WireApi::OpenAi { deepseek: false }, Server::from_env("OPENAI", "https://api.openai.com/v1", env)))
        }
        "anthropic" => Ok((WireApi::Anthropic, Server::from_env("ANTHROPIC", "https://api.anthropic.com", env))),
        other => Err(unknown_provider(other, settings)),
    }
}

/// Whether `provider` is one kin can reach: a built-in or a `[providers.NAME]`; else the error
/// naming the known ones (checked when the configuration is read, and again per call).
pub(crate) fn check_provider(provider: &str, settings: &ModelSettings) -> Result<(), String> {
    if BUILTIN_PROVIDERS.contains(&provider) || settings.providers.iter().any(|p| p.name == provider) {
        Ok(())
    } else {
        Err(unknown_provider(provider, settings))
    }
}

fn unknown_provider(provider: &str, settings: &ModelSettings) -> String {
    let mut all: Vec<&str> = BUILTIN_PROVIDERS.to_vec();
    all.extend(settings.providers.iter().map(|p| p.name.as_str()).filter(|n| !BUILTIN_PROVIDERS.contains(n)));
    format!(
        "unknown model provider {provider:?}; known providers: {} (declare others under [providers.NAME] in the config file)",
        all.join(", ")
    )
}

/// The providers that take a key, with the variable each reads it from: the built-ins (unless
/// a `[providers.NAME]` of the same name replaces them) and each `[providers.NAME]` with an
/// `api_key_env`, in that order.
pub(crate) fn key_providers(settings: &ModelSettings) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for name in BUILTIN_PROVIDERS {
        match settings.providers.iter().find(|p| p.name == name) {
            Some(named) => {
                if let Some(var) = &named.api_key_env {
                    out.push((name.to_string(), var.clone()));
                }
            }
            None => out.push((name.to_string(), format!("{}_API_KEY", name.to_uppercase()))),
        }
    }
    for named in settings.providers.iter().filter(|p| !BUILTIN_PROVIDERS.contains(&p.name.as_str())) {
        if let Some(var) = &named.api_key_env {
            out.push((named.name.clone(), var.clone()));
        }
    }
    out
}

/// The key a server needs and does not have.
pub(crate) fn missing_key(provider: &str, server: &Server) -> Option<super::MissingKey> {
    match (&server.api_key, &server.api_key_env) {
        (None, Some(variable)) => {
            Some(super::MissingKey { provider: provider.to_string(), variable: variable.clone() })
        }
        _ => None,
    }
}

/// The client for a provider's server (from [`endpoint`], its key filled in), sending images
/// when `images` (see [`takes_images`]).
pub(crate) fn client_for(
    api: WireApi,
    mut server: Server,
    settings: &ModelSettings,
    images: bool,
) -> Result<Arc<dyn Model>, String> {
    server.retry = settings.retry;
    server.idle_timeout = Duration::from_secs(settings.idle_timeout_secs.max(1));
    let reasoning_effort = settings.reasoning_effort.clone();
    let model: Arc<dyn Model> = match api {
        WireApi::OpenAi { deepseek } => {
            let config = OpenAiConfig { server, max_tokens: settings.max_tokens, reasoning_effort, deepseek, images };
            Arc::new(OpenAiModel::new(config))
        }
        WireApi::Anthropic => {
            let max_tokens = settings.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS);
            Arc::new(AnthropicModel::new(AnthropicConfig { server, max_tokens, reasoning_effort, images }))
        }
    };
    Ok(model)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(text: &str) -> ModelRoute {
        ModelRoute::parse(text).unwrap()
    }

    #[test]
    fn unknown_providers_are_named_with_the_known_ones() {
        let settings = ModelSettings {
            providers: vec![NamedProvider {
                name: "local".into(),
                base_url: "http://127.0.0.1:11434/v1".into(),
                api_key_env: None,
                headers: Vec::new(),
                kind: ProviderKind::OpenAi,
                images: false,
            }],
            ..ModelSettings::default()
        };
        let err = model_for_route(&route("nope/m"), &settings, &|_| None).err().unwrap();
        assert!(err.contains("\"nope\""), "{err}");
        assert!(err.contains("deepseek, openai, anthropic, local"), "{err}");
    }

    #[test]
    fn routes_build_without_keys() {
        let settings = ModelSettings::default();
        for text in ["deepseek/deepseek-v4-flash", "openai/gpt-5", "anthropic/claude-x"] {
            assert!(model_for_route(&route(text), &settings, &|_| None).is_ok());
        }
    }
}
