//! The `kin` binary: parse the command line, set up logging, resolve the configuration and run
//! the subcommand. Nothing else lives here.

use std::process::ExitCode;

use clap::Parser;
use kin::testkit::acp::run::{RunRequest, Target};
use kin::testkit::cli::{AcpCommand, Cli, Command, LoginArgs, ScenarioCommand, SessionsCommand};
use kin::testkit::config::{Config, process_env};
use kin::testkit::scenario::RunOptions;
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    kin::testkit::heap::configure();
    kin::testkit::signals::survive_file_size_limits();
    kin::testkit::signals::raise_open_files_limit();
    let cli = Cli::parse();
    let config = match Config::resolve(&cli.overrides(), &process_env) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("kin: {e:#}");
            return ExitCode::from(2);
        }
    };
    // `kin run` keeps stderr for its own progress lines, and `kin bench` its figures (its
    // in-process sections would log each compaction): only warnings unless RUST_LOG says more,
    // and none from the ACP crate, which warns of every error it answers (`kin run` says each
    // refusal itself).
    let quiet = matches!(
        cli.command,
        Command::Run(_)
            | Command::Bench { .. }
            | Command::Login(_)
            | Command::Logout { .. }
            | Command::Acp(kin::testkit::cli::AcpArgs { command: Some(_), .. })
    );
    let logs_to_file = config.log_file.is_some();
    // On the user's stderr, `kin run` says each retry and a failed turn itself: the model
    // client's and the turn's own warnings of them would say each two or three times.
    let default_level = match (quiet, logs_to_file) {
        (true, false) => "warn,agent_client_protocol=error,kin::model::http=error,kin::agent::turn=error",
        (true, true) => "warn,agent_client_protocol=error",
        (false, _) => "info",
    };
    let logging = match init_logging(&config, default_level) {
        Ok(logging) => logging,
        Err(e) => {
            eprintln!("kin: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime =
        match tokio::runtime::Builder::new_multi_thread().worker_threads(worker_threads()).enable_all().build() {
            Ok(rt) => rt,
            Err(e) => {
                eprintln!("kin: cannot start the async runtime: {e}");
                return ExitCode::FAILURE;
            }
        };
    let code = match runtime.block_on(run(cli, config)) {
        Ok(code) => code,
        Err(e) => {
            // Once on stderr: the log says it too only when it is a file.
            if logs_to_file {
                tracing::error!("{e:#}");
            }
            eprintln!("kin: {e:#}");
            ExitCode::FAILURE
        }
    };
    logging.finish();
    code
}

/// Tokio workers: kin is an I/O daemon (its CPU work is JSON and the odd file scan, which runs
/// on blocking threads), so it needs a couple of workers, not one per core of a large machine.
fn worker_threads() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZero::get).clamp(1, MAX_WORKERS)
}

/// The most tokio workers kin starts.
const MAX_WORKERS: usize = 4;

/// Lines the log writer queues before it drops new ones (tracing-appender's default, 128,000,
/// allocates and touches a 4 MiB queue at start). A writer that cannot keep up loses lines rather
/// than stalling the daemon (stderr may be a pipe nobody reads); how many is said at exit.
const LOG_QUEUE_LINES: usize = 4096;

/// The log writer's guard (flushes at exit) and its count of dropped lines.
struct Logging {
    guard: tracing_appender::non_blocking::WorkerGuard,
    dropped: tracing_appender::non_blocking::ErrorCounter,
}

impl Logging {
    /// Says how many lines the full queue dropped, then flushes the writer.
    fn finish(self) {
        let dropped = self.dropped.dropped_lines();
        if dropped > 0 {
            tracing::warn!(dropped, "the log queue was full: {dropped} log lines were dropped");
        }
        drop(self.guard);
    }
}

/// The runtime `kin acp` and `kin run` serve: the configured model and the coding tools.
fn build_runtime(config: Config) -> anyhow::Result<std::sync::Arc<kin::testkit::runtime::Runtime>> {
    let mut tools = kin::testkit::tools::ToolRegistry::new();
    kin::testkit::tools::builtin::register_coding_tools(&mut tools, kin::testkit::tools::fs::FileState::new());
    kin::testkit::runtime::Runtime::for_config(config, tools)
}

