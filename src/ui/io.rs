//! The live side of `Effects`: carries the cockpit's commands to the server off the UI task
//! and sends what comes back as events. One connection per request; a stream has its own.
use super::effects::{Command, DataEvent, RecipeChoice};
use super::panels::{chart::ParentLoss, ckpts::CkptList, ckpts::Resumed};
use crate::client::Client;
use crate::paths::DbPaths;
use crate::protocol::spec::ClientEnv;
use crate::protocol::{Reply, Request};
use std::collections::BTreeMap;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

pub struct ServerLink {
    db: DbPaths,
    tx: mpsc::Sender<DataEvent>,
    /// The open run's stream; replaced by the next `Open`, ended by `Close`.
    stream: Option<JoinHandle<()>>,
    /// The open run's progress stream, for its live verdicts; lives as long as `stream`.
    follow: Option<JoinHandle<()>>,
}

impl ServerLink {
    pub fn new(db: DbPaths, tx: mpsc::Sender<DataEvent>) -> ServerLink {
        ServerLink { db, tx, stream: None, follow: None }
    }

    pub fn handle(&mut self, cmd: Command) {
        let (db, tx) = (self.db.clone(), self.tx.clone());
        match cmd {
            Command::Open { run } => {
                self.close();
                let (db2, tx2, run2) = (db.clone(), tx.clone(), run.clone());
                self.stream = Some(tokio::spawn(async move {
                    if let Err(e) = stream(&db, &run, &tx).await {
                        let _ = tx.send(DataEvent::Error(format!("run {run}: {e:#}"))).await;
                    }
                }));
                // The snapshot stream carries frames, not verdicts: those ride on progress. A
                // failure here is not worth an error line (the main stream reports the run's).
                self.follow = Some(tokio::spawn(async move {
                    let _ = follow_verdicts(&db2, &run2, &tx2).await;
                }));
            }
            Command::Close => self.close(),
            other => {
                tokio::spawn(async move {
                    if let Err(e) = one(&db, other, &tx).await {
                        let _ = tx.send(DataEvent::Error(format!("{e:#}"))).await;
                    }
                });
            }
        }
    }

    fn close(&mut self) {
        if let Some(h) = self.stream.take() {
            h.abort();
        }
        if let Some(h) = self.follow.take() {
            h.abort();
        }
    }
}

impl Drop for ServerLink {
    fn drop(&mut self) {
        self.close();
    }
}

/// How a watch of the server ended.
enum Watch {
    /// The run ended or the cockpit quit: nothing more to do.
    Done,
    /// The connection broke (the server died): why.
    Lost(String),
}

/// Streams one run: its snapshot, then frames until it ends. A full event channel makes this
/// task wait, the server's broadcast then lags, and the app reloads: memory stays bounded. A
/// server that goes away is started again (as any client starts it) and the run reopened: its
/// new snapshot replaces the old one, so nothing is missed; the status line says so.
async fn stream(db: &DbPaths, run: &str, tx: &mpsc::Sender<DataEvent>) -> anyhow::Result<()> {
    let mut tries = 0;
    loop {
        let why = match stream_once(db, run, tx, &mut tries).await? {
            Watch::Done => return Ok(()),
            Watch::Lost(why) if tries < crate::client::RECONNECTS => why,
            Watch::Lost(why) => anyhow::bail!("lost the server while watching run {run} ({why})"),
        };
        tries += 1;
        let _ = tx.send(DataEvent::Done(format!("lost the server ({why}); starting it again…"))).await;
    }
}

/// One connection's worth of `stream`; `tries` > 0: a reconnection, said (and the count reset)
/// once the run reopens.
async fn stream_once(db: &DbPaths, run: &str, tx: &mpsc::Sender<DataEvent>, tries: &mut u32) -> anyhow::Result<Watch> {
    let mut c = Client::connect(db).await?;
    if let Err(e) = c.send(&Request::Open { run: run.to_string() }).await {
        return Ok(Watch::Lost(format!("{e:#}")));
    }
    let mut opened = false;
    loop {
        let reply = match c.next_or_lost().await {
            Ok(reply) => reply,
            Err(why) => return Ok(Watch::Lost(why)),
        };
        let ev = match reply {
            Reply::Error { message } if !opened => DataEvent::OpenFailed { run: run.to_string(), message },
            Reply::Snapshot(s) => {
                opened = true;
                if *tries > 0 {
                    *tries = 0;
                    let _ = tx.send(DataEvent::Done(format!("reconnected to the server; run {run} reopened"))).await;
                }
                DataEvent::Snapshot(s)
            }
            Reply::Frames { run, node, frames } => DataEvent::Frames { run, node, frames },
            Reply::Lagged { run, skipped } => DataEvent::Lagged { run, skipped },
            Reply::Ended { run, status, reason } => {
                let _ = tx.send(DataEvent::Ended { run, status, reason }).await;
                return Ok(Watch::Done);
            }
            Reply::Error { message } => anyhow::bail!("{message}"),
            other => anyhow::bail!("unexpected reply while watching: {other:?}"),
        };
        if tx.send(ev).await.is_err() {
            return Ok(Watch::Done); // the cockpit has quit
        }
    }
}

