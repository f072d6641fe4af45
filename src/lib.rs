//! kin: an Agent Client Protocol daemon hosting an LLM agent loop with tools and durable child
//! agents. Reading order: `session` (the on-disk log), `model` (the model seam), `tools`,
//! `permission` (the gate in front of tool calls), `sandbox`
//! (what commands may touch, enforced by the kernel), `prompt` (the system prompt), `agent` (the
//! turn loop), `runtime` (live sessions), `acp` (the protocol boundary), `scenario` (keyless
//! replay), then the CLI glue (`cli`, `config`, `commands`). See ARCHITECTURE.md.
//! Every module is private: the binary, the tests, the example and the fuzz targets use kin
//! through `testkit`, the one public module.

#![warn(unreachable_pub)]

mod acp;
mod agent;
mod bench;
mod cli;
mod commands;
mod config;
mod heap;
mod jsonrpc;
mod keys;
mod login;
mod mcp;
mod model;
mod outflow;
mod permission;
mod prompt;
mod runtime;
mod sandbox;
mod scenario;
mod session;
mod signals;
mod slash;
mod subagent;
pub mod testkit;
mod timefmt;
mod title;
mod tools;