/// The most bytes of a prompt `kin run` reads from stdin.
const MAX_STDIN_PROMPT_BYTES: u64 = 16 * 1024 * 1024;

/// `kin run`'s prompt: the argument, or stdin for `-` or no argument when stdin is not a
/// terminal (at most `MAX_STDIN_PROMPT_BYTES` of UTF-8, else an error); `None` when there is none
/// (or it is blank).
fn run_prompt(arg: Option<&str>) -> anyhow::Result<Option<String>> {
    use std::io::IsTerminal;
    let text = match arg {
        Some("-") => None,
        Some(text) => Some(text.to_string()),
        None if std::io::stdin().is_terminal() => return Ok(None),
        None => None,
    };
    let text = match text {
        Some(text) => text,
        None => kin::testkit::tools::regular::text_within(
            std::io::stdin().lock(),
            MAX_STDIN_PROMPT_BYTES,
            "the prompt on stdin",
        )?,
    };
    Ok(Some(text).filter(|t| !t.trim().is_empty()))
}

fn init_logging(config: &Config, default_level: &str) -> Result<Logging, String> {
    // The MCP client crate logs every server notification and handshake at info: warnings only.
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(format!("{default_level},rmcp=warn")));
    let builder = tracing_appender::non_blocking::NonBlockingBuilder::default()
        .buffered_lines_limit(LOG_QUEUE_LINES)
        .lossy(true)
        .thread_name("kin-log");
    let (writer, guard) = match &config.log_file {
        Some(path) => builder.finish(open_log_file(path)?),
        None => builder.finish(std::io::stderr()),
    };
    let dropped = writer.error_counter();
    let capped = move || CappedLine(writer.clone());
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(capped).with_ansi(false).init();
    Ok(Logging { guard, dropped })
}

/// The most bytes of one log line kept: a line may quote what a client or a server sent (the
/// ACP SDK logs a handler's description, 33 KB for one bad request), and the queue holds
/// `LOG_QUEUE_LINES` of them.
const MAX_LOG_LINE_BYTES: usize = 16 * 1024;

/// A writer of one formatted log line (tracing writes each event whole, once) that cuts it at
/// `MAX_LOG_LINE_BYTES`, saying how much it cut.
struct CappedLine<W>(W);

