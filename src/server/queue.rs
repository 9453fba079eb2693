//! The queue: sweeps' points started as room allows (`flightdeck sweep`, `flightdeck queue`).
//!
//! A pass runs when a sweep is queued or cancelled and when a run ends, and each second
//! besides. It reads the sweeps and the runs from the store, so the queue is always what the
//! store says: a point is started once a run carrying it is recorded (the launch writes the
//! point with the run), and until then only the launch under way (`launching`) holds it. A
//! server killed mid-sweep therefore starts again with every point either recorded or
//! waiting: none lost, none started twice.
//!
//! Room: a sweep's points run at most `max_parallel` at once and within `max_ranks` ranks,
//! counted over every live run on this machine for local points (other runs take room too),
//! over the sweep's own runs for points on hosts or Slurm. Points start in order: the next
//! waits while it does not fit, so a big point is not starved by small ones behind it.
use super::launch::LaunchRequest;
use super::recovery::Outcome;
use super::Shared;
use crate::ids::RunId;
use crate::protocol::spec::ClientEnv;
use crate::protocol::{AgentCommand, Reply};
use crate::recipe::Recipe;
use crate::record::{PointState, PointStatus, RunRecord, SweepPoint, SweepRecord, SweepStatus};
use crate::store::Batch;
use crate::sync::lock;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// How often a pass runs with nothing to wake it (a run that ended while a pass was reading).
const TICK: Duration = Duration::from_secs(1);

#[derive(Default)]
pub struct Queue {
    wake: tokio::sync::Notify,
    /// Points whose launch is under way, by sweep id: no run is recorded for them yet.
    launching: std::sync::Mutex<HashMap<String, Vec<u32>>>,
    /// Points waiting or launching at the last pass: the server stays up while there are any.
    open: AtomicUsize,
    /// Held while a sweep's record is read, changed and written (a cancel, a failed launch).
    edit: tokio::sync::Mutex<()>,
    /// Sweeps whose every point has ended: passes skip them (and read no runs when only
    /// those are left).
    done: std::sync::Mutex<HashSet<String>>,
}

impl Queue {
    /// Asks for a pass now.
    pub fn poke(&self) {
        self.wake.notify_one();
    }

    pub fn is_busy(&self) -> bool {
        self.open.load(Ordering::SeqCst) > 0
    }
}

/// Starts the queue's task (after the server reattached to the runs that were live).
pub fn start(shared: &Shared) {
    let shared = shared.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shared.queue.wake.notified() => {}
                _ = tick.tick() => {}
            }
            if let Err(e) = pass(&shared).await {
                tracing::warn!("queue: {e:#}");
            }
        }
    });
}

/// What a pass reads: every sweep with its points' states and the runs behind them.
struct View {
    sweeps: Vec<SweepStatus>,
    /// Every run, for the room the live ones take.
    runs: Vec<RunRecord>,
}

/// Reads the queue: the launches under way first, then the store, so a launch that ends in
/// between is seen as its recorded run and never as a waiting point. `skip`: sweeps left out;
/// when no other sweep is stored, the runs are not read.
async fn view(shared: &Shared, skip: HashSet<String>) -> anyhow::Result<View> {
    let launching = lock(&shared.queue.launching).clone();
    let store = shared.store.clone();
    let (sweeps, runs) = tokio::task::spawn_blocking(move || {
        let sweeps: Vec<SweepRecord> = store.list_sweeps()?.into_iter().filter(|s| !skip.contains(&s.id)).collect();
        let runs = if sweeps.is_empty() { Vec::new() } else { store.list_runs()? };
        Ok::<_, crate::store::StoreError>((sweeps, runs))
    })
    .await??;
    let restarting: HashSet<RunId> = lock(&shared.restarts)
        .iter()
        .filter(|(_, outcome)| *outcome.borrow() == Outcome::Pending)
        .map(|(run, _)| run.clone())
        .collect();
    let sweeps = sweeps
        .into_iter()
        .map(|sweep| {
            let mine: Vec<&RunRecord> =
                runs.iter().filter(|r| r.sweep.as_ref().is_some_and(|p| p.sweep == sweep.id)).collect();
            let starting = launching.get(&sweep.id).cloned().unwrap_or_default();
            let points = sweep
                .states(&mine, &starting)
                .into_iter()
                .enumerate()
                .map(|(i, state)| {
                    let of_point: Vec<&&RunRecord> =
                        mine.iter().filter(|r| r.sweep.as_ref().is_some_and(|p| p.point == i as u32)).collect();
                    let newest = match &state {
                        PointState::Run { run, .. } => of_point.iter().find(|r| &r.id == run).copied(),
                        _ => None,
                    };
                    PointStatus {
                        restarting: matches!(&state, PointState::Run { run, .. } if restarting.contains(run)),
                        step: newest.map_or(0, |r| r.step),
                        steps: newest.map_or(0, |r| r.steps_planned),
                        last_loss: newest.and_then(|r| r.last_loss),
                        attempts: of_point.len() as u32,
                        state,
                    }
                })
                .collect();
            SweepStatus { sweep, points }
        })
        .collect();
    Ok(View { sweeps, runs })
}

