//! Shared plumbing of the HTTP model clients: `HttpModel<A>` is the `Model` for any wire `Api`
//! (`openai`'s Chat Completions, `anthropic`'s Messages), each reaching a `Server`. One call runs
//! on a background task that posts the request, decodes the SSE stream into dsh `StreamChunk`s and
//! forwards them to the channel. It retries retryable failures (connect errors, 429, 5xx, a stream
//! that ends without a finish, an idle stream) with exponential backoff and jitter, honouring
//! `Retry-After` up to a cap, but only while nothing of the failed attempt reached the channel. A
//! completion with no content is passed on as it came: the agent's step retries it. Errors the user must act on (missing or rejected key, unknown model, context overflow)
//! are terminal and say what to do. The API key never appears in a message or a log line.
//! What a server sends is bounded: an error body is read to its first 16 KiB (`BodyHead`, which
//! `keycheck` shares; a cut body says so), a stream event to 16 MiB, a stream error's type or code
//! to 4 KiB (`tools::capture::MAX_ERROR_TEXT_BYTES`, the cut said; its message is an excerpt),
//! and a response stream to `Server::max_response_bytes` (64 MiB by default), past which the call
//! fails unretried.

use std::time::Duration;

use futures::StreamExt;
use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue, LOCATION};
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::sse::{Event, EventStream, SseError};
use super::{ChunkStream, Failure, FinishReason, Model, ModelEvent, ModelRequest, ModelResult, RetryInfo, StreamChunk};
use crate::tools::capture::{MAX_ERROR_TEXT_BYTES, cut};

/// No API key: the environment variable named in the message is unset.
pub(crate) const MISSING_CREDENTIAL: &str = "MISSING_CREDENTIAL";
/// HTTP 401/403: the key was rejected.
pub(crate) const AUTH_FAILED: &str = "AUTH_FAILED";
/// The provider does not know the model (HTTP 404, or DeepSeek's 400 "Model Not Exist").
pub(crate) const MODEL_NOT_FOUND: &str = "MODEL_NOT_FOUND";
/// The conversation no longer fits the model's context window.
pub(crate) const CONTEXT_WINDOW_EXCEEDED: &str = "CONTEXT_WINDOW_EXCEEDED";
/// Any other rejection by the provider (status and a body excerpt in the message).
pub(crate) const PROVIDER_ERROR: &str = "PROVIDER_ERROR";
/// The provider's content filter stopped the response.
pub(crate) const CONTENT_FILTERED: &str = "CONTENT_FILTERED";
/// The client configuration is unusable (an invalid header or URL).
pub(crate) const INVALID_CONFIG: &str = "INVALID_CONFIG";
/// HTTP 429 (retryable).
pub(crate) const RATE_LIMITED: &str = "RATE_LIMITED";
/// HTTP 5xx, 408, 409 or an overload reported in the stream (retryable).
pub(crate) const SERVER_ERROR: &str = "SERVER_ERROR";
/// The server could not be reached (retryable).
pub(crate) const CONNECTION_FAILED: &str = "CONNECTION_FAILED";
/// No model data for the idle timeout (retryable).
pub(crate) const TIMEOUT: &str = "TIMEOUT";
/// The stream ended or broke before the response finished (retryable).
pub(crate) const STREAM_INCOMPLETE: &str = "STREAM_INCOMPLETE";
/// A completion with no text, reasoning or tool calls (retryable). The client passes such a
/// completion on as it came; the agent's step names it and retries it (every model's alike).
pub(crate) const EMPTY_RESPONSE: &str = "EMPTY_RESPONSE";

/// The default idle-stream timeout of both HTTP clients (dsh `streamIdleTimeoutMs`).
pub(crate) const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(300);

/// The default cap on the bytes of one response stream: far above the longest answer a model
/// writes (128k tokens of per-token events are some 32 MiB), so only a looping server reaches it.
pub(crate) const DEFAULT_MAX_RESPONSE_BYTES: usize = 64 * 1024 * 1024;

/// The most of an error body kin reads to quote it in a message.
pub(crate) const ERROR_BODY_LIMIT: usize = 16 * 1024;

/// Whether a failure with this code may succeed when the call is simply made again.
pub(crate) fn is_retryable(code: &str) -> bool {
    matches!(code, RATE_LIMITED | SERVER_ERROR | CONNECTION_FAILED | TIMEOUT | STREAM_INCOMPLETE | EMPTY_RESPONSE)
}

/// How often and how patiently a model call is retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in total, the first one included (1 = never retry).
    pub max_attempts: u32,
    /// The backoff before the first retry; it doubles for each further retry.
    pub base_delay_ms: u64,
    /// The backoff never grows beyond this.
    pub max_delay_ms: u64,
    /// A server's `Retry-After` is honoured up to this; a longer one waits this long (and the
    /// retry it reports says the wait was capped).
    pub max_retry_after_ms: u64,
}

/// The default cap on a server's `Retry-After`.
pub(crate) const DEFAULT_MAX_RETRY_AFTER_MS: u64 = 60_000;

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 4,
            base_delay_ms: 500,
            max_delay_ms: 30_000,
            max_retry_after_ms: DEFAULT_MAX_RETRY_AFTER_MS,
        }
    }
}

