//! `flightdeck run RECIPE`: validate, launch through the server, follow until the run ends.
use super::{EXIT_BAD_INPUT, EXIT_DETACHED, EXIT_FAILURE, EXIT_STOPPED};
use crate::client::Client;
use crate::paths::DbPaths;
use crate::protocol::{Progress, Reply, Request};
use crate::store::RunStatus;
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// The recipe file (TOML).
    pub recipe: PathBuf,
    /// Override a recipe key: `--set train.steps=60` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub overrides: Vec<String>,
    /// Comma-separated hosts (overrides cluster.hosts).
    #[arg(long, value_delimiter = ',')]
    pub hosts: Vec<String>,
    /// Ranks on each host (overrides cluster.ranks_per_node).
    #[arg(long)]
    pub ranks_per_node: Option<u32>,
    /// A name for the run (default: the recipe's name).
    #[arg(long)]
    pub name: Option<String>,
    /// Print progress lines instead of opening the cockpit; exit with the run's outcome.
    #[arg(long)]
    pub headless: bool,
    /// The OpenSSH client config for host aliases (like `ssh -F`; default $FLIGHTDECK_SSH_CONFIG,
    /// else ~/.ssh/config). Sets cluster.ssh_config.
    #[arg(long, value_name = "FILE")]
    pub ssh_config: Option<PathBuf>,
    /// Trust SSH host keys seen for the first time and record them (like OpenSSH's
    /// accept-new); a changed key is still refused. Sets cluster.accept_new_host_keys.
    #[arg(long)]
    pub accept_new_host_keys: bool,
}

pub async fn run(db: &DbPaths, args: RunArgs) -> anyhow::Result<i32> {
    let mut overrides = args.overrides.clone();
    if !args.hosts.is_empty() {
        let quoted: Vec<String> = args.hosts.iter().map(|h| format!("{h:?}")).collect();
        overrides.push(format!("cluster.hosts=[{}]", quoted.join(",")));
    }
    // The client's own SSH environment ($FLIGHTDECK_SSH_CONFIG, HOME, SSH_AUTH_SOCK) travels
    // with the launch request; an explicit --ssh-config is part of the recipe.
    if let Some(path) = args.ssh_config.clone() {
        let path = std::path::absolute(&path).unwrap_or(path);
        overrides.push(format!("cluster.ssh_config={:?}", path.display().to_string()));
    }
    if args.accept_new_host_keys {
        overrides.push("cluster.accept_new_host_keys=true".to_string());
    }
    if let Some(n) = args.ranks_per_node {
        // parallel.data defaults to hosts × ranks_per_node, so the world size follows.
        overrides.push(format!("cluster.ranks_per_node={n}"));
    }
    let recipe = match crate::recipe::load_file(&args.recipe, &overrides) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("flightdeck: {e}");
            return Ok(EXIT_BAD_INPUT);
        }
    };
    if recipe.is_local() {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        if let Some(warning) = oversubscribed(recipe.cluster.ranks_per_node, cores) {
            eprintln!("flightdeck: {warning}");
        }
    }
    use std::io::IsTerminal;
    let cockpit = !args.headless && std::io::stdout().is_terminal() && std::io::stdin().is_terminal();
    if !args.headless && !cockpit {
        eprintln!("flightdeck: not a terminal: following the run headless");
    }
    let mut client = Client::connect(db).await?;
    let recipe_json = serde_json::to_string(&recipe)?;
    let req = Request::Launch {
        recipe_json,
        recipe_path: args.recipe.display().to_string(),
        name: args.name.clone(),
        env: crate::protocol::spec::ClientEnv::from_env(),
    };
    client.send(&req).await?;
    // SSH launches report each host's progress before the run id.
    let run = loop {
        match client.next().await? {
            Some(Reply::LaunchProgress { host, text }) => println!("launch {host}: {text}"),
            Some(Reply::Launched { run }) => break run,
            Some(Reply::Error { message }) => anyhow::bail!("launch failed: {message}"),
            Some(other) => anyhow::bail!("unexpected reply to launch: {other:?}"),
            None => anyhow::bail!("the server closed the connection during the launch"),
        }
    };
    println!("run {run}: {} on {} rank(s), {} steps", recipe.name, recipe.world_size(), recipe.train.steps);
    if cockpit {
        return crate::ui::run(db, crate::ui::Start::Open(run.0.clone())).await;
    }
    follow(db, client, &run).await
}

