//! The command line (DESIGN §3): parses arguments and dispatches to each subcommand.
mod ckpts;
mod doctor;
mod doctor_gpu;
mod doctor_hosts;
mod doctor_slurm;
mod export;
mod import;
mod output;
pub mod parse_log;
mod query;
mod report;
mod resume;
mod run;
mod stacks;
mod sweep;

use crate::paths::{db_dir, DbPaths};
use clap::{Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(name = "flightdeck", version, about = "A terminal cockpit for distributed training runs")]
pub struct Cli {
    /// The history database directory (default: $FLIGHTDECK_HOME, else the XDG data dir).
    #[arg(long, global = true)]
    pub db: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Option<Cmd>,
}

#[derive(Subcommand, Debug)]
pub enum Cmd {
    /// Launch a recipe.
    Run(run::RunArgs),
    /// Run history.
    Runs {
        /// One JSON document (docs/json.md) instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// One run: recipe, ranks, events, summary.
    Show {
        /// The run: full id, unique prefix, or name.
        run: String,
        /// One JSON document (docs/json.md) instead of the text.
        #[arg(long)]
        json: bool,
    },
    /// A run's metric series.
    Metrics(query::MetricsArgs),
    /// Graceful stop: every rank stops at the next step boundary and saves a checkpoint.
    Stop {
        /// The run: full id, unique prefix, or name.
        run: String,
    },
    /// Immediate SIGKILL of every rank.
    Kill {
        /// The run: full id, unique prefix, or name.
        run: String,
    },
    /// Check libtorch, NVML, NCCL, disk and ports on this machine, or on nodes (`--hosts`).
    Doctor(doctor::DoctorArgs),
    /// The database owner; normally started on demand by any client.
    Server {
        /// Log to stderr (default: to server.log in the database directory).
        #[arg(long)]
        foreground: bool,
    },
    /// Internal: a node agent, started by launchers.
    #[command(hide = true)]
    Agent(AgentArgs),
    /// Internal: a training rank, started by agents with the torchrun environment.
    #[command(hide = true)]
    Worker,
    /// Reopen the cockpit's live panels of a run (id, unique prefix or name).
    Attach {
        /// The run: full id, unique prefix, or name.
        run: String,
        /// Follow it with progress lines instead of the cockpit, as `run --headless` does;
        /// exit with its outcome.
        #[arg(long)]
        headless: bool,
    },
    /// A run's checkpoints: step, loss, size, age, verified.
    Ckpts {
        /// The run: full id, unique prefix, or name.
        run: String,
        /// One JSON document (docs/json.md) instead of the table.
        #[arg(long)]
        json: bool,
        /// Re-read every file and check its sha256 against the manifest (default: sizes only).
        #[arg(long)]
        verify: bool,
    },
    /// A child run from a verified checkpoint of RUN (default: the newest one).
    Resume(resume::ResumeArgs),
    /// Dump the stacks of a live run's ranks (all, or --rank R), identical ones grouped.
    Stacks(stacks::StacksArgs),
    /// Read a framework's log file (Megatron, DeepSpeed, HF/TRL, verl, torchtitan, ...) into
    /// records: one JSON object per line with metrics or a failure (docs/json.md).
    ParseLog(parse_log::ParseLogArgs),
    /// Bring a finished run's logs (a file, per-rank logs, torchrun's --log-dir) or TensorBoard
    /// events into the history, to open and compare like any run.
    Import(import::ImportArgs),
    /// Write runs' metrics, events and checkpoints as CSV, JSON lines, TensorBoard event files or Parquet.
    Export(export::ExportArgs),
    /// A markdown report with charts (SVG and PNG) of a run, or a comparison of several.
    Report(report::ReportArgs),
    /// A grid or random sweep of a recipe ([sweep], --set-grid): each point a run, queued
    /// onto the room this server knows.
    Sweep(sweep::SweepArgs),
    /// What waits and what runs: every sweep with a point queued or live (--all: every sweep);
    /// --cancel SWEEP[:N].
    Queue(sweep::QueueArgs),
    /// Internal: the cockpit's rendering benchmark on synthetic telemetry (docs/benchmarks.md).
    #[command(hide = true)]
    BenchUi(crate::ui::bench::BenchArgs),
}

/// Exit codes: 0 success, 1 failure (a run failed or was killed, a server error), 2 bad input
/// (a recipe, an unknown run or metric), 3 a followed run stopped on request (docs/cli.md).
pub const EXIT_FAILURE: i32 = 1;
pub const EXIT_BAD_INPUT: i32 = 2;
pub const EXIT_STOPPED: i32 = 3;
/// A headless follower left its run going: a second Ctrl-C (or SIGTERM) after the first asked
/// for a stop, or its terminal went away (SIGHUP). 130 as a shell reports a Ctrl-C.
pub const EXIT_DETACHED: i32 = 130;

pub fn main() -> i32 {
    // Before anything is created or any thread starts: what this process writes is private.
    crate::private_files::restrict();
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { EXIT_BAD_INPUT } else { 0 };
        }
    };
    let db = DbPaths::new(db_dir(cli.db.as_deref()));
    if let Some(cmd) = &cli.command {
        quiet_on_closed_pipe(cmd);
    }
    let result = match cli.command {
        None => client_runtime().and_then(|rt| rt.block_on(crate::ui::run(&db, crate::ui::Start::Home))),
        Some(Cmd::Server { foreground }) => crate::server::main(db, foreground).map(|_| 0),
        Some(Cmd::Agent(args)) => agent(args),
        Some(Cmd::Worker) => worker(),
        Some(Cmd::Doctor(args)) => doctor::main(&db, args),
        Some(Cmd::ParseLog(args)) => parse_log::parse_log(args),
        Some(cmd) => client_runtime().and_then(|rt| rt.block_on(client_command(&db, cmd))),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("flightdeck: {e:#}");
            EXIT_FAILURE
        }
    }
}