/// Follows a run's progress (about once a second while it changes) and passes its verdicts on;
/// like `stream`, it reconnects to a server started again.
async fn follow_verdicts(db: &DbPaths, run: &str, tx: &mpsc::Sender<DataEvent>) -> anyhow::Result<()> {
    let mut tries = 0;
    while tries <= crate::client::RECONNECTS {
        match follow_verdicts_once(db, run, tx, &mut tries).await? {
            Watch::Done => return Ok(()),
            Watch::Lost(_) => tries += 1,
        }
    }
    Ok(())
}

async fn follow_verdicts_once(
    db: &DbPaths,
    run: &str,
    tx: &mpsc::Sender<DataEvent>,
    tries: &mut u32,
) -> anyhow::Result<Watch> {
    let mut c = Client::connect(db).await?;
    if let Err(e) = c.send(&Request::Follow { run: run.to_string() }).await {
        return Ok(Watch::Lost(format!("{e:#}")));
    }
    loop {
        let reply = match c.next_or_lost().await {
            Ok(reply) => reply,
            Err(why) => return Ok(Watch::Lost(why)),
        };
        match reply {
            Reply::Progress(p) => {
                *tries = 0;
                let ev = DataEvent::Verdicts { run: p.run, verdicts: p.verdicts, incidents: p.incidents };
                if tx.send(ev).await.is_err() {
                    return Ok(Watch::Done);
                }
            }
            Reply::Restarted { run, child, restart, .. } => {
                let _ = tx.send(DataEvent::Restarted { run, child, restart }).await;
                return Ok(Watch::Done);
            }
            _ => return Ok(Watch::Done),
        }
    }
}

async fn request(db: &DbPaths, req: Request) -> anyhow::Result<Reply> {
    let mut c = Client::connect(db).await?;
    match c.request(&req).await? {
        Reply::Error { message } => anyhow::bail!("{message}"),
        r => Ok(r),
    }
}

