//! Command-line arguments (clap derive).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::config::Overrides;
use crate::permission::PermissionMode;
use crate::sandbox::SandboxPolicy;

/// `kin --version`: the crate version and the git commit it was built from.
pub(crate) const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("KIN_GIT_COMMIT"), ")");

#[derive(Debug, Parser)]
#[command(name = "kin", version = VERSION, about = "An ACP agent daemon with durable, continuable child agents")]
pub struct Cli {
    #[command(flatten)]
    pub common: Common,
    #[command(subcommand)]
    pub command: Command,
}

/// Settings shared by every subcommand.
#[derive(Debug, Args)]
pub struct Common {
    /// Config file (default: $XDG_CONFIG_HOME/kin/config.toml).
    #[arg(long, global = true, value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// Sessions directory (default: $KIN_SESSIONS_DIR, $XDG_STATE_HOME/kin/sessions, ~/.local/state/kin/sessions).
    #[arg(long, global = true, value_name = "DIR")]
    pub sessions: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the Agent Client Protocol on stdin/stdout.
    Acp(AcpArgs),
    /// Run one turn headless: the reply on stdout, progress on stderr (for scripts and CI).
    Run(RunArgs),
    /// Run recorded scenarios.
    Scenario {
        #[command(subcommand)]
        command: ScenarioCommand,
    },
    /// Print performance figures (cold start, turn overhead, append and load).
    Bench {
        /// A reduced set that runs in well under two minutes.
        #[arg(long)]
        quick: bool,
        /// Figures to compare with (ratios are printed; a regression is flagged).
        #[arg(long, value_name = "PATH", default_value = "bench/baseline.json")]
        baseline: PathBuf,
        /// Write this run's figures here (e.g. to refresh the baseline).
        #[arg(long, value_name = "PATH")]
        save: Option<PathBuf>,
        /// Run only these sections (repeat or comma-separate; default: all).
        #[arg(long, value_name = "SECTION", value_delimiter = ',')]
        only: Vec<crate::bench::Section>,
        /// (The catalog section's own use.) List PARENT's children once in SESSIONS, as the
        /// first listing after a start, and print its wall and CPU time as JSON.
        #[arg(long, hide = true, num_args = 2, value_names = ["SESSIONS", "PARENT"])]
        first_listing: Option<Vec<String>>,
    },
    /// Inspect stored sessions.
    Sessions {
        #[command(subcommand)]
        command: SessionsCommand,
    },
    /// Store a provider's API key (checked first) in the OS credential store or a 0600 file.
    Login(LoginArgs),
    /// Remove the stored key of a provider, or of every provider.
    Logout {
        /// The provider (default: all).
        provider: Option<String>,
    },
}

#[derive(Debug, Args)]
pub struct LoginArgs {
    /// The provider (default: ask).
    pub provider: Option<String>,
    /// Store the key without the check call to the provider.
    #[arg(long)]
    pub no_check: bool,
}

/// `kin acp login`: what an editor runs for the terminal auth method (its agent command plus
/// `login`).
#[derive(Debug, Subcommand)]
pub enum AcpCommand {
    /// The same as `kin login`.
    Login(LoginArgs),
}