impl RetryPolicy {
    /// The wait before retry number `retry` (1 = the first retry): the server's `Retry-After`
    /// when it sent one (at most `max_retry_after_ms`), else `base_delay_ms * 2^(retry-1)` capped
    /// at `max_delay_ms`, with jitter taking it down to as little as half.
    pub fn delay(&self, retry: u32, retry_after: Option<Duration>) -> Duration {
        if let Some(after) = retry_after {
            return after.min(Duration::from_millis(self.max_retry_after_ms));
        }
        let backoff =
            self.base_delay_ms.saturating_mul(2u64.saturating_pow(retry.saturating_sub(1))).min(self.max_delay_ms);
        let jittered = backoff as f64 * (0.5 + 0.5 * fastrand::f64());
        Duration::from_millis(jittered as u64)
    }
}

/// Builds the HTTP client both model clients use.
pub(crate) fn client() -> Result<reqwest::Client, String> {
    reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(30))
        // A redirect is an error naming where it points: followed, it would carry the API key
        // (and the configured headers) to whatever server it names.
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| format!("cannot create the HTTP client: {}", error_chain(&e)))
}

/// The key to send: the configured one, none when the endpoint needs none, or
/// `MISSING_CREDENTIAL` naming the environment variable.
pub(crate) fn resolve_key(
    api_key: Option<&str>,
    api_key_env: Option<&str>,
    request: &ModelRequest,
) -> Result<Option<String>, Failure> {
    match (api_key.filter(|k| !k.trim().is_empty()), api_key_env) {
        (Some(key), _) => Ok(Some(key.trim().to_string())),
        (None, None) => Ok(None),
        (None, Some(env)) => Err(Failure::new(
            format!(
                "no API key for {}: set the environment variable {env} or run `kin login` (kin looks for the key when a turn starts)",
                request.route
            ),
            MISSING_CREDENTIAL,
        )),
    }
}

/// A header value holding a secret: marked sensitive so it is never shown by `Debug`.
pub(crate) fn secret_value(value: &str) -> Result<HeaderValue, Failure> {
    let mut value = HeaderValue::from_str(value).map_err(|_| {
        Failure::new("the API key contains characters that cannot be sent in an HTTP header", INVALID_CONFIG)
    })?;
    value.set_sensitive(true);
    Ok(value)
}

/// The configured extra headers (values marked sensitive, as they may carry credentials).
pub(crate) fn extra_headers(headers: &mut HeaderMap, pairs: &[(String, String)]) -> Result<(), Failure> {
    for (name, value) in pairs {
        let header = HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
            Failure::new(format!("the configured header name {name:?} is not a valid HTTP header name"), INVALID_CONFIG)
        })?;
        let mut value = HeaderValue::from_str(value).map_err(|_| {
            Failure::new(
                format!("the configured value of header {name:?} is not a valid HTTP header value"),
                INVALID_CONFIG,
            )
        })?;
        value.set_sensitive(true);
        headers.insert(header, value);
    }
    Ok(())
}

/// A call that failed before any request: a stream yielding just the failure.
pub(crate) fn failed(failure: Failure) -> ChunkStream {
    tracing::warn!(code = %failure.code, "model call not started: {}", failure.message);
    let (tx, rx) = mpsc::channel(1);
    let _ = tx.try_send(Err(failure));
    rx
}

/// Everything one model call needs, owned by its task.
pub(crate) struct HttpCall {
    pub client: reqwest::Client,
    pub url: String,
    pub headers: HeaderMap,
    /// The serialized JSON request body.
    pub body: Vec<u8>,
    pub retry: RetryPolicy,
    pub idle_timeout: Duration,
    /// The most bytes one attempt's response stream may send.
    pub max_response_bytes: usize,
    /// The base URL as configured (for messages).
    pub base_url: String,
    /// The variable the key came from (for messages).
    pub key_env: Option<String>,
    /// The key itself, only to redact it from every message.
    pub key: Option<String>,
    pub request: RequestIds,
}

/// What the messages say about the call.
pub(crate) struct RequestIds {
    pub route: String,
    pub model: String,
}

impl RequestIds {
    pub(crate) fn of(request: &ModelRequest) -> Self {
        RequestIds { route: request.route.to_string(), model: request.route.model.clone() }
    }
}

/// Where and how a client reaches its API: what the OpenAI-compatible and Anthropic configs
/// share. `Debug` names the extra headers but shows neither their values nor the key.
#[derive(Clone)]
pub struct Server {
    /// The API root (a trailing `/` is allowed).
    pub base_url: String,
    /// The variable the key is read from, named in the missing-key error; None for servers
    /// that need no key (no key header is sent then).
    pub api_key_env: Option<String>,
    /// The key, read from `api_key_env` by whoever builds the config (the router). A missing
    /// key is reported when a call is made, so kin starts without one.
    pub api_key: Option<String>,
    /// Extra headers sent with every request (after the client's own, so they may override them).
    pub extra_headers: Vec<(String, String)>,
    pub retry: RetryPolicy,
    /// A call whose stream delivers no model data for this long fails with `TIMEOUT`
    /// (retryable); keep-alive comments do not count.
    pub idle_timeout: Duration,
    /// A response stream that sends more bytes than this fails the call with `PROVIDER_ERROR`
    /// (not retried): what a call decodes stays bounded even when a server streams forever.
    pub max_response_bytes: usize,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("base_url", &self.base_url)
            .field("api_key_env", &self.api_key_env)
            .field("api_key", &self.api_key.as_ref().map(|_| "[redacted]"))
            .field("extra_headers", &self.extra_headers.iter().map(|(n, _)| n).collect::<Vec<_>>())
            .field("retry", &self.retry)
            .field("idle_timeout", &self.idle_timeout)
            .field("max_response_bytes", &self.max_response_bytes)
            .finish()
    }
}

