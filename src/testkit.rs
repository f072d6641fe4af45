//! What code outside the library uses of it, and nothing else: the binary (`main.rs`), the
//! integration tests (`tests/`), the MCP fixture example and the fuzz targets reach kin only
//! through this module, whose layout mirrors the crate's. Every other module is private and
//! `pub(crate)` by default (`unreachable_pub` is on), so an item is public only when it is listed
//! here or appears in the signature of one that is.

pub mod acp {
    pub use crate::acp::{external_agents, fuzz_params, request_frame, serve_stdio};
    pub mod run {
        pub use crate::acp::run::{RunRequest, Target, run};
    }
}
pub mod agent {
    pub use crate::agent::{AgentDeps, AgentHandle, PromptRefused, Restored, TurnEnd, completed_prefix, spawn_agent};
    pub mod compact {
        pub use crate::agent::compact::{Manual, Policy};
    }
}
pub mod bench {
    pub use crate::bench::{Options, first_listing, run};
}
pub mod cli {
    pub use crate::cli::{AcpArgs, AcpCommand, Cli, Command, LoginArgs, ScenarioCommand, SessionsCommand};
}
pub mod commands {
    pub use crate::commands::{
        scenario_dirs, scenario_run, sessions_check, sessions_delete, sessions_list, sessions_show,
    };
}
pub mod signals {
    pub use crate::signals::{raise_open_files_limit, survive_file_size_limits};
}
pub mod heap {
    pub use crate::heap::configure;
}
pub mod config {
    pub use crate::config::{Config, Overrides, process_env};
}
pub mod login {
    pub use crate::login::{login, logout};
}
pub mod model {
    pub use crate::model::{
        ChunkStream, Failure, FinishReason, Model, ModelEvent, ModelRequest, ModelResult, ModelRoute, Purpose,
        RetryInfo, StreamChunk, ToolSchema, text_response, tool_call_response,
    };
    pub mod capacity {
        pub use crate::model::capacity::{ModelEntry, ModelTable};
    }
    pub mod http {
        pub use crate::model::http::{RetryPolicy, Server};
    }
    pub mod openai {
        pub use crate::model::openai::{OpenAiConfig, OpenAiModel};
    }
    pub mod router {
        pub use crate::model::router::{ModelSettings, NamedProvider, ProviderKind, model_for_route};
    }
    pub mod script {
        pub use crate::model::script::{ReplayEntry, ScriptedModel};
    }
}
pub mod permission {
    pub use crate::permission::{
        Decision, PermissionAnswer, PermissionMode, PermissionPrompt, PermissionRequest, Permissions,
    };
}
pub mod runtime {
    pub use crate::runtime::{ClientLink, Runtime};
}
pub mod sandbox {
    pub use crate::sandbox::{SandboxPolicy, SandboxSettings, SessionSandbox, landlock_for_tests};
}
pub mod scenario {
    pub use crate::scenario::{Compare, RunOptions, run};
}
pub mod session {
    pub use crate::session::{
        Event, Kind, Record, Session, SessionHeader, SessionObserver, SessionStore, StoreError, derive_messages,
    };
    pub mod inbox {
        pub use crate::session::inbox::fold;
    }
    pub mod catalog_index {
        pub use crate::session::catalog_index::path;
    }
    pub mod dir_memo {
        pub use crate::session::dir_memo::path;
    }
    pub mod fuzz_files {
        pub use crate::session::fuzz_files::{index_file, memo_file};
    }
    pub mod layout {
        pub use crate::session::layout::{log_path, project_key};
    }
    pub mod query {
        pub use crate::session::query::{
            EventRecord, Lineage, QueryError, QueryFault, QueryService, ReadRequest, SessionLog, SessionQuery,
            SessionRecord, SessionSource, SourceIo, StoreSource, Surface, Trace, Window, merge_records, sibling_order,
        };
    }
    pub mod repair {
        pub use crate::session::repair::closers;
    }
    pub mod scan {
        pub use crate::session::scan::{scan_bytes, scan_file};
    }
    pub mod surface {
        pub use crate::session::surface::validate;
    }
    pub mod watch {
        pub use crate::session::watch::LogWatch;
    }
}
pub mod subagent {
    pub use crate::subagent::{
        Capabilities, Dispose, ErrorCode, Lifecycle, ResolvedStart, StartRequest, StopReason, SubagentError,
        SubagentProvider, SubagentResult, SubagentRun, SubagentService, child_depth, descriptor,
    };
    pub mod agents {
        pub use crate::subagent::agents::Launch;
    }
    pub mod catalog {
        pub use crate::subagent::catalog::{
            Activity, ListEntry, Mode, QUERY_UNAVAILABLE, Reason, list_children, list_tree,
        };
    }
    pub mod continuation {
        pub use crate::subagent::continuation::{ContinuationManager, ContinuationSettings};
    }
    pub mod control {
        pub use crate::subagent::control::{InterruptTool, ReportTool, SendMessageTool};
    }
    pub mod external {
        pub use crate::subagent::external::{AcpProvider, ExternalAgentConfig, MAX_OUTPUT_BYTES};
    }
    pub mod inprocess {
        pub use crate::subagent::inprocess::{ChildFactory, ChildSetup, InProcessProvider};
    }
    pub mod list_agents {
        pub use crate::subagent::list_agents::{DESCRIPTION, ListAgentsTool, render};
    }
    pub mod tools {
        pub use crate::subagent::tools::{DelegateConfig, DelegateTool};
    }
}
pub mod tools {
    pub use crate::tools::{Access, Caller, Tool, ToolContext, ToolError, ToolOutput, ToolRegistry};
    pub mod bash {
        pub use crate::tools::bash::BashTool;
    }
    pub mod builtin {
        pub use crate::tools::builtin::register_coding_tools;
    }
    pub mod regular {
        pub use crate::tools::regular::text_within;
    }
    pub mod fs {
        pub use crate::tools::fs::FileState;
    }
}