/// A warning when a local run puts more ranks on this machine than it has cores: it runs, but
/// every rank's steps share the cores, and the step times say more about the machine than the
/// run (a straggler verdict then blames the scheduler).
fn oversubscribed(ranks: u32, cores: usize) -> Option<String> {
    let cores_u32 = u32::try_from(cores).unwrap_or(u32::MAX).max(1);
    (ranks > cores_u32).then(|| {
        format!(
            "{ranks} ranks on this machine's {cores} cores: they take turns, so steps are slower and              step times noisier; `--ranks-per-node {cores}` (or cluster.ranks_per_node) gives each a core"
        )
    })
}

/// Follows a run headless: a progress line about once a second, each verdict once as it
/// appears (and again if it sharpens), then the final status; the exit code says how it ended
/// (`exit_code`). A server that goes away (killed, crashed) is started again, as any client
/// starts it, and the follower follows on from where the run is, saying so in one line.
///
/// Interrupts, as torchrun's users expect them: the first Ctrl-C (or SIGTERM, as `timeout`
/// sends) asks for a graceful stop of the run and says so, and the follower goes on until the
/// run has stopped (exit code 3); a second detaches, leaving the run to finish stopping (130).
/// A terminal that goes away (SIGHUP) detaches at once: the run goes on, as with the cockpit.
pub async fn follow(db: &DbPaths, client: Client, run: &crate::ids::RunId) -> anyhow::Result<i32> {
    // Recovery's restarts hand the follower on to each child: the run followed changes, and
    // an interrupt stops the one followed now.
    let (current_tx, current) = tokio::sync::watch::channel(run.clone());
    use tokio::signal::unix::{signal, SignalKind};
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sighup = signal(SignalKind::hangup())?;
    let following = follow_run(db, client, run.clone(), current_tx);
    tokio::pin!(following);
    let mut stopping = false;
    loop {
        let by = tokio::select! {
            code = &mut following => return code,
            _ = sigint.recv() => "Ctrl-C",
            _ = sigterm.recv() => "SIGTERM",
            _ = sighup.recv() => {
                // The terminal went away: the run goes on, as it does when the cockpit closes.
                return Ok(EXIT_DETACHED);
            }
        };
        let run = current.borrow().clone();
        if stopping {
            println!(
                "run {run}: detached ({by} again); it goes on stopping without this terminal: \
                 `flightdeck attach {run}` · `flightdeck kill {run}`"
            );
            return Ok(EXIT_DETACHED);
        }
        stopping = true;
        match stop(db, &run).await {
            Ok(()) => println!(
                "run {run}: {by}: stopping the run gracefully (every rank saves a checkpoint at its next \
                 step boundary, then exits; a command's program gets SIGTERM); {by} again detaches"
            ),
            Err(e) => {
                println!("run {run}: {by}: could not ask for a stop ({e:#}); detached: `flightdeck stop {run}`");
                return Ok(EXIT_DETACHED);
            }
        }
    }
}

/// Asks the server for a graceful stop of `run`, on a connection of its own (the follower's is
/// streaming).
async fn stop(db: &DbPaths, run: &crate::ids::RunId) -> anyhow::Result<()> {
    let mut client = Client::connect(db).await?;
    match client.request(&Request::Stop { run: run.0.clone() }).await? {
        Reply::Error { message } => anyhow::bail!("{message}"),
        _ => Ok(()),
    }
}