#[derive(Debug, Args)]
pub struct AcpArgs {
    /// Model route, provider/model (default: $KIN_MODEL, the config file, deepseek/deepseek-v4-flash).
    #[arg(long, value_name = "ROUTE")]
    pub model: Option<String>,
    /// Write logs to this file instead of stderr.
    #[arg(long, value_name = "PATH")]
    pub log_file: Option<PathBuf>,
    /// Keyless mode: serve model calls from the recorded logs of this scenario directory.
    #[arg(long, value_name = "DIR")]
    pub replay: Option<PathBuf>,
    /// Permission mode sessions start in: ask, accept-edits, read-only or bypass (default:
    /// $KIN_PERMISSION_MODE, the config file, ask).
    #[arg(long, value_name = "MODE", value_parser = PermissionMode::parse_arg)]
    pub permission_mode: Option<PermissionMode>,
    /// The longest JSON-RPC frame (one line on stdin) kin reads, in bytes; a longer one is
    /// answered with an error and dropped (default: the config file, 67108864 = 64 MiB).
    #[arg(long, value_name = "BYTES")]
    pub max_frame_bytes: Option<usize>,
    /// Sandbox for commands: off, read-only or workspace-write, optionally `+network` (default:
    /// $KIN_SANDBOX, the config file, off).
    #[arg(long, value_name = "SANDBOX", value_parser = SandboxPolicy::parse_arg)]
    pub sandbox: Option<SandboxPolicy>,
    #[command(subcommand)]
    pub command: Option<AcpCommand>,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The prompt; `-` or absent reads it from stdin (when stdin is not a terminal).
    pub prompt: Option<String>,
    /// The session's working directory (default: the current directory).
    #[arg(long, value_name = "DIR")]
    pub cwd: Option<PathBuf>,
    /// text: the reply as it streams; json: one object at the end; stream-json: one object per update.
    #[arg(long, value_enum, default_value = "text")]
    pub output: OutputArg,
    /// Add the turn to this stored session.
    #[arg(long, value_name = "ID", conflicts_with = "continue_", value_parser = session_id)]
    pub resume: Option<String>,
    /// Add the turn to the newest top-level session of the working directory.
    #[arg(long = "continue")]
    pub continue_: bool,
    /// Model route, provider/model (default: $KIN_MODEL, the config file, deepseek/deepseek-v4-flash).
    #[arg(long, value_name = "ROUTE")]
    pub model: Option<String>,
    /// Permission mode of the turn (default: read-only; nobody can be asked, so `ask` refuses).
    #[arg(long, value_name = "MODE", value_parser = PermissionMode::parse_arg)]
    pub permission_mode: Option<PermissionMode>,
    /// Sandbox for the turn's commands (default: $KIN_SANDBOX, the config file, off); with one in
    /// force, commands need no question in ask and accept-edits.
    #[arg(long, value_name = "SANDBOX", value_parser = SandboxPolicy::parse_arg)]
    pub sandbox: Option<SandboxPolicy>,
    /// Model calls the turn may make before it stops (default: agent.max_steps, 50).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_steps: Option<u32>,
    /// Keyless mode: serve model calls from the recorded logs of this scenario directory.
    #[arg(long, value_name = "DIR")]
    pub replay: Option<PathBuf>,
    /// Write logs to this file instead of stderr.
    #[arg(long, value_name = "PATH")]
    pub log_file: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum OutputArg {
    Text,
    Json,
    StreamJson,
}

impl From<OutputArg> for crate::acp::run::Output {
    fn from(o: OutputArg) -> Self {
        match o {
            OutputArg::Text => crate::acp::run::Output::Text,
            OutputArg::Json => crate::acp::run::Output::Json,
            OutputArg::StreamJson => crate::acp::run::Output::StreamJson,
        }
    }
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum CompareArg {
    Exact,
    Text,
}

#[derive(Debug, Subcommand)]
pub enum ScenarioCommand {
    /// Replay scenario directories against this binary and compare the transcripts.
    Run {
        /// Rewrite the expected files from this run.
        #[arg(long)]
        update: bool,
        /// exact: every frame and log; text: responses and agent text only.
        #[arg(long, value_enum, default_value = "exact")]
        compare: CompareArg,
        /// Keep the produced session logs here, named like the fixture's.
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
        /// Scenario directories, or directories of scenarios.
        #[arg(required = true, value_name = "DIR")]
        dirs: Vec<PathBuf>,
    },
    /// Run scenarios' input.json against the configured real model and write their expected
    /// transcripts and session logs, so `scenario run` replays them keyless afterwards.
    Record {
        /// Scenario directories (each needs an input.json).
        #[arg(required = true, value_name = "DIR")]
        dirs: Vec<PathBuf>,
    },
}

#[derive(Debug, Subcommand)]
pub enum SessionsCommand {
    /// List top-level sessions, newest first.
    List {
        /// Only sessions whose cwd is DIR (a relative DIR is taken from the current directory).
        #[arg(long, value_name = "DIR")]
        cwd: Option<PathBuf>,
    },
    /// Print a readable transcript of a session.
    Show {
        #[arg(value_parser = session_id)]
        id: String,
    },
    /// Validate logs (all, or one); report torn tails and corruption by file and line. Changes nothing.
    Check {
        #[arg(value_parser = session_id)]
        id: Option<String>,
    },
    /// Delete a top-level session and its subagent sessions (refused while a kin has it open).
    Delete {
        #[arg(value_parser = session_id)]
        id: String,
    },
}

/// A session id as a command line gives it: one kin could store (bad usage otherwise, exit 2).
fn session_id(id: &str) -> Result<String, String> {
    crate::session::layout::validate_session_id(id).map(|()| id.to_string())
}

impl Cli {
    pub fn overrides(&self) -> Overrides {
        let mut o = Overrides {
            config: self.common.config.clone(),
            sessions: self.common.sessions.clone(),
            ..Default::default()
        };
        if let Command::Acp(acp) = &self.command {
            o.model = acp.model.clone();
            o.log_file = acp.log_file.clone();
            o.replay = acp.replay.clone();
            o.permission_mode = acp.permission_mode;
            o.max_frame_bytes = acp.max_frame_bytes;
            o.sandbox = acp.sandbox;
        }
        if let Command::Run(run) = &self.command {
            o.model = run.model.clone();
            o.log_file = run.log_file.clone();
            o.replay = run.replay.clone();
            o.permission_mode = Some(run.permission_mode.unwrap_or(PermissionMode::ReadOnly));
            o.max_steps = run.max_steps;
            o.sandbox = run.sandbox;
        }
        o
    }
}