impl Server {
    /// A server with the defaults: no key, no extra headers, default retry, idle timeout and
    /// response cap.
    pub fn new(base_url: impl Into<String>, api_key_env: Option<&str>) -> Self {
        Server {
            base_url: base_url.into(),
            api_key_env: api_key_env.map(str::to_string),
            api_key: None,
            extra_headers: Vec::new(),
            retry: RetryPolicy::default(),
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
        }
    }

    /// A built-in provider's server: `$<PREFIX>_BASE_URL` or `default_base`, the key from
    /// `$<PREFIX>_API_KEY` (blank values count as unset).
    pub fn from_env(prefix: &str, default_base: &str, env: &dyn Fn(&str) -> Option<String>) -> Self {
        let set = |name: String| env(&name).filter(|v| !v.trim().is_empty());
        let key_env = format!("{prefix}_API_KEY");
        let mut server =
            Self::new(set(format!("{prefix}_BASE_URL")).unwrap_or_else(|| default_base.into()), Some(&key_env));
        server.api_key = set(key_env);
        server
    }
}

/// One wire API over HTTP: where its calls go, how the key is sent, the request body, and the
/// decoder of its event stream. [`HttpModel`] is the `Model` that speaks it.
pub trait Api: Send + Sync + 'static {
    /// Turns the API's SSE events into dsh chunks (a fresh one per attempt).
    type Decoder: Decoder + Default + Send + 'static;
    /// The path under the base URL (`/chat/completions`, `/v1/messages`).
    const PATH: &'static str;
    /// The model listing under the base URL (`/models`, `/v1/models`): `kin login`'s key check,
    /// an authenticated call that costs no tokens.
    const MODELS_PATH: &'static str;

    fn server(&self) -> &Server;

    /// The key as its header (`Authorization: Bearer …`, `x-api-key: …`).
    fn auth(key: &str) -> Result<(HeaderName, HeaderValue), Failure>;

    /// Headers of the API itself (e.g. `anthropic-version`).
    fn fixed_headers() -> Vec<(HeaderName, HeaderValue)> {
        Vec::new()
    }

    /// The JSON body of one call.
    fn request_body(&self, request: &ModelRequest) -> Value;
}

/// A model behind an HTTP API: the API's configuration and one connection pool.
pub struct HttpModel<A> {
    api: A,
    /// Built by the first call (TLS roots and the pool cost memory a session that never calls
    /// the model should not pay for).
    client: std::sync::OnceLock<reqwest::Client>,
}

impl<A: Api> HttpModel<A> {
    pub fn new(api: A) -> Self {
        HttpModel { api, client: std::sync::OnceLock::new() }
    }

    /// The connection pool, created on first use.
    fn client(&self) -> Result<reqwest::Client, Failure> {
        if let Some(client) = self.client.get() {
            return Ok(client.clone());
        }
        let built = client().map_err(|message| Failure::new(message, INVALID_CONFIG))?;
        Ok(self.client.get_or_init(|| built).clone())
    }

    /// The API's configuration.
    pub fn api(&self) -> &A {
        &self.api
    }

    /// Builds one call: the key (resolved now), JSON and SSE headers, the API's own headers,
    /// the configured extra headers and the encoded body.
    fn prepare(&self, request: &ModelRequest) -> Result<HttpCall, Failure> {
        let server = self.api.server();
        let key = resolve_key(server.api_key.as_deref(), server.api_key_env.as_deref(), request)?;
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert(ACCEPT, HeaderValue::from_static("text/event-stream"));
        headers.extend(A::fixed_headers());
        if let Some(key) = &key {
            let (name, value) = A::auth(key)?;
            headers.insert(name, value);
        }
        extra_headers(&mut headers, &server.extra_headers)?;
        let body = serde_json::to_vec(&self.api.request_body(request))
            .map_err(|e| Failure::new(format!("cannot encode the request: {e}"), INVALID_CONFIG))?;
        let base_url = server.base_url.trim_end_matches('/').to_string();
        Ok(HttpCall {
            client: self.client()?,
            url: format!("{base_url}{}", A::PATH),
            headers,
            body,
            retry: server.retry,
            idle_timeout: server.idle_timeout,
            max_response_bytes: server.max_response_bytes,
            base_url,
            key_env: server.api_key_env.clone(),
            key,
            request: RequestIds::of(request),
        })
    }
}

impl<A: Api> Model for HttpModel<A> {
    fn stream(&self, request: ModelRequest, cancel: CancellationToken) -> ChunkStream {
        match self.prepare(&request) {
            Ok(call) => start::<A::Decoder>(call, cancel),
            Err(failure) => failed(failure),
        }
    }
}