/// Whether a point takes room now: live, launching, or ended with a restart on the way.
fn holds_room(p: &PointStatus) -> bool {
    p.state.is_live() || p.restarting
}

async fn pass(shared: &Shared) -> anyhow::Result<()> {
    let done = lock(&shared.queue.done).clone();
    let view = view(shared, done).await?;
    for s in &view.sweeps {
        if s.points.iter().all(|p| !(p.state.is_open() || holds_room(p))) {
            lock(&shared.queue.done).insert(s.sweep.id.clone());
        }
    }
    let mut local_in_use: u32 = view
        .runs
        .iter()
        .filter(|r| r.status.is_live() && r.hosts.iter().all(|h| h == "local"))
        .map(|r| r.world_size)
        .sum();
    // Launching points have no run yet, and restarting ones have none live: their ranks count
    // from their specs.
    for s in &view.sweeps {
        for (p, spec) in s.points.iter().zip(&s.sweep.points) {
            if (p.state == PointState::Launching || p.restarting) && spec.local {
                local_in_use += spec.world_size;
            }
        }
    }
    let mut open = 0;
    for s in &view.sweeps {
        open += s.points.iter().filter(|p| p.state.is_open()).count();
        let mut live = s.points.iter().filter(|p| holds_room(p)).count() as u32;
        let mut own_in_use: u32 =
            s.points.iter().zip(&s.sweep.points).filter(|(p, _)| holds_room(p)).map(|(_, spec)| spec.world_size).sum();
        for (i, (p, spec)) in s.points.iter().zip(&s.sweep.points).enumerate() {
            if p.state != PointState::Waiting {
                continue;
            }
            let in_use = if spec.local { local_in_use } else { own_in_use };
            if live >= s.sweep.max_parallel || in_use + spec.world_size > s.sweep.max_ranks {
                break;
            }
            live += 1;
            own_in_use += spec.world_size;
            if spec.local {
                local_in_use += spec.world_size;
            }
            start_point(shared, &s.sweep, i as u32);
        }
    }
    shared.queue.open.store(open, Ordering::SeqCst);
    Ok(())
}

/// Launches one point on a task of its own; a launch that fails is recorded on the sweep and
/// not tried again (a bad host or a full disk would fail every time).
fn start_point(shared: &Shared, sweep: &SweepRecord, point: u32) {
    lock(&shared.queue.launching).entry(sweep.id.clone()).or_default().push(point);
    let (shared, sweep) = (shared.clone(), sweep.clone());
    tokio::spawn(async move {
        let label = format!("sweep {} point {} ({})", sweep.name, point + 1, sweep.label(point));
        match launch_point(&shared, &sweep, point).await {
            Ok(run) => {
                tracing::info!("{label}: run {run}");
                // Cancelled while it launched: it goes as a live point would.
                let (store, id) = (shared.store.clone(), sweep.id.clone());
                let now = tokio::task::spawn_blocking(move || store.get_sweep(&id)).await;
                if matches!(now, Ok(Ok(Some(s))) if s.cancelled.contains(&point)) {
                    let tx = lock(&shared.registry).get(&run).map(|l| l.commands.clone());
                    if let Some(tx) = tx {
                        let _ = tx.send(AgentCommand::Kill).await;
                    }
                }
            }
            Err(e) => {
                let reason = format!("{e:#}");
                tracing::warn!("{label}: the launch failed: {reason}");
                let id = sweep.id.clone();
                if let Err(e) = edit(&shared, &id, |s| s.launch_failed.push((point, reason))).await {
                    tracing::error!("{label}: recording the failed launch: {e:#}");
                }
            }
        }
        if let Some(points) = lock(&shared.queue.launching).get_mut(&sweep.id) {
            points.retain(|p| *p != point);
        }
        shared.queue.poke();
    });
}

async fn launch_point(shared: &Shared, sweep: &SweepRecord, point: u32) -> anyhow::Result<RunId> {
    let spec = sweep.points.get(point as usize).ok_or_else(|| anyhow::anyhow!("no point {point}"))?;
    let recipe: Recipe = serde_json::from_str(&spec.recipe_json)?;
    let init = super::init::resolve(shared, &recipe).await?;
    let env: ClientEnv = serde_json::from_str(&sweep.env_json).unwrap_or_default();
    let req = LaunchRequest {
        recipe_json: spec.recipe_json.clone(),
        recipe_path: sweep.recipe_path.clone(),
        name: Some(spec.run_name.clone()),
        lineage: None,
        init,
        env,
        sweep: Some(SweepPoint { sweep: sweep.id.clone(), point }),
        carry: None,
    };
    super::launch::launch(shared, req, None).await
}