impl<W: std::io::Write> std::io::Write for CappedLine<W> {
    fn write(&mut self, line: &[u8]) -> std::io::Result<usize> {
        if line.len() <= MAX_LOG_LINE_BYTES {
            return self.0.write(line);
        }
        let mut cut = line[..MAX_LOG_LINE_BYTES].to_vec();
        cut.extend_from_slice(
            format!(" [... {} more bytes of this log line cut]\n", line.len() - MAX_LOG_LINE_BYTES).as_bytes(),
        );
        self.0.write_all(&cut)?;
        Ok(line.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

/// The log file (`--log-file`, `log_file`), appended to; its directory is made if missing.
fn open_log_file(path: &std::path::Path) -> Result<std::fs::File, String> {
    if let Some(dir) = path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot make the log file's directory {}: {e}", dir.display()))?;
    }
    std::fs::OpenOptions::new().create(true).append(true).open(path).map_err(|e| {
        format!("cannot open the log file {}: {e}; give a file path (--log-file, log_file)", path.display())
    })
}

/// `kin login` (and `kin acp login`, the editor's terminal auth method): 0 when the key is stored.
async fn login(config: &Config, args: &LoginArgs) -> ExitCode {
    match kin::testkit::login::login(config, args.provider.as_deref(), !args.no_check).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kin login: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli, config: Config) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Acp(kin::testkit::cli::AcpArgs { command: Some(AcpCommand::Login(args)), .. })
        | Command::Login(args) => Ok(login(&config, &args).await),
        Command::Logout { provider } => Ok(match kin::testkit::login::logout(&config, provider.as_deref()) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("kin logout: {e}");
                ExitCode::FAILURE
            }
        }),
        Command::Acp(_) => {
            let max_frame_bytes = config.max_frame_bytes;
            let runtime = build_runtime(config)?;
            kin::testkit::acp::serve_stdio(runtime.clone(), max_frame_bytes).await?;
            if let Err(unused) = runtime.check_fixture() {
                tracing::error!("replay incomplete: {unused}");
                return Ok(ExitCode::from(3));
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Run(args) => {
            let Some(prompt) = run_prompt(args.prompt.as_deref())? else {
                eprintln!("kin run: no prompt: pass it as an argument, or pipe it on stdin (`-` reads stdin)");
                return Ok(ExitCode::from(2));
            };
            let cwd = match args.cwd.clone() {
                Some(dir) => std::path::absolute(&dir)?,
                None => std::env::current_dir()?,
            };
            if !cwd.is_dir() {
                eprintln!("kin run: --cwd {} is not an existing directory", cwd.display());
                return Ok(ExitCode::from(2));
            }
            let target = match (&args.resume, args.continue_) {
                (Some(id), _) => Target::Resume(id.clone()),
                (None, true) => Target::Continue,
                (None, false) => Target::New,
            };
            let (mode, logs_to_file) = (config.permission_mode, config.log_file.is_some());
            let runtime = build_runtime(config)?;
            let request = RunRequest { prompt, cwd, output: args.output.into(), target, mode, logs_to_file };
            let exit = kin::testkit::acp::run::run(runtime, request).await?;
            Ok(ExitCode::from(exit.code()))
        }
        Command::Scenario { command: ScenarioCommand::Run { update, compare, out, dirs } } => {
            let exe = std::env::current_exe()?;
            let opts = RunOptions { exe, compare: compare.into(), update, out, record: false };
            let ok = kin::testkit::commands::scenario_run(&dirs, &opts).await?;
            Ok(if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE })
        }
        Command::Scenario { command: ScenarioCommand::Record { dirs } } => {
            let exe = std::env::current_exe()?;
            let opts = RunOptions {
                exe,
                compare: kin::testkit::scenario::Compare::Exact,
                update: true,
                out: None,
                record: true,
            };
            let ok = kin::testkit::commands::scenario_run(&dirs, &opts).await?;
            Ok(if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE })
        }
        Command::Bench { quick, baseline, save, only, first_listing } => {
            if let Some([sessions, parent]) = first_listing.as_deref() {
                kin::testkit::bench::first_listing(sessions.as_ref(), parent, &mut std::io::stdout().lock()).await?;
                return Ok(ExitCode::SUCCESS);
            }
            let options = kin::testkit::bench::Options { quick, baseline, save, only };
            kin::testkit::bench::run(&options, &mut std::io::stdout().lock()).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Sessions { command } => match command {
            SessionsCommand::List { cwd } => {
                // As `kin run --cwd` takes it: a relative DIR from the current directory.
                let cwd = cwd.map(std::path::absolute).transpose()?;
                until_stdout_closes(kin::testkit::commands::sessions_list(&config, cwd.as_deref()))
            }
            SessionsCommand::Show { id } => until_stdout_closes(kin::testkit::commands::sessions_show(&config, &id)),
            SessionsCommand::Delete { id } => {
                kin::testkit::commands::sessions_delete(&config, &id).map(|()| ExitCode::SUCCESS)
            }
            SessionsCommand::Check { id } => {
                let clean = kin::testkit::commands::sessions_check(&config, id.as_deref())?;
                Ok(if clean { ExitCode::SUCCESS } else { ExitCode::FAILURE })
            }
        },
    }
}

/// A command that only prints (`kin sessions list | head`): its reader closing stdout ends it
/// quietly and successfully (what was wanted was read), as a closed pipe ends other tools.
fn until_stdout_closes(printed: anyhow::Result<()>) -> anyhow::Result<ExitCode> {
    let closed = |e: &anyhow::Error| {
        e.chain().any(|cause| {
            cause.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
        })
    };
    match printed {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(e) if closed(&e) => Ok(ExitCode::SUCCESS),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    #[test]
    fn a_log_line_is_cut_and_says_so() {
        let mut out = Vec::new();
        CappedLine(&mut out).write_all(b"short\n").unwrap();
        assert_eq!(out, b"short\n");
        let long = "x".repeat(40_000) + "\n";
        let mut out = Vec::new();
        CappedLine(&mut out).write_all(long.as_bytes()).unwrap();
        let text = String::from_utf8_lossy(&out);
        let note = format!(" [... {} more bytes of this log line cut]\n", long.len() - MAX_LOG_LINE_BYTES);
        assert_eq!(text.len(), MAX_LOG_LINE_BYTES + note.len());
        assert!(text.ends_with(&note), "{}", &text[text.len() - 80..]);
    }
}
