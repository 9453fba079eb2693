//! Launching a run on the embedded local runtime: the run record, the run directory, and a
//! detached agent. SSH hosts go to `remote.rs`; both share everything above the transport.
use super::ingest::Ingest;
use super::tracker::Tracker;
use super::Registry;
use crate::agent::AgentSpec;
use crate::ids::{unix_ms, Rank, RunId};
use crate::paths::{DbPaths, RunDirPaths};
use crate::recipe::Recipe;
use crate::store::{Batch, EventKind, EventRecord, RunRecord, RunStatus};
use anyhow::Context;
use std::io::BufRead;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

/// SIGTERM-to-SIGKILL grace when stopping ranks.
const STOP_GRACE_MS: u64 = 5000;

pub async fn launch(
    db: &DbPaths,
    recipe_json: &str,
    recipe_path: &str,
    name: Option<String>,
    ingest: &Ingest,
    registry: &Registry,
) -> anyhow::Result<RunId> {
    let recipe: Recipe =
        serde_json::from_str(recipe_json).context("the client sent a recipe this server cannot read")?;
    if !recipe.is_local() {
        return super::remote::launch(db, recipe, recipe_json, recipe_path, name, ingest, registry).await;
    }
    let run = RunId::new_now();
    let paths = RunDirPaths::new(db.run_dir(&run));
    std::fs::create_dir_all(&paths.root).with_context(|| format!("creating {}", paths.root.display()))?;
    std::fs::write(paths.recipe(), recipe_json)?;
    let world = recipe.world_size();
    let spec = AgentSpec {
        run: run.clone(),
        node: "local".into(),
        ranks: (0..world).map(|r| (Rank(r), r)).collect(),
        world_size: world,
        master_addr: "127.0.0.1".into(),
        master_port: 0,
        host_store: true,
        exe: std::env::current_exe().context("locating the flightdeck executable")?,
        recipe: recipe.clone(),
        stop_grace_ms: STOP_GRACE_MS,
    };
    std::fs::write(paths.spec(), serde_json::to_vec_pretty(&spec)?)?;

    let record = RunRecord {
        id: run.clone(),
        name: name.unwrap_or_else(|| recipe.name.clone()),
        recipe_name: recipe.name.clone(),
        recipe_path: recipe_path.to_string(),
        recipe_json: recipe_json.to_string(),
        status: RunStatus::Starting,
        reason: String::new(),
        created_ms: unix_ms(),
        ended_ms: None,
        hosts: vec!["local".into()],
        world_size: world,
        steps_planned: recipe.train.steps,
        step: 0,
        last_loss: None,
        parent: None,
        agent_sockets: vec![paths.agent_socket().display().to_string()],
        acked_seq: vec![0],
    };
    let mut batch = Batch::default();
    batch.runs.push(record.clone());
    let text = format!("launched {} on local: {world} ranks", recipe.name);
    batch.events.push((run.clone(), EventRecord { t_ms: unix_ms(), kind: EventKind::RunStarted, rank: None, text }));
    ingest.write(batch).await.map_err(anyhow::Error::msg)?;

    let started = tokio::task::spawn_blocking({
        let paths = paths.clone();
        move || start_agent(&paths)
    })
    .await?;
    let mut tracker = Tracker::new(record, Vec::new());
    if let Err(e) = started {
        let mut batch = Batch::default();
        tracker.end_without_agent(RunStatus::Failed, format!("agent failed to start: {e:#}"), &mut batch);
        ingest.write(batch).await.map_err(anyhow::Error::msg)?;
        return Err(e);
    }
    super::link::attach(tracker, paths.agent_socket(), ingest.clone(), registry.clone()).await?;
    Ok(run)
}

/// Starts `flightdeck agent` in its own session and waits for its "ready" line.
fn start_agent(paths: &RunDirPaths) -> anyhow::Result<()> {
    let log = std::fs::OpenOptions::new().create(true).append(true).open(paths.agent_log())?;
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.arg("agent").arg("--run-dir").arg(&paths.root).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(log);
    // SAFETY: setsid is async-signal-safe and touches no parent memory.
    unsafe {
        cmd.pre_exec(|| {
            // Its own session: the agent survives the server, the terminal and the SSH session.
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().context("starting the agent")?;
    let mut line = String::new();
    if let Some(out) = child.stdout.take() {
        std::io::BufReader::new(out).read_line(&mut line)?;
    }
    // Reap it when it exits, so no zombie is left while this server lives.
    std::thread::spawn(move || child.wait());
    if line.trim() != "ready" {
        let tail = std::fs::read_to_string(paths.agent_log()).unwrap_or_default();
        let tail: Vec<&str> = tail.lines().rev().take(5).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        anyhow::bail!("the agent exited before it was ready; {}: {}", paths.agent_log().display(), tail.join(" | "));
    }
    Ok(())
}
