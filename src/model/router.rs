//! Picks the HTTP model client for a route's provider: the built-in `deepseek`, `openai` and
//! `anthropic` routes, or a named compatible endpoint from the config file (which wins over a
//! built-in of the same name). Keys are read from the environment here, but a missing key only
//! fails the first model call, so `kin acp` starts without one.

use std::sync::Arc;
use std::time::Duration;

use super::anthropic::{AnthropicConfig, AnthropicModel, DEFAULT_MAX_TOKENS};
use super::http::{RetryNotice, RetryPolicy, Server};
use super::openai::{OpenAiConfig, OpenAiModel};
use super::{Model, ModelRoute};

/// The providers kin knows without configuration.
pub const BUILTIN_PROVIDERS: [&str; 3] = ["deepseek", "openai", "anthropic"];

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

/// The client for `route`, without retry notices.
pub fn model_for_route(
    route: &ModelRoute,
    settings: &ModelSettings,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Arc<dyn Model>, String> {
    model_for_route_with_notice(route, settings, env, None)
}

/// The client for `route`; `notice` hears about every retry of every call.
pub fn model_for_route_with_notice(
    route: &ModelRoute,
    settings: &ModelSettings,
    env: &dyn Fn(&str) -> Option<String>,
    notice: Option<RetryNotice>,
) -> Result<Arc<dyn Model>, String> {
    /// Which API the server speaks.
    enum Api {
        OpenAi { deepseek: bool },
        Anthropic,
    }
    let (api, mut server) = match settings.providers.iter().find(|p| p.name == route.provider) {
        Some(named) => {
            let mut server = Server::new(named.base_url.clone(), named.api_key_env.as_deref());
            server.api_key = named.api_key_env.as_deref().and_then(env).filter(|v| !v.trim().is_empty());
            server.extra_headers = named.headers.clone();
            let api = match named.kind {
                ProviderKind::OpenAi => Api::OpenAi { deepseek: named.base_url.contains("deepseek") },
                ProviderKind::Anthropic => Api::Anthropic,
            };
            (api, server)
        }
        None => match route.provider.as_str() {
            "deepseek" => {
                (Api::OpenAi { deepseek: true }, Server::from_env("DEEPSEEK", "https://api.deepseek.com", env))
            }
            "openai" => (Api::OpenAi { deepseek: false }, Server::from_env("OPENAI", "https://api.openai.com/v1", env)),
            "anthropic" => (Api::Anthropic, Server::from_env("ANTHROPIC", "https://api.anthropic.com", env)),
            other => {
                let mut known: Vec<&str> = BUILTIN_PROVIDERS.to_vec();
                known.extend(settings.providers.iter().map(|p| p.name.as_str()));
                return Err(format!(
                    "unknown model provider {other:?} in route {route}; known providers: {} (declare others under [[providers]] in the config file)",
                    known.join(", ")
                ));
            }
        },
    };
    server.retry = settings.retry;
    server.idle_timeout = Duration::from_secs(settings.idle_timeout_secs.max(1));
    let reasoning_effort = settings.reasoning_effort.clone();
    let model: Arc<dyn Model> = match api {
        Api::OpenAi { deepseek } => {
            let config = OpenAiConfig { server, max_tokens: settings.max_tokens, reasoning_effort, deepseek };
            Arc::new(OpenAiModel::new(config)?.with_retry_notice(notice))
        }
        Api::Anthropic => {
            let max_tokens = settings.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS);
            Arc::new(
                AnthropicModel::new(AnthropicConfig { server, max_tokens, reasoning_effort })?
                    .with_retry_notice(notice),
            )
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