/// Reads a sweep, changes it and writes it back, one change at a time.
async fn edit(shared: &Shared, id: &str, change: impl FnOnce(&mut SweepRecord)) -> anyhow::Result<SweepRecord> {
    let _one = shared.queue.edit.lock().await;
    let (store, q) = (shared.store.clone(), id.to_string());
    let mut sweep = tokio::task::spawn_blocking(move || store.resolve_sweep(&q)).await??;
    change(&mut sweep);
    let mut batch = Batch::default();
    batch.sweeps.push(sweep.clone());
    shared.ingest.write(batch).await.map_err(anyhow::Error::msg)?;
    Ok(sweep)
}

/// `Request::Sweep`: fills in the id, the time and the capacity, stores the sweep and wakes
/// the queue.
pub async fn submit(shared: &Shared, mut sweep: SweepRecord, env: ClientEnv) -> anyhow::Result<Reply> {
    if sweep.points.is_empty() {
        anyhow::bail!("the sweep has no points");
    }
    let widest = sweep.points.iter().map(|p| p.world_size).max().unwrap_or(1);
    if sweep.max_ranks == 0 {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
        // Local points share this machine's cores; points elsewhere run one at a time unless
        // the recipe says how many of their ranks may run at once.
        sweep.max_ranks = if sweep.points.iter().all(|p| p.local) { cores.max(widest) } else { widest };
    }
    if widest > sweep.max_ranks {
        anyhow::bail!(
            "a point of sweep {} needs {widest} ranks, more than sweep.max_ranks = {}: no point that size could start",
            sweep.name,
            sweep.max_ranks
        );
    }
    sweep.id = RunId::new_now().0;
    sweep.created_ms = crate::ids::unix_ms();
    sweep.env_json = serde_json::to_string(&env)?;
    let mut batch = Batch::default();
    batch.sweeps.push(sweep.clone());
    shared.ingest.write(batch).await.map_err(anyhow::Error::msg)?;
    tracing::info!("sweep {} ({}): {} points queued", sweep.name, sweep.id, sweep.points.len());
    shared.queue.open.fetch_add(sweep.points.len(), Ordering::SeqCst);
    shared.queue.poke();
    Ok(Reply::Swept { sweep })
}

/// `Request::Queue`: sweeps with a point waiting, launching or live (every sweep with `all`).
pub async fn list(shared: &Shared, all: bool) -> anyhow::Result<Reply> {
    let view = view(shared, HashSet::new()).await?;
    let sweeps = view
        .sweeps
        .into_iter()
        .filter(|s| all || s.points.iter().any(|p| p.state.is_open() || holds_room(p)))
        .collect();
    Ok(Reply::Queue { sweeps })
}

/// `Request::Cancel`: `SWEEP` (every point) or `SWEEP:N` (point N, from 1). Waiting points are
/// marked cancelled; live ones are killed.
pub async fn cancel(shared: &Shared, target: &str) -> anyhow::Result<Reply> {
    let (query, only) = match target.rsplit_once(':') {
        Some((q, n)) if n.parse::<u32>().is_ok() => {
            let n: u32 = n.parse().unwrap_or(0);
            if n == 0 {
                anyhow::bail!("{target}: points are numbered from 1");
            }
            (q, Some(n - 1))
        }
        _ => (target, None),
    };
    let view = view(shared, HashSet::new()).await?;
    let store = shared.store.clone();
    let q = query.to_string();
    let id = tokio::task::spawn_blocking(move || store.resolve_sweep(&q)).await??.id;
    let Some(status) = view.sweeps.into_iter().find(|s| s.sweep.id == id) else {
        anyhow::bail!("sweep {query} vanished");
    };
    if let Some(n) = only.filter(|n| *n as usize >= status.points.len()) {
        anyhow::bail!("sweep {} has {} points; there is no point {}", status.sweep.name, status.points.len(), n + 1);
    }
    let chosen = |i: usize| only.is_none_or(|n| n as usize == i);
    let waiting: Vec<u32> = (0..status.points.len())
        .filter(|i| chosen(*i) && matches!(status.points[*i].state, PointState::Waiting | PointState::Launching))
        .map(|i| i as u32)
        .collect();
    let live: Vec<RunId> = status
        .points
        .iter()
        .enumerate()
        .filter(|(i, _)| chosen(*i))
        .filter_map(|(_, p)| match &p.state {
            PointState::Run { run, status } if status.is_live() => Some(run.clone()),
            _ => None,
        })
        .collect();
    let marked = waiting.clone();
    edit(shared, &id, move |s| {
        for p in marked {
            if !s.cancelled.contains(&p) {
                s.cancelled.push(p);
            }
        }
    })
    .await?;
    let mut killed = Vec::new();
    for run in live {
        let tx = lock(&shared.registry).get(&run).map(|l| l.commands.clone());
        if let Some(tx) = tx {
            if tx.send(AgentCommand::Kill).await.is_ok() {
                killed.push(run);
            }
        }
    }
    shared.queue.poke();
    Ok(Reply::Cancelled { sweep: status.sweep.name, points: waiting.iter().map(|p| p + 1).collect(), killed })
}
