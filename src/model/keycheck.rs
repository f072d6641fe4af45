//! The one cheap call `kin login` makes before it stores a key: the provider's model listing
//! (`GET {base}/models` on OpenAI-compatible servers, `GET {base}/v1/models` on Anthropic's),
//! authenticated the way model calls are, which costs no tokens. The key never appears in what
//! this returns.

use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};

use super::anthropic::AnthropicConfig;
use super::http::{self, Api, Server};
use super::openai::OpenAiConfig;
use super::router::WireApi;

/// How long the check may take, the error body's read included.
const CHECK_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a key was not accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum KeyCheckError {
    /// The server said the key is wrong (HTTP 401 or 403).
    Rejected(String),
    /// The check itself did not work (unreachable server, another status): the key is unknown.
    Unchecked(String),
}

impl std::fmt::Display for KeyCheckError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyCheckError::Rejected(m) | KeyCheckError::Unchecked(m) => f.write_str(m),
        }
    }
}

/// Checks `key` against the server; Ok when the listing answers 2xx.
pub(crate) async fn check_key(api: WireApi, server: &Server, key: &str) -> Result<(), KeyCheckError> {
    match api {
        WireApi::OpenAi { .. } => check::<OpenAiConfig>(server, key).await,
        WireApi::Anthropic => check::<AnthropicConfig>(server, key).await,
    }
}

async fn check<A: Api>(server: &Server, key: &str) -> Result<(), KeyCheckError> {
    let unchecked = |m: String| KeyCheckError::Unchecked(http::redact(&m, Some(key)));
    let mut headers = HeaderMap::new();
    headers.extend(A::fixed_headers());
    let (name, value) = A::auth(key).map_err(|f| unchecked(f.message))?;
    headers.insert(name, value);
    http::extra_headers(&mut headers, &server.extra_headers).map_err(|f| unchecked(f.message))?;
    headers.insert(HeaderName::from_static("accept"), HeaderValue::from_static("application/json"));
    let base = server.base_url.trim_end_matches('/');
    let url = format!("{base}{}", A::MODELS_PATH);
    let client = http::client().map_err(unchecked)?;
    let sent = client.get(&url).headers(headers).timeout(CHECK_TIMEOUT).send().await;
    let response = sent.map_err(|e| unchecked(format!("cannot reach {base}: {}", http::error_chain(&e))))?;
    let status = response.status().as_u16();
    if response.status().is_success() {
        return Ok(());
    }
    let body = http::BodyHead::read(response, http::ERROR_BODY_LIMIT, CHECK_TIMEOUT).await;
    let detail = http::redact(&body.excerpt(), Some(key));
    Err(match status {
        401 | 403 => KeyCheckError::Rejected(format!("{base} rejected the key (HTTP {status}): {detail}")),
        _ => {
            KeyCheckError::Unchecked(format!("{url} answered HTTP {status}, so the key could not be checked: {detail}"))
        }
    })
}