/// Commands whose output is made for pipes end quietly when their reader goes away (`| head`),
/// as `cat` and `grep` do, instead of an error line or a panic from the next print: SIGPIPE
/// goes back to its default there. The server, agents and ranks keep it ignored, so a closed
/// socket is an error they handle.
fn quiet_on_closed_pipe(cmd: &Cmd) {
    let printer = matches!(
        cmd,
        Cmd::Runs { .. } | Cmd::Show { .. } | Cmd::Metrics(_) | Cmd::Ckpts { .. } | Cmd::ParseLog(_) | Cmd::Queue(_)
    );
    if printer {
        // SAFETY: resetting a signal's disposition, before any other thread exists.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
}

#[cfg(feature = "torch")]
fn worker() -> anyhow::Result<i32> {
    match crate::worker::main_from_env() {
        Ok(()) => Ok(0),
        Err(e) => match crate::worker::exit_code(&e) {
            Some(code) => {
                eprintln!("flightdeck: {e:#}");
                Ok(code)
            }
            None => Err(e),
        },
    }
}

#[cfg(not(feature = "torch"))]
fn worker() -> anyhow::Result<i32> {
    anyhow::bail!("this flightdeck was built without the `torch` feature: it cannot run the worker")
}

fn client_runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread().enable_all().build()?)
}

async fn client_command(db: &DbPaths, cmd: Cmd) -> anyhow::Result<i32> {
    match cmd {
        Cmd::Run(args) => run::run(db, args).await,
        Cmd::Runs { json } => query::runs(db, json).await,
        Cmd::Show { run, json } => query::show(db, &run, json).await,
        Cmd::Metrics(args) => query::metrics(db, args).await,
        Cmd::Stop { run } => query::stop_or_kill(db, &run, false).await,
        Cmd::Kill { run } => query::stop_or_kill(db, &run, true).await,
        Cmd::Attach { run, headless } => query::attach(db, &run, headless).await,
        Cmd::Ckpts { run, json, verify } => ckpts::ckpts(db, &run, json, verify).await,
        Cmd::Resume(args) => resume::resume(db, args).await,
        Cmd::Stacks(args) => stacks::stacks(db, args).await,
        Cmd::Import(args) => import::import(db, args).await,
        Cmd::Export(args) => export::export(db, args).await,
        Cmd::Report(args) => report::report(db, args).await,
        Cmd::Sweep(args) => sweep::sweep(db, args).await,
        Cmd::Queue(args) => sweep::queue(db, args).await,
        Cmd::BenchUi(args) => crate::ui::bench::run(args).await,
        Cmd::Server { .. } | Cmd::Agent(_) | Cmd::Worker | Cmd::Doctor(_) | Cmd::ParseLog(_) => unreachable_command(),
    }
}

