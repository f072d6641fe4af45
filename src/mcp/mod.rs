//! MCP servers: the tools an editor (`mcpServers` of `session/new`, `session/load`,
//! `session/resume`, `session/fork`) or the config file (`[mcp_servers.NAME]`) provides, offered
//! to the model behind the tool trait. This module is the only one that knows MCP (the `rmcp`
//! crate); the rest of kin sees a [`ServerSpec`] going in, a [`ToolSource`] of ordinary tools
//! coming out, and [`McpNotice`]s for the user.
//!
//! - `spec`: what a server is (kin's own type; `acp/` and `config` convert into it).
//! - `connect`: starting one server (a stdio child in its own process group with a cleared
//!   environment, or streamable HTTP), the handshake under a timeout, stderr to the log.
//! - `server`: one server of a session: its connection, tools, death and one restart.
//! - `session`: every server of one top-level session: concurrent start, notices, the tools of a
//!   step, shutdown.
//! - `names`, `schema`, `result`: model-visible names, input schemas and results.
//! - `tool`: an MCP tool as a kin `Tool`.
//! - `replay`: keyless replay: servers answered from the recorded session logs.
//!
//! [`ToolSource`]: crate::tools::ToolSource

mod connect;
mod names;
mod replay;
mod result;
mod schema;
mod server;
mod session;
mod spec;
mod tool;

pub(crate) use names::{call_title, is_mcp_tool};

pub(crate) use replay::Recording;
pub(crate) use session::McpNotice;
pub(crate) use session::McpSession;
pub(crate) use spec::Defaults;
pub(crate) use spec::Origin;
pub(crate) use spec::ServerSpec;
pub(crate) use spec::Settings;
pub(crate) use spec::Transport;
pub(crate) use spec::Trust;
pub(crate) use spec::merge;

/// Whether kin connects to streamable HTTP servers (ACP `mcpCapabilities.http`).
pub(crate) const HTTP_SUPPORTED: bool = true;
