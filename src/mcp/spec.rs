//! What an MCP server is, as kin knows it: a name, a transport and the settings kin applies.
//! `acp/` converts the editor's `McpServer` entries into it, `config` the `[mcp_servers.NAME]`
//! tables. Env values and header values may be secrets: `Debug` never shows them, and the log
//! records only the name, the kind and the origin.

use std::fmt;
use std::time::Duration;

use crate::session::event::McpServer;

/// How kin reaches a server.
#[derive(Clone, PartialEq, Eq)]
pub enum Transport {
    /// A child process speaking MCP on stdin/stdout.
    Stdio { command: String, args: Vec<String>, env: Vec<(String, String)> },
    /// Streamable HTTP at `url`, with extra request headers.
    Http { url: String, headers: Vec<(String, String)> },
    /// A transport kin does not connect to (`sse`, or a kind the SDK adds): skipped with a notice.
    Unsupported { kind: String },
}

impl Transport {
    /// `text` without what could show a secret of this transport, each as `[redacted]`: an HTTP
    /// URL's query and user info (`?token=…`, `user:pass@`) and its header values, a stdio
    /// server's env values (of 4 characters or more: a shorter one would garble the text). An
    /// error of the HTTP client quotes the URL it failed on.
    pub(crate) fn redact<'t>(&self, text: &'t str) -> std::borrow::Cow<'t, str> {
        let mut secrets: Vec<&str> = match self {
            Transport::Stdio { env, .. } => env.iter().map(|(_, v)| v.as_str()).filter(|v| v.len() >= 4).collect(),
            Transport::Http { url, headers } => {
                let mut found: Vec<&str> = headers.iter().map(|(_, v)| v.as_str()).filter(|v| v.len() >= 4).collect();
                if let Some((_, query)) = url.split_once('?') {
                    found.push(query.split('#').next().unwrap_or(query));
                }
                let authority = url.split_once("://").map_or(url.as_str(), |(_, rest)| rest);
                let authority = authority.split(['/', '?', '#']).next().unwrap_or(authority);
                if let Some((user_info, _)) = authority.rsplit_once('@') {
                    found.push(user_info);
                }
                found
            }
            Transport::Unsupported { .. } => Vec::new(),
        };
        secrets.retain(|s| !s.is_empty() && text.contains(*s));
        if secrets.is_empty() {
            return std::borrow::Cow::Borrowed(text);
        }
        // The longest first, so a secret holding another is replaced whole.
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        let mut out = text.to_string();
        for secret in secrets {
            out = out.replace(secret, "[redacted]");
        }
        std::borrow::Cow::Owned(out)
    }

    /// `stdio`, `http` or the unsupported kind.
    pub fn kind(&self) -> &str {
        match self {
            Transport::Stdio { .. } => "stdio",
            Transport::Http { .. } => "http",
            Transport::Unsupported { kind } => kind,
        }
    }
}

impl fmt::Debug for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = |pairs: &[(String, String)]| pairs.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>();
        match self {
            Transport::Stdio { command, args, env } => f
                .debug_struct("Stdio")
                .field("command", command)
                .field("args", &args.len())
                .field("env", &names(env))
                .finish(),
            Transport::Http { headers, .. } => f.debug_struct("Http").field("headers", &names(headers)).finish(),
            Transport::Unsupported { kind } => f.debug_struct("Unsupported").field("kind", kind).finish(),
        }
    }
}

/// Whether a server's tool annotations may loosen the permission gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Trust {
    /// Annotations are display hints only (the default, and always for editor servers).
    #[default]
    None,
    /// `readOnlyHint: true` lets a call run like a workspace read (config `trust = "read-only-hints"`).
    ReadOnlyHints,
}

impl Trust {
    /// The config value: `none` or `read-only-hints`.
    pub fn parse(text: &str) -> Option<Trust> {
        match text {
            "none" => Some(Trust::None),
            "read-only-hints" => Some(Trust::ReadOnlyHints),
            _ => None,
        }
    }
}

/// Where a server came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    Editor,
    Config,
}

impl Origin {
    fn id(self) -> &'static str {
        match self {
            Origin::Editor => "editor",
            Origin::Config => "config",
        }
    }
}

