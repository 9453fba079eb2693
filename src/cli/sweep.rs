//! `flightdeck sweep RECIPE` (a grid or random sweep, each point a run, queued onto the room
//! the server knows) and `flightdeck queue` (what waits and what runs; `--cancel`).
use super::output;
use super::{EXIT_BAD_INPUT, EXIT_FAILURE};
use crate::client::Client;
use crate::paths::DbPaths;
use crate::protocol::{Reply, Request};
use crate::record::{PointState, SweepPointSpec, SweepRecord, SweepStatus};
use crate::store::RunStatus;
use std::path::PathBuf;
use std::time::Duration;

/// How often `sweep --wait` looks at the queue.
const WAIT_POLL: Duration = Duration::from_millis(500);

#[derive(clap::Args, Debug)]
pub struct SweepArgs {
    /// The recipe file (TOML), with a [sweep] table, or swept with --set-grid.
    pub recipe: PathBuf,
    /// Override a recipe key for every point: `--set train.steps=60` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub overrides: Vec<String>,
    /// Sweep a key over values: `--set-grid train.lr=1e-3,3e-3` (repeatable; adds to
    /// [sweep.grid], or replaces a key it has).
    #[arg(long = "set-grid", value_name = "KEY=V1,V2")]
    pub set_grid: Vec<String>,
    /// A name for the sweep (default: sweep.name, else the recipe's name + "-sweep"); point N's
    /// run is named NAME.N.
    #[arg(long)]
    pub name: Option<String>,
    /// Runs of the sweep live at once, at most (overrides sweep.max_parallel).
    #[arg(long)]
    pub max_parallel: Option<u32>,
    /// Ranks live at once, at most (overrides sweep.max_ranks; default: this machine's cores
    /// for local points, one point at a time on hosts).
    #[arg(long)]
    pub max_ranks: Option<u32>,
    /// Print the points and queue nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Wait until every point has ended, printing each end; exit 0 when every point succeeded.
    #[arg(long)]
    pub wait: bool,
}

#[derive(clap::Args, Debug)]
pub struct QueueArgs {
    /// Every sweep, finished ones too.
    #[arg(long)]
    pub all: bool,
    /// One JSON document (docs/json.md) instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Cancel points: SWEEP (id, prefix or name) for all of its points, SWEEP:N for point N.
    /// Waiting points never start; running ones are killed.
    #[arg(long, value_name = "SWEEP[:N]")]
    pub cancel: Option<String>,
}

pub async fn sweep(db: &DbPaths, args: SweepArgs) -> anyhow::Result<i32> {
    let plan = match crate::recipe::load_sweep(&args.recipe, &args.overrides, &args.set_grid) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("flightdeck: {e}");
            return Ok(EXIT_BAD_INPUT);
        }
    };
    for (flag, v) in [("--max-parallel", args.max_parallel), ("--max-ranks", args.max_ranks)] {
        if v == Some(0) {
            eprintln!("flightdeck: {flag} 0: give at least 1");
            return Ok(EXIT_BAD_INPUT);
        }
    }
    let name = args.name.clone().unwrap_or(plan.name.clone());
    let mut points = Vec::with_capacity(plan.points.len());
    for (i, p) in plan.points.iter().enumerate() {
        points.push(SweepPointSpec {
            values: p.values.clone(),
            recipe_json: serde_json::to_string(&p.recipe)?,
            run_name: format!("{name}.{}", i + 1),
            world_size: p.recipe.world_size(),
            local: p.recipe.is_local(),
        });
    }
    let sweep = SweepRecord {
        id: String::new(),
        name,
        recipe_path: args.recipe.display().to_string(),
        created_ms: 0,
        keys: plan.keys.clone(),
        max_parallel: args.max_parallel.or(plan.max_parallel).unwrap_or(points.len() as u32),
        max_ranks: args.max_ranks.or(plan.max_ranks).unwrap_or(0),
        points,
        cancelled: Vec::new(),
        launch_failed: Vec::new(),
        env_json: String::new(),
    };
    print_points(&sweep);
    if args.dry_run {
        println!("(--dry-run: nothing queued)");
        return Ok(0);
    }
    let mut client = Client::connect(db).await?;
    let env = crate::protocol::spec::ClientEnv::from_env();
    let sweep = match client.request(&Request::Sweep { sweep, env }).await? {
        Reply::Swept { sweep } => sweep,
        Reply::Error { message } => {
            eprintln!("flightdeck: {message}");
            return Ok(EXIT_BAD_INPUT);
        }
        other => anyhow::bail!("unexpected reply: {other:?}"),
    };
    println!(
        "sweep {} ({}): {} points queued, at most {} at once within {} ranks; `flightdeck queue` shows them",
        sweep.name,
        sweep.id,
        sweep.points.len(),
        sweep.max_parallel,
        sweep.max_ranks
    );
    if !args.wait {
        return Ok(0);
    }
    wait(db, &sweep.id).await
}

/// The points as a table: number, each swept value, the run name it will have.
fn print_points(sweep: &SweepRecord) {
    let widths: Vec<usize> = sweep
        .keys
        .iter()
        .enumerate()
        .map(|(k, key)| sweep.points.iter().map(|p| p.values[k].len()).max().unwrap_or(0).max(key.len()))
        .collect();
    let row = |cells: Vec<&str>| -> String {
        cells.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect::<Vec<_>>().join("  ")
    };
    println!("{:>4}  {}  RUN", "#", row(sweep.keys.iter().map(String::as_str).collect()));
    for (i, p) in sweep.points.iter().enumerate() {
        println!("{:>4}  {}  {}", i + 1, row(p.values.iter().map(String::as_str).collect()), p.run_name);
    }
}