/// A failed attempt: the failure and the server's requested wait, if any.
pub struct AttemptError {
    /// Boxed: the error travels through every parser result and should stay small.
    pub failure: Box<Failure>,
    pub retry_after: Option<Duration>,
}

impl AttemptError {
    pub(crate) fn new(code: &str, message: impl Into<String>) -> Self {
        AttemptError { failure: Box::new(Failure::new(message, code)), retry_after: None }
    }

    /// The error a decoder found in `call`'s stream, saying whose stream it was (the decoders
    /// know only the stream).
    fn naming(mut self, call: &HttpCall) -> Self {
        self.failure.message = format!("{} (from {} for {})", self.failure.message, call.base_url, call.request.route);
        self
    }

    fn with_status(mut self, status: u16) -> Self {
        self.failure.extra.insert("status".into(), status.into());
        self
    }

    fn retryable(&self) -> bool {
        is_retryable(&self.failure.code)
    }
}

/// The response ended before the model finished.
pub(crate) fn incomplete() -> AttemptError {
    AttemptError::new(STREAM_INCOMPLETE, "the response stream ended before the model finished")
}

/// A stream event that is not the JSON the provider documents.
pub(crate) fn unreadable(data: &str, error: &serde_json::Error) -> AttemptError {
    AttemptError::new(
        PROVIDER_ERROR,
        format!("the provider sent an unreadable stream event ({error}): {}", excerpt(data)),
    )
}

/// Turns provider SSE events into dsh chunks; one decoder per attempt.
pub trait Decoder {
    /// Handles one SSE event, appending chunks to `out`. Returns true when the response is
    /// complete (the last chunk appended is the finish).
    fn event(&mut self, event: &Event, out: &mut Vec<StreamChunk>) -> Result<bool, AttemptError>;

    /// The stream ended without the provider's terminator: append the tail or fail.
    fn end(&mut self, out: &mut Vec<StreamChunk>) -> Result<(), AttemptError>;
}

/// Runs a call on a background task, with retries, the idle watchdog and cancellation.
pub(crate) fn start<D: Decoder + Default + Send + 'static>(call: HttpCall, cancel: CancellationToken) -> ChunkStream {
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        // Leaving the select drops the in-flight request, which aborts it at once.
        let cancelled = tokio::select! {
            biased;
            () = cancel.cancelled() => true,
            () = tx.closed() => false,
            () = run::<D>(&call, &tx) => false,
        };
        if cancelled {
            tracing::debug!(route = %call.request.route, "model call cancelled");
            let _ = tx.try_send(Ok(ModelEvent::Chunk(StreamChunk::Finish {
                reason: FinishReason::Aborted { failure: None },
                replay_state: None,
            })));
        }
    });
    rx
}

async fn run<D: Decoder + Default>(call: &HttpCall, tx: &mpsc::Sender<ModelResult>) {
    let max_attempts = call.retry.max_attempts.max(1);
    let mut attempt = 1;
    loop {
        let mut forwarded = false;
        let error = match attempt_once::<D>(call, tx, &mut forwarded).await {
            Ok(()) => return,
            Err(error) => error,
        };
        let retryable = error.retryable();
        let mut failure = error.failure;
        failure.message = redact(&failure.message, call.key.as_deref());
        if let Some(after) = error.retry_after {
            let ms = u64::try_from(after.as_millis()).unwrap_or(u64::MAX);
            failure.extra.insert("providerRetryAfterMs".into(), ms.into());
        }
        if forwarded {
            // Chunks of this attempt already reached the consumer: finish with the failure
            // rather than replaying the response from the start.
            tracing::warn!(
                route = %call.request.route,
                code = %failure.code,
                "model stream failed mid-response: {}",
                failure.message
            );
            let finish = StreamChunk::Finish { reason: FinishReason::Error { failure: *failure }, replay_state: None };
            let _ = tx.send(Ok(ModelEvent::Chunk(finish))).await;
            return;
        }
        if !retryable || attempt >= max_attempts {
            if retryable && attempt > 1 {
                failure.message = format!("{} (gave up after {attempt} attempts)", failure.message);
            }
            tracing::warn!(
                route = %call.request.route,
                code = %failure.code,
                "model call failed: {}",
                failure.message
            );
            let _ = tx.send(Err(*failure)).await;
            return;
        }
        let delay = call.retry.delay(attempt, error.retry_after);
        let delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        let requested_delay_ms = error
            .retry_after
            .filter(|after| *after > delay)
            .map(|after| u64::try_from(after.as_millis()).unwrap_or(u64::MAX));
        attempt += 1;
        tracing::warn!(
            route = %call.request.route,
            attempt,
            max_attempts,
            delay_ms,
            requested_delay_ms,
            code = %failure.code,
            "model call failed, retrying: {}",
            failure.message
        );
        // In band, before the wait: the consumer hears of the retry when it happens.
        let retry = RetryInfo {
            attempt,
            max_attempts,
            delay_ms,
            code: failure.code,
            reason: failure.message,
            requested_delay_ms,
        };
        if tx.send(Ok(ModelEvent::Retry(retry))).await.is_err() {
            return;
        }
        tokio::time::sleep(delay).await;
    }
}