/// What kin applies to a server's startup and calls.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Settings {
    /// How long the start and the handshake may take (`None`: the `[mcp]` default).
    pub startup_timeout: Option<Duration>,
    /// How long one call may take (`None`: the `[mcp]` default).
    pub tool_timeout: Option<Duration>,
    /// Only these tools (by the server's names) are offered, when given.
    pub enabled_tools: Option<Vec<String>>,
    /// These tools are never offered.
    pub disabled_tools: Vec<String>,
    pub trust: Trust,
}

impl Settings {
    /// Whether the server's tool `name` passes the filters.
    pub fn offers(&self, name: &str) -> bool {
        let enabled = self.enabled_tools.as_ref().is_none_or(|list| list.iter().any(|t| t == name));
        enabled && !self.disabled_tools.iter().any(|t| t == name)
    }
}

/// The `[mcp]` defaults for servers that set no timeout of their own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Defaults {
    pub startup_timeout: Duration,
    pub tool_timeout: Duration,
}

impl Default for Defaults {
    fn default() -> Self {
        // First runs of `npx` servers download packages: give them time.
        Defaults { startup_timeout: Duration::from_secs(30), tool_timeout: Duration::from_secs(120) }
    }
}

/// One MCP server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerSpec {
    pub name: String,
    pub transport: Transport,
    pub settings: Settings,
    pub origin: Origin,
}

impl ServerSpec {
    /// A server from the editor: default settings, never trusted.
    pub fn from_editor(name: impl Into<String>, transport: Transport) -> Self {
        ServerSpec { name: name.into(), transport, settings: Settings::default(), origin: Origin::Editor }
    }

    /// What tells this server from another for remembered answers (in memory only): its name,
    /// transport and what it runs or reaches, without env or header values.
    pub(crate) fn identity(&self) -> String {
        let target = match &self.transport {
            Transport::Stdio { command, args, .. } => format!("{command}\u{0}{}", args.join("\u{0}")),
            Transport::Http { url, .. } => url.clone(),
            Transport::Unsupported { kind } => kind.clone(),
        };
        format!("{}\u{0}{}\u{0}{target}", self.name, self.transport.kind())
    }

    /// What the log records: name, kind and origin (nothing that may hold a secret).
    pub fn describe(&self) -> McpServer {
        McpServer { name: self.name.clone(), kind: self.transport.kind().into(), origin: self.origin.id().into() }
    }
}