async fn one(db: &DbPaths, cmd: Command, tx: &mpsc::Sender<DataEvent>) -> anyhow::Result<()> {
    let ev = match cmd {
        Command::ListRuns => match request(db, Request::ListRuns).await? {
            Reply::Runs { runs } => DataEvent::Runs(runs),
            other => anyhow::bail!("unexpected reply to the runs list: {other:?}"),
        },
        Command::Launch { recipe, overrides } => {
            let path = recipe.clone();
            let loaded = tokio::task::spawn_blocking(move || crate::recipe::load_file(&path, &overrides)).await?;
            let r = loaded.map_err(|e| anyhow::anyhow!("{e}"))?;
            let req = Request::Launch {
                recipe_json: serde_json::to_string(&r)?,
                recipe_path: recipe.display().to_string(),
                name: None,
                env: ClientEnv::from_env(),
            };
            // An SSH launch reports each host's progress before its one final reply.
            let mut c = Client::connect(db).await?;
            c.send(&req).await?;
            loop {
                match c.next().await? {
                    Some(Reply::LaunchProgress { host, text }) => {
                        if tx.send(DataEvent::Done(format!("launch {host}: {text}"))).await.is_err() {
                            return Ok(());
                        }
                    }
                    Some(Reply::Launched { run }) => break DataEvent::Launched(run),
                    Some(Reply::Error { message }) => anyhow::bail!("{message}"),
                    Some(other) => anyhow::bail!("unexpected reply to launch: {other:?}"),
                    None => anyhow::bail!("the server closed the connection during the launch"),
                }
            }
        }
        Command::Kill { run } => {
            request(db, Request::Kill { run: run.to_string() }).await?;
            DataEvent::Done(format!("kill sent to run {run}"))
        }
        Command::ListRecipes => {
            let list = tokio::task::spawn_blocking(list_recipes).await?;
            DataEvent::Recipes(list)
        }
        Command::LoadCompare { runs } => {
            for run in runs {
                let req = Request::Metrics { run: run.to_string(), key: Some("loss".into()), rank: None };
                let Reply::Metrics { points } = request(db, req).await? else {
                    anyhow::bail!("unexpected reply to metrics of {run}");
                };
                let points = mean_by_step(&points);
                if tx.send(DataEvent::CompareSeries { run: run.clone(), points }).await.is_err() {
                    return Ok(());
                }
                let Reply::Run { detail } = request(db, Request::ShowRun { run: run.to_string() }).await? else {
                    anyhow::bail!("unexpected reply to show {run}");
                };
                let ratio = detail.goodput.map(|g| g.ratio);
                if tx.send(DataEvent::CompareGoodput { run, ratio }).await.is_err() {
                    return Ok(());
                }
            }
            return Ok(());
        }
        Command::LoadSweep { id } => {
            let Reply::Queue { sweeps } = request(db, Request::Queue { all: true }).await? else {
                anyhow::bail!("unexpected reply to the queue");
            };
            match sweeps.into_iter().find(|s| s.sweep.id == id) {
                Some(s) => DataEvent::Sweep(Box::new(s)),
                None => DataEvent::Error(format!("sweep {id} is not in the history")),
            }
        }
        Command::LoadCheckpoints { run, verify } => {
            let req = Request::Checkpoints { run: run.to_string(), verify };
            match request(db, req).await {
                Ok(Reply::Checkpoints { run, dir, latest, checkpoints }) => {
                    DataEvent::Checkpoints(Box::new(CkptList { run, dir, latest, checkpoints }))
                }
                Ok(other) => anyhow::bail!("unexpected reply to the checkpoints of {run}: {other:?}"),
                Err(e) => DataEvent::CheckpointsFailed { message: format!("checkpoints of run {run}: {e:#}"), run },
            }
        }
        Command::Resume { run, step, kill_first } => {
            if kill_first {
                // Never kill a run that has nothing to restart from: the listing decides first.
                let listed = request(db, Request::Checkpoints { run: run.to_string(), verify: false }).await;
                if let Ok(Reply::Checkpoints { checkpoints, dir, .. }) = &listed {
                    if !checkpoints.iter().any(|c| c.verified) {
                        let why = format!("run {run} was not killed: no checkpoint in {dir} verifies");
                        let _ = tx.send(DataEvent::ResumeFailed(why)).await;
                        return Ok(());
                    }
                }
                if let Err(e) = kill_and_wait(db, &run).await {
                    // A closed channel means the cockpit is gone; nothing is left to tell.
                    let _ = tx.send(DataEvent::ResumeFailed(format!("{e:#}"))).await;
                    return Ok(());
                }
            }
            let req = Request::Resume {
                run: run.to_string(),
                step,
                recipe_json: None,
                name: None,
                env: ClientEnv::from_env(),
            };
            match request(db, req).await {
                Ok(Reply::Resumed { run, parent, step, path, skipped }) => {
                    DataEvent::Resumed(Box::new(Resumed { run, parent, step, path, skipped }))
                }
                Ok(other) => anyhow::bail!("unexpected reply to resume: {other:?}"),
                Err(e) => DataEvent::ResumeFailed(format!("{e:#}")),
            }
        }
        Command::Stop { run } => {
            request(db, Request::Stop { run: run.to_string() }).await?;
            DataEvent::Done(format!("stop sent to run {run}: each rank saves a checkpoint, then exits"))
        }
        Command::LoadParentLoss { child, parent, step } => {
            DataEvent::ParentLoss { child, loss: lineage_loss(db, parent, step).await? }
        }
        Command::Stacks { run, rank, native } => {
            let result = match request(db, Request::Stacks { run: run.to_string(), rank, native }).await {
                Ok(Reply::Stacks(report)) => Ok(report),
                Ok(other) => Err(format!("unexpected reply to stacks: {other:?}")),
                Err(e) => Err(format!("{e:#}")),
            };
            DataEvent::Stacks { run, rank, result }
        }
        Command::Export { run, format, out } => {
            let req = crate::export::ExportRequest {
                runs: vec![run.to_string()],
                format,
                out: absolute(&out),
                metrics: Vec::new(),
                ranks: Vec::new(),
                lineage: false,
            };
            let mut c = Client::connect(db).await?;
            match crate::export::export(&mut c, &req).await {
                Ok(done) => DataEvent::Done(done.summary(&req.out)),
                Err(e) => DataEvent::Error(format!("export of {run}: {e:#}")),
            }
        }
        Command::Report { run, out } => {
            let mut c = Client::connect(db).await?;
            match crate::report::report(&mut c, &[run.to_string()], &absolute(&out), Default::default()).await {
                Ok(files) => DataEvent::Done(format!("report of {run} written: {}", files[0].display())),
                Err(e) => DataEvent::Error(format!("report of {run}: {e:#}")),
            }
        }
        Command::LoadIncident { run } => {
            let result = match request(db, Request::ShowRun { run: run.to_string() }).await {
                Ok(Reply::Run { detail }) => newest_incident(&detail),
                Ok(other) => Err(format!("unexpected reply to show: {other:?}")),
                Err(e) => Err(format!("{e:#}")),
            };
            DataEvent::Incident { run, result }
        }
        Command::Open { .. } | Command::Close => return Ok(()),
    };
    let _ = tx.send(ev).await;
    Ok(())
}