/// Bytes one unfinished stream event may hold (its data lines so far and a partial line); a
/// longer one fails the attempt instead of growing the event's buffer without bound.
const MAX_EVENT_BYTES: usize = 16 * 1024 * 1024;

/// One attempt. `Ok` means the call is over (finished, or the consumer went away);
/// `forwarded` records whether any chunk reached the channel.
async fn attempt_once<D: Decoder + Default>(
    call: &HttpCall,
    tx: &mpsc::Sender<ModelResult>,
    forwarded: &mut bool,
) -> Result<(), AttemptError> {
    let idle = call.idle_timeout;
    let send = call.client.post(call.url.as_str()).headers(call.headers.clone()).body(call.body.clone()).send();
    let response = match tokio::time::timeout(idle, send).await {
        Err(_) => return Err(idle_error(call)),
        Ok(Err(e)) => return Err(transport_error(call, &e)),
        Ok(Ok(response)) => response,
    };
    let status = response.status();
    if status.is_redirection() {
        return Err(redirected(call, status.as_u16(), response.headers()));
    }
    if !status.is_success() {
        let retry_after = retry_after(response.headers());
        let body = BodyHead::read(response, ERROR_BODY_LIMIT, idle).await;
        let mut error = status_error(call, status.as_u16(), &body);
        error.retry_after = retry_after;
        return Err(error);
    }
    if let Some(kind) = not_a_stream(response.headers()) {
        let body = BodyHead::read(response, ERROR_BODY_LIMIT, idle).await;
        return Err(AttemptError::new(
            PROVIDER_ERROR,
            format!(
                "{} answered the request for {} with {kind} instead of an event stream (HTTP {status}); check the provider's base URL: {}",
                call.base_url,
                call.request.route,
                body.excerpt()
            ),
        ));
    }
    let mut body = response.bytes_stream();
    let mut events = EventStream::new(MAX_EVENT_BYTES);
    let mut decoder = D::default();
    let mut out = Vec::new();
    // The idle watchdog counts model data: it is rearmed when an event yields chunks, so SSE
    // comments (keep-alives) and events without content do not keep a silent model alive.
    let mut deadline = tokio::time::Instant::now() + idle;
    let mut received = 0usize;
    loop {
        let piece = match tokio::time::timeout_at(deadline, body.next()).await {
            Ok(piece) => piece,
            Err(_) => return Err(idle_error(call)),
        };
        let piece = match piece {
            None => {
                decoder.end(&mut out).map_err(|e| e.naming(call))?;
                forward(&mut out, tx, forwarded).await;
                return Ok(());
            }
            Some(Ok(piece)) => piece,
            Some(Err(e)) => {
                return Err(AttemptError::new(
                    STREAM_INCOMPLETE,
                    format!("the response stream from {} broke off: {}", call.base_url, error_chain(&e)),
                ));
            }
        };
        received = received.saturating_add(piece.len());
        if received > call.max_response_bytes {
            return Err(too_large(call));
        }
        let mut rest = &piece[..];
        loop {
            let event = match events.next(&mut rest) {
                Ok(Some(event)) => event,
                Ok(None) => break,
                Err(SseError::Oversize) => {
                    return Err(AttemptError::new(
                        PROVIDER_ERROR,
                        format!(
                            "the response stream from {} sent an event larger than {}; kin does not buffer more",
                            call.base_url,
                            size(MAX_EVENT_BYTES)
                        ),
                    ));
                }
                Err(SseError::NotUtf8) => {
                    return Err(AttemptError::new(
                        PROVIDER_ERROR,
                        format!("the response stream from {} is not UTF-8", call.base_url),
                    ));
                }
            };
            let done = decoder.event(event, &mut out).map_err(|e| e.naming(call))?;
            if !out.is_empty() {
                deadline = tokio::time::Instant::now() + idle;
            }
            if !forward(&mut out, tx, forwarded).await || done {
                return Ok(());
            }
        }
    }
}

/// Hands the decoded chunks on; false when the consumer went away.
async fn forward(out: &mut Vec<StreamChunk>, tx: &mpsc::Sender<ModelResult>, forwarded: &mut bool) -> bool {
    // An attempt's first block starts wait for something of theirs (a delta, their end): one
    // that fails after a bare start (Anthropic's `content_block_start`, then an overload) has
    // shown nothing, and is retried.
    if !*forwarded && out.iter().all(|chunk| matches!(chunk, StreamChunk::BlockStart { .. })) {
        return true;
    }
    for chunk in out.drain(..) {
        if tx.send(Ok(ModelEvent::Chunk(chunk))).await.is_err() {
            return false;
        }
        *forwarded = true;
    }
    true
}

fn idle_error(call: &HttpCall) -> AttemptError {
    AttemptError::new(
        TIMEOUT,
        format!(
            "no model data from {} for {:?} while calling {} (idle timeout; keep-alive comments do not count)",
            call.base_url, call.idle_timeout, call.request.route
        ),
    )
}