fn unreachable_command() -> anyhow::Result<i32> {
    anyhow::bail!("internal: this command is not a client command")
}

/// `flightdeck agent --run-dir DIR` runs a node's agent; `start` and `connect` serve SSH launchers.
#[derive(clap::Args, Debug)]
pub struct AgentArgs {
    #[command(subcommand)]
    pub action: Option<AgentAction>,
    /// The node's run directory (with its spec.json).
    #[arg(long)]
    pub run_dir: Option<PathBuf>,
}

#[derive(Subcommand, Debug)]
pub enum AgentAction {
    /// Start the agent detached, wait until it is ready, print `ready PID PORT`.
    Start {
        #[arg(long)]
        run_dir: PathBuf,
    },
    /// Bridge stdin/stdout to the agent's socket (the SSH transport's far end).
    Connect {
        #[arg(long)]
        run_dir: PathBuf,
    },
    /// Run a node's agent as a Slurm step's task (started by the Slurm launcher through srun).
    Slurm,
    /// Choose a checkpoint under ROOT on this node as `resume` does (the one at --step, else the
    /// newest whose every file matches its sha256) and print the choice as one JSON line.
    Checkpoint {
        #[arg(long)]
        root: PathBuf,
        #[arg(long)]
        step: Option<u64>,
    },
}

fn agent(args: AgentArgs) -> anyhow::Result<i32> {
    match (args.action, args.run_dir) {
        (Some(AgentAction::Start { run_dir }), _) => crate::agent::remote::start(run_dir),
        (Some(AgentAction::Connect { run_dir }), _) => crate::agent::remote::connect(run_dir),
        (Some(AgentAction::Slurm), _) => crate::slurm::node::main().map(|_| 0),
        (Some(AgentAction::Checkpoint { root, step }), _) => Ok(crate::agent::remote::checkpoint(&root, step)),
        (None, Some(run_dir)) => crate::agent::main(run_dir).map(|_| 0),
        (None, None) => anyhow::bail!("flightdeck agent needs --run-dir DIR (it is started by launchers)"),
    }
}

#[cfg(test)]
mod tests {
    use super::Cli;
    use clap::CommandFactory;

    /// `--help` of every command a user can see explains every argument, positional ones too.
    #[test]
    fn every_visible_argument_has_help_text() {
        let cli = Cli::command();
        let mut bare = Vec::new();
        for cmd in cli.get_subcommands().filter(|c| !c.is_hide_set()) {
            for arg in cmd.get_arguments().filter(|a| !a.is_hide_set()) {
                let id = arg.get_id().as_str();
                if id != "help" && id != "version" && arg.get_help().is_none() {
                    bare.push(format!("{} {id}", cmd.get_name()));
                }
            }
        }
        assert!(bare.is_empty(), "arguments without help text: {bare:?}");
    }

    /// A flag with a default is shown as optional in the usage line.
    #[test]
    fn metrics_usage_shows_key_as_optional() {
        let mut cli = Cli::command();
        let metrics = cli.find_subcommand_mut("metrics").expect("metrics");
        let usage = metrics.render_usage().to_string();
        assert!(usage.contains("[--key <KEY>]") || usage.contains("[OPTIONS]"), "{usage}");
        assert!(!usage.contains(" --key <KEY> "), "{usage}");
    }
}