/// A session's servers: the config's, each replaced by the editor's server of the same name,
/// then the editor's other servers in the order given (a repeated editor name: the last wins).
pub(crate) fn merge(config: &[ServerSpec], editor: Vec<ServerSpec>) -> Vec<ServerSpec> {
    let mut editor_last: Vec<ServerSpec> = Vec::new();
    for spec in editor {
        if editor_last.iter().any(|s| s.name == spec.name) {
            tracing::warn!(server = %spec.name, "the editor gave two MCP servers named `{}`; the last one is used", spec.name);
            editor_last.retain(|s| s.name != spec.name);
        }
        editor_last.push(spec);
    }
    let mut merged: Vec<ServerSpec> =
        config.iter().filter(|c| !editor_last.iter().any(|e| e.name == c.name)).cloned().collect();
    merged.extend(editor_last);
    merged
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stdio(name: &str, command: &str, origin: Origin) -> ServerSpec {
        let transport = Transport::Stdio { command: command.into(), args: vec![], env: vec![] };
        ServerSpec { name: name.into(), transport, settings: Settings::default(), origin }
    }

    #[test]
    fn editor_servers_replace_config_servers_of_the_same_name() {
        let config = [stdio("a", "config-a", Origin::Config), stdio("b", "config-b", Origin::Config)];
        let editor = vec![
            stdio("b", "editor-b", Origin::Editor),
            stdio("c", "c1", Origin::Editor),
            stdio("c", "c2", Origin::Editor),
        ];
        let merged = merge(&config, editor);
        let got: Vec<(&str, &str)> = merged
            .iter()
            .map(|s| match &s.transport {
                Transport::Stdio { command, .. } => (s.name.as_str(), command.as_str()),
                _ => unreachable!(),
            })
            .collect();
        assert_eq!(got, [("a", "config-a"), ("b", "editor-b"), ("c", "c2")]);
    }

    /// What remembered answers are kept under: two servers whose names map to one model-visible
    /// name (`x.y`, `x_y`), or another program under one name, are told apart; env and header
    /// values are not part of it.
    #[test]
    fn identities_tell_servers_apart_without_their_secrets() {
        let a = stdio("x.y", "fx", Origin::Editor);
        let b = stdio("x_y", "fx", Origin::Editor);
        let other_program = stdio("x.y", "evil", Origin::Editor);
        assert_ne!(a.identity(), b.identity());
        assert_ne!(a.identity(), other_program.identity());
        assert_eq!(a.identity(), stdio("x.y", "fx", Origin::Config).identity(), "where it was given does not count");
        let env =
            Transport::Stdio { command: "fx".into(), args: vec!["--v".into()], env: vec![("K".into(), "sk-1".into())] };
        let with_env = ServerSpec { transport: env, ..stdio("x.y", "fx", Origin::Editor) };
        assert!(!with_env.identity().contains("sk-1"));
        assert_ne!(with_env.identity(), a.identity(), "the arguments count");
        let http = |url: &str| ServerSpec {
            transport: Transport::Http { url: url.into(), headers: vec![("Authorization".into(), "sk-2".into())] },
            ..stdio("x.y", "", Origin::Editor)
        };
        assert_ne!(http("https://a.example/mcp").identity(), http("https://b.example/mcp").identity());
        assert!(!http("https://a.example/mcp").identity().contains("sk-2"));
    }

    /// An HTTP client's error quotes the URL: its token, user info and header values are
    /// redacted from every failure text, as a stdio server's env values are.
    #[test]
    fn failure_texts_are_redacted() {
        let http = Transport::Http {
            url: "https://bob:pw1@mcp.example/v1?token=SECRET123&x=1#frag".into(),
            headers: vec![("Authorization".into(), "Bearer sk-live-9".into())],
        };
        let error = "error sending request for url (https://bob:pw1@mcp.example/v1?token=SECRET123&x=1#frag): \
                     401 with Bearer sk-live-9";
        let said = http.redact(error);
        assert_eq!(
            said,
            "error sending request for url (https://[redacted]@mcp.example/v1?[redacted]#frag): 401 with [redacted]"
        );
        assert!(matches!(http.redact("connection refused"), std::borrow::Cow::Borrowed(_)));
        let stdio = Transport::Stdio {
            command: "fx".into(),
            args: vec![],
            env: vec![("K".into(), "sk-abc".into()), ("N".into(), "1".into())],
        };
        assert_eq!(stdio.redact("bad key sk-abc (attempt 1)"), "bad key [redacted] (attempt 1)");
    }

    #[test]
    fn secrets_stay_out_of_debug_and_the_log() {
        let transport = Transport::Http {
            url: "https://u:pw@example.test/mcp".into(),
            headers: vec![("Authorization".into(), "Bearer s3cret".into())],
        };
        let spec = ServerSpec::from_editor("api", transport);
        let shown = format!("{spec:?}");
        assert!(!shown.contains("s3cret") && !shown.contains("pw@"), "{shown}");
        assert!(shown.contains("Authorization"), "{shown}");
        let described = serde_json::to_value(spec.describe()).unwrap();
        assert_eq!(described, serde_json::json!({"name": "api", "kind": "http", "origin": "editor"}));
        let env = Transport::Stdio {
            command: "x".into(),
            args: vec!["--token=t0k".into()],
            env: vec![("K".into(), "v4lue".into())],
        };
        let shown = format!("{env:?}");
        assert!(!shown.contains("v4lue") && !shown.contains("t0k"), "{shown}");
    }

    #[test]
    fn tool_filters() {
        let mut settings = Settings::default();
        assert!(settings.offers("x"));
        settings.enabled_tools = Some(vec!["a".into(), "b".into()]);
        settings.disabled_tools = vec!["b".into()];
        assert!(settings.offers("a"));
        assert!(!settings.offers("b"));
        assert!(!settings.offers("x"));
        assert_eq!(Trust::parse("read-only-hints"), Some(Trust::ReadOnlyHints));
        assert_eq!(Trust::parse("all"), None);
    }
}