/// The response stream went past `max_response_bytes`: not retried, as the same request would
/// likely loop again.
fn too_large(call: &HttpCall) -> AttemptError {
    AttemptError::new(
        PROVIDER_ERROR,
        format!(
            "the model's response from {} for {} is larger than {}: kin stopped reading it (is the server looping?)",
            call.base_url,
            call.request.route,
            size(call.max_response_bytes)
        ),
    )
}

fn transport_error(call: &HttpCall, error: &reqwest::Error) -> AttemptError {
    if error.is_builder() {
        return AttemptError::new(
            INVALID_CONFIG,
            format!("cannot build the request to {} for {}: {}", call.base_url, call.request.route, error_chain(error)),
        );
    }
    AttemptError::new(
        CONNECTION_FAILED,
        format!("cannot reach {} for {}: {}", call.base_url, call.request.route, error_chain(error)),
    )
}

/// A redirect, not followed: where it points, and what to do.
fn redirected(call: &HttpCall, status: u16, headers: &HeaderMap) -> AttemptError {
    let to = headers.get(LOCATION).and_then(|v| v.to_str().ok()).map(|v| cut(v, 1000));
    AttemptError::new(
        PROVIDER_ERROR,
        format!(
            "{} redirected the request for {} (HTTP {status}) to {}: kin does not follow a model server's redirects, which would send the API key along; set the provider's base URL to the address the server means",
            call.base_url,
            call.request.route,
            to.as_deref().unwrap_or("nowhere (no Location header)")
        ),
    )
    .with_status(status)
}

/// A successful answer whose content type says it is a document, not a stream (a JSON error
/// with HTTP 200, a proxy's or portal's HTML page): that type. Any other type (or none) is read
/// as a stream.
fn not_a_stream(headers: &HeaderMap) -> Option<String> {
    let kind = headers.get(CONTENT_TYPE)?.to_str().ok()?;
    let essence = kind.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
    matches!(essence.as_str(), "application/json" | "text/html" | "application/xhtml+xml").then(|| cut(&essence, 100))
}

/// Classifies a non-success HTTP status (the body is the provider's error document, or its head).
fn status_error(call: &HttpCall, status: u16, body: &BodyHead) -> AttemptError {
    let detail = body.excerpt();
    let lower = body.text.to_lowercase();
    let (route, model, base_url) = (&call.request.route, &call.request.model, &call.base_url);
    let model_missing = status == 404
        || (matches!(status, 400 | 422)
            && ["model not exist", "model_not_found", "does not exist", "unknown model"]
                .iter()
                .any(|p| lower.contains(p)));
    let error = match status {
        401 | 403 => AttemptError::new(
            AUTH_FAILED,
            match &call.key_env {
                Some(env) => format!(
                    "the API key in {env} was rejected (HTTP {status}) by {base_url} for {route}; check the key: {detail}"
                ),
                None => format!(
                    "{base_url} refused the request for {route} as unauthorized (HTTP {status}); configure an API key variable for this provider: {detail}"
                ),
            },
        ),
        _ if model_missing => AttemptError::new(
            MODEL_NOT_FOUND,
            format!(
                "model {model:?} was not found (HTTP {status}) for route {route} at {base_url}; check the model name and the base URL: {detail}"
            ),
        ),
        // A rate limit is waited out, never taken for an overflow (compacting would lose history
        // for nothing), whatever its text says of tokens ("too many tokens per minute").
        _ if status == 413 || (status < 500 && status != 429 && is_context_overflow(&lower)) => AttemptError::new(
            CONTEXT_WINDOW_EXCEEDED,
            format!("the conversation no longer fits the context window of {route} (HTTP {status}): {detail}"),
        ),
        429 => AttemptError::new(RATE_LIMITED, format!("{route} is rate limited (HTTP 429): {detail}")),
        408 | 409 | 500..=599 => {
            AttemptError::new(SERVER_ERROR, format!("{base_url} failed with HTTP {status} for {route}: {detail}"))
        }
        _ => AttemptError::new(
            PROVIDER_ERROR,
            format!("{base_url} rejected the request for {route} with HTTP {status}: {detail}"),
        ),
    };
    error.with_status(status)
}

/// Classifies an error object reported inside the stream (`{type, message}` or `{code, message}`):
/// its message as an [`excerpt`], its type or code cut to `MAX_ERROR_TEXT_BYTES`.
pub(crate) fn stream_error(error: &Value) -> AttemptError {
    let message = error["message"].as_str().map_or_else(|| excerpt(&error.to_string()), excerpt);
    let kind = error["type"].as_str().or_else(|| error["code"].as_str()).unwrap_or("error");
    let kind = cut(kind, MAX_ERROR_TEXT_BYTES);
    let lower = format!("{kind} {message}").to_lowercase();
    let code = if lower.contains("rate_limit") || lower.contains("rate limit") {
        // Before the overflow check: a rate limit's text may speak of tokens.
        RATE_LIMITED
    } else if is_context_overflow(&lower) {
        CONTEXT_WINDOW_EXCEEDED
    } else if ["invalid_request", "authentication", "permission", "not_found"].iter().any(|p| lower.contains(p)) {
        PROVIDER_ERROR
    } else {
        // Overloads, api_error, server_error and unknown kinds: worth another attempt.
        SERVER_ERROR
    };
    AttemptError::new(code, format!("the provider reported an error in the stream ({kind}): {message}"))
}