/// `p` under the working directory, so the status line names where the files are.
fn absolute(p: &std::path::Path) -> std::path::PathBuf {
    std::env::current_dir().map(|d| d.join(p)).unwrap_or_else(|_| p.to_path_buf())
}

/// The newest incident report among a run's stored verdicts, or why it has none.
fn newest_incident(detail: &crate::record::RunDetail) -> Result<(Option<String>, String), String> {
    let newest = detail.verdicts.iter().rev().find_map(|v| v.report_md.clone().map(|md| (v.report_path.clone(), md)));
    newest.ok_or_else(|| {
        format!(
            "run {} has no incident report: one is written when a hang verdict is given (a straggler gets none)",
            detail.run.id
        )
    })
}

/// `recipes/*.toml` under the current directory, sorted.
/// Each is marked when it asks for `cluster.device = "cuda"` and this machine has no NVIDIA
/// driver (`/dev/nvidiactl`), as `doctor` would find.
fn list_recipes() -> Vec<RecipeChoice> {
    let gpu_here = std::path::Path::new("/dev/nvidiactl").exists();
    let mut out: Vec<RecipeChoice> = std::fs::read_dir("recipes")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .map(|p| {
            let cuda = crate::recipe::load_file(&p, &[]).is_ok_and(|r| r.cluster.device == crate::recipe::Device::Cuda);
            RecipeChoice { path: p.display().to_string(), no_gpu_here: cuda && !gpu_here }
        })
        .collect();
    out.sort_by(|a, b| a.path.cmp(&b.path));
    out
}

/// The mean over ranks at each step (non-finite values left out), for the compare screen.
pub fn mean_by_step(points: &[crate::store::Point]) -> Vec<(u64, f64)> {
    let mut by_step: BTreeMap<u64, (f64, u32)> = BTreeMap::new();
    for p in points.iter().filter(|p| p.value.is_finite()) {
        let e = by_step.entry(p.step).or_insert((0.0, 0));
        e.0 += p.value;
        e.1 += 1;
    }
    by_step.into_iter().map(|(s, (sum, n))| (s, sum / f64::from(n))).collect()
}

/// The most ancestors a chart walks back through (a lineage of restarts is rarely longer).
const LINEAGE_DEPTH: usize = 64;

/// The loss of a resumed run's lineage before it: `parent`'s mean loss up to `step`, then its own
/// parent's up to the step it resumed from, and so on up to the first attempt, each segment the
/// steps that attempt's child kept (work a failed attempt did past its checkpoint is left out);
/// and each resume step, for the chart's markers.
async fn lineage_loss(db: &DbPaths, parent: crate::ids::RunId, step: u64) -> anyhow::Result<ParentLoss> {
    let (mut at, mut upto) = (Some(parent.clone()), step);
    let mut points: BTreeMap<u64, f64> = BTreeMap::new();
    let mut marks = vec![step];
    for _ in 0..LINEAGE_DEPTH {
        let Some(run) = at.take() else { break };
        let req = Request::Metrics { run: run.to_string(), key: Some("loss".into()), rank: None };
        let Reply::Metrics { points: own } = request(db, req).await? else {
            anyhow::bail!("unexpected reply to metrics of {run}");
        };
        for (s, v) in mean_by_step(&own) {
            if s <= upto {
                points.entry(s).or_insert(v);
            }
        }
        let Reply::Run { detail } = request(db, Request::ShowRun { run: run.to_string() }).await? else {
            anyhow::bail!("unexpected reply to show of {run}");
        };
        if let (Some(p), Some(from)) = (detail.run.parent.clone(), detail.run.resumed_from.as_ref()) {
            (at, upto) = (Some(p), from.step);
            marks.push(from.step);
        }
    }
    marks.sort_unstable();
    marks.dedup();
    Ok(ParentLoss { parent, step, points: points.into_iter().collect(), marks })
}

/// How long a killed run may take to end before a restart gives up on it.
const KILL_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// Kills a live run and waits until the server records its end (SIGTERM, then SIGKILL after
/// the agent's grace), so that a resume sees a finished parent.
async fn kill_and_wait(db: &DbPaths, run: &crate::ids::RunId) -> anyhow::Result<()> {
    request(db, Request::Kill { run: run.to_string() }).await?;
    let deadline = tokio::time::Instant::now() + KILL_WAIT;
    loop {
        let Reply::Runs { runs } = request(db, Request::ListRuns).await? else {
            anyhow::bail!("unexpected reply to the runs list");
        };
        match runs.iter().find(|r| &r.id == run) {
            Some(r) if r.status.is_live() => {}
            _ => return Ok(()),
        }
        if tokio::time::Instant::now() > deadline {
            anyhow::bail!("run {run} was killed but has not ended after {KILL_WAIT:?}; not restarting it");
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}