/// The follower's loop (`follow` adds the interrupts).
async fn follow_run(
    db: &DbPaths,
    mut client: Client,
    run: crate::ids::RunId,
    current: tokio::sync::watch::Sender<crate::ids::RunId>,
) -> anyhow::Result<i32> {
    let mut run = run;
    let run = &mut run;
    // Verdicts already printed: each is said once when it appears, and again if it sharpens
    // (stacks single out the culprit of a collective every rank entered).
    let mut said: std::collections::BTreeSet<(&'static str, u64, String)> = Default::default();
    // Reconnections in a row without a progress report between them: a server that dies at
    // every start is given up on.
    let mut tries = 0;
    loop {
        let lost = match follow_once(&mut client, run, &mut said, &mut tries, &current).await? {
            Followed::Ended(code) => return Ok(code),
            Followed::Lost(e) => e,
        };
        tries += 1;
        if tries > crate::client::RECONNECTS {
            anyhow::bail!("lost the server while following run {run} ({lost}); it goes on: `flightdeck show {run}`");
        }
        println!("run {run}: lost the server ({lost}); starting it again");
        client = Client::connect(db).await?;
        println!("run {run}: reconnected to the server; following on");
    }
}

enum Followed {
    /// The run ended: the exit code.
    Ended(i32),
    /// The connection to the server broke: why.
    Lost(String),
}

async fn follow_once(
    client: &mut Client,
    run: &mut crate::ids::RunId,
    said: &mut std::collections::BTreeSet<(&'static str, u64, String)>,
    tries: &mut u32,
    current: &tokio::sync::watch::Sender<crate::ids::RunId>,
) -> anyhow::Result<Followed> {
    if let Err(e) = client.send(&Request::Follow { run: run.0.clone() }).await {
        return Ok(Followed::Lost(format!("{e:#}")));
    }
    loop {
        let reply = match client.next_or_lost().await {
            Ok(reply) => reply,
            Err(why) => return Ok(Followed::Lost(why)),
        };
        match reply {
            Reply::Progress(p) => {
                *tries = 0;
                println!("{}", progress_line(&p));
                for v in &p.verdicts {
                    if said.insert((v.kind.name(), v.detected_ms, v.summary.clone())) {
                        println!("{}", verdict_line(&p.run, v));
                    }
                }
            }
            Reply::Ended { run, status, reason } => {
                println!("run {run} {}: {reason}", status.name());
                return Ok(Followed::Ended(exit_code(status)));
            }
            Reply::Restarted { run: ended, status, reason, child, restart } => {
                println!("run {ended} {}: {reason}", status.name());
                println!(
                    "run {ended}: recovery restarted it after a {} as run {child} (restart {})",
                    restart.cause.name(),
                    restart.attempt
                );
                *run = child;
                current.send_replace(run.clone());
            }
            Reply::Error { message } => anyhow::bail!("{message}"),
            other => anyhow::bail!("unexpected reply while following: {other:?}"),
        }
    }
}

/// A followed run's exit code: 0 succeeded, 3 stopped on request (a graceful stop saves a
/// checkpoint to resume from), 1 anything else (failed, killed, interrupted).
pub fn exit_code(status: RunStatus) -> i32 {
    match status {
        RunStatus::Succeeded => 0,
        RunStatus::Stopped => EXIT_STOPPED,
        _ => EXIT_FAILURE,
    }
}

pub fn progress_line(p: &Progress) -> String {
    let loss = p.loss_mean.map(|l| format!("{l:.4}")).unwrap_or_else(|| "-".into());
    let ms = p.step_time_ms_mean.map(|m| format!("{m:.1} ms/step")).unwrap_or_else(|| "- ms/step".into());
    format!(
        "{} step {}{} loss {loss} {ms} ranks {}/{} {}",
        p.run,
        p.step,
        if p.steps == 0 { String::new() } else { format!("/{}", p.steps) },
        p.ranks_alive,
        p.world_size,
        p.status.name()
    )
}

/// `RUN verdict never-entered after 5.1 s: rank 1 (local, pid 4121) never entered ...`.
pub fn verdict_line(run: &crate::ids::RunId, v: &crate::protocol::Verdict) -> String {
    format!("{run} verdict {} after {:.1} s: {}", v.kind.name(), v.duration_ms() as f64 / 1e3, v.summary)
}

#[cfg(test)]
mod tests {
    use super::oversubscribed;

    #[test]
    fn more_local_ranks_than_cores_is_said_and_as_many_is_not() {
        assert_eq!(oversubscribed(2, 2), None);
        assert_eq!(oversubscribed(1, 16), None);
        let w = oversubscribed(64, 2).expect("a warning");
        assert!(w.starts_with("64 ranks on this machine's 2 cores") && w.contains("--ranks-per-node 2"), "{w}");
    }
}