fn is_context_overflow(lower: &str) -> bool {
    [
        "context length",
        "context_length",
        "context window",
        "context_window",
        "maximum context",
        "prompt is too long",
        "input is too long",
        "too many tokens",
        "reduce the length",
    ]
    .iter()
    .any(|p| lower.contains(p))
}

/// `Retry-After` in seconds (or OpenAI's `retry-after-ms`); HTTP dates are not read.
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let number =
        |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).and_then(|v| v.trim().parse::<f64>().ok());
    // A wait past what a `Duration` holds (`1e300`) is the longest one, which the policy caps.
    let wait = |secs: f64| {
        Duration::try_from_secs_f64(secs).ok().or_else(|| (secs > 0.0 && !secs.is_nan()).then_some(Duration::MAX))
    };
    if let Some(ms) = number("retry-after-ms") {
        return wait(ms / 1000.0);
    }
    number("retry-after").and_then(wait)
}

/// A short, single-line excerpt of an error body: the provider's `error.message` when the body
/// is a JSON error document, else the start of the body.
pub(crate) fn excerpt(body: &str) -> String {
    let parsed: Option<Value> = serde_json::from_str(body).ok();
    let message = parsed.as_ref().and_then(|v| {
        v["error"]["message"]
            .as_str()
            .or_else(|| v["message"].as_str())
            .or_else(|| v["error"].as_str())
            .or_else(|| v["detail"].as_str())
    });
    let text = message.unwrap_or(body);
    let collapsed: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if collapsed.is_empty() {
        return "(empty body)".into();
    }
    let mut short: String = collapsed.chars().take(300).collect();
    if short.len() < collapsed.len() {
        short.push('…');
    }
    short
}

/// The start of a response body, read only to quote it in an error: at most a limit of bytes,
/// so a server answering an error with an endless body costs kin no more than that.
pub(crate) struct BodyHead {
    /// The bytes read, decoded lossily.
    text: String,
    /// The limit, when the body went on past it (the rest was not read).
    cut_at: Option<usize>,
}

impl BodyHead {
    /// Reads at most `limit` bytes of `response`'s body within `patience`. A body that breaks
    /// off or stalls is quoted as far as it came; one longer than `limit` is cut and says so.
    pub(crate) async fn read(mut response: reqwest::Response, limit: usize, patience: Duration) -> Self {
        let deadline = tokio::time::Instant::now() + patience;
        let mut body = Vec::new();
        let mut cut_at = None;
        while let Ok(Ok(Some(bytes))) = tokio::time::timeout_at(deadline, response.chunk()).await {
            let room = limit - body.len();
            if bytes.len() > room {
                body.extend_from_slice(&bytes[..room]);
                cut_at = Some(limit);
                break;
            }
            body.extend_from_slice(&bytes);
        }
        BodyHead { text: String::from_utf8_lossy(&body).into_owned(), cut_at }
    }

    /// The body's [`excerpt`], followed by a note when the body was cut.
    pub(crate) fn excerpt(&self) -> String {
        let detail = excerpt(&self.text);
        match self.cut_at {
            Some(limit) => format!("{detail} (body cut at {})", size(limit)),
            None => detail,
        }
    }
}

/// A byte count as messages say it: `64 MiB`, `16 KiB`, `100 bytes`.
fn size(bytes: usize) -> String {
    const KIB: usize = 1024;
    const MIB: usize = KIB * KIB;
    if bytes >= MIB && bytes.is_multiple_of(MIB) {
        format!("{} MiB", bytes / MIB)
    } else if bytes >= KIB && bytes.is_multiple_of(KIB) {
        format!("{} KiB", bytes / KIB)
    } else {
        format!("{bytes} bytes")
    }
}

/// Removes every occurrence of the key from a message.
pub(crate) fn redact(message: &str, key: Option<&str>) -> String {
    match key {
        Some(key) if !key.is_empty() => message.replace(key, "[redacted]"),
        _ => message.to_string(),
    }
}

