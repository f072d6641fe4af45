//! kin: an Agent Client Protocol daemon hosting an LLM agent loop with tools and durable child
//! agents. Reading order: `session` (the on-disk log), `model` (the model seam), `tools`,
//! `permission` (the gate in front of tool calls), `sandbox`
//! (what commands may touch, enforced by the kernel), `prompt` (the system prompt), `agent` (the
//! turn loop), `runtime` (live sessions), `acp` (the protocol boundary), `scenario` (keyless
//! replay), then the CLI glue (`cli`, `config`, `commands`). See ARCHITECTURE.md.

pub mod acp;
pub mod agent;
pub mod bench;
pub mod cli;
pub mod commands;
pub mod config;
mod heap;
pub mod keys;
pub mod login;
pub mod mcp;
pub mod model;
mod outflow;
pub mod permission;
pub mod prompt;
pub mod runtime;
pub mod sandbox;
pub mod scenario;
pub mod session;
pub mod slash;
pub mod subagent;
pub mod timefmt;
pub mod title;
pub mod tools;