/// Follows a sweep until no point waits or runs; says each point's end once. The server may
/// go and come back meanwhile (each look connects, which starts it again).
async fn wait(db: &DbPaths, id: &str) -> anyhow::Result<i32> {
    let mut said = std::collections::BTreeSet::new();
    let mut tick = tokio::time::interval(WAIT_POLL);
    loop {
        tick.tick().await;
        let status = match ask_queue(db, true).await? {
            Ok(sweeps) => sweeps.into_iter().find(|s| s.sweep.id == id),
            Err(message) => anyhow::bail!("{message}"),
        };
        let Some(status) = status else { anyhow::bail!("sweep {id} is no longer in the history") };
        for (i, p) in status.points.iter().enumerate() {
            let done = !(p.state.is_open() || p.state.is_live() || p.restarting);
            if done && said.insert(i) {
                let run = match &p.state {
                    PointState::Run { run, .. } => format!(" run {run}"),
                    _ => String::new(),
                };
                let loss = p.last_loss.map(|l| format!(", loss {l:.4}")).unwrap_or_default();
                println!("point {} ({}): {}{run}{loss}", i + 1, status.sweep.label(i as u32), p.state.word());
            }
        }
        if said.len() == status.points.len() {
            let ok =
                status.points.iter().all(|p| matches!(p.state, PointState::Run { status: RunStatus::Succeeded, .. }));
            println!("sweep {}: {}", status.sweep.name, summary(&status));
            return Ok(if ok { 0 } else { EXIT_FAILURE });
        }
    }
}

async fn ask_queue(db: &DbPaths, all: bool) -> anyhow::Result<Result<Vec<SweepStatus>, String>> {
    let mut client = Client::connect(db).await?;
    Ok(match client.request(&Request::Queue { all }).await? {
        Reply::Queue { sweeps } => Ok(sweeps),
        Reply::Error { message } => Err(message),
        other => anyhow::bail!("unexpected reply: {other:?}"),
    })
}

/// `4 points: 2 succeeded, 1 running, 1 waiting`.
fn summary(s: &SweepStatus) -> String {
    let mut counts: Vec<(&str, usize)> = Vec::new();
    for p in &s.points {
        let word = if p.restarting { "restarting" } else { p.state.word() };
        match counts.iter_mut().find(|(w, _)| *w == word) {
            Some(c) => c.1 += 1,
            None => counts.push((word, 1)),
        }
    }
    let parts: Vec<String> = counts.iter().map(|(w, n)| format!("{n} {w}")).collect();
    format!("{} points: {}", s.points.len(), parts.join(", "))
}

pub async fn queue(db: &DbPaths, args: QueueArgs) -> anyhow::Result<i32> {
    if let Some(target) = &args.cancel {
        let mut client = Client::connect(db).await?;
        return match client.request(&Request::Cancel { target: target.clone() }).await? {
            Reply::Cancelled { sweep, points, killed } => {
                let points: Vec<String> = points.iter().map(u32::to_string).collect();
                let killed: Vec<String> = killed.iter().map(|r| r.to_string()).collect();
                println!(
                    "sweep {sweep}: {} cancelled; {} killed",
                    if points.is_empty() {
                        "no waiting point".to_string()
                    } else {
                        format!("points {}", points.join(", "))
                    },
                    if killed.is_empty() { "no run".to_string() } else { format!("runs {}", killed.join(", ")) }
                );
                Ok(0)
            }
            Reply::Error { message } => {
                eprintln!("flightdeck: {message}");
                Ok(EXIT_BAD_INPUT)
            }
            other => anyhow::bail!("unexpected reply: {other:?}"),
        };
    }
    let sweeps = match ask_queue(db, args.all).await? {
        Ok(s) => s,
        Err(message) => {
            eprintln!("flightdeck: {message}");
            return Ok(EXIT_BAD_INPUT);
        }
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&output::queue_json(&sweeps))?);
        return Ok(0);
    }
    if sweeps.is_empty() {
        let more = if args.all { "" } else { " (`flightdeck queue --all` lists finished sweeps)" };
        println!("nothing queued or running{more}");
        return Ok(0);
    }
    for s in &sweeps {
        println!(
            "sweep {} ({}): {}; at most {} at once within {} ranks",
            s.sweep.name,
            s.sweep.id,
            summary(s),
            s.sweep.max_parallel,
            s.sweep.max_ranks
        );
        let keys = s.sweep.keys.join("  ");
        println!("{:>4}  {:<12} {:<22} {:>11} {:>9}  {keys}", "#", "STATE", "RUN", "STEP", "LOSS");
        for (i, (p, spec)) in s.points.iter().zip(&s.sweep.points).enumerate() {
            let run = match &p.state {
                PointState::Run { run, .. } => run.to_string(),
                PointState::LaunchFailed { reason } => reason.chars().take(60).collect(),
                _ => "-".into(),
            };
            let state = if p.restarting { "restarting" } else { p.state.word() };
            let step = if p.steps > 0 { format!("{}/{}", p.step, p.steps) } else { "-".into() };
            let loss = p.last_loss.map_or("-".into(), |l| format!("{l:.4}"));
            println!("{:>4}  {state:<12} {run:<22} {step:>11} {loss:>9}  {}", i + 1, spec.values.join("  "));
        }
    }
    Ok(0)
}