/// An error with its causes, `outer: inner: innermost`.
pub(crate) fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_caps_and_honours_retry_after() {
        let policy = RetryPolicy { max_attempts: 5, base_delay_ms: 100, max_delay_ms: 300, max_retry_after_ms: 9_000 };
        for _ in 0..20 {
            let first = policy.delay(1, None).as_millis();
            let second = policy.delay(2, None).as_millis();
            let capped = policy.delay(6, None).as_millis();
            assert!((50..=100).contains(&first), "{first}");
            assert!((100..=200).contains(&second), "{second}");
            assert!((150..=300).contains(&capped), "{capped}");
        }
        assert_eq!(policy.delay(1, Some(Duration::from_secs(7))), Duration::from_secs(7));
        assert_eq!(policy.delay(1, Some(Duration::from_secs(3600))), Duration::from_secs(9));
    }

    #[test]
    fn retry_after_is_capped_at_a_minute_by_default() {
        let policy = RetryPolicy::default();
        assert_eq!(policy.max_retry_after_ms, 60_000);
        assert_eq!(policy.delay(1, Some(Duration::from_secs(86_400))), Duration::from_secs(60));
        assert_eq!(policy.delay(1, Some(Duration::from_secs(59))), Duration::from_secs(59));
    }

    #[test]
    fn retry_after_reads_seconds_and_milliseconds() {
        let mut headers = HeaderMap::new();
        headers.insert("retry-after", HeaderValue::from_static("2"));
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(2)));
        headers.insert("retry-after-ms", HeaderValue::from_static("250"));
        assert_eq!(retry_after(&headers), Some(Duration::from_millis(250)));
        let mut dated = HeaderMap::new();
        dated.insert("retry-after", HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"));
        assert_eq!(retry_after(&dated), None);
        // Past what a Duration holds: the longest wait, which the policy caps (not none at all).
        for (name, value) in [("retry-after", "1e300"), ("retry-after", "1e999"), ("retry-after-ms", "1e30")] {
            let mut huge = HeaderMap::new();
            huge.insert(name, HeaderValue::from_static(value));
            assert_eq!(retry_after(&huge), Some(Duration::MAX), "{name}: {value}");
            assert_eq!(RetryPolicy::default().delay(1, retry_after(&huge)), Duration::from_secs(60));
        }
        let mut negative = HeaderMap::new();
        negative.insert("retry-after", HeaderValue::from_static("-5"));
        assert_eq!(retry_after(&negative), None);
    }

    #[test]
    fn excerpts_prefer_the_error_message_and_stay_short() {
        assert_eq!(
            excerpt(r#"{"error":{"message":"Model Not Exist","type":"invalid_request_error"}}"#),
            "Model Not Exist"
        );
        assert_eq!(excerpt("  bad\n\ngateway "), "bad gateway");
        assert_eq!(excerpt(""), "(empty body)");
        assert_eq!(excerpt(&"x".repeat(400)).chars().count(), 301);
    }

    #[test]
    fn a_rate_limit_in_the_stream_is_one_whatever_it_says_of_tokens() {
        let tpm = serde_json::json!({"message": "Rate limit reached: too many tokens per minute (TPM).", "code": "rate_limit_exceeded"});
        assert_eq!(stream_error(&tpm).failure.code, RATE_LIMITED);
        let overflow = serde_json::json!({"message": "prompt is too long: 215000 tokens > 200000 maximum", "type": "invalid_request_error"});
        assert_eq!(stream_error(&overflow).failure.code, CONTEXT_WINDOW_EXCEEDED);
    }

    #[test]
    fn a_stream_error_quotes_a_long_type_cut_and_says_so() {
        let error = stream_error(&serde_json::json!({"type": "overloaded_error", "message": "Overloaded"}));
        assert_eq!(
            error.failure.message,
            "the provider reported an error in the stream (overloaded_error): Overloaded"
        );
        let long = "t".repeat(1 << 20);
        let error = stream_error(&serde_json::json!({"code": long, "message": "m"}));
        let kept = "t".repeat(MAX_ERROR_TEXT_BYTES);
        let note = format!("[... {} more bytes not shown ...]", (1 << 20) - MAX_ERROR_TEXT_BYTES);
        let expected = format!("the provider reported an error in the stream ({kept}\n{note}): m");
        assert_eq!(error.failure.message, expected);
    }

    #[test]
    fn sizes_are_named_in_the_largest_whole_unit() {
        assert_eq!(size(MAX_EVENT_BYTES), "16 MiB");
        assert_eq!(size(DEFAULT_MAX_RESPONSE_BYTES), "64 MiB");
        assert_eq!(size(ERROR_BODY_LIMIT), "16 KiB");
        assert_eq!(size(1536), "1536 bytes");
        assert_eq!(size(100), "100 bytes");
    }

    #[test]
    fn a_cut_body_says_so_after_its_excerpt() {
        let whole = BodyHead { text: "bad gateway".into(), cut_at: None };
        assert_eq!(whole.excerpt(), "bad gateway");
        let cut = BodyHead { text: "x".repeat(ERROR_BODY_LIMIT), cut_at: Some(ERROR_BODY_LIMIT) };
        let excerpt = cut.excerpt();
        assert!(excerpt.ends_with("… (body cut at 16 KiB)"), "{excerpt}");
    }

    #[test]
    fn a_server_debug_names_neither_the_key_nor_header_values() {
        let mut server = Server::from_env("DEEPSEEK", "https://api.deepseek.com", &|name| match name {
            "DEEPSEEK_API_KEY" => Some("sk-secret".into()),
            "DEEPSEEK_BASE_URL" => Some("  ".into()),
            _ => None,
        });
        server.extra_headers = vec![("x-token".into(), "hidden-value".into())];
        assert_eq!(
            (server.base_url.as_str(), server.api_key.as_deref()),
            ("https://api.deepseek.com", Some("sk-secret"))
        );
        let debug = format!("{server:?}");
        assert!(debug.contains("DEEPSEEK_API_KEY") && debug.contains("x-token"), "{debug}");
        assert!(!debug.contains("sk-secret") && !debug.contains("hidden-value"), "{debug}");
    }

    #[test]
    fn keys_are_redacted() {
        assert_eq!(redact("your key sk-123 is wrong", Some("sk-123")), "your key [redacted] is wrong");
        assert_eq!(redact("fine", None), "fine");
    }
}
